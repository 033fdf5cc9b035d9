//! The Llama stage against llama.cpp's golden generations, and layer-range stages chained in one
//! process against the whole model.

use std::sync::Arc;

use candle_core::Device;
use shoal_kernels::ThreadPool;
use shoal_model::gguf::GgufFile;
use shoal_model::{HostMatrix, LayerRange, LlamaStage, SeqChunk, StageInput};
use shoal_testkit::fixtures::{golden, model_path};

fn load(ranges: &[(usize, usize)]) -> Vec<LlamaStage> {
    let pool = Arc::new(ThreadPool::new(1));
    let mut g = GgufFile::open(&model_path()).expect("open model");
    ranges
        .iter()
        .map(|&(s, e)| {
            LlamaStage::load(&mut g, LayerRange { start: s, end: e }, &Device::Cpu, &pool)
                .expect("load")
        })
        .collect()
}

/// Runs `tokens` as one prefill chunk through the chained stages; returns the last position's logits.
fn step(stages: &[LlamaStage], kvs: &mut [shoal_model::KvCache], tokens: &[u32]) -> Vec<f32> {
    let mut input = StageInput::Tokens(tokens);
    let mut out = None;
    for (stage, kv) in stages.iter().zip(kvs.iter_mut()) {
        let mut chunk = [SeqChunk {
            kv,
            len: tokens.len(),
            want_logits: true,
        }];
        let t = stage.forward(input, &mut chunk).expect("forward");
        input = StageInput::Hidden(t.clone());
        out = Some(t);
    }
    let logits = out.expect("stages");
    assert_eq!(logits.rows(), 1);
    logits.into_data()
}

fn greedy(stages: &[LlamaStage], prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut kvs: Vec<_> = stages.iter().map(|s| s.new_kv_cache()).collect();
    let mut logits = step(stages, &mut kvs, prompt);
    let (mut toks, mut all) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let next = argmax(&logits);
        toks.push(next);
        all.push(logits);
        logits = step(stages, &mut kvs, &[next]);
    }
    (toks, all)
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
        .0 as u32
}

