//! AVX-512 VNNI batched kernel of the 32-value IQ formats (`IQ4_NL`, `MXFP4`): 16 weight rows in
//! the 16 lanes.
//!
//! The one-row kernels (`kernels::sym_dot1`, `iq512::sym_dotn`) multiply a weight block by an
//! activation block along the vector: eight `i32` lanes of 4 values each, converted to float and
//! accumulated with one FMA per lane and block, `acc = fma(d_w·d_x, Σ, acc)`, in two accumulators
//! (even and odd blocks) summed at the end (`kernels::finish`). Every (weight row, activation
//! row) pair pays the nibble lookup and the sign trick again.
//!
//! Here a group of 16 GGUF weight rows is decoded once per call into a scratch ([`decode`]): per
//! block, 8 vectors whose lane `L` holds values `4 i .. + 4` of row `L` as the unsigned bytes
//! `q + 128` (the nibble transposition `iqtile` uses for `IQ4_XS`), and the 16 rows' `d`. Each
//! activation row then takes, per block and lane `i`, one `vpdpbusd` of those bytes with its 4
//! broadcast activation bytes, started from `-128 · Σ` of those 4 activations ([`offsets`]), so
//! the lane ends with exactly the integer `Σ q · x` of the one-row kernels' lane `i`, for 16
//! rows at once; the same conversion and FMA follow in 16 accumulators (8 lanes × even / odd
//! block), summed in `kernels::hsum`'s order. So every output is bitwise the one-row kernels'.

use std::arch::x86_64::*;
use std::ops::Range;

use super::iq512::SymPair;
use super::iqtile::nibble_lanes;
use crate::format::{GROUP, QK};
use crate::gemm::Gemm;

/// `-128 ·` the sum of each 4 consecutive activation quants of the rows of `g` (`k / 4` per
/// row): the start of each lane's `vpdpbusd`, which adds `(q + 128) · x`.
#[inline(always)]
unsafe fn offsets(g: &Gemm<'_>) -> Vec<i32> {
    let k = g.k;
    let mut out = vec![0i32; g.m * k / 4];
    // SAFETY (all): each activation row holds `k` quants (a multiple of 32; 64 read at a time,
    // the last 32 alone), `out` `k / 4` sums per row.
    unsafe {
        let ones = _mm512_set1_epi8(1);
        for (r, o) in out.chunks_exact_mut(k / 4).enumerate() {
            let x = g.x.q_row(r).as_ptr();
            let mut i = 0;
            while i < k {
                let v = if i + 64 <= k {
                    _mm512_loadu_si512(x.add(i).cast())
                } else {
                    _mm512_castsi256_si512(_mm256_loadu_si256(x.add(i).cast()))
                };
                let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, v);
                let s = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(s));
                if i + 64 <= k {
                    _mm512_storeu_si512(o.as_mut_ptr().add(i / 4).cast(), s);
                } else {
                    let s = _mm512_castsi512_si256(s);
                    _mm256_storeu_si256(o.as_mut_ptr().add(i / 4).cast(), s);
                }
                i += 64;
            }
        }
    }
    out
}

/// Decodes the `nb` blocks of the 16 rows `w[L]` into `q` (8 vectors per block) and `d` (one
/// vector of the rows' `d` per block), prefetching `next` (the following group's bytes).
#[inline(always)]
unsafe fn decode<B: SymPair>(
    w: &[*const u8; GROUP],
    nb: usize,
    next: *const u8,
    q: &mut [__m512i],
    d: &mut [__m512],
) {
    unsafe {
        let table = _mm512_xor_si512(
            _mm512_broadcast_i32x4(_mm_loadu_si128(B::TABLE.as_ptr().cast())),
            _mm512_set1_epi8(-128),
        );
        for b in 0..nb {
            let mut o = 0;
            while o < GROUP * B::BYTES {
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(b * GROUP * B::BYTES + o).cast());
                o += 64;
            }
            let wb: [*const u8; GROUP] = std::array::from_fn(|l| w[l].add(b * B::BYTES));
            let nib: [*const u8; GROUP] = std::array::from_fn(|l| wb[l].add(B::NIBBLES));
            nibble_lanes(&nib, table, &mut q[8 * b..8 * b + 8]);
            let mut dw = [0f32; GROUP];
            for (dl, &wl) in dw.iter_mut().zip(&wb) {
                *dl = _mm_cvtss_f32(B::d1(wl));
            }
            d[b] = _mm512_loadu_ps(dw.as_ptr());
        }
    }
}

