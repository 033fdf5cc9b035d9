//! NEON forms of `crate::attn`'s three loops (scores, the softmax's sum, the weighted sum of
//! values), with the portable code's IEEE operations in its order, so results are bitwise the
//! same: its 8-lane partial sums are two `float32x4_t` (lanes 0–3 and 4–7) taking fused
//! multiply-adds, reduced as `l + (l+4)` then `(0+1) + (2+3)`; every weighted-sum output is its
//! chain of fused multiply-adds in key order, four outputs per register.

use std::arch::aarch64::*;

use half::f16;

use super::ops::cvt_f16x4;
use crate::weighted::{Reg, weighted};

/// The portable code's lanes.
const L: usize = 8;

/// The reduction of the portable `hsum` on lanes 0–3 (`lo`) and 4–7 (`hi`).
#[inline(always)]
unsafe fn hsum(lo: float32x4_t, hi: float32x4_t) -> f32 {
    unsafe {
        let a = vaddq_f32(lo, hi);
        let b = vpaddq_f32(a, a); // a0+a1, a2+a3, ..
        vpadds_f32(vget_low_f32(b))
    }
}

/// Four f16 at `p` as f32.
#[inline(always)]
unsafe fn load_f16(p: *const f16) -> float32x4_t {
    unsafe { cvt_f16x4(vld1_u16(p.cast())) }
}

/// `s[h·len + j] = dot(q_h, k_j) · scale`, each key converted once into `kf` (≥ `hd` values) for
/// all the heads.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn scores(
    q: &[f32],
    keys: &[f16],
    hd: usize,
    scale: f32,
    s: &mut [f32],
    kf: &mut [f32],
) {
    let (len, nc) = (keys.len() / hd, hd / L);
    let kf = &mut kf[..hd];
    for (j, k) in keys.chunks_exact(hd).enumerate() {
        let n4 = hd / 4 * 4;
        for i in (0..n4).step_by(4) {
            // SAFETY: `i + 4 ≤ hd` in both rows.
            unsafe { vst1q_f32(kf.as_mut_ptr().add(i), load_f16(k.as_ptr().add(i))) };
        }
        for i in n4..hd {
            kf[i] = k[i].to_f32();
        }
        for (h, qh) in q.chunks_exact(hd).enumerate() {
            let (qp, kp) = (qh.as_ptr(), kf.as_ptr());
            let (mut lo, mut hi) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
            for c in 0..nc {
                // SAFETY: `c · 8 + 8 ≤ hd` in both rows.
                unsafe {
                    lo = vfmaq_f32(lo, vld1q_f32(qp.add(c * L)), vld1q_f32(kp.add(c * L)));
                    hi = vfmaq_f32(
                        hi,
                        vld1q_f32(qp.add(c * L + 4)),
                        vld1q_f32(kp.add(c * L + 4)),
                    );
                }
            }
            // SAFETY: register arithmetic.
            let mut r = unsafe { hsum(lo, hi) };
            for d in nc * L..hd {
                r = qh[d].mul_add(kf[d], r);
            }
            s[h * len + j] = r * scale;
        }
    }
}

/// The portable `sum`: element `j` into lane `j % 8`, the lane reduction, then the tail.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn sum(w: &[f32]) -> f32 {
    let n8 = w.len() / L * L;
    let (mut lo, mut hi) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    for i in (0..n8).step_by(L) {
        // SAFETY: `i + 8 ≤ len`.
        unsafe {
            lo = vaddq_f32(lo, vld1q_f32(w.as_ptr().add(i)));
            hi = vaddq_f32(hi, vld1q_f32(w.as_ptr().add(i + 4)));
        }
    }
    // SAFETY: register arithmetic.
    let r = unsafe { hsum(lo, hi) };
    w[n8..].iter().fold(r, |r, &x| r + x)
}

/// NEON's four lanes for [`weighted`].
impl Reg for float32x4_t {
    const WIDTH: usize = 4;
    #[inline(always)]
    unsafe fn zero() -> Self {
        unsafe { vdupq_n_f32(0.0) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> Self {
        unsafe { load_f16(p) }
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> Self {
        unsafe { vdupq_n_f32(*p) }
    }
    #[inline(always)]
    unsafe fn fma(self, a: Self, b: Self) -> Self {
        unsafe { vfmaq_f32(self, a, b) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { vst1q_f32(p, self) }
    }
}

/// `out_h = Σ_j w[h·len + j] · v_j` for `hd` a multiple of 4 ([`weighted`] on NEON registers).
#[target_feature(enable = "neon")]
pub(crate) unsafe fn weighted_sum(w: &[f32], values: &[f16], hd: usize, out: &mut [f32]) {
    // SAFETY: NEON is enabled here.
    unsafe { weighted::<float32x4_t>(w, values, hd, out) }
}
