//! Portable reference kernels: quantization, dequantization, dot products, and the `Scalar`
//! backend's matmul rows.
//!
//! These are the semantics every SIMD path must reproduce (quantization bitwise, dot products to
//! rounding). They follow ggml's CPU kernels, with activation quantization rounding to nearest,
//! ties to even, as ggml's AVX2 path does. The row-level functions take slices whose lengths they
//! check, so they are safe to call directly.

use crate::format::{Q4_1_BYTES, Q8_0_BYTES, Q8_1_BYTES, QK, QType, f16_at, put_f16};
use crate::gemm::Gemm;

fn check(what: &str, k: usize, block_bytes: usize, bytes: usize) -> usize {
    assert!(
        k.is_multiple_of(QK),
        "{what}: k = {k} is not a multiple of {QK}"
    );
    let nb = k / QK;
    assert!(
        bytes == nb * block_bytes,
        "{what}: {bytes} bytes for k = {k}, expected {}",
        nb * block_bytes
    );
    nb
}

/// Scale and inverse scale for a block whose largest magnitude is `amax` (ggml's Q8 rule).
#[inline(always)]
pub(crate) fn q8_scales(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    (d, id)
}

/// Quantizes `x` block by block into `qs`, returning each block's (d, Σq) in `ds`.
///
/// # Panics
/// If `x.len() != qs.len()` or `ds.len() != x.len() / 32`.
pub(crate) fn quantize_q8(x: &[f32], qs: &mut [u8], ds: &mut [(f32, i32)]) {
    assert!(
        x.len() == qs.len() && ds.len() * QK == x.len(),
        "quantize_q8: mismatched lengths"
    );
    for ((xb, qb), o) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(ds) {
        *o = quantize_block_q8(xb, qb);
    }
}

/// Quantizes one block of 32 values to i8 with the ggml Q8 rule; returns (d, Σq).
#[inline(always)]
fn quantize_block_q8(x: &[f32], qs: &mut [u8]) -> (f32, i32) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let (d, id) = q8_scales(amax);
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        let qi = (v * id).round_ties_even() as i8;
        sum += i32::from(qi);
        *q = qi as u8;
    }
    (d, sum)
}

/// Quantizes `x` (length a multiple of 32) into `Q8_1` blocks.
///
/// # Panics
/// If the lengths do not match.
pub fn quantize_row_q8_1(x: &[f32], out: &mut [u8]) {
    check("quantize_row_q8_1", x.len(), Q8_1_BYTES, out.len());
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q8_1_BYTES)) {
        let (d, sum) = quantize_block_q8(xb, &mut ob[4..]);
        put_f16(ob, 0, d);
        put_f16(ob, 2, sum as f32 * d);
    }
}

/// Quantizes `x` (length a multiple of 32) into `Q8_0` blocks.
///
/// # Panics
/// If the lengths do not match.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) {
    check("quantize_row_q8_0", x.len(), Q8_0_BYTES, out.len());
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let (d, _) = quantize_block_q8(xb, &mut ob[2..]);
        put_f16(ob, 0, d);
    }
}

/// Quantizes `x` (length a multiple of 32) into `Q4_1` blocks (ggml's reference rule).
///
/// # Panics
/// If the lengths do not match.
pub fn quantize_row_q4_1(x: &[f32], out: &mut [u8]) {
    check("quantize_row_q4_1", x.len(), Q4_1_BYTES, out.len());
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q4_1_BYTES)) {
        let min = xb.iter().fold(f32::INFINITY, |a, &v| a.min(v));
        let max = xb.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(ob, 0, d);
        put_f16(ob, 2, min);
        let q = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
        for j in 0..QK / 2 {
            ob[4 + j] = q(xb[j]) | (q(xb[j + QK / 2]) << 4);
        }
    }
}

/// Dequantizes `Q4_1` blocks into `out`.
///
/// # Panics
/// If the lengths do not match.
pub fn dequantize_row_q4_1(bytes: &[u8], out: &mut [f32]) {
    check("dequantize_row_q4_1", out.len(), Q4_1_BYTES, bytes.len());
    for (b, o) in bytes.chunks_exact(Q4_1_BYTES).zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for j in 0..QK / 2 {
            o[j] = f32::from(b[4 + j] & 0x0F) * d + m;
            o[j + QK / 2] = f32::from(b[4 + j] >> 4) * d + m;
        }
    }
}

