//! AVX-512 VNNI batched kernel of the 256-value IQ formats: 16 weight rows in the 16 lanes.
//!
//! The one-row kernels (`iq`, `iq512`) multiply a weight row by an activation row with the
//! values along the vector and reduce each super-block's sum across the lanes; for a batch of
//! activation rows that reduction and the grid decode (scalar table loads) are paid once per
//! (weight row, activation row) pair or, in the tiles of `iq::iq_dot_rows`, per weight row.
//! Here a group of 16 weight rows' super-block is decoded once (with the formats' own
//! [`IqSuper::chunk`]) into a small scratch, each value as the unsigned byte `q + 128`, laid out
//! as `k512` lays out `Q4_K` (vector `i` of chunk `c`: lane `L` holds values `32 c + 4 i .. + 4`
//! of row `L`), so one `vpdpbusd` multiplies 4 values of 16 rows by 4 broadcast activation bytes
//! and every lane ends with its row's sum, never reduced across lanes. The decode is then paid
//! once per 16 rows and super-block for all activation rows.
//!
//! Exactness: per 16 values with scale `s`, `Σ (q + 128) · x − 128 · Σ x = Σ q · x`, where `Σ x`
//! is the activations' sum of 16 quants (`Q8_K`'s `bsums`); the scales multiply the lanes'
//! `i32` sums (`vpmulld`) and the offsets' term `Σ s · Σ x` is one `vpdpwssd` per 32 values (the
//! two 16-value scales of a chunk against the two sums, as `i16` pairs). All of it is integer
//! arithmetic, equal (modulo 2³², as the scalar `i32` sum) to `scalar::dot_iq`'s `Σ s · Σ q · x`;
//! then per super-block the same float steps, `acc + (d · d_x) · Σ` (a multiply, a multiply, an
//! add, no fusing), so every output is bitwise equal to the scalar and one-row kernels'.

use std::arch::x86_64::*;
use std::ops::Range;

use super::iq::{Iq1M, Iq1S, Iq2S, Iq2Xs, Iq2Xxs, Iq3S, Iq3Xxs, Iq4Xs, IqSuper};
use super::kquants::{ActRowK, PackedK};
use crate::format::{GROUP, QK_K};
use crate::gemm::Gemm;
use crate::iq::grids::{IQ3S_GRID, KVALUES_IQ4NL};

/// Activation rows multiplied per pass over a decoded super-block (two accumulators each stay in
/// registers with the weight vector).
const TILE: usize = 8;

/// One group of 16 rows' super-block, decoded.
#[repr(C, align(64))]
pub(crate) struct Decoded {
    /// `q + 128` of the 256 values of 16 rows: vector `8 c + i` holds values `32 c + 4 i .. + 4`
    /// of row `L` in lane `L`.
    q: [__m512i; QK_K / 4],
    /// Per 32 values `c`, lane `L`: row `L`'s scales of values `32 c .. + 16` (low `i16`) and
    /// `32 c + 16 .. + 32` (high `i16`).
    sc: [[i32; GROUP]; QK_K / 32],
    /// Each row's `d` (times the format's factor).
    d: [f32; GROUP],
}

/// Transposes 16 rows of 8 dwords (`lo[L]` = row `L`, `hi[L]` = row `L + 8`) into 8 vectors:
/// `out[i]` lane `L` = dword `i` of row `L`.
#[inline(always)]
unsafe fn transpose16x8(lo: &[__m256i; 8], hi: &[__m256i; 8], out: *mut __m512i) {
    // Plain loops, not `map`: a closure is not compiled with the caller's target features.
    unsafe {
        let mut z = [_mm512_setzero_si512(); 8];
        for l in 0..8 {
            z[l] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo[l]), hi[l]);
        }
        // Within each 128-bit lane (rows L and L + 8 in the two 256-bit halves): pairs, quads.
        let mut t = [(z[0], z[0]); 4];
        for p in 0..4 {
            t[p] = (
                _mm512_unpacklo_epi32(z[2 * p], z[2 * p + 1]),
                _mm512_unpackhi_epi32(z[2 * p], z[2 * p + 1]),
            );
        }
        // s[h][j]: rows 4 h .. 4 h + 4 (and + 8) of dwords j (128-bit lanes 0, 2) and j + 4 (1, 3).
        let mut s = [[z[0]; 4]; 2];
        for h in 0..2 {
            let (a, b) = (t[2 * h], t[2 * h + 1]);
            s[h] = [
                _mm512_unpacklo_epi64(a.0, b.0),
                _mm512_unpackhi_epi64(a.0, b.0),
                _mm512_unpacklo_epi64(a.1, b.1),
                _mm512_unpackhi_epi64(a.1, b.1),
            ];
        }
        let even = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
        let odd = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
        for (j, (&a, &b)) in s[0].iter().zip(&s[1]).enumerate() {
            out.add(j).write(_mm512_permutex2var_epi64(a, even, b));
            out.add(j + 4).write(_mm512_permutex2var_epi64(a, odd, b));
        }
    }
}

