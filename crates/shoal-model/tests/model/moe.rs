//! Mixture-of-experts stages on the synthetic `qwen3moe`, `qwen2moe`, `gpt-oss`, `glm4moe` and `deepseek2` fixtures (decisions 020, 022), beyond the
//! llama.cpp comparison every fixture gets in `synthetic`: the grouped-by-expert prefill and batched
//! decode give the one-token-at-a-time results bitwise, a two-stage split gives the one-stage tokens (a GPU
//! stage's: `gpu_moe`), the footprint prices a token by the experts it reads, and
//! deepseek2 files resolve their latent attention and routing from their metadata.

use std::path::PathBuf;
use std::sync::Arc;

use shoal_kernels::ThreadPool;
use shoal_model::gguf::GgufFile;
use shoal_model::{DecoderStage, Footprint, LayerRange, ModelConfig};

use crate::common::{greedy, greedy_together, ids, load_from, step};
use crate::synthetic::{fixtures, is_moe};

fn moe_fixtures() -> Vec<(PathBuf, serde_json::Value)> {
    let out: Vec<_> = fixtures().into_iter().filter(|(_, r)| is_moe(r)).collect();
    let archs: Vec<_> = out.iter().map(|(_, r)| r["arch"].clone()).collect();
    assert_eq!(
        archs,
        [
            "deepseek2",
            "deepseek2",
            "deepseek2",
            "glm4moe",
            "gpt-oss",
            "qwen2moe",
            "qwen3moe"
        ],
        "the MoE fixtures"
    );
    out
}

fn load_with(path: &std::path::Path, threads: usize) -> DecoderStage {
    let pool = Arc::new(ThreadPool::new(threads));
    let mut g = GgufFile::open(path).expect("open");
    let n = ModelConfig::from_gguf(&g).expect("config").n_layers;
    DecoderStage::load(&mut g, LayerRange::full(n), &pool).expect("load")
}

#[test]
fn a_prompt_prefilled_in_one_batch_equals_it_decoded_token_by_token() {
    for (path, r) in moe_fixtures() {
        let prompt = ids(&r["prompt"]);
        for threads in [1, 2] {
            let stages = [load_with(&path, threads)];
            let mut kv = [stages[0].new_kv_cache()];
            let batched = step(&stages, &mut kv, &prompt);
            let mut kv = [stages[0].new_kv_cache()];
            let mut one_by_one = Vec::new();
            for &t in &prompt {
                one_by_one = step(&stages, &mut kv, &[t]);
            }
            // Each row meets the same expert matmuls, row for row, whatever the batch: bitwise equal.
            assert_eq!(batched, one_by_one, "{}, {threads} threads", path.display());
        }
    }
}

#[test]
fn two_stages_give_the_tokens_of_one() {
    for (path, r) in moe_fixtures() {
        let prompt = ids(&r["prompt"]);
        let n = ModelConfig::from_gguf(&GgufFile::open(&path).expect("open"))
            .expect("config")
            .n_layers;
        // glm4moe's file has 4 blocks, the last a nextn (MTP) layer that is not run.
        assert_eq!(n, if r["arch"] == "glm4moe" { 3 } else { 2 });
        let (whole, whole_logits) = greedy(&load_from(&path, &[(0, n)]), &prompt, 8);
        let (split, split_logits) = greedy(&load_from(&path, &[(0, 1), (1, n)]), &prompt, 8);
        assert_eq!(split, whole, "{}", path.display());
        assert_eq!(split_logits, whole_logits, "{}", path.display());
    }
}

#[test]
fn sequences_decoded_in_one_batch_equal_each_alone() {
    for (path, r) in moe_fixtures() {
        let stage = load_with(&path, 2);
        let prompt = ids(&r["prompt"]);
        let prompts: [&[u32]; 3] = [&prompt[..7], &prompt[7..10], &prompt[10..]];
        let stages = [stage];
        let alone: Vec<Vec<u32>> = prompts.iter().map(|p| greedy(&stages, p, 5).0).collect();
        let got = greedy_together(&stages[0], &prompts, 5);
        assert_eq!(got, alone, "{}", path.display());
    }
}

