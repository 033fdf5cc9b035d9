//! What the GPU test files share: opening the adapter, random GGUF matrices, the f64 reference.

#![allow(dead_code)] // each test file uses its part

use half::f16;
use shoal_gpu::{Gpu, GpuError, OpenOptions};
use shoal_kernels::{QMatrix, QType, dequantize_row, row_bytes};
use shoal_testkit::rng::{Draw, SplitMix64};

/// The first adapter, or `None` when there is none and `SHOAL_GPU_TESTS=skip` is set.
pub fn gpu_with(options: OpenOptions) -> Option<Gpu> {
    let skip = std::env::var("SHOAL_GPU_TESTS").is_ok_and(|v| v == "skip");
    match Gpu::open_with(0, options) {
        Ok(gpu) => Some(gpu),
        Err(GpuError::NoAdapter { .. }) if skip => None,
        Err(e) => panic!(
            "no usable GPU adapter ({e}); install Mesa's lavapipe (apt-get install \
             mesa-vulkan-drivers) or set SHOAL_GPU_TESTS=skip to skip the GPU tests"
        ),
    }
}

pub fn gpu() -> Option<Gpu> {
    gpu_with(OpenOptions::default())
}

/// The shapes every matrix-vector kernel is tested at (k a multiple of the 32-value block).
pub const SHAPES: [(usize, usize); 5] = [(1, 32), (7, 64), (33, 96), (64, 256), (129, 544)];
/// More for the plain formats: k not a multiple of 4 (the padded rows).
pub const PLAIN_SHAPES: [(usize, usize); 3] = [(1, 1), (5, 7), (17, 37)];
/// The K-quants' shapes (k a multiple of the 256-value super-block).
pub const K_SHAPES: [(usize, usize); 5] = [(1, 256), (7, 512), (33, 768), (64, 256), (13, 1280)];

/// Byte offsets of the f16 fields of a block (`d`, and `m` or `dmin`), which get finite random
/// values; every other byte is random.
fn f16_fields(qtype: QType) -> &'static [usize] {
    match qtype {
        QType::Q4_0 | QType::Q5_0 | QType::Q8_0 => &[0],
        QType::Q4_1 | QType::Q5_1 | QType::Q4_K => &[0, 2],
        QType::Q5_K => &[0, 2],
        QType::Q6_K => &[208],
        QType::Q3_K => &[108],
        QType::Q2_K => &[80, 82],
        // `MXFP4` has an exponent byte and `IQ1_M` its `d` in four nibbles (`set_iq_scale`).
        QType::MXFP4 | QType::IQ1_M => &[],
        q if q.is_iq() => &[0],
        _ => unreachable!(),
    }
}

/// The scale of an `MXFP4` block (an E8M0 exponent: 2^-8 .. 2^-1 of its doubled values, up to 12)
/// or an `IQ1_M` super-block (f16 `d` up to 0.05 of either sign, one nibble in the top of each of
/// its four scale words at 48); every other byte stays random.
fn set_iq_scale(rng: &mut SplitMix64, qtype: QType, block: &mut [u8]) {
    match qtype {
        QType::MXFP4 => block[0] = 120 + rng.below(8) as u8,
        QType::IQ1_M => {
            let d = f16::from_f32(rng.f32_in(-0.05, 0.05)).to_bits();
            for i in 0..4 {
                let at = 48 + 2 * i;
                let w = u16::from_le_bytes([block[at], block[at + 1]]) & 0x0FFF;
                let w = w | (((d >> (4 * i)) & 0xF) << 12);
                block[at..at + 2].copy_from_slice(&w.to_le_bytes());
            }
        }
        _ => {}
    }
}