/// A 256-value IQ format's decode of 16 rows' super-block into [`Decoded`].
pub(crate) trait IqLanes: IqSuper {
    /// Whether the two 16-value halves of a chunk have their own scales (else one scale per 32
    /// values, applied once to the chunk's sum).
    const SPLIT: bool = false;
    /// Decodes super-block `b` of the 16 rows at `w[L]` into `dst`: by default each row's
    /// [`IqSuper::chunk`]s, transposed 16 rows at a time.
    #[inline(always)]
    unsafe fn decode(w: &[*const u8; GROUP], b: usize, dst: &mut Decoded) {
        unsafe {
            let flip = _mm256_set1_epi8(-128);
            for (l, &wl) in w.iter().enumerate() {
                dst.d[l] = Self::d(wl.add(b * Self::BYTES));
            }
            for c in 0..QK_K / 32 {
                let z = _mm256_setzero_si256();
                let (mut lo, mut hi) = ([z; 8], [z; 8]);
                for (l, &wl) in w.iter().enumerate() {
                    let wb = wl.add(b * Self::BYTES);
                    let (aq, sg, sc) = Self::chunk(wb, c);
                    let v = _mm256_xor_si256(_mm256_sign_epi8(aq, sg), flip);
                    if l < 8 {
                        lo[l] = v;
                    } else {
                        hi[l - 8] = v;
                    }
                    let s0 = _mm256_extract_epi16::<0>(sc) as u32 & 0xFFFF;
                    let s1 = _mm256_extract_epi16::<8>(sc) as u32;
                    dst.sc[c][l] = (s0 | (s1 << 16)) as i32;
                }
                transpose16x8(&lo, &hi, dst.q.as_mut_ptr().add(8 * c));
            }
        }
    }
}

impl IqLanes for Iq3Xxs {}
impl IqLanes for Iq2Xxs {}
impl IqLanes for Iq2Xs {
    const SPLIT: bool = true;
}
impl IqLanes for Iq2S {
    const SPLIT: bool = true;
}
impl IqLanes for Iq1S {}
impl IqLanes for Iq1M {
    const SPLIT: bool = true;
}

/// The 32 values of a 16-byte nibble block (low nibbles: values `0..16`, high: `16..32`) of each
/// of 16 rows (`p[L]`: row `L`'s nibble bytes), looked up in `table` (a 16-byte table in every
/// 128-bit lane): `out[i]` lane `L` = values `4 i .. + 4` of row `L` (`i` < 8).
#[inline(always)]
pub(super) unsafe fn nibble_lanes(p: &[*const u8; GROUP], table: __m512i, out: &mut [__m512i]) {
    unsafe {
        // z[a], 128-bit lane k: the 16 nibble bytes of row 4 k + a.
        let mut z = [_mm512_setzero_si512(); 4];
        for (a, za) in z.iter_mut().enumerate() {
            let v = _mm512_castsi128_si512(_mm_loadu_si128(p[a].cast()));
            let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(p[4 + a].cast()));
            let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(p[8 + a].cast()));
            *za = _mm512_inserti32x4::<3>(v, _mm_loadu_si128(p[12 + a].cast()));
        }
        let (t0, t1) = (
            _mm512_unpacklo_epi32(z[0], z[1]),
            _mm512_unpackhi_epi32(z[0], z[1]),
        );
        let (t2, t3) = (
            _mm512_unpacklo_epi32(z[2], z[3]),
            _mm512_unpackhi_epi32(z[2], z[3]),
        );
        let n = [
            _mm512_unpacklo_epi64(t0, t2),
            _mm512_unpackhi_epi64(t0, t2),
            _mm512_unpacklo_epi64(t1, t3),
            _mm512_unpackhi_epi64(t1, t3),
        ];
        let m = _mm512_set1_epi8(0x0F);
        for (j, &nj) in n.iter().enumerate() {
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(nj), m);
            out[j] = _mm512_shuffle_epi8(table, _mm512_and_si512(nj, m));
            out[4 + j] = _mm512_shuffle_epi8(table, hi);
        }
    }
}

