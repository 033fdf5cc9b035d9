//! Mixture-of-experts layers on a GPU stage (lavapipe in CI): the synthetic `qwen3moe`, `qwen2moe`,
//! `glm4moe`, `gpt-oss` and `deepseek2` fixtures (routed experts, a sigmoid-gated shared expert,
//! sigmoid routing with a selection bias, a leading dense layer, an ungated shared expert; gpt-oss's
//! router and expert biases, top-k-then-softmax routing, clamped SwiGLU, MXFP4 experts, attention
//! sinks, sliding-window layers and YaRN rope; deepseek2's latent attention, with and without the
//! query bottleneck, and in the older `attn_kv_b` layout; group-limited routing) against the CPU
//! stage of the same file,
//! teacher-forced over the fixture's prompt and then greedily; a prompt prefilled in one batch
//! against the same prompt one token at a time; and a hybrid split (the first layers on the GPU,
//! the rest on the CPU). Their llama.cpp comparison is `synthetic.rs`'s GPU test. These fail when no
//! GPU adapter exists unless `SHOAL_GPU_TESTS=skip`.

use std::path::PathBuf;

use shoal_model::gguf::GgufFile;
use shoal_model::{ModelConfig, Pool, SeqChunk, StageInput};

use crate::common::{Model, argmax, gpu, greedy, ids, load_from, load_gpu, load_whole, step};
use crate::gpu_iq::{TOLERANCE, logits_against_cpu};
use crate::synthetic::fixtures;

/// The tolerance of gpt-oss and deepseek2 on the GPU, against the CPU or llama.cpp. gpt-oss's router
/// picks 2 of 4 experts by raw logits, and at two positions of the fixture's prompt (16 and 18) the
/// runners-up nearly tie, so any rounding difference upstream swaps an expert there: shoal's CPU path
/// itself is 0.063 and 0.045 from llama.cpp at those positions (0.013–0.037 elsewhere), the GPU
/// (f32 activations) 0.10 from the CPU at position 16 and 0.11 from llama.cpp at 18 (0.015–0.045
/// elsewhere). deepseek2's (a 256-wide latent, Q4_K) spread over every position with no trend along
/// the prompt: the CPU 0.02–0.064 from llama.cpp, the GPU 0.02–0.083 (0.085 and 0.094 from the CPU).
/// Without the sinks, YaRN, the clamp or the down experts' biases (gpt-oss), or the score scale, the
/// latent's norm or the queries' rope (deepseek2), `routed_experts_on_the_gpu_*` fails (checked by
/// breaking each: a decisive top token differs, or 0.137 for the biases).
pub const WIDE_TOLERANCE: f32 = 0.12;

/// The tolerance of the fixture of `arch` on the GPU against the CPU or llama.cpp.
pub fn gpu_tolerance(arch: &str) -> f32 {
    match arch {
        "gpt-oss" | "deepseek2" => WIDE_TOLERANCE,
        _ => TOLERANCE,
    }
}

/// The families whose experts run on the GPU.
pub const GPU_MOE: [&str; 5] = ["deepseek2", "glm4moe", "gpt-oss", "qwen2moe", "qwen3moe"];

/// Whether the mixture-of-experts fixture `r` runs on the GPU: its family does.
pub fn runs_on_gpu(r: &serde_json::Value) -> bool {
    GPU_MOE.contains(&r["arch"].as_str().unwrap_or(""))
}

fn gpu_moe_fixtures() -> Vec<(PathBuf, serde_json::Value, usize)> {
    let out: Vec<_> = fixtures()
        .into_iter()
        .filter(|(_, r)| runs_on_gpu(r))
        .map(|(p, r)| {
            let g = GgufFile::open(&p).expect("open");
            let n = ModelConfig::from_gguf(&g).expect("config").n_layers;
            (p, r, n)
        })
        .collect();
    assert_eq!(
        out.len(),
        7,
        "every MoE fixture: one per family, deepseek2's three (with and without q_lora, attn_kv_b)"
    );
    out
}

