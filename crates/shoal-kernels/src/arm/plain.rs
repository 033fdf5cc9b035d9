//! NEON dot products of the plain formats (`F32`, `F16`, `BF16` weights · `f32` activations):
//! sixteen values per step in four `fmla` accumulators, `F16` widened with `fcvtl`, `BF16` by a
//! 16-bit shift; then a four-value loop and a scalar tail. Within rounding of the scalar
//! reference (another summation order); the matmul calls the same function per output, so it is
//! bitwise equal to [`crate::vec_dot`] on this backend.

use std::arch::aarch64::*;

use super::ops::{cvt_f16x4, f16_to_f32, load_f32};

/// A plain weight format.
pub(super) trait Plain {
    /// Bytes per value.
    const BYTES: usize;
    /// Four values at `p` as f32.
    unsafe fn load4(p: *const u8) -> float32x4_t;
    /// One value at `p`.
    unsafe fn one(p: *const u8) -> f32;
}

pub(super) struct F32;
pub(super) struct F16;
pub(super) struct Bf16;

// SAFETY (the impls): `p` is readable for the values read.
impl Plain for F32 {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn load4(p: *const u8) -> float32x4_t {
        unsafe { load_f32(p) }
    }
    #[inline(always)]
    unsafe fn one(p: *const u8) -> f32 {
        unsafe { p.cast::<f32>().read_unaligned() }
    }
}

impl Plain for F16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load4(p: *const u8) -> float32x4_t {
        unsafe { cvt_f16x4(vreinterpret_u16_u8(vld1_u8(p))) }
    }
    #[inline(always)]
    unsafe fn one(p: *const u8) -> f32 {
        f16_to_f32(unsafe { p.cast::<u16>().read_unaligned() })
    }
}

impl Plain for Bf16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load4(p: *const u8) -> float32x4_t {
        unsafe { vreinterpretq_f32_u32(vshll_n_u16::<16>(vreinterpret_u16_u8(vld1_u8(p)))) }
    }
    #[inline(always)]
    unsafe fn one(p: *const u8) -> f32 {
        f32::from_bits(u32::from(unsafe { p.cast::<u16>().read_unaligned() }) << 16)
    }
}

/// `Σ w·x` over `k` values: weights of `P` at `w`, little-endian f32 activations at `x`.
///
/// # Safety
/// `w` must hold `k · P::BYTES` bytes and `x` `4 k`.
#[inline(always)]
pub(super) unsafe fn plain_dot<P: Plain>(k: usize, w: *const u8, x: *const u8) -> f32 {
    let wv = |i: usize| unsafe { P::load4(w.add(i * P::BYTES)) };
    let xv = |i: usize| unsafe { load_f32(x.add(4 * i)) };
    // SAFETY (all loads): indices below `k` (the caller's guarantee).
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i + 16 <= k {
            for (j, a) in acc.iter_mut().enumerate() {
                *a = vfmaq_f32(*a, wv(i + 4 * j), xv(i + 4 * j));
            }
            i += 16;
        }
        while i + 4 <= k {
            acc[0] = vfmaq_f32(acc[0], wv(i), xv(i));
            i += 4;
        }
        let v = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
        let mut sum = vaddvq_f32(v);
        while i < k {
            sum += P::one(w.add(i * P::BYTES)) * x.add(4 * i).cast::<f32>().read_unaligned();
            i += 1;
        }
        sum
    }
}