/// `IQ4_XS` decodes 16 rows at once: the nibbles of a chunk are 4 dwords per row, transposed
/// with one 4 × 4 step per 128-bit lane and looked up with `vpshufb` (the table already offset
/// by 128); `d` and the 6-bit scales are computed in the 16 lanes.
impl IqLanes for Iq4Xs {
    #[inline(always)]
    unsafe fn decode(w: &[*const u8; GROUP], b: usize, dst: &mut Decoded) {
        unsafe {
            let wb: [*const u8; GROUP] = std::array::from_fn(|l| w[l].add(b * Self::BYTES));
            // Bytes 0..8 of each row: d (f16), scales_h (u16), scales_l (u32).
            let mut hdr = [0u64; GROUP];
            for l in 0..GROUP {
                hdr[l] = wb[l].cast::<u64>().read_unaligned();
            }
            let (h0, h1) = (
                _mm512_loadu_si512(hdr.as_ptr().cast()),
                _mm512_loadu_si512(hdr.as_ptr().add(8).cast()),
            );
            let lo32 = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm512_cvtepi64_epi32(h0)),
                _mm512_cvtepi64_epi32(h1),
            );
            let sl = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm512_cvtepi64_epi32(_mm512_srli_epi64::<32>(h0))),
                _mm512_cvtepi64_epi32(_mm512_srli_epi64::<32>(h1)),
            );
            let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(lo32));
            _mm512_storeu_ps(dst.d.as_mut_ptr(), d);
            let sh = _mm512_srli_epi32::<16>(lo32);
            let table = _mm512_xor_si512(
                _mm512_broadcast_i32x4(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast())),
                _mm512_set1_epi8(-128),
            );
            let (m4, m2) = (_mm512_set1_epi32(0x0F), _mm512_set1_epi32(3));
            for c in 0..QK_K / 32 {
                let shift_l = _mm512_set1_epi32(4 * c as i32);
                let shift_h = _mm512_set1_epi32(2 * c as i32);
                let ls = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srlv_epi32(sl, shift_l), m4),
                    _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srlv_epi32(sh, shift_h), m2)),
                );
                let sc = _mm512_sub_epi32(ls, _mm512_set1_epi32(32));
                let sc = _mm512_or_si512(
                    _mm512_and_si512(sc, _mm512_set1_epi32(0xFFFF)),
                    _mm512_slli_epi32::<16>(sc),
                );
                _mm512_storeu_si512(dst.sc[c].as_mut_ptr().cast(), sc);
                let nib: [*const u8; GROUP] = std::array::from_fn(|l| wb[l].add(8 + 16 * c));
                nibble_lanes(&nib, table, &mut dst.q[8 * c..8 * c + 8]);
            }
        }
    }
}

/// `T` activation rows `a` against the decoded super-block `dw` (block `b` of the rows):
/// `acc[t] += (d · d_x) · Σ` per lane.
#[inline(always)]
unsafe fn tile<B: IqLanes, const T: usize>(
    dw: &Decoded,
    b: usize,
    a: &[PackedK],
    acc: &mut [__m512],
) {
    unsafe {
        let mut isum = [_mm512_setzero_si512(); T];
        // The offsets' term: Σ over 16-value groups of scale · (sum of the 16 activations).
        for c in 0..QK_K / 32 {
            let s2 = _mm512_loadu_si512(dw.sc[c].as_ptr().cast());
            for t in 0..T {
                let bs = a[t].sums(b).add(2 * c).cast::<i32>().read_unaligned();
                isum[t] = _mm512_dpwssd_epi32(isum[t], s2, _mm512_set1_epi32(bs));
            }
        }
        for s in isum.iter_mut() {
            *s = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(*s));
        }
        for c in 0..QK_K / 32 {
            let s2 = _mm512_loadu_si512(dw.sc[c].as_ptr().cast());
            let scales = [
                _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(s2)),
                _mm512_srai_epi32::<16>(s2),
            ];
            // One sum and scale per 16 values, or (one scale per chunk) per 32.
            let (parts, len) = if B::SPLIT { (2, 4) } else { (1, 8) };
            for (h, &sc) in scales.iter().enumerate().take(parts) {
                let mut dp = [_mm512_setzero_si512(); T];
                for i in 0..len {
                    let q = dw.q[8 * c + 4 * h + i];
                    for t in 0..T {
                        let x = a[t].qs(b).add(32 * c + 16 * h + 4 * i);
                        let x = _mm512_set1_epi32(x.cast::<i32>().read_unaligned());
                        dp[t] = _mm512_dpbusd_epi32(dp[t], q, x);
                    }
                }
                for t in 0..T {
                    isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dp[t], sc));
                }
            }
        }
        let d = _mm512_loadu_ps(dw.d.as_ptr());
        for t in 0..T {
            let dd = _mm512_mul_ps(d, _mm512_set1_ps(a[t].d(b)));
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(dd, _mm512_cvtepi32_ps(isum[t])));
        }
    }
}

