//! Vectorized elementwise helpers for the host forward pass: `exp` over a slice (softmax, SiLU), the
//! log-normalizer of a logit row (the sampler's), and f16 ↔ f32 conversions (the f16 KV cache).
//!
//! Each has one definition of its arithmetic: the AVX2 and NEON paths and the portable path perform the same
//! IEEE operations (fused multiply-adds, round-to-nearest-even), so results are bitwise the same
//! whichever runs, and an element's result never depends on its neighbours or the slice length.

use half::f16;

/// Inputs are clamped to this range: below it `exp` underflows to (almost) 0, above it overflows.
const EXP_MIN: f32 = -87.336_55;
const EXP_MAX: f32 = 88.0;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two (Cephes): `C1` has few mantissa bits, so `n · C1` is exact.
const C1: f32 = 0.693_359_4;
const C2: f32 = -2.121_944_4e-4;
/// Minimax polynomial for `(e^r − 1 − r) / r²` on |r| ≤ ln2 / 2 (Cephes `expf`).
const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5, // 5.0000001e-1 in Cephes, the same f32
];

/// `e^x` with a relative error of about 2 ulp (`x` clamped to [−87.3, 88]).
#[inline]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(EXP_MIN, EXP_MAX);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-C2, n.mul_add(-C1, x));
    let mut y = P[0];
    for p in &P[1..] {
        y = y.mul_add(r, *p);
    }
    let y = y.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `ln Σ exp(logits)` (a logit minus this is its log-probability): the row's max, then
/// [`exp_in_place`] of `l − max` in chunks, summed in f64. The sampler pays this over the whole
/// vocabulary every token (and the compute probe times it).
pub fn log_normalizer(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut buf = [0f32; 256];
    let mut sum = 0f64;
    for chunk in logits.chunks(buf.len()) {
        let b = &mut buf[..chunk.len()];
        for (d, &l) in b.iter_mut().zip(chunk) {
            *d = l - max;
        }
        exp_in_place(b);
        sum += b.iter().map(|&v| f64::from(v)).sum::<f64>();
    }
    (max as f64 + sum.ln()) as f32
}

/// `x[i] = e^x[i]` for every element.
pub fn exp_in_place(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::x86::has_avx2() {
        // SAFETY: the features were just checked.
        let done = unsafe { x86::exp_in_place(x) };
        x[done..].iter_mut().for_each(|v| *v = exp(*v));
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if crate::arm::has_neon() {
        // SAFETY: the features were just checked.
        let done = unsafe { neon::exp_in_place(x) };
        x[done..].iter_mut().for_each(|v| *v = exp(*v));
        return;
    }
    x.iter_mut().for_each(|v| *v = exp(*v));
}

/// `dst[i] = src[i]` as f32.
///
/// # Panics
/// If the lengths differ.
pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "f16_to_f32: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if crate::x86::has_avx2() {
        // SAFETY: features checked; equal lengths.
        let done = unsafe { x86::f16_to_f32(src, dst) };
        let (s, d) = (&src[done..], &mut dst[done..]);
        d.iter_mut().zip(s).for_each(|(d, s)| *d = s.to_f32());
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if crate::arm::has_neon() {
        // SAFETY: features checked; equal lengths.
        let done = unsafe { neon::f16_to_f32(src, dst) };
        let (s, d) = (&src[done..], &mut dst[done..]);
        d.iter_mut().zip(s).for_each(|(d, s)| *d = s.to_f32());
        return;
    }
    dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
}

/// `dst[i] = src[i]` rounded to the nearest f16 (ties to even).
///
/// # Panics
/// If the lengths differ.
pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_f16: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if crate::x86::has_avx2() {
        // SAFETY: features checked; equal lengths.
        let done = unsafe { x86::f32_to_f16(src, dst) };
        let (s, d) = (&src[done..], &mut dst[done..]);
        d.iter_mut()
            .zip(s)
            .for_each(|(d, s)| *d = f16::from_f32(*s));
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if crate::arm::has_neon() {
        // SAFETY: features checked; equal lengths.
        let done = unsafe { neon::f32_to_f16(src, dst) };
        let (s, d) = (&src[done..], &mut dst[done..]);
        d.iter_mut()
            .zip(s)
            .for_each(|(d, s)| *d = f16::from_f32(*s));
        return;
    }
    dst.iter_mut()
        .zip(src)
        .for_each(|(d, s)| *d = f16::from_f32(*s));
}

