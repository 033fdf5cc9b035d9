//! Portable reference kernels: quantization, dequantization, dot products, and the `Scalar`
//! backend's matmul rows.
//!
//! These are the semantics every SIMD path must reproduce (quantization bitwise, dot products to
//! rounding). They follow ggml's CPU kernels, with activation quantization rounding to nearest,
//! ties to even, as ggml's AVX2 path does (and as its `Q8_K` reference does). The row-level
//! functions take slices whose lengths they check, so they are safe to call directly.
//!
//! - this module: quantizing activations (`Q8_0`, `Q8_1`, `Q8_K`) and `Q4_1` test weights;
//! - `dequant`: every weight format to `f32` (bitwise as ggml's `dequantize_row_*`), through one
//!   decoder per format that the dot products share;
//! - `dot`: dot products of a weight row with an activation row (ggml bytes or the packed
//!   [`crate::Activations`] layout) and the `Scalar` backend's `gemm_rows`.

mod dequant;
mod dot;

pub(crate) use dequant::dequantize_blocks;
pub use dequant::{
    dequantize_row_f32, dequantize_row_q4_1, dequantize_row_q8_0, dequantize_row_q8_1,
    dequantize_row_q8_k,
};
pub(crate) use dot::gemm_rows;
pub use dot::{vec_dot, vec_dot_f32, vec_dot_q4_1_q8_1, vec_dot_q8_0_q8_0};

use crate::format::{Q4_1_BYTES, Q8_0_BYTES, Q8_1_BYTES, Q8_K_BYTES, QK, QK_K, put_f16};

/// Checks that `bytes` holds the blocks of `block_bytes` for `k` values in blocks of `block`;
/// returns the number of blocks.
fn check_blocks(what: &str, k: usize, block: usize, block_bytes: usize, bytes: usize) -> usize {
    assert!(
        k.is_multiple_of(block),
        "{what}: k = {k} is not a multiple of {block}"
    );
    let nb = k / block;
    assert!(
        bytes == nb * block_bytes,
        "{what}: {bytes} bytes for k = {k}, expected {}",
        nb * block_bytes
    );
    nb
}

/// [`check_blocks`] for 32-value blocks.
fn check(what: &str, k: usize, block_bytes: usize, bytes: usize) -> usize {
    check_blocks(what, k, QK, block_bytes, bytes)
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

/// The `Q8_K` scale of a 256-value block: `-max / 127` where `max` is the first value of the
/// largest magnitude, and its inverse `-127 / max` (ggml's rule); `(0, 0)` for an all-zero block.
#[inline(always)]
pub(crate) fn q8k_scales(max: f32) -> (f32, f32) {
    if max == 0.0 {
        return (0.0, 0.0);
    }
    let iscale = -127.0 / max;
    (1.0 / iscale, iscale)
}

/// Quantizes `x` into `Q8_K` blocks of 256: quants in `qs`, each block's scale in `d` and its 16
/// sums of 16 quants in `bsums` (ggml's `quantize_row_q8_K_ref`, bitwise).
///
/// # Panics
/// If `x.len() != qs.len()`, `d.len() != x.len() / 256` or `bsums.len() != 16 · d.len()`.
pub(crate) fn quantize_q8k(x: &[f32], qs: &mut [u8], d: &mut [f32], bsums: &mut [i16]) {
    assert!(
        x.len() == qs.len() && d.len() * QK_K == x.len() && bsums.len() == d.len() * 16,
        "quantize_q8k: mismatched lengths"
    );
    let blocks = x.chunks_exact(QK_K).zip(qs.chunks_exact_mut(QK_K));
    for ((xb, qb), (db, sb)) in blocks.zip(d.iter_mut().zip(bsums.chunks_exact_mut(16))) {
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                (amax, max) = (v.abs(), v);
            }
        }
        let (dd, iscale) = q8k_scales(max);
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = ((v * iscale).round_ties_even() as i32).min(127) as i8 as u8;
        }
        for (s, g) in sb.iter_mut().zip(qb.chunks_exact(16)) {
            *s = g.iter().map(|&q| i16::from(q as i8)).sum();
        }
        *db = dd;
    }
}

/// Quantizes `x` (length a multiple of 256) into ggml `Q8_K` blocks.
///
/// # Panics
/// If the lengths do not match.
pub fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) {
    let nb = check_blocks("quantize_row_q8_k", x.len(), QK_K, Q8_K_BYTES, out.len());
    let mut qs = vec![0u8; x.len()];
    let (mut d, mut sums) = (vec![0f32; nb], vec![0i16; 16 * nb]);
    quantize_q8k(x, &mut qs, &mut d, &mut sums);
    write_q8k(&qs, &d, &sums, out);
}

/// Writes `Q8_K` blocks from their parts (lengths as [`quantize_q8k`] leaves them).
pub(crate) fn write_q8k(qs: &[u8], d: &[f32], sums: &[i16], out: &mut [u8]) {
    let parts = qs.chunks_exact(QK_K).zip(d).zip(sums.chunks_exact(16));
    for (o, ((q, d), s)) in out.chunks_exact_mut(Q8_K_BYTES).zip(parts) {
        o[..4].copy_from_slice(&d.to_le_bytes());
        o[4..4 + QK_K].copy_from_slice(q);
        for (b, v) in o[4 + QK_K..].chunks_exact_mut(2).zip(s) {
            b.copy_from_slice(&v.to_le_bytes());
        }
    }
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
