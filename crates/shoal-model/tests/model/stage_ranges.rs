//! `stage_byte_ranges` names every byte a stage reads: each stage loaded from a copy of the file where
//! every byte outside its ranges is zero gives bitwise the same logits as from the real file — SmolLM2
//! (tied head) and synthetic Llama 3 (rope_freqs), untied-head Llama, Phi-3 and Gemma 3 files.

use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::{greedy, load_from};
use shoal_kernels::ThreadPool;
use shoal_model::gguf::GgufFile;
use shoal_model::{DecoderStage, LayerRange, ModelConfig, stage_byte_ranges, stage_byte_ranges_at};

fn synth(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/synth")
        .join(format!("{name}.gguf"))
}

/// A copy of `src` as long as it, holding only the bytes of `ranges` (zeros elsewhere).
fn keep_only(src: &Path, ranges: &[Range<u64>], out: &Path) {
    let len = std::fs::metadata(src).unwrap().len();
    let mut from = std::fs::File::open(src).unwrap();
    let mut to = std::fs::File::create(out).unwrap();
    to.set_len(len).unwrap();
    for r in ranges {
        let mut buf = vec![0u8; (r.end - r.start) as usize];
        from.seek(SeekFrom::Start(r.start)).unwrap();
        from.read_exact(&mut buf).unwrap();
        to.seek(SeekFrom::Start(r.start)).unwrap();
        to.write_all(&buf).unwrap();
    }
}

/// Splits `path` into `splits`, loads each stage from its own zeroed copy, and checks the chain's logits
/// equal the real file's bit for bit; returns the bytes each stage needs.
fn check(path: &Path, splits: &[(usize, usize)], prompt: &[u32]) -> Vec<u64> {
    let n = ModelConfig::from_gguf(&GgufFile::open(path).unwrap())
        .unwrap()
        .n_layers;
    // A folder of this test run (removed at the end), in cargo's scratch space for integration tests.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "stage_ranges-{}-{}",
        std::process::id(),
        path.file_stem().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let pool = Arc::new(ThreadPool::new(1));
    let mut needed = Vec::new();
    let stages: Vec<DecoderStage> = splits
        .iter()
        .enumerate()
        .map(|(k, &(s, e))| {
            let ranges = stage_byte_ranges_at(path, s, e, n).unwrap();
            assert!(
                ranges.windows(2).all(|w| w[0].end < w[1].start),
                "sorted, disjoint: {ranges:?}"
            );
            needed.push(ranges.iter().map(|r| r.end - r.start).sum());
            let copy = dir.join(format!("stage{k}.gguf"));
            keep_only(path, &ranges, &copy);
            let mut g = GgufFile::open(&copy).unwrap();
            DecoderStage::load(&mut g, LayerRange { start: s, end: e }, &pool).unwrap()
        })
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    let real = load_from(path, splits);
    let (want_toks, want) = greedy(&real, prompt, 4);
    let (got_toks, got) = greedy(&stages, prompt, 4);
    assert_eq!(got_toks, want_toks, "{}", path.display());
    for (a, b) in want.iter().zip(&got) {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{}: logits differ",
            path.display()
        );
    }
    needed
}

#[test]
fn smollm2_stages_load_from_their_ranges_alone() {
    let path = shoal_testkit::fixtures::model_path();
    let size = std::fs::metadata(&path).unwrap().len();
    let needed = check(
        &path,
        &[(0, 10), (10, 20), (20, 30)],
        &[504, 3575, 282, 4649, 314],
    );
    // The middle stage has neither the embedding nor the head: well under a third of the file.
    assert!(needed[1] < size / 3, "{needed:?} of {size}");
    // The tied head makes the last stage read the embedding too.
    assert!(needed[2] > needed[1], "{needed:?}");
}

#[test]
fn synthetic_families_load_from_their_ranges_alone() {
    for name in ["llama3-s-f16", "llama-untied-s-f16", "phi3-s-f16"] {
        check(&synth(name), &[(0, 1), (1, 2)], &[1, 5, 9, 2]);
    }
    check(
        &synth("gemma3-s-f16"),
        &[(0, 2), (2, 5), (5, 6)],
        &[2, 5, 9, 3],
    );
}

#[test]
fn the_ranges_follow_the_loader_rule() {
    let g = GgufFile::open(&synth("llama3-s-f16")).unwrap();
    let c = g.content();
    let data = c.tensor_data_offset;
    let at = |name: &str| {
        let info = &c.tensor_infos[name];
        data + info.offset
    };
    let covered = |ranges: &[Range<u64>], name: &str| ranges.iter().any(|r| r.contains(&at(name)));
    let first = stage_byte_ranges(&g, 0, 1, 2).unwrap();
    let last = stage_byte_ranges(&g, 1, 2, 2).unwrap();
    assert_eq!(first[0].start, 0, "the header comes first");
    assert!(first[0].end >= data);
    for (ranges, yes, no) in [
        (
            &first,
            [
                "token_embd.weight",
                "blk.0.attn_q.weight",
                "rope_freqs.weight",
            ],
            ["blk.1.attn_q.weight", "output_norm.weight"],
        ),
        (
            &last,
            [
                "blk.1.ffn_down.weight",
                "output_norm.weight",
                "rope_freqs.weight",
            ],
            ["blk.0.ffn_down.weight", "blk.0.attn_norm.weight"],
        ),
    ] {
        for n in yes {
            assert!(covered(ranges, n), "{n} missing");
        }
        for n in no {
            assert!(!covered(ranges, n), "{n} included");
        }
    }
    assert!(stage_byte_ranges(&g, 1, 1, 2).is_err());
    assert!(stage_byte_ranges(&g, 0, 3, 2).is_err());
}
