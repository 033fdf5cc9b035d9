//! Mixture-of-experts stages split over tensor-parallel members by experts (issue 31, decision 024,
//! `shoal_model::split`): every member holds a contiguous run of the routed experts (only their
//! bytes read), a slice of the shared expert and of the heads where the blocks allow, and the router
//! whole; it routes every token as the whole stage does and adds only its experts' weighted outputs.
//! Against the whole stage on every MoE synthetic family, two and three ways, even and uneven:
//! greedy decoding (its first step a whole prompt's prefill, tokens choosing different experts), a
//! batch of sequences, members on different thread counts; the bytes a member reads; refusals.

use std::path::{Path, PathBuf};

use shoal_kernels::dequantize_row;
use shoal_model::gguf::GgufFile;
use shoal_model::linear::kernel_qtype;
use shoal_model::split::shares;
use shoal_model::{LayerRange, ModelConfig, ModelError};

use crate::common::{ids, load_whole, step};
use crate::gguf_writer::TempDir;
use crate::split::{Group, compare, relative, tolerance};
use crate::synthetic::{fixtures, is_moe};

fn moe_fixtures() -> Vec<(PathBuf, serde_json::Value)> {
    let out: Vec<_> = fixtures().into_iter().filter(|(_, r)| is_moe(r)).collect();
    assert_eq!(out.len(), 7, "the MoE fixtures");
    out
}

fn config(path: &Path) -> ModelConfig {
    ModelConfig::from_gguf(&GgufFile::open(path).expect("open")).expect("config")
}

/// Each member's experts: contiguous, every expert on exactly one member, none without one, each
/// count within one expert of its weight's share; heads and shared-expert columns partitioned.
fn check_shares(group: &Group, cfg: &ModelConfig, weights: &[f64]) {
    let s = group.shares();
    let count = cfg.arch.experts.expect("experts").count;
    let total: f64 = weights.iter().sum();
    let mut next = 0;
    for (share, w) in s.iter().zip(weights) {
        assert_eq!(share.experts.start, next, "{s:?}");
        assert!(!share.experts.is_empty(), "{s:?}");
        let want = count as f64 * w / total;
        assert!(
            (share.experts.len() as f64 - want).abs() < 1.0,
            "{} experts for a share of {want}: {s:?}",
            share.experts.len()
        );
        next = share.experts.end;
    }
    assert_eq!(next, count, "{s:?}");
    let heads: usize = s.iter().map(|s| s.q_heads.len()).sum();
    assert_eq!(heads, cfg.n_heads, "{s:?}");
    for pair in s.windows(2) {
        assert_eq!(pair[0].shared_ff.end, pair[1].shared_ff.start, "{s:?}");
        assert_eq!(pair[0].q_heads.end, pair[1].q_heads.start, "{s:?}");
    }
}

#[test]
fn every_moe_family_split_by_experts_decodes_and_prefills_as_the_whole_stage() {
    let mut ran = Vec::new();
    for (path, r) in moe_fixtures() {
        let cfg = config(&path);
        let prompt = ids(&r["prompt"]);
        let tol = tolerance(&path);
        let cases: [(&[f64], &[usize]); 5] = [
            (&[1.0, 1.0], &[1, 1]),
            (&[3.0, 1.0], &[1, 1]),
            (&[1.0, 1.0, 1.0], &[1, 1, 1]),
            (&[1.0, 2.0, 1.0], &[1, 1, 1]),
            // Members on different thread counts route the same way.
            (&[1.0, 1.0], &[2, 1]),
        ];
        for (weights, threads) in cases {
            if weights.len() > cfg.arch.experts.expect("experts").count {
                continue;
            }
            let group = Group::load_with(&path, weights, threads)
                .unwrap_or_else(|e| panic!("{}: {weights:?}: {e}", path.display()));
            check_shares(&group, &cfg, weights);
            // Step 0 is the whole prompt's prefill (24 tokens routed to different experts), then
            // greedy decoding.
            let (n, worst) = compare(&path, &group, &prompt, tol);
            assert!(n >= 1);
            println!(
                "{} over {weights:?} on {threads:?} threads: {n} steps, worst relative Δ {worst:.2e}; {:?}",
                path.display(),
                group.shares()
            );
            ran.push(r["arch"].clone());
        }
    }
    ran.dedup();
    assert_eq!(
        ran,
        ["deepseek2", "glm4moe", "gpt-oss", "qwen2moe", "qwen3moe"],
        "families split"
    );
}

