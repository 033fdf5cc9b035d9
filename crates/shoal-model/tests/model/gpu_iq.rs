//! Whole models in the IQ formats and `MXFP4` on a GPU stage (lavapipe in CI) against the CPU stage
//! of the same file. No IQ fixture is committed (llama-quantize makes the grid formats only with an
//! importance matrix), so the models are made here from the synthetic fixtures: llama-s-q4_0 with
//! its `Q4_0` matrices relabelled `IQ4_NL` (the same 18-byte blocks), and llama-k-q4_k_m with every
//! matrix (the tied embedding too) replaced by random valid blocks of one IQ format at the
//! original's magnitude. These
//! fail when no GPU adapter exists unless `SHOAL_GPU_TESTS=skip`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::f16;
use shoal_gpu::Gpu;
use shoal_kernels::{QType, dequantize_row, row_bytes};
use shoal_model::gguf::GgufFile;
use shoal_testkit::rng::{Draw, SplitMix64};

use crate::common::{Model, argmax, gpu, load_gpu_whole, load_whole, step};
use crate::gguf_writer::TempDir;

/// The CPU quantizes activations to 8 bits for these formats (`Q8_0` per 32 values for `IQ4_NL`
/// and `MXFP4`, `Q8_K` per 256 for the others), the GPU keeps them f32: the tolerance of the
/// quantized synthetic models against llama.cpp (synthetic.rs), on `max |Δ logit| / max |logit|`.
pub const TOLERANCE: f32 = 0.075;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/synth")
        .join(name)
}

/// Runs 12 prompt tokens one position at a time through the CPU and the GPU stage of the model at
/// `path`; checks the same top token wherever the CPU's margin is decisive and returns the worst
/// relative logit difference.
fn gpu_against_cpu(path: &Path, gpu: &Arc<Gpu>, what: &str) -> f32 {
    let on_gpu = load_gpu_whole(path, gpu);
    let mut kv_gpu = vec![on_gpu[0].new_kv()];
    let prompt = [311u32, 25, 477, 176, 28, 55, 463, 264, 438, 129, 271, 247];
    logits_against_cpu(path, &prompt, |t| step(&on_gpu, &mut kv_gpu, &[t]), what)
}

/// Runs `prompt` one position at a time through the CPU stage of the model at `path` and through
/// `run` (another way to take one token to its logits); checks the same top token wherever the
/// CPU's margin is decisive and returns the worst relative logit difference
/// (`max |Δ logit| / max |logit|` per position).
pub fn logits_against_cpu(
    path: &Path,
    prompt: &[u32],
    mut run: impl FnMut(u32) -> Vec<f32>,
    what: &str,
) -> f32 {
    let cpu = load_whole(path);
    let mut kv_cpu = vec![cpu[0].new_kv()];
    let mut worst = 0f32;
    for (pos, &tok) in prompt.iter().enumerate() {
        let want = step(&cpu, &mut kv_cpu, &[tok]);
        let got = run(tok);
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = got
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        worst = worst.max(d / scale);
        let mut sorted = want.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        if sorted[0] - sorted[1] > 0.05 * scale {
            assert_eq!(argmax(&got), argmax(&want), "{what}: position {pos}");
        }
    }
    eprintln!("{what}: against the CPU, worst relative logit difference {worst:.4}");
    worst
}

/// Where each tensor's directory entry starts in the header (its name: u64 length, bytes), in
/// file order: `(position, name)`.
fn directory(g: &GgufFile, header: &[u8]) -> Vec<(usize, String)> {
    let mut at: Vec<(usize, String)> = g
        .tensor_names()
        .map(|name| {
            let mut key = (name.len() as u64).to_le_bytes().to_vec();
            key.extend(name.as_bytes());
            let pos = header
                .windows(key.len())
                .position(|w| w == key.as_slice())
                .unwrap_or_else(|| panic!("{name}: no directory entry"));
            (pos, name.to_string())
        })
        .collect();
    at.sort();
    at
}

