//! Shared helpers for the integration tests: random activations and matrices (from the testkit's seeded
//! generator), encoding, decoding and the reference product.
#![allow(dead_code)]

use shoal_kernels::{
    ActType, Activations, QType, quantize_row_q4_1, quantize_row_q8_0, row_bytes, scalar,
};

pub use shoal_testkit::rng::{Draw, SplitMix64 as Rng};

/// Every weight format: [`QType::ALL`] then [`QType::IQ`].
pub const TYPES: [QType; 23] = {
    let mut t = [QType::F32; 23];
    let mut i = 0;
    while i < 23 {
        t[i] = if i < 13 {
            QType::ALL[i]
        } else {
            QType::IQ[i - 13]
        };
        i += 1;
    }
    t
};

/// `k` rounded up to whole blocks of `qtype` (the K-quants need multiples of 256).
pub fn fit_k(qtype: QType, k: usize) -> usize {
    k.next_multiple_of(qtype.block_size())
}

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

/// Whether [`encode`] can quantize floats to `qtype` (the others get [`random_raw`] blocks).
pub fn has_encoder(qtype: QType) -> bool {
    matches!(
        qtype,
        QType::F32 | QType::F16 | QType::BF16 | QType::Q4_1 | QType::Q8_0
    )
}

/// Encodes `rows × k` floats as `qtype` rows.
///
/// # Panics
/// If [`has_encoder`] is false for `qtype`.
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
            QType::F16 => {
                for (d, v) in dst.chunks_exact_mut(2).zip(src) {
                    d.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
                }
            }
            QType::BF16 => {
                for (d, v) in dst.chunks_exact_mut(2).zip(src) {
                    d.copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes());
                }
            }
            QType::Q4_1 => quantize_row_q4_1(src, dst).expect("encode Q4_1"),
            QType::Q8_0 => quantize_row_q8_0(src, dst).expect("encode Q8_0"),
            other => panic!("no test encoder for {other:?}"),
        }
    }
    out
}

/// A random weight matrix: quantized from random floats of varied per-row scale where the
/// tests can encode `qtype`, random blocks with sane scales otherwise.
pub fn random_weights(rng: &mut Rng, qtype: QType, rows: usize, k: usize) -> Vec<u8> {
    if !has_encoder(qtype) {
        return random_raw(rng, qtype, rows, k);
    }
    let mut w = Vec::with_capacity(rows * k);
    for r in 0..rows {
        let scale = 0.02 * (1 + r % 7) as f32;
        w.extend(
            (0..k).map(|_| rng.f32_in(-1.0, 1.0) * scale + if r % 3 == 0 { 0.01 } else { 0.0 }),
        );
    }
    encode(qtype, &w, rows, k)
}

/// Random raw blocks: arbitrary quant bytes (every bit pattern, including -128 in Q8_0 weights
/// and every 6-bit K-quant scale) with sane f16 scales.
pub fn random_raw(rng: &mut Rng, qtype: QType, rows: usize, k: usize) -> Vec<u8> {
    let rb = row_bytes(qtype, k);
    let mut out = rng.bytes(rows * rb);
    let put = |b: &mut [u8], at: usize, v: f32| {
        b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes())
    };
    if matches!(qtype, QType::F32 | QType::F16 | QType::BF16) {
        let floats: Vec<f32> = (0..rows * k).map(|_| rng.f32_in(-1.0, 1.0)).collect();
        return encode(qtype, &floats, rows, k);
    }
    // (offset of d, offset of a second f16 (m or dmin) if any, scale of d)
    let (d_at, m_at, d_scale) = match qtype {
        QType::Q4_0 | QType::Q5_0 => (0, None, 0.01),
        QType::Q4_1 | QType::Q5_1 => (0, Some(2), 0.01),
        QType::Q8_0 => (0, None, 0.001),
        QType::Q2_K => (80, Some(82), 0.01),
        QType::Q3_K => (108, None, 0.01),
        QType::Q4_K | QType::Q5_K => (0, Some(2), 0.001),
        QType::Q6_K => (208, None, 0.0001),
        QType::IQ4_XS | QType::IQ3_S | QType::IQ3_XXS => (0, None, 0.001),
        QType::IQ4_NL | QType::IQ2_XXS | QType::IQ2_XS | QType::IQ2_S | QType::IQ1_S => {
            (0, None, 0.01)
        }
        QType::MXFP4 => {
            // The E8M0 exponent byte: scales 2^-10 .. 2^2.
            for b in out.chunks_exact_mut(qtype.type_size()) {
                b[0] = 118 + (rng.next_u64() % 13) as u8;
            }
            return out;
        }
        QType::IQ1_M => {
            // The f16 d is spread over the top nibbles of the four scale words.
            for b in out.chunks_exact_mut(qtype.type_size()) {
                let d = half::f16::from_f32(rng.f32_in(-1.0, 1.0) * 0.01).to_bits();
                for i in 0..4 {
                    let at = 48 + 2 * i;
                    let w = u16::from_le_bytes([b[at], b[at + 1]]) & 0x0FFF;
                    let w = w | (((d >> (4 * i)) & 0xF) << 12);
                    b[at..at + 2].copy_from_slice(&w.to_le_bytes());
                }
            }
            return out;
        }
        _ => unreachable!("plain formats handled above"),
    };
    for b in out.chunks_exact_mut(qtype.type_size()) {
        let d = rng.f32_in(-1.0, 1.0) * d_scale;
        put(b, d_at, if m_at.is_some() { d.abs() } else { d });
        if let Some(at) = m_at {
            put(b, at, rng.f32_in(-1.0, 1.0) * 5.0 * d_scale);
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
            Some(ActType::Q8_K) => scalar::dequantize_row_q8_k(&src, dst),
            _ => scalar::dequantize_row_f32(&src, dst),
        }
    }
    out
}

/// Each weight replaced by its block's minimum `m` for the formats multiplied with `Q8_1`
/// activations (whose `s` is rounded to f16), zeros for the others.
pub fn block_mins(qtype: QType, data: &[u8], n: usize, k: usize) -> Vec<f32> {
    if qtype.act_type() != ActType::Q8_1 {
        return vec![0.0; n * k];
    }
    data.chunks_exact(qtype.type_size())
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