/// Activation row `r` against the decoded group (`nb` blocks of `q`, `d`): the 16 rows' outputs.
#[inline(always)]
unsafe fn row(g: &Gemm<'_>, r: usize, offs: &[i32], q: &[__m512i], d: &[__m512]) -> __m512 {
    unsafe {
        let nb = g.x.nb();
        let x = g.x.q_row(r).as_ptr();
        let dx = g.x.sc_group(r / 4)[2 * (r % 4)..].as_ptr();
        let off = offs[r * g.k / 4..].as_ptr();
        // acc[2 i + p]: lane i, even (p = 0) or odd blocks.
        let mut acc = [_mm512_setzero_ps(); 16];
        for b in 0..nb {
            let dd = _mm512_mul_ps(d[b], _mm512_set1_ps(dx.add(8 * b).read()));
            let p = b % 2;
            for i in 0..8 {
                let c = _mm512_set1_epi32(off.add(8 * b + i).read());
                let xa = _mm512_set1_epi32(x.add(QK * b + 4 * i).cast::<i32>().read_unaligned());
                let s = _mm512_dpbusd_epi32(c, q[8 * b + i], xa);
                acc[2 * i + p] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(s), acc[2 * i + p]);
            }
        }
        // `finish`: lane i of both accumulators, then `hsum`'s ((0+4)+(2+6))+((1+5)+(3+7)).
        let mut t = [_mm512_setzero_ps(); 8];
        for (i, ti) in t.iter_mut().enumerate() {
            *ti = _mm512_add_ps(acc[2 * i], acc[2 * i + 1]);
        }
        let lo = _mm512_add_ps(_mm512_add_ps(t[0], t[4]), _mm512_add_ps(t[2], t[6]));
        let hi = _mm512_add_ps(_mm512_add_ps(t[1], t[5]), _mm512_add_ps(t[3], t[7]));
        _mm512_add_ps(lo, hi)
    }
}

/// Weight rows `rows` (GGUF rows of format `B`) against all activation rows of `g`, 16 weight
/// rows at a time (the last group of fewer rows repeats its last row; only real rows are
/// stored).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VNNI and AVX2; `g` holds `B`'s rows with `g.x.nb()` blocks each and
/// `Q8_0` activations (the caller checked the operands).
#[inline(always)]
pub(crate) unsafe fn gemm_sym_tile<B: SymPair>(g: &Gemm<'_>, rows: Range<usize>) {
    if rows.is_empty() {
        return;
    }
    let nb = g.x.nb();
    // SAFETY (all): as the caller guarantees; the scratch holds `nb` blocks.
    unsafe {
        let offs = offsets(g);
        let mut q = vec![_mm512_setzero_si512(); 8 * nb];
        let mut d = vec![_mm512_setzero_ps(); nb];
        let mut j0 = rows.start;
        while j0 < rows.end {
            let w: [*const u8; GROUP] =
                std::array::from_fn(|l| g.weight_row((j0 + l).min(rows.end - 1)).as_ptr());
            let next = g.w.as_ptr().wrapping_add((j0 + GROUP) * g.w_row_bytes);
            decode::<B>(&w, nb, next, &mut q, &mut d);
            let real = (rows.end - j0).min(GROUP);
            for r in 0..g.m {
                let mut v = [0f32; GROUP];
                _mm512_storeu_ps(v.as_mut_ptr(), row(g, r, &offs, &q, &d));
                g.store_first(r, j0, real, &v);
            }
            j0 += GROUP;
        }
    }
}