/// Random GGUF bytes of a `rows × cols` matrix: values in [-1, 1) for F32/F16/BF16; for the quants,
/// random quants and scales of either sign up to 0.05 (every byte pattern of the IQ formats'
/// indices, signs and sub-block scales is a valid block: random bytes reach every grid row).
pub fn random_matrix(rng: &mut SplitMix64, qtype: QType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    match qtype {
        QType::F32 => (0..n)
            .flat_map(|_| rng.f32_in(-1.0, 1.0).to_le_bytes())
            .collect(),
        QType::F16 => (0..n)
            .flat_map(|_| f16::from_f32(rng.f32_in(-1.0, 1.0)).to_le_bytes())
            .collect(),
        QType::BF16 => (0..n)
            .flat_map(|_| ((rng.f32_in(-1.0, 1.0).to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        _ => {
            let size = qtype.type_size();
            let mut out = Vec::with_capacity(rows * row_bytes(qtype, cols));
            for _ in 0..n / qtype.block_size() {
                let mut block = rng.bytes(size);
                for &at in f16_fields(qtype) {
                    let v = f16::from_f32(rng.f32_in(-0.05, 0.05));
                    block[at..at + 2].copy_from_slice(&v.to_le_bytes());
                }
                set_iq_scale(rng, qtype, &mut block);
                out.extend(block);
            }
            out
        }
    }
}

pub fn random_vec(rng: &mut SplitMix64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.f32_in(lo, hi)).collect()
}

/// `W · x` in f64 from the dequantized weights, and `Σ |w·x|` per row (the scale of rounding).
pub fn matvec_reference(w: &QMatrix<'_>, x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let rb = row_bytes(w.qtype, w.cols);
    let mut row = vec![0f32; w.cols];
    (0..w.rows)
        .map(|r| {
            dequantize_row(w.qtype, &w.data[r * rb..(r + 1) * rb], &mut row).unwrap();
            let exact = row
                .iter()
                .zip(x)
                .map(|(&a, &b)| f64::from(a) * f64::from(b));
            let mag = row.iter().zip(x).map(|(&a, &b)| f64::from(a * b).abs());
            (exact.sum::<f64>(), mag.sum::<f64>())
        })
        .unzip()
}

/// Checks one KV head's attention output `got` (`group × hd` values: the group's query heads)
/// against shoal-kernels' `attend_f16` over the same f16-rounded query `qg`, `keys` and `values`
/// (`[pos][hd]`), and against an f64 softmax over them. Tolerances, of `Σ_j |p_j · v_j|` per
/// output value: 1e-3 against `attend_f16` (the GPU's `exp` can move a weight by one f16
/// rounding step, 2^-11) and 2e-3 against the f64 softmax (which does not round the weights).
#[allow(clippy::too_many_arguments)] // attend_f16's arguments, the result and its context
pub fn check_attention(
    qg: &[f32],
    group: usize,
    keys: &[f16],
    values: &[f16],
    hd: usize,
    scale: f32,
    got: &[f32],
    ctx: &str,
) {
    let mut cpu = vec![0f32; group * hd];
    shoal_kernels::attn::attend_f16(
        qg,
        group,
        keys,
        values,
        hd,
        scale,
        &mut Vec::new(),
        &mut cpu,
    );
    for (hh, qh) in qg.chunks_exact(hd).enumerate() {
        let s: Vec<f64> = keys
            .chunks_exact(hd)
            .map(|k| {
                let d: f64 = qh
                    .iter()
                    .zip(k)
                    .map(|(&a, b)| f64::from(a) * f64::from(b.to_f32()))
                    .sum();
                d * f64::from(scale)
            })
            .collect();
        let m = s.iter().cloned().fold(f64::MIN, f64::max);
        let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
        let sum: f64 = e.iter().sum();
        for d in 0..hd {
            let at = hh * hd + d;
            let terms = e
                .iter()
                .zip(values.chunks_exact(hd))
                .map(|(p, v)| p / sum * f64::from(v[d].to_f32()));
            let exact: f64 = terms.clone().sum();
            let mag: f64 = terms.map(f64::abs).sum();
            let (g, want) = (f64::from(got[at]), f64::from(cpu[at]));
            assert!(
                (g - want).abs() <= 1e-3 * mag + 1e-6,
                "{ctx} head {hh} [{d}]: gpu {g} attend_f16 {want}"
            );
            assert!(
                (g - exact).abs() <= 2e-3 * mag + 1e-6,
                "{ctx} head {hh} [{d}]: gpu {g} f64 {exact}"
            );
        }
    }
}

/// The attention tests' head layouts `(n_heads, n_kv_heads, head_dim)`: plain, GQA 2–6 query
/// heads per KV head, head_dim 2–128.
pub const HEAD_LAYOUTS: [(usize, usize, usize); 5] =
    [(4, 4, 64), (8, 2, 64), (6, 1, 32), (4, 2, 128), (2, 1, 2)];

/// The attention tests' KV shape: 2 layers of 40 positions.
pub fn kv_shape_of((n_heads, n_kv_heads, head_dim): (usize, usize, usize)) -> shoal_gpu::KvShape {
    shoal_gpu::KvShape {
        layers: 2,
        capacity: 40,
        n_heads,
        n_kv_heads,
        head_dim,
        keys_only: false,
    }
}