#[test]
fn the_footprint_prices_a_token_by_the_experts_it_reads() {
    for (path, _) in moe_fixtures() {
        let g = GgufFile::open(&path).expect("open");
        let fp = Footprint::from_gguf(&g).expect("footprint");
        let cfg = ModelConfig::from_gguf(&g).expect("config");
        let ex = cfg.arch.experts.expect("experts");
        // The first layer with experts (glm4moe's layer 0 is dense).
        let name = |p: &str| format!("blk.{}.{p}.weight", ex.leading_dense);
        let bytes = |p: &str| g.tensor_bytes(&name(p)).unwrap_or(0);
        let experts: u64 = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
            .iter()
            .map(|p| bytes(p))
            .sum();
        assert!(experts > 0, "{}", path.display());
        let (count, used) = (ex.count as u64, ex.used as u64);
        assert_eq!(
            fp.active_layer_bytes,
            fp.layer_bytes - experts + experts * used / count,
            "{}",
            path.display()
        );
        let (d, ff) = (cfg.dim as u64, ex.ff as u64);
        let expert_params = 3 * d * ff * count;
        assert_eq!(
            fp.active_layer_params,
            fp.layer_params - expert_params + expert_params * used / count,
            "{}",
            path.display()
        );
        assert!(fp.active_layer_bytes < fp.layer_bytes, "{fp:?}");
    }
}

#[test]
fn deepseek2_files_resolve_their_latent_attention_and_routing_from_the_metadata() {
    use shoal_model::arch::Gating;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/synth");
    let cfg = |name: &str| {
        let g = GgufFile::open(&dir.join(name)).expect("open");
        ModelConfig::from_gguf(&g).expect("config")
    };
    // V3-like: the query bottleneck, sigmoid routing in groups, renormalised and scaled; YaRN's mscale
    // (1 + 0.1 · 1 · ln 40)² on 1 / sqrt(64 + 32).
    let v3 = cfg("deepseek2-k-q4_k_m.gguf");
    let (m, e) = (v3.arch.mla.expect("mla"), v3.arch.experts.expect("experts"));
    assert_eq!(
        (m.q_lora, m.kv_lora, m.nope, m.rope, m.v_head),
        (256, 256, 64, 32, 64)
    );
    assert_eq!((v3.n_kv_heads, v3.head_dim), (1, 288));
    let mscale = 1.0 + 0.1 * 40f32.ln();
    assert!(
        (m.kq_scale - mscale * mscale / 96f32.sqrt()).abs() < 1e-6,
        "{m:?}"
    );
    assert_eq!(e.routing.gating, Gating::Sigmoid);
    assert!(e.routing.norm_weights);
    assert_eq!((e.groups, e.groups_used, e.weights_scale), (2, 1, 2.5));
    assert_eq!((e.leading_dense, e.shared_ff), (1, 32));
    // One key of the latent and the rope part per token and layer, no values.
    assert_eq!(v3.kv_bytes_per_token(2, 2), 2 * 288 * 2);
    // V2-Lite-like: queries straight from attn_q, softmax (no gating key), weights as they are.
    let lite = cfg("deepseek2-lite-k-q4_k_m.gguf");
    let (m, e) = (
        lite.arch.mla.expect("mla"),
        lite.arch.experts.expect("experts"),
    );
    assert_eq!(m.q_lora, 0);
    let mscale = 1.0 + 0.1 * 0.707 * 40f32.ln();
    assert!(
        (m.kq_scale - mscale * mscale / 96f32.sqrt()).abs() < 1e-5,
        "{m:?}"
    );
    assert_eq!(e.routing.gating, Gating::SoftmaxThenTopK);
    assert!(!e.routing.norm_weights);
    assert_eq!((e.groups, e.weights_scale, e.shared_ff), (1, 1.0, 64));
    let stage = load_with(&dir.join("deepseek2-lite-k-q4_k_m.gguf"), 1);
    assert!(!stage.new_kv_cache().has_values());
    // The older layout (attn_kv_b; every head a KV head of the decompressed key and value lengths) runs
    // as the same latent attention over the same one-key cache.
    let old = cfg("deepseek2-kvb-k-q4_k_m.gguf");
    let m = old.arch.mla.expect("mla");
    assert_eq!(
        (m.q_lora, m.kv_lora, m.nope, m.rope, m.v_head),
        (256, 256, 64, 32, 64)
    );
    assert_eq!((old.n_kv_heads, old.head_dim), (1, 288));
    assert_eq!(old.kv_bytes_per_token(1, 2), 288 * 2);
}
