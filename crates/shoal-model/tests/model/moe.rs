//! Mixture-of-experts stages on the synthetic `qwen3moe`, `qwen2moe`, `gpt-oss`, `glm4moe` and `deepseek2` fixtures (decisions 020, 022), beyond the
//! llama.cpp comparison every fixture gets in `synthetic`: the grouped-by-expert prefill and batched
//! decode give the one-token-at-a-time results bitwise, a two-stage split gives the one-stage tokens, a
//! GPU stage refuses the experts by name, and the footprint prices a token by the experts it reads.

use std::path::PathBuf;
use std::sync::Arc;

use shoal_kernels::ThreadPool;
use shoal_model::gguf::GgufFile;
use shoal_model::{DecoderStage, Footprint, LayerRange, ModelConfig};

use crate::common::{gpu, greedy, greedy_together, ids, load_from, step};
use crate::synthetic::{fixtures, is_moe};

fn moe_fixtures() -> Vec<(PathBuf, serde_json::Value)> {
    let out: Vec<_> = fixtures().into_iter().filter(|(_, r)| is_moe(r)).collect();
    let archs: Vec<_> = out.iter().map(|(_, r)| r["arch"].clone()).collect();
    assert_eq!(
        archs,
        ["deepseek2", "glm4moe", "gpt-oss", "qwen2moe", "qwen3moe"],
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
fn a_gpu_stage_refuses_mixture_of_experts_layers_by_name() {
    let Some(gpu) = gpu() else { return };
    for (path, r) in moe_fixtures() {
        let mut g = GgufFile::open(&path).expect("open");
        let err = shoal_model::gpu::GpuDecoderStage::load(&mut g, LayerRange::full(2), &gpu)
            .map(|_| ())
            .expect_err("no experts on the GPU")
            .to_string();
        let arch = r["arch"].as_str().expect("arch");
        assert!(
            err.contains("mixture-of-experts") && err.contains(arch) && err.contains("cpu"),
            "{err}"
        );
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
