//! AVX-512 kernels of the IQ formats on GGUF rows (the AVX-512 VNNI backend's path for
//! `IQ4_NL`, `IQ4_XS`, `IQ3_S`, `IQ2_S`, `IQ1_M`; the other IQ formats and `MXFP4` measured
//! faster with their 256-bit kernels there, see `x86::has_zmm_kernel`).
//!
//! - `IQ4_NL`: two 32-value blocks per 512-bit vector. The nibbles of both blocks become table
//!   values with one 512-bit `vpshufb`; their products with the activations are one `vpdpbusd`
//!   (`|q|` times the activations with `q`'s sign, applied by a masked subtraction: AVX-512 has
//!   no `vpsignb`); the even block's float step runs in the low 256 bits and the odd block's in
//!   the high 256, so the two halves are exactly the even and odd accumulators of the 256-bit
//!   kernels (`kernels::sym_dot1`) and the result is bitwise theirs.
//! - The 256-value formats: each pair of 32-value chunks ([`IqPair::pair`], from
//!   [`IqSuper::chunk`]; `IQ2_S`/`IQ3_S` read their sign bits as the 64-bit mask itself) is one
//!   512-bit vector, multiplied with `vpmaddubsw` and its scales with `vpdpwssd`, summing the
//!   same exact integers over the super-block as the 256-bit kernels; one float step per
//!   super-block as there, so every path is bitwise equal to the portable one.
//!
//! [`sym_dotn`] / [`iq_dotn`] multiply one or four activation rows with each weight block decoded
//! once; [`iq_dot_rows`] any number of rows (the batched tiles).

use std::arch::x86_64::*;

use super::iq::{Iq1M, Iq2S, Iq3S, Iq4Xs, IqSuper};
use super::kernels::{ActRow, SymBlock, finish, load256, prefetch_weights};
use super::kquants::ActRowK;
use crate::format::QK_K;

/// `lo` in the low 256 bits, `hi` in the high 256.
#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    unsafe { _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi) }
}

/// `x` with the sign of `q` (for the lanes where `|q|`, the other factor, is not 0).
#[inline(always)]
unsafe fn signed(x: __m512i, q_negative: __mmask64) -> __m512i {
    unsafe { _mm512_mask_sub_epi8(x, q_negative, _mm512_setzero_si512(), x) }
}

/// A 32-value format whose block gives 32 signed quants (`IQ4_NL`, `MXFP4`): the quants of two
/// blocks at once.
pub(crate) trait SymPair: SymBlock {
    /// The 16-entry table the nibbles index.
    const TABLE: &'static [i8; 16];
    /// Where the 16 nibble bytes start in a block.
    const NIBBLES: usize;
}

impl SymPair for super::iq::Iq4Nl {
    const TABLE: &'static [i8; 16] = &crate::iq::grids::KVALUES_IQ4NL;
    const NIBBLES: usize = 2;
}

impl SymPair for super::iq::Mxfp4 {
    const TABLE: &'static [i8; 16] = &crate::iq::grids::KVALUES_MXFP4;
    const NIBBLES: usize = 1;
}

/// The 64 signed quants of the blocks at `w0` (low 256 bits) and `w1` (high).
#[inline(always)]
unsafe fn sym_quants<B: SymPair>(w0: *const u8, w1: *const u8) -> __m512i {
    unsafe {
        let n0 = _mm_loadu_si128(w0.add(B::NIBBLES).cast());
        let n1 = _mm_loadu_si128(w1.add(B::NIBBLES).cast());
        let v = join(_mm256_set_m128i(n0, n0), _mm256_set_m128i(n1, n1));
        // Low nibbles in 128-bit lanes 0 and 2, high nibbles in lanes 1 and 3.
        let v = _mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
        let v = _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
        let t = _mm512_broadcast_i32x4(_mm_loadu_si128(B::TABLE.as_ptr().cast()));
        _mm512_shuffle_epi8(t, v)
    }
}

/// `d_w · d_x` of block `b`, as `kernels::sym_dot1` forms it.
#[inline(always)]
unsafe fn sym_scale<B: SymBlock, A: ActRow>(wb: *const u8, a: A, b: usize) -> f32 {
    unsafe { _mm_cvtss_f32(_mm_mul_ps(B::d1(wb), a.scales(b))) }
}

/// Symmetric 32-value weights (`nb` blocks at `w`) · `R` `Q8_0` activation rows, bitwise equal to
/// `kernels::sym_dot1` per row.
#[inline(always)]
pub(crate) unsafe fn sym_dotn<B: SymPair, A: ActRow, const R: usize>(
    nb: usize,
    w: *const u8,
    a: [A; R],
) -> [f32; R] {
    unsafe {
        let mut acc = [_mm512_setzero_ps(); R];
        let mut b = 0;
        while b < nb {
            // The last block of an odd count runs alone: its pair is itself, and only the low
            // (even) half takes the step.
            let b1 = if b + 1 < nb { b + 1 } else { b };
            let keep = if b1 > b { 0xFFFF } else { 0x00FF };
            let (w0, w1) = (w.add(b * B::BYTES), w.add(b1 * B::BYTES));
            prefetch_weights(w0);
            let qw = sym_quants::<B>(w0, w1);
            let (aw, neg) = (_mm512_abs_epi8(qw), _mm512_movepi8_mask(qw));
            for r in 0..R {
                let x = join(load256(a[r].qs(b)), load256(a[r].qs(b1)));
                let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), aw, signed(x, neg));
                let (p0, p1) = (
                    sym_scale::<B, A>(w0, a[r], b),
                    sym_scale::<B, A>(w1, a[r], b1),
                );
                let p = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(p0), _mm512_set1_ps(p1));
                acc[r] = _mm512_mask3_fmadd_ps(p, _mm512_cvtepi32_ps(s), acc[r], keep);
            }
            b += 2;
        }
        // A plain loop, not `map`: a closure is not compiled with the caller's target features.
        let mut out = [0f32; R];
        for (o, v) in out.iter_mut().zip(acc) {
            let lo = _mm512_castps512_ps256(v);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            *o = finish(lo, hi, 1.0);
        }
        out
    }
}