/// Dequantizes `Q8_0` blocks into `out`.
///
/// # Panics
/// If the lengths do not match.
pub fn dequantize_row_q8_0(bytes: &[u8], out: &mut [f32]) {
    check("dequantize_row_q8_0", out.len(), Q8_0_BYTES, bytes.len());
    for (b, o) in bytes.chunks_exact(Q8_0_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (v, &q) in o.iter_mut().zip(&b[2..]) {
            *v = f32::from(q as i8) * d;
        }
    }
}

/// Dequantizes `Q8_1` blocks into `out` (for tests of activation quantization).
///
/// # Panics
/// If the lengths do not match.
pub fn dequantize_row_q8_1(bytes: &[u8], out: &mut [f32]) {
    check("dequantize_row_q8_1", out.len(), Q8_1_BYTES, bytes.len());
    for (b, o) in bytes.chunks_exact(Q8_1_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (v, &q) in o.iter_mut().zip(&b[4..]) {
            *v = f32::from(q as i8) * d;
        }
    }
}

/// Decodes little-endian f32 bytes into `out`.
///
/// # Panics
/// If `bytes.len() != 4 * out.len()`.
pub fn dequantize_row_f32(bytes: &[u8], out: &mut [f32]) {
    assert!(
        bytes.len() == out.len() * 4,
        "dequantize_row_f32: {} bytes for {} values",
        bytes.len(),
        out.len()
    );
    for (v, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// `Q4_1` weight row · `Q8_1` activation row, `k` values.
///
/// # Panics
/// If the lengths do not match `k`.
pub fn vec_dot_q4_1_q8_1(k: usize, w: &[u8], x: &[u8]) -> f32 {
    let nb = check("vec_dot_q4_1_q8_1 (weights)", k, Q4_1_BYTES, w.len());
    check("vec_dot_q4_1_q8_1 (activations)", k, Q8_1_BYTES, x.len());
    let mut sum = 0.0f32;
    for b in 0..nb {
        let wb = &w[b * Q4_1_BYTES..(b + 1) * Q4_1_BYTES];
        let xb = &x[b * Q8_1_BYTES..(b + 1) * Q8_1_BYTES];
        let mut sumi = 0i32;
        for j in 0..QK / 2 {
            let lo = i32::from(wb[4 + j] & 0x0F);
            let hi = i32::from(wb[4 + j] >> 4);
            sumi += lo * i32::from(xb[4 + j] as i8) + hi * i32::from(xb[4 + j + QK / 2] as i8);
        }
        let (dw, mw) = (f16_at(wb, 0), f16_at(wb, 2));
        let (dx, sx) = (f16_at(xb, 0), f16_at(xb, 2));
        sum += dw * dx * sumi as f32 + mw * sx;
    }
    sum
}

/// `Q8_0` weight row · `Q8_0` activation row, `k` values.
///
/// # Panics
/// If the lengths do not match `k`.
pub fn vec_dot_q8_0_q8_0(k: usize, w: &[u8], x: &[u8]) -> f32 {
    let nb = check("vec_dot_q8_0_q8_0 (weights)", k, Q8_0_BYTES, w.len());
    check("vec_dot_q8_0_q8_0 (activations)", k, Q8_0_BYTES, x.len());
    let mut sum = 0.0f32;
    for b in 0..nb {
        let wb = &w[b * Q8_0_BYTES..(b + 1) * Q8_0_BYTES];
        let xb = &x[b * Q8_0_BYTES..(b + 1) * Q8_0_BYTES];
        let sumi: i32 = wb[2..]
            .iter()
            .zip(&xb[2..])
            .map(|(&a, &b)| i32::from(a as i8) * i32::from(b as i8))
            .sum();
        sum += f16_at(wb, 0) * f16_at(xb, 0) * sumi as f32;
    }
    sum
}

/// `F32` weight row · `F32` activation row (both little-endian bytes), `k` values.
///
/// # Panics
/// If the lengths do not match `k`.
pub fn vec_dot_f32(k: usize, w: &[u8], x: &[u8]) -> f32 {
    assert!(
        w.len() == 4 * k && x.len() == 4 * k,
        "vec_dot_f32: {} and {} bytes for k = {k}",
        w.len(),
        x.len()
    );
    let f = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    w.chunks_exact(4)
        .zip(x.chunks_exact(4))
        .map(|(a, b)| f(a) * f(b))
        .sum()
}

/// `F32` weight row (little-endian bytes) · `f32` activations.
pub(crate) fn dot_f32_f32(w: &[u8], x: &[f32]) -> f32 {
    assert!(
        w.len() == 4 * x.len(),
        "dot_f32_f32: {} bytes for {} values",
        w.len(),
        x.len()
    );
    w.chunks_exact(4)
        .zip(x)
        .map(|(a, b)| f32::from_le_bytes([a[0], a[1], a[2], a[3]]) * b)
        .sum()
}

/// `Q4_1` weight row · packed `Q8_1` activation row (`qs`, scales at `sc[8 b + 2 lane ..]`).
pub(crate) fn dot_q4_1_packed(nb: usize, w: &[u8], qs: &[u8], sc: &[f32], lane: usize) -> f32 {
    assert!(w.len() == nb * Q4_1_BYTES && qs.len() == nb * QK && sc.len() == nb * 8 && lane < 4);
    let mut sum = 0.0f32;
    for b in 0..nb {
        let wb = &w[b * Q4_1_BYTES..(b + 1) * Q4_1_BYTES];
        let xq = &qs[b * QK..(b + 1) * QK];
        let mut sumi = 0i32;
        for j in 0..QK / 2 {
            sumi += i32::from(wb[4 + j] & 0x0F) * i32::from(xq[j] as i8)
                + i32::from(wb[4 + j] >> 4) * i32::from(xq[j + QK / 2] as i8);
        }
        let (dx, sx) = (sc[b * 8 + 2 * lane], sc[b * 8 + 2 * lane + 1]);
        sum += f16_at(wb, 0) * dx * sumi as f32 + f16_at(wb, 2) * sx;
    }
    sum
}

/// `Q8_0` weight row · packed `Q8_0` activation row (`qs`, scales at `sc[8 b + 2 lane]`).
pub(crate) fn dot_q8_0_packed(nb: usize, w: &[u8], qs: &[u8], sc: &[f32], lane: usize) -> f32 {
    assert!(w.len() == nb * Q8_0_BYTES && qs.len() == nb * QK && sc.len() == nb * 8 && lane < 4);
    let mut sum = 0.0f32;
    for b in 0..nb {
        let wb = &w[b * Q8_0_BYTES..(b + 1) * Q8_0_BYTES];
        let xq = &qs[b * QK..(b + 1) * QK];
        let sumi: i32 = wb[2..]
            .iter()
            .zip(xq)
            .map(|(&a, &b)| i32::from(a as i8) * i32::from(b as i8))
            .sum();
        sum += f16_at(wb, 0) * sc[b * 8 + 2 * lane] * sumi as f32;
    }
    sum
}

/// Weight rows `rows` of `g` against all its activation rows: the portable row loop over the
/// packed activations (the `Scalar` backend's matmul).
///
/// # Panics
/// If `rows` lies outside the matrix.
pub(crate) fn gemm_rows(g: &Gemm<'_>, rows: std::ops::Range<usize>) {
    g.check_rows(&rows);
    let nb = g.x.nb();
    for j in rows {
        let w = g.weight_row(j);
        for r in 0..g.m {
            let v = match g.qtype {
                QType::F32 => dot_f32_f32(w, g.x.f_row(r)),
                QType::Q4_1 => dot_q4_1_packed(nb, w, g.x.q_row(r), g.x.sc_group(r / 4), r % 4),
                QType::Q8_0 => dot_q8_0_packed(nb, w, g.x.q_row(r), g.x.sc_group(r / 4), r % 4),
            };
            g.store(r, j, v);
        }
    }
}