#[test]
fn sequences_prefilled_in_one_batch_on_a_split_stage_equal_each_alone_on_the_whole() {
    for (path, r) in moe_fixtures() {
        let prompt = ids(&r["prompt"]);
        let chunks: [&[u32]; 3] = [&prompt[..7], &prompt[7..10], &prompt[10..]];
        let whole = load_whole(&path);
        let alone: Vec<Vec<f32>> = chunks
            .iter()
            .map(|c| step(&whole, &mut [whole[0].new_kv_cache()], c))
            .collect();
        for weights in [&[1.0, 1.0][..], &[1.0, 1.0, 1.0]] {
            let group = Group::load(&path, weights).expect("split");
            let mut kvs: Vec<_> = chunks
                .iter()
                .map(|_| group.members.iter().map(|m| m.new_kv_cache()).collect())
                .collect();
            let got = group.forward_batch(&mut kvs, &chunks);
            assert_eq!(got.shape()[0], chunks.len());
            let vocab = got.shape()[1];
            for (i, want) in alone.iter().enumerate() {
                let row = &got.data()[i * vocab..(i + 1) * vocab];
                let d = relative(want, row);
                assert!(
                    d < tolerance(&path),
                    "{} over {weights:?}: sequence {i} differs by {d}",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn a_member_reads_only_its_experts_and_the_whole_router() {
    for (path, _) in moe_fixtures() {
        let cfg = config(&path);
        let ex = cfg.arch.experts.expect("experts");
        let range = LayerRange::full(cfg.n_layers);
        for weights in [&[1.0, 1.0][..], &[1.0, 1.0, 2.0]] {
            let split = shares(
                &mut GgufFile::open(&path).expect("open"),
                &cfg,
                range,
                weights,
            )
            .expect("split");
            let mut expert_bytes = 0u64;
            for share in &split {
                let mut g = GgufFile::open(&path).expect("open");
                let pool = std::sync::Arc::new(shoal_kernels::ThreadPool::new(1));
                shoal_model::DecoderStage::load_share(&mut g, range, share, &pool).expect("load");
                for layer in ex.leading_dense..cfg.n_layers {
                    for p in ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] {
                        let name = format!("blk.{layer}.{p}.weight");
                        let all = g.tensor_bytes(&name).expect("expert tensor");
                        let held = all / ex.count as u64 * share.experts.len() as u64;
                        assert_eq!(g.bytes_read(&name), held, "{name} of {share:?}");
                        expert_bytes += held;
                    }
                    let router = format!("blk.{layer}.ffn_gate_inp.weight");
                    let whole = g.tensor_bytes(&router).expect("router");
                    assert_eq!(g.bytes_read(&router), whole, "{router} of {share:?}");
                }
            }
            // Every expert read once across the members.
            let every: u64 = (ex.leading_dense..cfg.n_layers)
                .flat_map(|l| {
                    ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
                        .map(|p| format!("blk.{l}.{p}.weight"))
                })
                .map(|n| GgufFile::open(&path).unwrap().tensor_bytes(&n).unwrap())
                .sum();
            assert_eq!(expert_bytes, every, "{}", path.display());
        }
    }
}

#[test]
fn impossible_expert_splits_are_refused_by_name() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/synth");
    let refuse = |name: &str, weights: &[f64]| -> String {
        let path = dir.join(name);
        let cfg = config(&path);
        let mut g = GgufFile::open(&path).expect("open");
        match shares(&mut g, &cfg, LayerRange::full(cfg.n_layers), weights) {
            Err(e @ ModelError::Unsupported(_)) => e.to_string(),
            other => panic!("{name} over {weights:?}: {other:?}"),
        }
    };
    // gpt-oss has 4 experts: five members cannot each hold one.
    let e = refuse("gpt-oss-k-mxfp4_moe.gguf", &[1.0; 5]);
    assert!(
        e.contains("4 routed experts cannot give each member at least one"),
        "{e}"
    );
    let e = refuse("qwen3moe-k-q4_k_m.gguf", &[1.0, 0.0]);
    assert!(e.contains("must be positive"), "{e}");
    let e = refuse("deepseek2-lite-k-q4_k_m.gguf", &[]);
    assert!(e.contains("must be positive"), "{e}");
}

/// A copy (in `dir`) of the fixture at `src` whose `attn_output` matrices are F32 — dequantized,
/// appended after the data and pointed to by their directory entries — so their columns can be cut
/// per head (the fixtures' K-quant blocks span all four heads' values).
fn with_f32_attn_output(src: &Path, dir: &TempDir) -> PathBuf {
    let mut bytes = std::fs::read(src).expect("read fixture");
    let mut g = GgufFile::open(src).expect("open");
    let data = g.content().tensor_data_offset as usize;
    let align = g.get_u32("general.alignment").unwrap_or(32) as usize;
    let mut names: Vec<String> = g
        .tensor_names()
        .filter(|n| n.ends_with("attn_output.weight"))
        .map(str::to_string)
        .collect();
    names.sort();
    assert!(!names.is_empty());
    for name in names {
        let raw = g.read_raw(&name).expect("read");
        let (rows, cols) = (raw.dims[0], raw.dims[1]);
        let q = kernel_qtype(&name, raw.ty).expect("type");
        let mut row = vec![0f32; cols];
        while !(bytes.len() - data).is_multiple_of(align) {
            bytes.push(0);
        }
        let offset = (bytes.len() - data) as u64;
        for r in raw.data.chunks_exact(raw.data.len() / rows) {
            dequantize_row(q, r, &mut row).expect("dequantize");
            bytes.extend(row.iter().flat_map(|x| x.to_le_bytes()));
        }
        // The entry: name length (u64), name, n_dims (u32), dims (u64 each), type (u32), offset (u64).
        let mut key = (name.len() as u64).to_le_bytes().to_vec();
        key.extend_from_slice(name.as_bytes());
        let at = bytes[..data]
            .windows(key.len())
            .position(|w| w == key)
            .expect("directory entry")
            + key.len();
        let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let ty = at + 4 + 8 * n_dims;
        bytes[ty..ty + 4].copy_from_slice(&0u32.to_le_bytes());
        bytes[ty + 4..ty + 12].copy_from_slice(&offset.to_le_bytes());
    }
    dir.write(&src.file_name().unwrap().to_string_lossy(), &bytes)
}

#[test]
fn latent_attention_split_by_heads_decodes_as_the_whole_stage() {
    let dir = TempDir::new();
    let mut ran = 0;
    for (src, r) in moe_fixtures() {
        if r["arch"] != "deepseek2" {
            continue;
        }
        let path = with_f32_attn_output(&src, &dir);
        let prompt = ids(&r["prompt"]);
        for weights in [&[1.0, 1.0][..], &[3.0, 1.0], &[1.0, 1.0, 1.0]] {
            let group = Group::load(&path, weights).expect("split");
            let s = group.shares();
            // Every member holds heads now (4 heads; one KV head: any cut).
            assert!(s.iter().all(|s| s.attends()), "{s:?}");
            check_shares(&group, &config(&path), weights);
            // Up to the order of additions, which the activations' 8-bit rounding may amplify.
            let (n, worst) = compare(&path, &group, &prompt, tolerance(&path));
            println!(
                "{} (F32 attn_output) over {weights:?}: {n} steps, worst relative Δ {worst:.2e}; {s:?}",
                src.display()
            );
            ran += 1;
        }
    }
    assert_eq!(ran, 9);
}

#[test]
fn members_return_their_heads_rows_for_a_caller_that_merges_the_shards() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/synth");
    // Tied (qwen3moe, llama) and untied (qwen2moe) heads.
    for name in [
        "qwen3moe-k-q4_k_m.gguf",
        "qwen2moe-k-q4_k_m.gguf",
        "llama-s-q8_0.gguf",
    ] {
        let path = dir.join(name);
        let prompt = [1u32, 15, 27, 3, 99, 42, 7, 64];
        for weights in [&[1.0, 1.0][..], &[1.0, 2.0, 1.0]] {
            let group = Group::load(&path, weights).expect("split");
            let mut kvs = vec![group.members.iter().map(|m| m.new_kv_cache()).collect()];
            let whole = group.forward_batch(&mut kvs, &[&prompt]);
            let shards = group.prefill_shards(&prompt);
            let mut joined = Vec::new();
            for (share, shard) in group.shares().iter().zip(&shards) {
                assert!(!share.vocab.is_empty(), "{name}: {share:?}");
                assert_eq!(shard.shape(), [1, share.vocab.len()], "{name}: {share:?}");
                joined.extend_from_slice(shard.data());
            }
            // The same products; the whole row only adds zeros to them.
            assert_eq!(joined, whole.data(), "{name} over {weights:?}");
        }
    }
}
