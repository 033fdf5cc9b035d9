//! The `i8mm` level's matmul of the K-quants (`Q2_K` … `Q6_K` against `Q8_K` activations):
//! two weight rows × two, four or eight activation rows per super-block, through `smmla`.
//!
//! Each weight row pair's super-block is decoded once ([`KBlock::quants`], the `sdot` level's
//! decode) and its 16-value groups interleaved by 8 bytes (`zip1`/`zip2` on 64-bit lanes, as in
//! [`super::mmla`]); each activation pair's groups likewise, once per tile of activation rows into
//! a copy every weight pair reads ([`zip_pairs`]). Two `smmla` per group then give the
//! four products `w_i · x_j` in the four lanes of one vector `[w0·x0, w0·x1, w1·x0, w1·x1]`, so a
//! unit's (16-value group's, or for `Q4_K`/`Q5_K` 32-value sub-block's) sums are scaled with one
//! `mla` by `[s0, s0, s1, s1]` (built from the two rows' scale vectors with `zip`s) and the
//! super-block's `Σ_u sc_u Σ q·x` of all four outputs is one exact integer vector, as the `sdot`
//! kernel's per-row sum is. The minimums' `Σ_g m_g·bsum_g` are exact integers too, and the float
//! steps are the scalar reference's in its order, lane by lane (`fmul` then `fadd`, never fused),
//! so every output is bitwise equal to the other levels' and to `scalar::vec_dot`.
//!
//! Weight rows or activation rows left over from the pairs go through the `sdot` kernel.

use std::arch::aarch64::*;
use std::ops::Range;

use super::kquants::{self, ActK, KBlock, PackedK, VScales};
use super::mmla::{smmla, zip};
use super::ops::{Sdot, load_i8, load_i16};
use super::{KQuant, Rows};
use crate::gemm::Gemm;

/// The unit scales of weight rows 0 and 1 as `[s0, s0, s1, s1]` per unit (16 units; the first
/// 8 where [`KBlock::PAIRS`]).
#[inline(always)]
unsafe fn pair_scales<B: KBlock>(s0: &VScales, s1: &VScales) -> [int32x4_t; 16] {
    let mut out = [unsafe { vdupq_n_s32(0) }; 16];
    let n = if B::PAIRS { 2 } else { 4 };
    for c in 0..n {
        // SAFETY: register operations only.
        unsafe {
            let t = vzip1q_s32(s0.sc[c], s1.sc[c]);
            let u = vzip2q_s32(s0.sc[c], s1.sc[c]);
            out[4 * c] = vzip1q_s32(t, t);
            out[4 * c + 1] = vzip2q_s32(t, t);
            out[4 * c + 2] = vzip1q_s32(u, u);
            out[4 * c + 3] = vzip2q_s32(u, u);
        }
    }
    out
}

/// `Σ_g m_g · bsum_g` for weight rows 0, 1 (minimums `m0`, `m1`) and activation rows 0, 1 (sums
/// at `b0`, `b1`), as `[w0·x0, w0·x1, w1·x0, w1·x1]`: exact. Where [`KBlock::PAIRS`] each
/// minimum covers two groups, so the sums are added in pairs first (at most 2·16·128, an `i16`).
#[inline(always)]
unsafe fn min4<B: KBlock>(
    m0: &[int16x8_t; 2],
    m1: &[int16x8_t; 2],
    b: [*const u8; 2],
) -> int32x4_t {
    // SAFETY: 16 sums per activation block (the caller's guarantee); registers otherwise.
    unsafe {
        let xs = b.map(|p| [load_i16(p), load_i16(p.add(16))]);
        if B::PAIRS {
            let (m0, m1) = (vuzp1q_s16(m0[0], m0[1]), vuzp1q_s16(m1[0], m1[1]));
            let [x0, x1] = xs.map(|[lo, hi]| vpaddq_s16(lo, hi));
            let dot = |m: int16x8_t, x: int16x8_t| {
                vmlal_high_s16(vmull_s16(vget_low_s16(m), vget_low_s16(x)), m, x)
            };
            vpaddq_s32(
                vpaddq_s32(dot(m0, x0), dot(m0, x1)),
                vpaddq_s32(dot(m1, x0), dot(m1, x1)),
            )
        } else {
            let dot = |m: &[int16x8_t; 2], x: &[int16x8_t; 2]| {
                let acc = vmull_s16(vget_low_s16(m[0]), vget_low_s16(x[0]));
                let acc = vmlal_high_s16(acc, m[0], x[0]);
                let acc = vmlal_s16(acc, vget_low_s16(m[1]), vget_low_s16(x[1]));
                vmlal_high_s16(acc, m[1], x[1])
            };
            vpaddq_s32(
                vpaddq_s32(dot(m0, &xs[0]), dot(m0, &xs[1])),
                vpaddq_s32(dot(m1, &xs[0]), dot(m1, &xs[1])),
            )
        }
    }
}

