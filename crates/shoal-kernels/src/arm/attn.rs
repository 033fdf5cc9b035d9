//! NEON forms of `crate::attn`'s three loops (scores, the softmax's sum, the weighted sum of
//! values), with the portable code's IEEE operations in its order, so results are bitwise the
//! same: its 8-lane partial sums are two `float32x4_t` (lanes 0–3 and 4–7) taking fused
//! multiply-adds, reduced as `l + (l+4)` then `(0+1) + (2+3)`; every weighted-sum output is its
//! chain of fused multiply-adds in key order, four outputs per register.

use std::arch::aarch64::*;

use half::f16;

use super::ops::cvt_f16x4;

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

/// `NH` heads × `ND` registers of outputs, accumulated in registers over every key: `w` at the
/// first head's weights (`len` per head), `values` at column `d0` of row 0, `out` at column `d0`
/// of the first head.
#[inline(always)]
unsafe fn weighted_block<const NH: usize, const ND: usize>(
    w: *const f32,
    len: usize,
    values: *const f16,
    hd: usize,
    out: *mut f32,
) {
    // SAFETY: the caller guarantees `NH` heads of `len` weights, `len` rows of `hd` values with
    // `4 · ND` readable from `values`, and `NH` output rows with `4 · ND` writable.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); ND]; NH];
        for j in 0..len {
            let row = values.add(j * hd);
            let v: [float32x4_t; ND] = std::array::from_fn(|c| load_f16(row.add(4 * c)));
            for (h, acc) in acc.iter_mut().enumerate() {
                let p = vdupq_n_f32(*w.add(h * len + j));
                for c in 0..ND {
                    acc[c] = vfmaq_f32(acc[c], p, v[c]);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (c, a) in acc.iter().enumerate() {
                vst1q_f32(out.add(h * hd + 4 * c), *a);
            }
        }
    }
}

/// `out_h = Σ_j w[h·len + j] · v_j` for `hd` a multiple of 4: heads two at a time, outputs 16
/// at a time (8 accumulators), then 4.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn weighted_sum(w: &[f32], values: &[f16], hd: usize, out: &mut [f32]) {
    let len = values.len() / hd;
    let n_q = out.len() / hd;
    let mut h0 = 0;
    while h0 < n_q {
        let nh = (n_q - h0).min(2);
        let mut d0 = 0;
        while d0 < hd {
            let nd = if hd - d0 >= 16 { 4 } else { 1 };
            let (wp, vp) = (w[h0 * len..].as_ptr(), values[d0..].as_ptr());
            let op = out[h0 * hd + d0..].as_mut_ptr();
            // SAFETY: heads `h0..h0 + nh` exist in `w` and `out`; columns `d0..d0 + 4 nd` lie
            // within every row (`hd` is a multiple of 4).
            unsafe {
                match (nh, nd) {
                    (2, 4) => weighted_block::<2, 4>(wp, len, vp, hd, op),
                    (1, 4) => weighted_block::<1, 4>(wp, len, vp, hd, op),
                    (2, _) => weighted_block::<2, 1>(wp, len, vp, hd, op),
                    _ => weighted_block::<1, 1>(wp, len, vp, hd, op),
                }
            }
            d0 += 4 * nd;
        }
        h0 += nh;
    }
}
