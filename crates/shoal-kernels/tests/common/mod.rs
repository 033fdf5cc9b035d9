//! Shared helpers for the integration tests: random activations and matrices (from the testkit's seeded
//! generator), encoding, decoding and the reference product.
#![allow(dead_code)]

use shoal_kernels::{
    ActType, Activations, QType, quantize_row_q4_1, quantize_row_q8_0, row_bytes, scalar,
};

pub use shoal_testkit::rng::{Draw, SplitMix64 as Rng};

/// Roughly normal with the given scale, plus occasional outliers (like real activations).
pub fn activation(rng: &mut Rng) -> f32 {
    let v = (0..4).map(|_| rng.f32_in(-1.0, 1.0)).sum::<f32>() * 0.5;
    if rng.next_u64().is_multiple_of(97) {
        v * 20.0
    } else {
        v
    }
}

/// `n` random activations.
pub fn activations(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| activation(rng)).collect()
}

/// Encodes `rows × k` floats as `qtype` rows.
pub fn encode(qtype: QType, w: &[f32], rows: usize, k: usize) -> Vec<u8> {
    let rb = row_bytes(qtype, k);
    let mut out = vec![0u8; rows * rb];
    for (src, dst) in w.chunks_exact(k).zip(out.chunks_exact_mut(rb)) {
        match qtype {
            QType::F32 => {
                for (d, v) in dst.chunks_exact_mut(4).zip(src) {
                    d.copy_from_slice(&v.to_le_bytes());
                }
            }
            QType::Q4_1 => quantize_row_q4_1(src, dst).expect("encode Q4_1"),
            QType::Q8_0 => quantize_row_q8_0(src, dst).expect("encode Q8_0"),
        }
    }
    out
}

/// A random weight matrix: quantized from random floats of varied per-row scale.
pub fn random_weights(rng: &mut Rng, qtype: QType, rows: usize, k: usize) -> Vec<u8> {
    let mut w = Vec::with_capacity(rows * k);
    for r in 0..rows {
        let scale = 0.02 * (1 + r % 7) as f32;
        w.extend(
            (0..k).map(|_| rng.f32_in(-1.0, 1.0) * scale + if r % 3 == 0 { 0.01 } else { 0.0 }),
        );
    }
    encode(qtype, &w, rows, k)
}

/// Random raw blocks: arbitrary nibbles / quants with sane f16 scales (exercises every bit
/// pattern of the quant bytes, including -128 in Q8_0 weights).
pub fn random_raw(rng: &mut Rng, qtype: QType, rows: usize, k: usize) -> Vec<u8> {
    let rb = row_bytes(qtype, k);
    let mut out = rng.bytes(rows * rb);
    let put = |b: &mut [u8], at: usize, v: f32| {
        b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes())
    };
    match qtype {
        QType::F32 => {
            for c in out.chunks_exact_mut(4) {
                let v = rng.f32_in(-1.0, 1.0);
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        QType::Q4_1 => {
            for b in out.chunks_exact_mut(20) {
                let (d, m) = (
                    rng.f32_in(-1.0, 1.0).abs() * 0.01,
                    rng.f32_in(-1.0, 1.0) * 0.05,
                );
                put(b, 0, d);
                put(b, 2, m);
            }
        }
        QType::Q8_0 => {
            for b in out.chunks_exact_mut(34) {
                let d = rng.f32_in(-1.0, 1.0) * 0.001;
                put(b, 0, d);
            }
        }
    }
    out
}

/// Dequantizes a whole matrix.
pub fn decode(qtype: QType, data: &[u8], rows: usize, k: usize) -> Vec<f32> {
    let rb = row_bytes(qtype, k);
    let mut out = vec![0f32; rows * k];
    for (src, dst) in data.chunks_exact(rb).zip(out.chunks_exact_mut(k)) {
        shoal_kernels::dequantize_row(qtype, src, dst).expect("decode");
    }
    out
}

pub fn dequantize_acts(acts: &Activations, m: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * k];
    for (r, dst) in out.chunks_exact_mut(k.max(1)).enumerate() {
        let src = acts.ggml_row(r).expect("row");
        match acts.act_type() {
            Some(ActType::Q8_1) => scalar::dequantize_row_q8_1(&src, dst),
            Some(ActType::Q8_0) => scalar::dequantize_row_q8_0(&src, dst),
            _ => scalar::dequantize_row_f32(&src, dst),
        }
    }
    out
}

/// Each weight replaced by its block's minimum `m` (zeros for formats without one).
pub fn block_mins(qtype: QType, data: &[u8], n: usize, k: usize) -> Vec<f32> {
    if qtype != QType::Q4_1 {
        return vec![0.0; n * k];
    }
    data.chunks_exact(20)
        .flat_map(|b| [half::f16::from_le_bytes([b[2], b[3]]).to_f32(); 32])
        .collect()
}

/// `x · Wᵀ` in f64 from f32 operands, plus Σ|terms| per output.
pub fn reference(w: &[f32], x: &[f32], m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>) {
    let mut out = vec![0f32; m * n];
    let mut mag = vec![0f32; m * n];
    for r in 0..m {
        for j in 0..n {
            let (wr, xr) = (&w[j * k..(j + 1) * k], &x[r * k..(r + 1) * k]);
            out[r * n + j] = wr
                .iter()
                .zip(xr)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum::<f64>() as f32;
            mag[r * n + j] = wr.iter().zip(xr).map(|(a, b)| (a * b).abs()).sum();
        }
    }
    (out, mag)
}

/// Checks `out` (`m × n`, `m = x.len() / k`) against the naive product of the kernel's exact operands
/// (dequantized weights and activations): only f32 rounding and the f16 rounding of Q8_1's `s`
/// may separate them. Returns the dequantized weights.
pub fn assert_near_reference(
    label: &str,
    qtype: QType,
    data: &[u8],
    n: usize,
    k: usize,
    x: &[f32],
    out: &[f32],
) -> Vec<f32> {
    let m = x.len() / k.max(1);
    let wf = decode(qtype, data, n, k);
    let acts = Activations::quantize(qtype.act_type(), x, m, k).expect("acts");
    let xq = dequantize_acts(&acts, m, k);
    let (want, mag) = reference(&wf, &xq, m, n, k);
    // Q8_1 stores `s = d·Σq` as f16 (relative error ≤ 2⁻¹¹), which enters as `m·s`.
    let (_, mag_min) = reference(&block_mins(qtype, data, n, k), &xq, m, n, k);
    for i in 0..m * n {
        let tol = 1e-4 * mag[i] + 1e-3 * mag_min[i] + 1e-5;
        assert!(
            (out[i] - want[i]).abs() <= tol,
            "{label} m={m} n={n} k={k} out[{i}] = {} vs {} (tol {tol})",
            out[i],
            want[i]
        );
    }
    wf
}