/// `[a, a, b, b]`.
#[inline(always)]
fn f2(a: f32, b: f32) -> float32x4_t {
    // SAFETY: register operations only.
    unsafe { vcombine_f32(vdup_n_f32(a), vdup_n_f32(b)) }
}

/// Bytes of one activation pair's super-block in a tile's interleaved copy ([`zip_pairs`]): each
/// 16-value group's two rows interleaved by 8 bytes, as `smmla` takes them (32 bytes a group).
const ZIPPED: usize = 2 * 256;

/// The interleaved copy of a tile's activation pairs: pair `q` is rows `r0 + 2q`, `r0 + 2q + 1`;
/// its super-block `b` starts at `(q * nb + b) * ZIPPED`, group `g`'s low and high halves
/// (`zip1`, `zip2`) at `32 g` and `32 g + 16` from there. Made once per tile, so every weight pair
/// reads the same interleaved activations instead of interleaving them again.
///
/// # Safety
/// Rows `r0..r0 + 2 pairs` must exist with `nb` super-blocks each; NEON only.
#[inline(always)]
unsafe fn zip_pairs(
    out: &mut Vec<u8>,
    nb: usize,
    r0: usize,
    pairs: usize,
    packed: &impl Fn(usize) -> PackedK,
) {
    out.clear();
    out.resize(pairs * nb * ZIPPED, 0);
    for q in 0..pairs {
        let (x0, x1) = (packed(r0 + 2 * q), packed(r0 + 2 * q + 1));
        for b in 0..nb {
            // SAFETY: block `b` of both rows (the caller's guarantee); the stores stay within
            // `out`, sized above.
            unsafe {
                let (p0, p1) = (x0.qs(b), x1.qs(b));
                let dst = out.as_mut_ptr().add((q * nb + b) * ZIPPED);
                for g in 0..16 {
                    let (xl, xh) = zip(load_i8(p0.add(16 * g)), load_i8(p1.add(16 * g)));
                    vst1q_s8(dst.add(32 * g).cast(), xl);
                    vst1q_s8(dst.add(32 * g + 16).cast(), xh);
                }
            }
        }
    }
}

/// Weight rows `w[0]`, `w[1]` (`nb` super-blocks each) · the `P` activation pairs `a`, whose
/// interleaved quants start at `z[p]` ([`zip_pairs`]): lane `2 i + j` of `out[p]` is weight row
/// `i` · activation row `a[p][j]`.
///
/// # Safety
/// Every row must hold `nb` whole super-blocks, every `z[p]` `nb` interleaved ones; the CPU must
/// have `i8mm`.
#[inline(always)]
unsafe fn dot2xp<B: KBlock, A: ActK, const P: usize>(
    nb: usize,
    w: [*const u8; 2],
    a: [[A; 2]; P],
    z: [*const u8; P],
) -> [float32x4_t; P] {
    let mut sum = [unsafe { vdupq_n_f32(0.0) }; P];
    let (units, per) = if B::PAIRS { (8, 2) } else { (16, 1) };
    for b in 0..nb {
        // SAFETY: super-block `b` of every row (the caller's guarantee).
        unsafe {
            let (w0, w1) = (w[0].add(b * B::BYTES), w[1].add(b * B::BYTES));
            let (q0, q1) = (B::quants(w0), B::quants(w1));
            let (s0, s1) = (B::vscales(w0), B::vscales(w1));
            let sc = pair_scales::<B>(&s0, &s1);
            let x = z.map(|z| z.add(b * ZIPPED));
            let mut acc = [vdupq_n_s32(0); P];
            for (u, &scu) in sc.iter().enumerate().take(units) {
                let wz: [_; 2] = std::array::from_fn(|i| {
                    let g = per * u + i.min(per - 1);
                    zip(q0[g], q1[g])
                });
                for (acc, xz) in acc.iter_mut().zip(x) {
                    let mut t = vdupq_n_s32(0);
                    for (i, &(wl, wh)) in wz.iter().enumerate().take(per) {
                        let g = per * u + i;
                        let (xl, xh) = (load_i8(xz.add(32 * g)), load_i8(xz.add(32 * g + 16)));
                        t = smmla(smmla(t, wl, xl), wh, xh);
                    }
                    *acc = vmlaq_s32(*acc, t, scu);
                }
            }
            let (dw, dmw) = (f2(s0.d, s1.d), f2(s0.dmin, s1.dmin));
            for p in 0..P {
                let [x0, x1] = a[p];
                let dx = vcombine_f32(
                    vset_lane_f32::<1>(x1.d(b), vdup_n_f32(x0.d(b))),
                    vset_lane_f32::<1>(x1.d(b), vdup_n_f32(x0.d(b))),
                );
                sum[p] = vaddq_f32(sum[p], vmulq_f32(vmulq_f32(dw, dx), vcvtq_f32_s32(acc[p])));
                if B::MIN {
                    let summ = min4::<B>(&s0.m, &s1.m, [x0.bsums(b), x1.bsums(b)]);
                    let dm = vmulq_f32(dmw, dx);
                    sum[p] = vsubq_f32(sum[p], vmulq_f32(dm, vcvtq_f32_s32(summ)));
                }
            }
        }
    }
    sum
}