/// Weight rows `rows` (GGUF rows of format `B`) against all activation rows of `g`, 16 weight
/// rows at a time (the last group of fewer rows repeats its last row; only real rows are
/// stored).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VNNI and AVX2; `g` holds `B`'s rows with `g.x.nb()` super-blocks each
/// and `Q8_K` activations (the caller checked the operands).
#[inline(always)]
pub(crate) unsafe fn gemm_iq_tile<B: IqLanes>(g: &Gemm<'_>, rows: Range<usize>) {
    let (nb, m) = (g.x.nb(), g.m);
    if rows.is_empty() {
        return;
    }
    let acts: Vec<PackedK> = (0..m).map(|r| super::packed_k(g.x, r)).collect();
    let mut acc = vec![unsafe { _mm512_setzero_ps() }; m];
    // SAFETY: an all-zero `Decoded` is valid (integers and floats).
    let mut dw: Decoded = unsafe { std::mem::zeroed() };
    let mut j0 = rows.start;
    while j0 < rows.end {
        let w: [*const u8; GROUP] =
            std::array::from_fn(|l| g.weight_row((j0 + l).min(rows.end - 1)).as_ptr());
        let next = g.w.as_ptr().wrapping_add((j0 + GROUP) * g.w_row_bytes);
        acc.fill(unsafe { _mm512_setzero_ps() });
        for b in 0..nb {
            // SAFETY: each row holds `nb` super-blocks; the activation rows hold `nb` blocks with
            // their sums and scales; prefetching touches no memory.
            unsafe {
                // The next group's rows (contiguous: 16 rows of `nb` blocks), an nb-th of
                // them per super-block, so they arrive while this group is multiplied.
                let mut o = 0;
                while o < GROUP * B::BYTES {
                    let at = next.wrapping_add(b * GROUP * B::BYTES + o);
                    _mm_prefetch::<_MM_HINT_T0>(at.cast());
                    o += 64;
                }
                B::decode(&w, b, &mut dw);
                let mut r = 0;
                while r < m {
                    let left = m - r;
                    let (a, o) = (&acts[r..], &mut acc[r..]);
                    r += if left >= TILE {
                        tile::<B, TILE>(&dw, b, a, o);
                        TILE
                    } else if left >= 4 {
                        tile::<B, 4>(&dw, b, a, o);
                        4
                    } else if left >= 2 {
                        tile::<B, 2>(&dw, b, a, o);
                        2
                    } else {
                        tile::<B, 1>(&dw, b, a, o);
                        1
                    };
                }
            }
        }
        let real = (rows.end - j0).min(GROUP);
        for (r, a) in acc.iter().enumerate() {
            let mut v = [0f32; GROUP];
            // SAFETY: `v` holds 16 floats.
            unsafe { _mm512_storeu_ps(v.as_mut_ptr(), *a) };
            g.store_first(r, j0, real, &v);
        }
        j0 += GROUP;
    }
}

/// `IQ3_S` with AVX-512 VBMI and BITALG: 16 rows' grid indices built in the lanes (`vpermt2b`
/// picks each row's index byte, the ninth bit comes from its `qh` byte), their grid rows fetched
/// with one `vpgatherdd` per 4 values of the 16 rows (already in the lane layout, no transpose),
/// and the signs applied under a mask `vpshufbitqmb` takes from the rows' sign words.
pub(crate) struct Iq3SGather;

