//! AVX2 dot products of plain weight rows (`F32`, `F16`, `BF16`) with `f32` activations: one
//! loop ([`plain_dot`]) over a per-format conversion of eight weights to `f32` ([`Plain`]) —
//! `F16` with F16C's `vcvtph2ps`, `BF16` by widening to 32 bits and shifting left by 16.
//!
//! Like the rest of `x86`, only called from `#[target_feature]` entry points in `super`, with
//! lengths checked there.

use std::arch::x86_64::*;

use super::kernels::hsum;

/// A plain weight format: how to read eight (or one) of its values as `f32`.
pub(crate) trait Plain {
    /// Values `i..i + 8` of the row at `w`.
    unsafe fn load8(w: *const u8, i: usize) -> __m256;
    /// Value `i` of the row at `w`.
    unsafe fn value(w: *const u8, i: usize) -> f32;
}

pub(crate) struct F32;
pub(crate) struct F16;
pub(crate) struct BF16;

impl Plain for F32 {
    #[inline(always)]
    unsafe fn load8(w: *const u8, i: usize) -> __m256 {
        unsafe { _mm256_loadu_ps(w.cast::<f32>().add(i)) }
    }
    #[inline(always)]
    unsafe fn value(w: *const u8, i: usize) -> f32 {
        unsafe { w.cast::<f32>().add(i).read_unaligned() }
    }
}

impl Plain for F16 {
    #[inline(always)]
    unsafe fn load8(w: *const u8, i: usize) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * i).cast())) }
    }
    #[inline(always)]
    unsafe fn value(w: *const u8, i: usize) -> f32 {
        unsafe { half::f16::from_bits(w.add(2 * i).cast::<u16>().read_unaligned()).to_f32() }
    }
}

impl Plain for BF16 {
    #[inline(always)]
    unsafe fn load8(w: *const u8, i: usize) -> __m256 {
        unsafe {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(w.add(2 * i).cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
        }
    }
    #[inline(always)]
    unsafe fn value(w: *const u8, i: usize) -> f32 {
        unsafe { f32::from_bits(u32::from(w.add(2 * i).cast::<u16>().read_unaligned()) << 16) }
    }
}

/// Plain weights (`k` values at `w`) · `k` `f32` activations at `x`.
#[inline(always)]
pub(crate) unsafe fn plain_dot<P: Plain>(k: usize, w: *const u8, x: *const f32) -> f32 {
    unsafe {
        let z = _mm256_setzero_ps();
        let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
        let mut i = 0;
        while i + 32 <= k {
            a0 = _mm256_fmadd_ps(P::load8(w, i), _mm256_loadu_ps(x.add(i)), a0);
            a1 = _mm256_fmadd_ps(P::load8(w, i + 8), _mm256_loadu_ps(x.add(i + 8)), a1);
            a2 = _mm256_fmadd_ps(P::load8(w, i + 16), _mm256_loadu_ps(x.add(i + 16)), a2);
            a3 = _mm256_fmadd_ps(P::load8(w, i + 24), _mm256_loadu_ps(x.add(i + 24)), a3);
            i += 32;
        }
        while i + 8 <= k {
            a0 = _mm256_fmadd_ps(P::load8(w, i), _mm256_loadu_ps(x.add(i)), a0);
            i += 8;
        }
        let mut sum = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        while i < k {
            sum += P::value(w, i) * x.add(i).read();
            i += 1;
        }
        sum
    }
}