/// Weight rows `j`, `j + 1` of `g` · its activation rows `r..r + 2P` through [`dot2xp`], stored;
/// `zipped` is the tile's interleaved copy ([`zip_pairs`]) whose first pair is row `r0`.
///
/// # Safety
/// As [`gemm_rows`]; the rows must exist, and `zipped` must hold rows `r..r + 2P`.
#[inline(always)]
unsafe fn pairs<B: KBlock, const P: usize>(
    g: &Gemm<'_>,
    (j, r, r0): (usize, usize, usize),
    packed: &impl Fn(usize) -> PackedK,
    zipped: &[u8],
) {
    let nb = g.x.nb();
    let w = [g.weight_row(j).as_ptr(), g.weight_row(j + 1).as_ptr()];
    let a: [[PackedK; 2]; P] = std::array::from_fn(|p| [packed(r + 2 * p), packed(r + 2 * p + 1)]);
    let z: [*const u8; P] =
        std::array::from_fn(|p| zipped[((r - r0) / 2 + p) * nb * ZIPPED..].as_ptr());
    // SAFETY: two complete weight rows, 2P activation rows and their interleaved copy (the
    // caller's guarantee).
    let v = unsafe { dot2xp::<B, _, P>(nb, w, a, z) };
    for (p, v) in v.into_iter().enumerate() {
        let mut o = [0f32; 4];
        // SAFETY: a 4-float store into a local array.
        unsafe { vst1q_f32(o.as_mut_ptr(), v) };
        let r = r + 2 * p;
        g.store(r, j, o[0]);
        g.store(r + 1, j, o[1]);
        g.store(r, j + 1, o[2]);
        g.store(r + 1, j + 1, o[3]);
    }
}

/// Weight rows `rows` of `g` (a K-quant `B`) against all its activation rows: pairs of weight
/// rows × eight (then four, then two) activation rows through [`dot2xp`], a last weight row and a
/// last activation row through the `sdot` kernel, over tiles of `tile` activation rows (a
/// multiple of 8).
///
/// # Safety
/// The operands of `g` must have been checked (`Gemm::check_ggml`) and the CPU must have
/// `dotprod` and `i8mm`.
#[inline(always)]
pub(super) unsafe fn gemm_rows<B: KBlock>(
    g: &Gemm<'_>,
    rows: Range<usize>,
    tile: usize,
    packed: impl Fn(usize) -> PackedK,
) {
    let (nb, m) = (g.x.nb(), g.m);
    let one = |j: usize, r: usize| {
        let w = g.weight_row(j).as_ptr();
        // SAFETY: one complete weight row and activation row (the caller's guarantee).
        g.store(r, j, unsafe {
            kquants::dotn::<B, Sdot, _, 1>(nb, w, [packed(r)])[0]
        });
    };
    let mut zipped = Vec::new();
    let mut r0 = 0;
    while r0 < m {
        let r1 = (r0 + tile).min(m);
        let mut j = rows.start;
        if j + 2 <= rows.end {
            // SAFETY: the tile's rows exist (the caller's guarantee).
            unsafe { zip_pairs(&mut zipped, nb, r0, (r1 - r0) / 2, &packed) };
        }
        while j + 2 <= rows.end {
            let mut r = r0;
            // SAFETY (the three): the rows exist and are interleaved; the caller's guarantees.
            while r + 8 <= r1 {
                unsafe { pairs::<B, 4>(g, (j, r, r0), &packed, &zipped) };
                r += 8;
            }
            if r + 4 <= r1 {
                unsafe { pairs::<B, 2>(g, (j, r, r0), &packed, &zipped) };
                r += 4;
            }
            if r + 2 <= r1 {
                unsafe { pairs::<B, 1>(g, (j, r, r0), &packed, &zipped) };
                r += 2;
            }
            if r < r1 {
                one(j, r);
                one(j + 1, r);
            }
            j += 2;
        }
        if j < rows.end {
            // The last weight row: four activation rows at a time (`r` a multiple of 4, as the
            // packed scales' groups need), then one by one.
            let w = g.weight_row(j).as_ptr();
            let mut r = r0;
            while r + 4 <= r1 {
                // SAFETY: see the `Rows` impl of `KQuant`.
                let v = unsafe { KQuant::<B, Sdot>::dot4(nb, w, g.x, r) };
                for (i, &o) in v.iter().enumerate() {
                    g.store(r + i, j, o);
                }
                r += 4;
            }
            (r..r1).for_each(|r| one(j, r));
        }
        r0 = r1;
    }
}
