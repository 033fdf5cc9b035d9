//! The decoder stage (SmolLM2, a Llama) against llama.cpp's golden generations, and layer-range stages
//! chained in one process against the whole model.

use std::sync::Arc;

use crate::common::{
    argmax, check_greedy, check_logprobs, greedy, greedy_together, load_from, step,
};
use shoal_kernels::ThreadPool;
use shoal_model::gguf::GgufFile;
use shoal_model::{DecoderStage, HostMatrix, LayerRange, Pool, SeqChunk, StageInput};
use shoal_testkit::fixtures::model_path;

fn load(ranges: &[(usize, usize)]) -> Vec<DecoderStage> {
    load_from(&model_path(), ranges)
}

const GOLDEN: &str = "smollm2-135m-q4_1.greedy.json";

#[test]
fn greedy_tokens_match_llama_cpp_up_to_the_first_near_tie() {
    check_greedy(&load(&[(0, 30)]), GOLDEN, 40);
}

#[test]
fn logprobs_match_llama_cpp_within_its_own_noise() {
    // The tolerances and how they were measured: `common::check_logprobs`.
    check_logprobs(&load(&[(0, 30)]), GOLDEN, 0.05, 0.45);
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
    let got = greedy_together(s, &prompts, 6);
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

/// Pooled rows of `chunks` (lengths) of `prompt`, prefilled in that many steps on `stages`, each chunk
/// asking for `pool`; with the last step's logits.
fn pooled(stages: &[DecoderStage], prompt: &[u32], chunks: &[usize], pool: Pool) -> Vec<Vec<f32>> {
    let mut kvs: Vec<_> = stages.iter().map(|s| s.new_kv_cache()).collect();
    let mut rows = Vec::new();
    let mut at = 0;
    for &n in chunks {
        let tokens = &prompt[at..at + n];
        at += n;
        let mut input = StageInput::Tokens(tokens);
        for (stage, kv) in stages.iter().zip(kvs.iter_mut()) {
            let mut c = [SeqChunk {
                kv,
                len: n,
                want_logits: at == prompt.len(),
                pool,
            }];
            let out = stage.run(input, &mut c).expect("run");
            if stage.is_last() {
                assert_eq!(out.pooled.shape(), [1, stage.config().dim]);
                rows.push(out.pooled.data().to_vec());
                input = StageInput::Tokens(&[]);
            } else {
                assert_eq!(out.pooled.rows(), 0, "only the last stage pools");
                input = StageInput::Hidden(out.main);
            }
        }
    }
    rows
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.iter()
        .zip(b)
        .all(|(x, y)| (x - y).abs() <= 1e-4 * (1.0 + x.abs()))
}

#[test]
fn pooled_rows_are_the_final_normed_states_whatever_the_chunks_and_stages() {
    let whole = load(&[(0, 30)]);
    let split = load(&[(0, 12), (12, 30)]);
    let prompt: Vec<u32> = vec![6403, 1980, 253, 655, 28, 281, 253, 1165, 6560, 28];
    let sum = pooled(&whole, &prompt, &[10], Pool::Sum).remove(0);
    let parts = pooled(&split, &prompt, &[3, 4, 3], Pool::Sum);
    let added: Vec<f32> = (0..sum.len())
        .map(|i| parts.iter().map(|p| p[i]).sum())
        .collect();
    assert!(
        close(&sum, &added),
        "a sum over chunks is the sum over the prompt"
    );
    // One token's sum, its first and its last row are the same row; the last of the whole prompt is
    // the last of its last chunk, the first the first of its first chunk.
    let last = pooled(&whole, &prompt, &[10], Pool::Last).remove(0);
    let first = pooled(&split, &prompt, &[10], Pool::First).remove(0);
    let singles = pooled(&whole, &prompt, &[1; 10], Pool::Sum);
    assert!(close(&first, &singles[0]) && close(&last, &singles[9]));
    assert!(close(
        &sum,
        &(0..sum.len())
            .map(|i| singles.iter().map(|r| r[i]).sum())
            .collect::<Vec<f32>>()
    ));
    assert_eq!(
        pooled(&split, &prompt, &[7, 3], Pool::Last)[1],
        pooled(&split, &prompt, &[10], Pool::Last)[0]
    );
    // The rows are normed states (RMS ≈ the norm weights' scale), not raw residuals or logits.
    assert_ne!(first, last);
    assert!(sum.iter().all(|v| v.is_finite()));
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
        pool: Pool::None,
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
        pool: Pool::None,
    }];
    assert!(
        stages[0]
            .forward(StageInput::Tokens(&[1_000_000]), &mut c0)
            .is_err()
    );
    // Invalid layer range.
    let pool = Arc::new(ThreadPool::new(1));
    let mut g = GgufFile::open(&model_path()).expect("open");
    assert!(DecoderStage::load(&mut g, LayerRange { start: 20, end: 31 }, &pool).is_err());
}