/// The position of a directory entry's u32 type (after its name, dims count and dims).
fn type_at(header: &[u8], entry: usize, name: &str) -> usize {
    let at = entry + 8 + name.len();
    let n_dims = u32::from_le_bytes(header[at..at + 4].try_into().unwrap()) as usize;
    at + 4 + 8 * n_dims
}

/// llama-s-q4_0 with its `Q4_0` matrices relabelled `IQ4_NL` (the same blocks: f16 `d` and 16
/// nibble bytes in the same order; `d` divided by 16, exactly, so the table's values, up to 127,
/// keep `Q4_0`'s magnitudes), written into `dir`; and how many matrices were relabelled.
fn iq4_nl_model(dir: &TempDir) -> (PathBuf, usize) {
    let src = fixture("llama-s-q4_0.gguf");
    let g = GgufFile::open(&src).expect("open fixture");
    let mut bytes = std::fs::read(&src).expect("read fixture");
    let data0 = g.content().tensor_data_offset as usize;
    let mut relabelled = 0;
    for (entry, name) in directory(&g, &bytes[..data0]) {
        let t = &g.tensors()[&name];
        if t.ty.name != "Q4_0" {
            continue;
        }
        let ty = type_at(&bytes, entry, &name);
        assert_eq!(bytes[ty..ty + 4], 2u32.to_le_bytes(), "{name}: Q4_0's id");
        bytes[ty..ty + 4].copy_from_slice(&20u32.to_le_bytes());
        let start = data0 + t.offset as usize;
        for block in bytes[start..start + t.bytes as usize].chunks_exact_mut(18) {
            let d = f16::from_le_bytes([block[0], block[1]]).to_f32() / 16.0;
            block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        }
        relabelled += 1;
    }
    (dir.write("llama-s-iq4_nl.gguf", &bytes), relabelled)
}

/// Sets the scale of one block of `qtype` to `d` (an `MXFP4` block's E8M0 byte to the nearest power
/// of two, `2^(e - 128)`; an `IQ1_M` super-block in the top nibbles of its four scale words).
fn set_scale(qtype: QType, block: &mut [u8], d: f32) {
    match qtype {
        QType::MXFP4 => block[0] = (128.0 + d.log2().round()).clamp(2.0, 255.0) as u8,
        QType::IQ1_M => {
            let bits = f16::from_f32(d).to_bits();
            for i in 0..4 {
                let at = 48 + 2 * i;
                let w = u16::from_le_bytes([block[at], block[at + 1]]) & 0x0FFF;
                let w = w | (((bits >> (4 * i)) & 0xF) << 12);
                block[at..at + 2].copy_from_slice(&w.to_le_bytes());
            }
        }
        _ => block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes()),
    }
}

/// `rows × cols` random valid weights of `qtype` (random indices, signs and sub-block scales, every
/// pattern valid) with the root mean square `rms`.
fn random_weights(
    rng: &mut SplitMix64,
    qtype: QType,
    rows: usize,
    cols: usize,
    rms: f32,
) -> Vec<u8> {
    let size = qtype.type_size();
    let mut out = rng.bytes(rows * row_bytes(qtype, cols));
    let rms_of = |bytes: &[u8]| {
        let mut v = vec![0f32; rows * cols];
        for (r, row) in bytes.chunks_exact(row_bytes(qtype, cols)).enumerate() {
            dequantize_row(qtype, row, &mut v[r * cols..(r + 1) * cols]).expect("dequantize");
        }
        (v.iter().map(|x| f64::from(x * x)).sum::<f64>() / v.len() as f64).sqrt() as f32
    };
    out.chunks_exact_mut(size)
        .for_each(|b| set_scale(qtype, b, 1.0));
    let d = rms / rms_of(&out);
    out.chunks_exact_mut(size)
        .for_each(|b| set_scale(qtype, b, d));
    let got = rms_of(&out);
    assert!(
        (got / rms - 1.0).abs() < 0.5,
        "{}: rms {got} for {rms}",
        qtype.name()
    );
    out
}

