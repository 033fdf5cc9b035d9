//! NEON quantization of activations into `Q8_0`/`Q8_1` quants (32-value blocks) and `Q8_K`
//! (256-value blocks with sums of 16), bitwise equal to the scalar reference: `fmaxnm` ignores
//! NaN like `f32::max`, `fcvtns` rounds to nearest with ties to even like `round_ties_even`, and
//! the saturating narrows give the scalar casts' results for every value they can see.

use std::arch::aarch64::*;

use crate::format::{QK, QK_K};
use crate::scalar::{q8_scales, q8k_scales};

/// `round_ties_even(v · s)` of four values, saturated to `i32`.
#[inline(always)]
unsafe fn round4(x: *const f32, s: f32) -> int32x4_t {
    unsafe { vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x), s)) }
}

/// Sixteen rounded values narrowed (saturating) to `i8`.
#[inline(always)]
unsafe fn narrow16(q: [int32x4_t; 4]) -> int8x16_t {
    unsafe {
        let a = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
        let b = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
        vcombine_s8(vqmovn_s16(a), vqmovn_s16(b))
    }
}

/// The largest magnitude of `n` values at `x` (NaN ignored), `n` a multiple of 16.
#[inline(always)]
unsafe fn amax(x: *const f32, n: usize) -> f32 {
    unsafe {
        let mut m = [vdupq_n_f32(0.0); 4];
        for i in (0..n).step_by(16) {
            for (j, v) in m.iter_mut().enumerate() {
                *v = vmaxnmq_f32(*v, vabsq_f32(vld1q_f32(x.add(i + 4 * j))));
            }
        }
        vmaxnmvq_f32(vmaxnmq_f32(
            vmaxnmq_f32(m[0], m[1]),
            vmaxnmq_f32(m[2], m[3]),
        ))
    }
}

/// One block of 32 values to `i8` with the ggml Q8 rule; returns `(d, Σq)`.
///
/// # Safety
/// `x` must hold 32 floats and `q` 32 bytes.
#[inline(always)]
pub(super) unsafe fn quantize_block_q8(x: *const f32, q: *mut u8) -> (f32, i32) {
    unsafe {
        let (d, id) = q8_scales(amax(x, QK));
        let mut sum = vdupq_n_s32(0);
        for h in 0..2 {
            let xs = x.add(16 * h);
            let v = narrow16(std::array::from_fn(|j| round4(xs.add(4 * j), id)));
            vst1q_s8(q.add(16 * h).cast(), v);
            sum = vpadalq_s16(sum, vpaddlq_s8(v));
        }
        (d, vaddvq_s32(sum))
    }
}

/// One block of 256 values to `Q8_K`: quants at `q`, the sums of each 16 at `sums`; returns `d`.
///
/// # Safety
/// `x` must hold 256 floats, `q` 256 bytes and `sums` 16 values.
#[inline(always)]
pub(super) unsafe fn quantize_block_q8k(x: *const f32, q: *mut u8, sums: *mut i16) -> f32 {
    unsafe {
        let a = amax(x, QK_K);
        // The first value of the largest magnitude sets the sign (the scalar rule).
        let max = (0..QK_K)
            .map(|i| *x.add(i))
            .find(|v| v.abs() == a)
            .unwrap_or(0.0);
        let (d, iscale) = q8k_scales(max);
        for g in 0..16 {
            let xs = x.add(16 * g);
            let v = narrow16(std::array::from_fn(|j| {
                vminq_s32(round4(xs.add(4 * j), iscale), vdupq_n_s32(127))
            }));
            vst1q_s8(q.add(16 * g).cast(), v);
            *sums.add(g) = vaddvq_s16(vpaddlq_s8(v));
        }
        d
    }
}

/// Quantizes `x` block by block (lengths checked by the caller).
#[target_feature(enable = "neon")]
pub(super) unsafe fn quantize_q8_tf(x: &[f32], qs: &mut [u8], ds: &mut [(f32, i32)]) {
    for ((xb, qb), o) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(ds) {
        // SAFETY: 32 floats and 32 bytes (exact chunks).
        *o = unsafe { quantize_block_q8(xb.as_ptr(), qb.as_mut_ptr()) };
    }
}

/// Quantizes `x` into `Q8_K` blocks (lengths checked by the caller).
#[target_feature(enable = "neon")]
pub(super) unsafe fn quantize_q8k_tf(x: &[f32], qs: &mut [u8], d: &mut [f32], sums: &mut [i16]) {
    let blocks = x.chunks_exact(QK_K).zip(qs.chunks_exact_mut(QK_K));
    for ((xb, qb), (db, sb)) in blocks.zip(d.iter_mut().zip(sums.chunks_exact_mut(16))) {
        // SAFETY: 256 floats, 256 bytes and 16 sums (exact chunks).
        *db = unsafe { quantize_block_q8k(xb.as_ptr(), qb.as_mut_ptr(), sb.as_mut_ptr()) };
    }
}