impl IqSuper for Iq3SGather {
    const BYTES: usize = Iq3S::BYTES;
    const FACTOR: f32 = Iq3S::FACTOR;
    #[inline(always)]
    unsafe fn chunk(wb: *const u8, c: usize) -> (__m256i, __m256i, __m256i) {
        unsafe { Iq3S::chunk(wb, c) }
    }
}

impl IqLanes for Iq3S {}

impl IqLanes for Iq3SGather {
    #[inline(always)]
    unsafe fn decode(w: &[*const u8; GROUP], b: usize, dst: &mut Decoded) {
        unsafe {
            let base = w[0].add(b * Self::BYTES);
            let mut offs = [0i32; GROUP];
            for l in 0..GROUP {
                offs[l] = w[l].offset_from(w[0]) as i32;
            }
            let off = _mm512_loadu_si512(offs.as_ptr().cast());
            let (off_lo, off_hi) = (
                _mm512_castsi512_si256(off),
                _mm512_extracti64x4_epi64::<1>(off),
            );
            let dv = _mm512_i32gather_epi32::<1>(off, base.cast());
            _mm512_storeu_ps(
                dst.d.as_mut_ptr(),
                _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dv)),
            );
            let sv = _mm512_i32gather_epi32::<1>(off, base.add(106).cast());
            let qh0 = _mm512_i32gather_epi64::<1>(off_lo, base.add(66).cast());
            let qh1 = _mm512_i32gather_epi64::<1>(off_hi, base.add(66).cast());
            // Byte 0 of dword lane L: 8 L, the index of row L's first byte in a pair of
            // registers holding 8 bytes of each of the 16 rows.
            let pick = _mm512_setr_epi32(
                0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120,
            );
            const LOW_BYTES: u64 = 0x1111_1111_1111_1111;
            let (x80, bit8) = (_mm512_set1_epi8(-128), _mm512_set1_epi32(0x100));
            for c in 0..QK_K / 32 {
                let qhc = _mm512_maskz_permutex2var_epi8(
                    LOW_BYTES,
                    qh0,
                    _mm512_add_epi8(pick, _mm512_set1_epi8(c as i8)),
                    qh1,
                );
                let q0 = _mm512_i32gather_epi64::<1>(off_lo, base.add(2 + 8 * c).cast());
                let q1 = _mm512_i32gather_epi64::<1>(off_hi, base.add(2 + 8 * c).cast());
                let sg = _mm512_i32gather_epi32::<1>(off, base.add(74 + 4 * c).cast());
                let ls = _mm512_and_si512(
                    _mm512_srlv_epi32(sv, _mm512_set1_epi32(4 * c as i32)),
                    _mm512_set1_epi32(0x0F),
                );
                let sc = _mm512_add_epi32(_mm512_slli_epi32::<1>(ls), _mm512_set1_epi32(1));
                let sc = _mm512_or_si512(sc, _mm512_slli_epi32::<16>(sc));
                _mm512_storeu_si512(dst.sc[c].as_mut_ptr().cast(), sc);
                for i in 0..8 {
                    let lo = _mm512_maskz_permutex2var_epi8(
                        LOW_BYTES,
                        q0,
                        _mm512_add_epi8(pick, _mm512_set1_epi8(i as i8)),
                        q1,
                    );
                    let hb = _mm512_and_si512(
                        _mm512_sllv_epi32(qhc, _mm512_set1_epi32(8 - i as i32)),
                        bit8,
                    );
                    let idx = _mm512_or_si512(lo, hb);
                    let g = _mm512_i32gather_epi32::<4>(idx, IQ3S_GRID.as_ptr().cast());
                    // Mask bit 4 L + k: bit 4 i + k of row L's sign word (rows 2 q and 2 q + 1
                    // are the low and high halves of qword q).
                    let j = 4 * i as u64;
                    let sel = (j | (j + 1) << 8 | (j + 2) << 16 | (j + 3) << 24)
                        | ((j + 32) | (j + 33) << 8 | (j + 34) << 16 | (j + 35) << 24) << 32;
                    let neg = _mm512_bitshuffle_epi64_mask(sg, _mm512_set1_epi64(sel as i64));
                    dst.q[8 * c + i] = _mm512_mask_sub_epi8(_mm512_add_epi8(g, x80), neg, x80, g);
                }
            }
        }
    }
}