/// A 256-value IQ format as pairs of 32-value chunks. By default the two chunks of
/// [`IqSuper::chunk`] side by side, the sign lanes taken from their sign vectors; formats that
/// store sign bits give them as the 64-bit mask directly (AVX-512 masks replace the sign-vector
/// build of the 256-bit kernels, whose unused sign vectors the compiler then drops).
pub(crate) trait IqPair: IqSuper {
    /// Chunks `2 c2` and `2 c2 + 1` of the super-block at `wb`: magnitudes, the lanes where the
    /// value is negative, and the `i16` scales.
    #[inline(always)]
    unsafe fn pair(wb: *const u8, c2: usize) -> (__m512i, __mmask64, __m512i) {
        unsafe {
            let (a0, s0, k0) = Self::chunk(wb, 2 * c2);
            let (a1, s1, k1) = Self::chunk(wb, 2 * c2 + 1);
            (
                join(a0, a1),
                _mm512_movepi8_mask(join(s0, s1)),
                join(k0, k1),
            )
        }
    }
}

/// Magnitudes and scales of chunks `2 c2`, `2 c2 + 1` with the sign mask `neg`.
#[inline(always)]
unsafe fn with_mask<B: IqSuper>(
    wb: *const u8,
    c2: usize,
    neg: u64,
) -> (__m512i, __mmask64, __m512i) {
    unsafe {
        let (a0, _, k0) = B::chunk(wb, 2 * c2);
        let (a1, _, k1) = B::chunk(wb, 2 * c2 + 1);
        (join(a0, a1), neg, join(k0, k1))
    }
}

impl IqPair for Iq4Xs {}
impl IqPair for Iq1M {}

impl IqPair for Iq2S {
    #[inline(always)]
    unsafe fn pair(wb: *const u8, c2: usize) -> (__m512i, __mmask64, __m512i) {
        // Bit j of the 4 sign bytes of chunk c (at 34 + 4 c) is value j's sign.
        unsafe { with_mask::<Self>(wb, c2, wb.add(34 + 8 * c2).cast::<u64>().read_unaligned()) }
    }
}

impl IqPair for Iq3S {
    #[inline(always)]
    unsafe fn pair(wb: *const u8, c2: usize) -> (__m512i, __mmask64, __m512i) {
        // As `IQ2_S`, the sign bytes of chunk c at 74 + 4 c.
        unsafe { with_mask::<Self>(wb, c2, wb.add(74 + 8 * c2).cast::<u64>().read_unaligned()) }
    }
}

/// `acc + Σ sc · |q| · (x with q's sign)` over 64 values.
#[inline(always)]
unsafe fn madd64(
    acc: __m512i,
    (aq, neg, sc): (__m512i, __mmask64, __m512i),
    x: *const u8,
) -> __m512i {
    unsafe {
        let x = _mm512_loadu_si512(x.cast());
        _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(aq, signed(x, neg)), sc)
    }
}

/// IQ weights (`nb` super-blocks at `w`) · `R` `Q8_K` activation rows, bitwise equal to
/// `iq::iq_dot1` per row.
#[inline(always)]
pub(crate) unsafe fn iq_dotn<B: IqPair, A: ActRowK, const R: usize>(
    nb: usize,
    w: *const u8,
    a: [A; R],
) -> [f32; R] {
    unsafe {
        let mut sum = [0f32; R];
        for b in 0..nb {
            let wb = w.add(b * B::BYTES);
            prefetch_weights(wb);
            let mut acc = [_mm512_setzero_si512(); R];
            for c2 in 0..QK_K / 64 {
                let ch = B::pair(wb, c2);
                for r in 0..R {
                    acc[r] = madd64(acc[r], ch, a[r].qs(b).add(64 * c2));
                }
            }
            let d = B::d(wb);
            for r in 0..R {
                sum[r] += (d * a[r].d(b)) * _mm512_reduce_add_epi32(acc[r]) as f32;
            }
        }
        sum
    }
}

/// IQ weights · the rows `a` into `out`, each super-block decoded once for all rows; bitwise equal
/// to [`iq_dotn`] per row.
#[inline(always)]
pub(crate) unsafe fn iq_dot_rows<B: IqPair, A: ActRowK>(
    nb: usize,
    w: *const u8,
    a: &[A],
    out: &mut [f32],
) {
    unsafe {
        out.fill(0.0);
        for b in 0..nb {
            let wb = w.add(b * B::BYTES);
            prefetch_weights(wb);
            // A plain loop, not `array::from_fn` (its closure would not get the target features).
            let z = _mm512_setzero_si512();
            let mut chunks = [(z, 0, z); QK_K / 64];
            for (c2, ch) in chunks.iter_mut().enumerate() {
                *ch = B::pair(wb, c2);
            }
            let d = B::d(wb);
            for (r, o) in a.iter().zip(out.iter_mut()) {
                let qs = r.qs(b);
                let mut acc = _mm512_setzero_si512();
                for (c2, &ch) in chunks.iter().enumerate() {
                    acc = madd64(acc, ch, qs.add(64 * c2));
                }
                *o += (d * r.d(b)) * _mm512_reduce_add_epi32(acc) as f32;
            }
        }
    }
}
