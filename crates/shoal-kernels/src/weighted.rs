//! Attention's weighted sum of values (`out_h = Σ_j w[h·len + j] · v_j`) on any register of f32 lanes
//! ([`Reg`]: AVX2's and AVX-512's in `super::x86`, NEON's in `crate::arm::attn`): every output is
//! its own chain of fused multiply-adds in key order, so the result is the same bits whatever the
//! register width or the blocking.

use half::f16;

/// A register of f32 lanes for the value sums.
pub(crate) trait Reg: Copy {
    /// f32 lanes per register.
    const WIDTH: usize;
    unsafe fn zero() -> Self;
    /// `WIDTH` f16 values at `p`, as f32.
    unsafe fn load_f16(p: *const f16) -> Self;
    /// `*p` in every lane.
    unsafe fn splat(p: *const f32) -> Self;
    /// `a · b + self`, one rounding per lane.
    unsafe fn fma(self, a: Self, b: Self) -> Self;
    unsafe fn store(self, p: *mut f32);
}

/// One register block of [`weighted`]: `NH` heads × `ND` registers of outputs, the accumulators
/// held in registers over the whole `j` loop. `w` points at the first head's weights (`len` per
/// head), `values` at column `d0` of row 0, `out` at column `d0` of the first head.
#[inline(always)]
unsafe fn weighted_block<V: Reg, const NH: usize, const ND: usize>(
    w: *const f32,
    len: usize,
    values: *const f16,
    hd: usize,
    out: *mut f32,
) {
    // SAFETY: the caller guarantees `NH` heads of `len` weights, `len` rows of `hd` values with
    // `ND · WIDTH` readable from `values`, and `NH` output rows of `hd` with `ND · WIDTH` writable.
    unsafe {
        let mut acc = [[V::zero(); ND]; NH];
        for j in 0..len {
            let row = values.add(j * hd);
            let v: [V; ND] = std::array::from_fn(|c| V::load_f16(row.add(c * V::WIDTH)));
            for (h, acc) in acc.iter_mut().enumerate() {
                let p = V::splat(w.add(h * len + j));
                for c in 0..ND {
                    acc[c] = acc[c].fma(p, v[c]);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (c, a) in acc.iter().enumerate() {
                a.store(out.add(h * hd + c * V::WIDTH));
            }
        }
    }
}

/// `crate::attn`'s weighted sum on registers `V`; `hd` is a multiple of `V::WIDTH`. Heads go three at a
/// time and outputs four registers at a time (12 accumulators and 4 values), then one register.
/// The caller enables the features `V` needs.
#[inline(always)]
pub(crate) unsafe fn weighted<V: Reg>(w: &[f32], values: &[f16], hd: usize, out: &mut [f32]) {
    let len = values.len() / hd;
    let n_q = out.len() / hd;
    let mut h0 = 0;
    while h0 < n_q {
        let nh = (n_q - h0).min(3);
        let mut d0 = 0;
        while d0 < hd {
            let nd = if hd - d0 >= 4 * V::WIDTH { 4 } else { 1 };
            let (wp, vp) = (w[h0 * len..].as_ptr(), values[d0..].as_ptr());
            let op = out[h0 * hd + d0..].as_mut_ptr();
            // SAFETY: heads `h0..h0 + nh` exist in `w` and `out`; columns `d0..d0 + nd · WIDTH`
            // lie within every row (`hd` is a multiple of the width).
            unsafe {
                match (nh, nd) {
                    (3, 4) => weighted_block::<V, 3, 4>(wp, len, vp, hd, op),
                    (2, 4) => weighted_block::<V, 2, 4>(wp, len, vp, hd, op),
                    (1, 4) => weighted_block::<V, 1, 4>(wp, len, vp, hd, op),
                    (3, _) => weighted_block::<V, 3, 1>(wp, len, vp, hd, op),
                    (2, _) => weighted_block::<V, 2, 1>(wp, len, vp, hd, op),
                    _ => weighted_block::<V, 1, 1>(wp, len, vp, hd, op),
                }
            }
            d0 += nd * V::WIDTH;
        }
        h0 += nh;
    }
}