#[test]
fn routed_experts_on_the_gpu_follow_the_cpu_stage() {
    let Some(gpu) = gpu() else { return };
    let mut failures = Vec::new();
    for (path, r, n) in gpu_moe_fixtures() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let prompt = ids(&r["prompt"]);
        let on_gpu = load_gpu(&path, &[(0, n)], &gpu);
        let mut kv = vec![on_gpu[0].new_kv()];
        let worst = logits_against_cpu(&path, &prompt, |t| step(&on_gpu, &mut kv, &[t]), &name);
        if worst > gpu_tolerance(r["arch"].as_str().unwrap_or("")) {
            failures.push(format!(
                "{name}: worst relative logit difference {worst:.4}"
            ));
        }
        // Greedy tokens from the whole prompt, compared up to the CPU's first near tie.
        let (want, want_logits) = greedy(&load_whole(&path), &prompt, 8);
        let (got, _) = greedy(&on_gpu, &prompt, 8);
        for (i, l) in want_logits.iter().enumerate() {
            let mut sorted = l.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let scale = sorted[0].abs().max(1.0);
            if sorted[0] - sorted[1] < 0.05 * scale {
                break;
            }
            if got[i] != want[i] {
                failures.push(format!(
                    "{name}: greedy token {i}: {} vs CPU {}",
                    got[i], want[i]
                ));
                break;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_gpu_moe_prompt_prefilled_in_one_batch_equals_it_token_by_token() {
    let Some(gpu) = gpu() else { return };
    for (path, r, n) in gpu_moe_fixtures() {
        let prompt = ids(&r["prompt"]);
        let stages = load_gpu(&path, &[(0, n)], &gpu);
        let mut kv = [stages[0].new_kv()];
        let batched = step(&stages, &mut kv, &prompt);
        let mut kv = [stages[0].new_kv()];
        let mut one_by_one = Vec::new();
        for &t in &prompt {
            one_by_one = step(&stages, &mut kv, &[t]);
        }
        // Each (token, slot) pair takes the same per-pair expert product whatever the batch, but the
        // dense products (attention, router, shared expert) tile a batch differently from one row:
        // measured on lavapipe, 0.7–1.3e-4 of the largest logit here and up to 3.9e-4 on the dense
        // quantized fixtures (llama-k-q4_k_m); an expert chosen differently moves far more.
        let scale = one_by_one.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = batched
            .iter()
            .zip(&one_by_one)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(d <= 1e-3 * scale, "{}: {d} of {scale}", path.display());
        assert_eq!(argmax(&batched), argmax(&one_by_one));
    }
}

#[test]
fn a_hybrid_split_runs_the_first_moe_layer_on_the_gpu_and_the_rest_on_the_cpu() {
    let Some(gpu) = gpu() else { return };
    // deepseek2-kvb is left out: its layer 1 routes 2 of 8 experts within 1 of 2 groups, and at
    // position 7 of its prompt the GPU layer 0's f32 rounding (0.01–0.025 of the hidden state's
    // largest value, as for the other two deepseek2 files) flips the group: 0.30 there, 0.03–0.08 at
    // the other positions (measured; the CPU-only split of the same file is bitwise its whole
    // stage). Its whole-GPU run is in the tests above.
    let fixtures = gpu_moe_fixtures().into_iter();
    for (path, r, n) in fixtures.filter(|(p, _, _)| !p.to_string_lossy().contains("-kvb-")) {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let prompt = ids(&r["prompt"]);
        // glm4moe's first layer is dense: its GPU part is the first two (one of them routed); so is
        // deepseek2's, whose GPU part is that one (latent attention, a dense feed-forward).
        let split = if r["arch"] == "glm4moe" { 2 } else { 1 };
        let head = load_gpu(&path, &[(0, split)], &gpu);
        let tail = load_from(&path, &[(split, n)]);
        let (mut kv_gpu, mut kv_cpu) = (head[0].new_kv(), tail[0].new_kv_cache());
        let worst = logits_against_cpu(
            &path,
            &prompt,
            |t| {
                let hidden =
                    head[0].forward_chunks(StageInput::Tokens(&[t]), &mut [chunk(&mut kv_gpu)]);
                tail[0]
                    .forward(StageInput::Hidden(hidden), &mut [chunk(&mut kv_cpu)])
                    .expect("CPU tail")
                    .into_data()
            },
            &name,
        );
        let tol = gpu_tolerance(r["arch"].as_str().unwrap_or(""));
        assert!(worst <= tol, "{name}: {worst:.4}");
    }
}

fn chunk<K>(kv: &mut K) -> SeqChunk<'_, K> {
    SeqChunk {
        kv,
        len: 1,
        want_logits: true,
        pool: Pool::None,
    }
}