fn log_softmax_at(v: &[f32], id: usize) -> f32 {
    let max = v.iter().copied().fold(f32::MIN, f32::max);
    let z: f64 = v.iter().map(|&x| ((x - max) as f64).exp()).sum();
    ((v[id] - max) as f64 - z.ln()) as f32
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Where llama.cpp's own top-2 candidates are closer than this (in nats), a different but correct kernel
/// may pick the other one. Measured: llama.cpp built from the golden's own tree on this machine flips at
/// margins up to 0.26 between its `-fa on` and `-fa off` runs (docs/benchmarks.md, "Correctness").
const NEAR_TIE: f64 = 0.3;

fn margin(top: &serde_json::Value) -> f64 {
    top[0]["logprob"].as_f64().expect("logprob") - top[1]["logprob"].as_f64().expect("logprob")
}

#[test]
fn greedy_tokens_match_llama_cpp_up_to_the_first_near_tie() {
    let stages = load(&[(0, 30)]);
    let cases = golden("smollm2-135m-q4_1.greedy.json");
    let mut compared = 0;
    for case in cases.as_array().expect("cases") {
        let prompt = ids(&case["prompt_tokens"]);
        let expected = ids(&case["completion_tokens"]);
        let tops = case["top_logprobs"].as_array().expect("top_logprobs");
        // llama-server reports one entry per complete UTF-8 piece, on the token that completes it: align
        // entries to tokens by id; tokens in the middle of a character have no margin of their own.
        let mut margins = vec![None; expected.len()];
        let mut j = 0;
        for (i, &tok) in expected.iter().enumerate() {
            if j < tops.len() && tops[j][0]["id"].as_u64() == Some(tok as u64) {
                margins[i] = Some(margin(&tops[j]));
                j += 1;
            }
        }
        let (got, _) = greedy(&stages, &prompt, 16);
        for pos in 0..16 {
            if margins[pos].is_some_and(|m| m < NEAR_TIE) {
                break;
            }
            assert_eq!(
                got[pos], expected[pos],
                "{:?}: token {pos} (ours {got:?}, llama.cpp {expected:?})",
                case["prompt"]
            );
            compared += 1;
        }
    }
    assert!(compared >= 40, "only {compared} tokens compared");
}

#[test]
fn logprobs_match_llama_cpp_within_its_own_noise() {
    let stages = load(&[(0, 30)]);
    let cases = golden("smollm2-135m-q4_1.greedy.json");
    let (mut sum, mut n, mut worst) = (0f64, 0usize, 0f64);
    for case in cases.as_array().expect("cases") {
        let prompt = ids(&case["prompt_tokens"]);
        let expected = ids(&case["completion_tokens"]);
        let tops = case["top_logprobs"].as_array().expect("top_logprobs");
        if tops.len() != expected.len() {
            continue; // not per token (see above)
        }
        // Teacher forcing: feed llama.cpp's tokens so every position has the same context.
        let mut kvs = vec![stages[0].new_kv_cache()];
        let mut logits = step(&stages, &mut kvs, &prompt);
        for (pos, top) in tops.iter().enumerate() {
            let id = top[0]["id"].as_u64().expect("id") as usize;
            let d = (log_softmax_at(&logits, id) as f64
                - top[0]["logprob"].as_f64().expect("logprob"))
            .abs();
            sum += d;
            n += 1;
            worst = worst.max(d);
            logits = step(&stages, &mut kvs, &[expected[pos]]);
        }
    }
    let mean = sum / n as f64;
    // llama.cpp itself, same file and tree on this machine: mean 0.024, worst 0.21 (`-fa on` vs off).
    // Ours differs from llama.cpp's rounding on both sides, and the worst of ~200 positions moves with
    // any change of summation order in attention: measured 0.26 (8 mul+add partial sums), 0.37 (one
    // FMA chain, pairwise lanes), 0.35 (ggml's four FMA chains), 0.24 (one FMA chain, ggml's lane
    // reduction: the current kernel) with means 0.033–0.037. A real bug
    // fails the mean: a 10 % error in the attention scale alone gives 0.077.
    assert!(
        mean <= 0.05,
        "mean |Δ top-1 logprob| {mean:.4} over {n} positions"
    );
    assert!(worst <= 0.45, "worst |Δ top-1 logprob| {worst:.4}");
}

#[test]
fn chained_layer_ranges_equal_the_whole_model() {
    let whole = load(&[(0, 30)]);
    let split = load(&[(0, 10), (10, 20), (20, 30)]);
    assert!(split[0].is_first() && !split[0].is_last());
    assert!(!split[1].is_first() && !split[1].is_last());
    assert!(split[2].is_last() && !split[2].is_first());
    let prompt = [504u32, 3575, 282, 4649, 314];
    let (a_toks, a_logits) = greedy(&whole, &prompt, 12);
    let (b_toks, b_logits) = greedy(&split, &prompt, 12);
    assert_eq!(a_toks, b_toks);
    for (a, b) in a_logits.iter().zip(&b_logits) {
        let diff = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(diff <= 1e-4, "max abs logit difference {diff}");
    }
}

#[test]
fn batched_sequences_equal_sequences_run_alone() {
    let stages = load(&[(0, 30)]);
    let s = &stages[0];
    let prompts: [&[u32]; 3] = [
        &[504, 3575, 282, 4649, 314],
        &[1604, 3987, 46477, 24, 94, 727],
        &[33, 28, 216],
    ];
    let alone: Vec<Vec<u32>> = prompts.iter().map(|p| greedy(&stages, p, 6).0).collect();
    // Prefill all three in one batch, then decode them together.
    let mut kvs: Vec<_> = prompts.iter().map(|_| s.new_kv_cache()).collect();
    let mut next: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
    let mut got = vec![Vec::new(); 3];
    for _ in 0..6 {
        let flat: Vec<u32> = next.concat();
        let mut chunks: Vec<SeqChunk> = kvs
            .iter_mut()
            .zip(&next)
            .map(|(kv, t)| SeqChunk {
                kv,
                len: t.len(),
                want_logits: true,
            })
            .collect();
        let logits: HostMatrix = s
            .forward(StageInput::Tokens(&flat), &mut chunks)
            .expect("forward");
        let rows: Vec<&[f32]> = logits.data().chunks(logits.cols()).collect();
        assert_eq!(rows.len(), 3);
        for (i, row) in rows.iter().enumerate() {
            let t = argmax(row);
            got[i].push(t);
            next[i] = vec![t];
        }
    }
    assert_eq!(got, alone);
}

#[test]
fn chunked_prefill_equals_one_shot_prefill() {
    let stages = load(&[(0, 30)]);
    let prompt: Vec<u32> = vec![6403, 1980, 253, 655, 28, 281, 253, 1165, 6560, 28];
    let mut kv = stages[0].new_kv_cache();
    let one_shot = step(&stages, std::slice::from_mut(&mut kv), &prompt);
    let mut kv = stages[0].new_kv_cache();
    step(&stages, std::slice::from_mut(&mut kv), &prompt[..3]);
    step(&stages, std::slice::from_mut(&mut kv), &prompt[3..7]);
    let chunked = step(&stages, std::slice::from_mut(&mut kv), &prompt[7..]);
    let diff = one_shot
        .iter()
        .zip(&chunked)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    // Every row is computed the same way whatever the chunking: bitwise equal.
    assert!(diff == 0.0, "max abs difference {diff}");
    assert_eq!(argmax(&one_shot), argmax(&chunked));
}

#[test]
fn bad_inputs_are_errors() {
    let stages = load(&[(0, 10), (10, 30)]);
    let mut kv = stages[1].new_kv_cache();
    // Token ids into a stage without the embedding.
    let mut c = [SeqChunk {
        kv: &mut kv,
        len: 1,
        want_logits: true,
    }];
    assert!(stages[1].forward(StageInput::Tokens(&[1]), &mut c).is_err());
    // Hidden state of the wrong width.
    let h = HostMatrix::zeros(1, 7);
    assert!(stages[1].forward(StageInput::Hidden(h), &mut c).is_err());
    // Token outside the vocabulary.
    let mut kv0 = stages[0].new_kv_cache();
    let mut c0 = [SeqChunk {
        kv: &mut kv0,
        len: 1,
        want_logits: false,
    }];
    assert!(
        stages[0]
            .forward(StageInput::Tokens(&[1_000_000]), &mut c0)
            .is_err()
    );
    // Invalid layer range.
    let pool = Arc::new(ThreadPool::new(1));
    let mut g = GgufFile::open(&model_path()).expect("open");
    assert!(
        LlamaStage::load(
            &mut g,
            LayerRange { start: 20, end: 31 },
            &Device::Cpu,
            &pool
        )
        .is_err()
    );
}

#[test]
fn device_op_path_agrees_with_the_host_path() {
    let host = load(&[(0, 30)]);
    let device = vec![load(&[(0, 30)]).remove(0).with_device_ops()];
    let prompt = [504u32, 3575, 282, 4649, 314];
    let (a, la) = greedy(&host, &prompt, 8);
    let (b, lb) = greedy(&device, &prompt, 8);
    // Rounding differs between the two paths, so compare where the model is decisive.
    assert_eq!(a[..4], b[..4]);
    for (x, y) in la.iter().zip(&lb).take(4) {
        let id = argmax(x) as usize;
        let d = (log_softmax_at(x, id) - log_softmax_at(y, id)).abs();
        assert!(d < 0.3, "top-1 logprob differs by {d}");
    }
}