/// llama-k-q4_k_m (n_embd and n_ff 256: every matrix's rows a multiple of 256) with every layer
/// matrix and the token embedding (which is also its tied output head) replaced by random valid
/// `qtype` weights of the original's root mean square (norms as they are), written into `dir`; and
/// how many matrices were replaced.
fn retyped_model(dir: &TempDir, qtype: QType) -> (PathBuf, usize) {
    let src = fixture("llama-k-q4_k_m.gguf");
    let g = GgufFile::open(&src).expect("open fixture");
    let bytes = std::fs::read(&src).expect("read fixture");
    let data0 = g.content().tensor_data_offset as usize;
    let align = g.get_u32("general.alignment").unwrap_or(32) as usize;
    let entries = directory(&g, &bytes[..data0]);
    let mut header = bytes[..entries[0].0].to_vec();
    let mut data: Vec<Vec<u8>> = Vec::new();
    let mut rng = SplitMix64::new(u64::from(qtype.ggml_type_id()));
    let mut replaced = 0;
    for (entry, name) in &entries {
        let t = &g.tensors()[name];
        let ty = type_at(&bytes, *entry, name);
        let old = &bytes[data0 + t.offset as usize..][..t.bytes as usize];
        let matrix = t.dims.len() == 2 && (name.starts_with("blk.") || name == "token_embd.weight");
        let (id, new) = if matrix {
            let (rows, cols) = (t.dims[0], t.dims[1]);
            let from = QType::from_ggml_type_id(t.ty.id).expect("a kernel type");
            let mut v = vec![0f32; rows * cols];
            for (r, row) in old.chunks_exact(row_bytes(from, cols)).enumerate() {
                dequantize_row(from, row, &mut v[r * cols..(r + 1) * cols]).expect("dequantize");
            }
            let rms = (v.iter().map(|x| f64::from(x * x)).sum::<f64>() / v.len() as f64).sqrt();
            replaced += 1;
            let new = random_weights(&mut rng, qtype, rows, cols, rms as f32);
            (qtype.ggml_type_id(), new)
        } else {
            (t.ty.id, old.to_vec())
        };
        let offset: usize = data.iter().map(|d| d.len().next_multiple_of(align)).sum();
        header.extend_from_slice(&bytes[*entry..ty]);
        header.extend(id.to_le_bytes());
        header.extend((offset as u64).to_le_bytes());
        data.push(new);
    }
    header.resize(header.len().next_multiple_of(align), 0);
    for d in &data {
        header.extend(d);
        header.resize(header.len().next_multiple_of(align), 0);
    }
    let name = format!("llama-k-{}.gguf", qtype.name().to_ascii_lowercase());
    (dir.write(&name, &header), replaced)
}

/// A model whose layers are `IQ4_NL` (real weights: llama-s-q4_0's blocks read as `IQ4_NL`) gives
/// the CPU stage's logits on a GPU stage.
#[test]
fn an_iq4_nl_model_runs_on_a_gpu_stage_as_on_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let dir = TempDir::new();
    let (path, relabelled) = iq4_nl_model(&dir);
    assert!(relabelled >= 14, "{relabelled} Q4_0 matrices relabelled");
    let worst = gpu_against_cpu(&path, &gpu, "IQ4_NL (llama-s-q4_0 relabelled)");
    assert!(
        worst <= TOLERANCE,
        "worst relative logit difference {worst:.4}"
    );
}

/// For every IQ format and `MXFP4`: a model whose 14 layer matrices and token embedding (the tied
/// head too) are of that format loads on a GPU stage and gives the CPU stage's logits.
#[test]
fn models_of_every_iq_format_run_on_a_gpu_stage_as_on_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let dir = TempDir::new();
    let mut failures = Vec::new();
    for qtype in QType::IQ {
        let (path, replaced) = retyped_model(&dir, qtype);
        assert_eq!(replaced, 15, "{}: matrices replaced", qtype.name());
        let worst = gpu_against_cpu(&path, &gpu, qtype.name());
        if worst > TOLERANCE {
            failures.push(format!("{}: {worst:.4}", qtype.name()));
        }
    }
    assert!(
        failures.is_empty(),
        "worst relative logit differences: {failures:?}"
    );
}