/// Rounds every value to f16 precision in place.
pub fn round_to_f16(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::x86::has_avx2() {
        // SAFETY: features checked.
        let done = unsafe { x86::round_to_f16(x) };
        x[done..]
            .iter_mut()
            .for_each(|v| *v = f16::from_f32(*v).to_f32());
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if crate::arm::has_neon() {
        // SAFETY: features checked.
        let done = unsafe { neon::round_to_f16(x) };
        x[done..]
            .iter_mut()
            .for_each(|v| *v = f16::from_f32(*v).to_f32());
        return;
    }
    x.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::{C1, C2, EXP_MAX, EXP_MIN, LOG2E, P};

    /// The vector form of [`super::exp`], 8 lanes; returns how many leading elements it did.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_in_place(x: &mut [f32]) -> usize {
        let n8 = x.len() / 8 * 8;
        let p = x.as_mut_ptr();
        let mut i = 0;
        while i < n8 {
            // SAFETY: `i + 8 ≤ len`.
            unsafe {
                let v = _mm256_loadu_ps(p.add(i));
                let v = _mm256_min_ps(
                    _mm256_max_ps(v, _mm256_set1_ps(EXP_MIN)),
                    _mm256_set1_ps(EXP_MAX),
                );
                let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm256_mul_ps(v, _mm256_set1_ps(LOG2E)),
                );
                let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C1), v);
                let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C2), r);
                let mut y = _mm256_set1_ps(P[0]);
                for c in &P[1..] {
                    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(*c));
                }
                let y = _mm256_add_ps(
                    _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r),
                    _mm256_set1_ps(1.0),
                );
                let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
                    _mm256_cvtps_epi32(n),
                    _mm256_set1_epi32(127),
                ));
                _mm256_storeu_ps(p.add(i), _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
            }
            i += 8;
        }
        n8
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn f16_to_f32(src: &[f16], dst: &mut [f32]) -> usize {
        let n8 = src.len().min(dst.len()) / 8 * 8;
        let mut i = 0;
        while i < n8 {
            // SAFETY: `i + 8 ≤` both lengths; f16 is a transparent u16.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        n8
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn f32_to_f16(src: &[f32], dst: &mut [f16]) -> usize {
        let n8 = src.len().min(dst.len()) / 8 * 8;
        let mut i = 0;
        while i < n8 {
            // SAFETY: `i + 8 ≤` both lengths; f16 is a transparent u16.
            unsafe {
                let f = _mm256_loadu_ps(src.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(f);
                _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), h);
            }
            i += 8;
        }
        n8
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn round_to_f16(x: &mut [f32]) -> usize {
        let n8 = x.len() / 8 * 8;
        let p = x.as_mut_ptr();
        let mut i = 0;
        while i < n8 {
            // SAFETY: `i + 8 ≤ len`.
            unsafe {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(p.add(i)));
                _mm256_storeu_ps(p.add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        n8
    }
}

/// The NEON forms (aarch64): 4 lanes, the same IEEE operations as the portable code.
#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    use half::f16;

    use super::{C1, C2, EXP_MAX, EXP_MIN, LOG2E, P};
    use crate::arm::ops::{cvt_f16x4, cvt_f32x4_f16};

    /// The vector form of [`super::exp`], 4 lanes; returns how many leading elements it did.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn exp_in_place(x: &mut [f32]) -> usize {
        let n4 = x.len() / 4 * 4;
        let p = x.as_mut_ptr();
        for i in (0..n4).step_by(4) {
            // SAFETY: `i + 4 ≤ len`.
            unsafe {
                let v = vld1q_f32(p.add(i));
                let v = vminq_f32(vmaxq_f32(v, vdupq_n_f32(EXP_MIN)), vdupq_n_f32(EXP_MAX));
                let n = vrndnq_f32(vmulq_n_f32(v, LOG2E));
                let r = vfmsq_f32(v, n, vdupq_n_f32(C1));
                let r = vfmsq_f32(r, n, vdupq_n_f32(C2));
                let mut y = vdupq_n_f32(P[0]);
                for c in &P[1..] {
                    y = vfmaq_f32(vdupq_n_f32(*c), y, r);
                }
                let y = vaddq_f32(vfmaq_f32(r, y, vmulq_f32(r, r)), vdupq_n_f32(1.0));
                let e = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
                vst1q_f32(p.add(i), vmulq_f32(y, vreinterpretq_f32_s32(e)));
            }
        }
        n4
    }

    #[target_feature(enable = "neon")]
    pub(super) unsafe fn f16_to_f32(src: &[f16], dst: &mut [f32]) -> usize {
        let n4 = src.len().min(dst.len()) / 4 * 4;
        for i in (0..n4).step_by(4) {
            // SAFETY: `i + 4 ≤` both lengths; f16 is a transparent u16.
            unsafe {
                let h = vld1_u16(src.as_ptr().add(i).cast());
                vst1q_f32(dst.as_mut_ptr().add(i), cvt_f16x4(h));
            }
        }
        n4
    }

    #[target_feature(enable = "neon")]
    pub(super) unsafe fn f32_to_f16(src: &[f32], dst: &mut [f16]) -> usize {
        let n4 = src.len().min(dst.len()) / 4 * 4;
        for i in (0..n4).step_by(4) {
            // SAFETY: `i + 4 ≤` both lengths; f16 is a transparent u16.
            unsafe {
                let h = cvt_f32x4_f16(vld1q_f32(src.as_ptr().add(i)));
                vst1_u16(dst.as_mut_ptr().add(i).cast(), h);
            }
        }
        n4
    }

    #[target_feature(enable = "neon")]
    pub(super) unsafe fn round_to_f16(x: &mut [f32]) -> usize {
        let n4 = x.len() / 4 * 4;
        let p = x.as_mut_ptr();
        for i in (0..n4).step_by(4) {
            // SAFETY: `i + 4 ≤ len`.
            unsafe { vst1q_f32(p.add(i), cvt_f16x4(cvt_f32x4_f16(vld1q_f32(p.add(i))))) };
        }
        n4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_a_few_ulp_of_std_and_handles_the_extremes() {
        let mut xs: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.0437).collect();
        xs.extend([0.0, -0.0, 1e-30, -1e-30, 88.0, 100.0, -87.0, -100.0, -1e30]);
        let mut got = xs.clone();
        exp_in_place(&mut got);
        for (&x, &g) in xs.iter().zip(&got) {
            assert_eq!(
                g.to_bits(),
                exp(x).to_bits(),
                "vector and scalar differ at {x}"
            );
            let want = f64::from(x.clamp(EXP_MIN, EXP_MAX)).exp();
            let rel = (f64::from(g) - want).abs() / want;
            assert!(rel < 4e-7, "exp({x}) = {g}, want {want} (rel {rel:e})");
        }
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1e30) < 1e-37 && exp(-1e30) >= 0.0);
        assert!(exp(1e30).is_finite());
    }

    #[test]
    fn f16_conversions_match_the_half_crate_for_every_length() {
        let src: Vec<f32> = (0..37)
            .map(|i| (i as f32 - 18.0) * 0.3771 + 1e-4 * i as f32)
            .chain([65504.0, 70000.0, -1e-8, f32::INFINITY])
            .collect();
        for len in [0, 1, 7, 8, 9, 16, src.len()] {
            let s = &src[..len];
            let mut h = vec![f16::ZERO; len];
            f32_to_f16(s, &mut h);
            let want: Vec<f16> = s.iter().map(|&v| f16::from_f32(v)).collect();
            assert_eq!(h, want, "len {len}");
            let mut back = vec![0f32; len];
            f16_to_f32(&h, &mut back);
            let mut rounded = s.to_vec();
            round_to_f16(&mut rounded);
            for i in 0..len {
                assert_eq!(back[i].to_bits(), want[i].to_f32().to_bits());
                assert_eq!(rounded[i].to_bits(), back[i].to_bits());
            }
        }
    }
}
