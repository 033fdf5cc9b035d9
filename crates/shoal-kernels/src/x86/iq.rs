//! AVX2 / AVX-VNNI kernels of the IQ formats and `MXFP4`.
//!
//! - `IQ4_NL`, `MXFP4` (32-value blocks, `Q8_0` activations) are [`SymBlock`]s: their nibbles
//!   become the table's signed values with one `vpshufb`, and the 32-value formats' kernels
//!   (`kernels::sym_dot1` / `sym_dot4`) do the rest; `MXFP4` brings its own scale (E8M0).
//! - The 256-value formats (`Q8_K` activations) decode each 32 values ([`IqSuper::chunk`]) to
//!   unsigned magnitudes, a sign vector and the `i16` scales of its two halves of 16, as
//!   `iq::decode` defines them: value = `d · sc · q`. The magnitudes multiply the activations
//!   with the sign applied (`vpsignb`, then `vpmaddubsw`: ≤ 2·127·127, no saturation), the
//!   scales with `vpmaddwd` (`vpdpwssd` on AVX-VNNI), summing exact `i32`s over the super-block;
//!   then `acc += (d·d_x) · Σ` in scalar f32 — the float operations of `scalar::dot_iq`, so every
//!   path is bitwise equal to the portable one. Grid rows are gathered with scalar table loads
//!   (as ggml's AVX2 kernels do); sign bytes expand through [`SIGNS`] (one `u64` of `±1` bytes per
//!   8 sign bits).
//!
//! [`iq_dot1`] multiplies one activation row, [`iq_dotn`] `R` and [`iq_dot_rows`] any number
//! (decoding each super-block once for them) with the same operations per row.

use std::arch::x86_64::*;

use super::kernels::MulSum;
use super::kernels::{SymBlock, load256, nibbles, prefetch_weights};
use super::kquants::{ActRowK, hsum_i32};
use crate::format::{
    IQ1_M_BYTES, IQ1_S_BYTES, IQ2_S_BYTES, IQ2_XS_BYTES, IQ2_XXS_BYTES, IQ3_S_BYTES, IQ3_XXS_BYTES,
    IQ4_NL_BYTES, IQ4_XS_BYTES, MXFP4_BYTES, QK_K, f16_at,
};
use crate::iq::e8m0_half;
use crate::iq::grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS, KVALUES_IQ4NL,
    KVALUES_MXFP4,
};

/// Byte `j` of entry `b` is `-1` (`0xFF`) where bit `j` of `b` is set, else `1`.
static SIGNS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut j = 0;
        while j < 8 {
            let v: u64 = if (b >> j) & 1 == 1 { 0xFF } else { 0x01 };
            t[b] |= v << (8 * j);
            j += 1;
        }
        b += 1;
    }
    t
};

/// The sign vector of a `KSIGNS` index.
#[inline(always)]
fn ksign(i: u32) -> i64 {
    SIGNS[usize::from(KSIGNS[(i & 127) as usize])] as i64
}

#[inline(always)]
unsafe fn rd16(p: *const u8) -> u16 {
    unsafe { p.cast::<u16>().read_unaligned() }
}

#[inline(always)]
unsafe fn rd32u(p: *const u8) -> u32 {
    unsafe { p.cast::<u32>().read_unaligned() }
}

/// A 16-entry i8 table in both 128-bit halves (for `vpshufb`).
#[inline(always)]
unsafe fn table16(t: &[i8; 16]) -> __m256i {
    unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr().cast())) }
}

/// `IQ4_NL`: f16 `d`, 16 nibble bytes indexing `KVALUES_IQ4NL`.
pub(crate) struct Iq4Nl;

impl SymBlock for Iq4Nl {
    const BYTES: usize = IQ4_NL_BYTES;
    #[inline(always)]
    unsafe fn quants(wb: *const u8) -> __m256i {
        unsafe { _mm256_shuffle_epi8(table16(&KVALUES_IQ4NL), nibbles(wb.add(2))) }
    }
}

/// [`e8m0_half`] of every byte (1 KB, stays in L1: one load instead of a branch and a build).
static E8M0_HALF: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut e = 0;
    while e < 256 {
        t[e] = e8m0_half(e as u8);
        e += 1;
    }
    t
};

/// `MXFP4`: E8M0 byte, 16 nibble bytes indexing `KVALUES_MXFP4`.
pub(crate) struct Mxfp4;

impl SymBlock for Mxfp4 {
    const BYTES: usize = MXFP4_BYTES;
    #[inline(always)]
    unsafe fn quants(wb: *const u8) -> __m256i {
        unsafe { _mm256_shuffle_epi8(table16(&KVALUES_MXFP4), nibbles(wb.add(1))) }
    }
    #[inline(always)]
    unsafe fn d1(wb: *const u8) -> __m128 {
        unsafe { _mm_load_ss(&E8M0_HALF[usize::from(wb.read())]) }
    }
    #[inline(always)]
    unsafe fn d8(wb: *const u8) -> __m256 {
        unsafe { _mm256_broadcast_ss(&E8M0_HALF[usize::from(wb.read())]) }
    }
}

/// A 256-value IQ format: `d` and each 32 values' magnitudes, signs and scales.
pub(crate) trait IqSuper {
    const BYTES: usize;
    /// The power-of-two factor `iq::decode` folds into `d`.
    const FACTOR: f32 = 0.125;
    /// `d` times [`IqSuper::FACTOR`]: by default the f16 at the block start.
    #[inline(always)]
    unsafe fn d(wb: *const u8) -> f32 {
        unsafe { f16_at(std::slice::from_raw_parts(wb, 2), 0) * Self::FACTOR }
    }
    /// Values `32 c..32 c + 32`: (unsigned magnitudes, a vector whose signs are the values',
    /// `i16` scales: lanes 0..8 those of values 0..16, lanes 8..16 of values 16..32).
    unsafe fn chunk(wb: *const u8, c: usize) -> (__m256i, __m256i, __m256i);
}

/// Eight 4-byte grid rows as one vector, built in registers (a store of the rows and a wide load
/// would stall on store forwarding).
#[inline(always)]
unsafe fn rows32(g: [u32; 8]) -> __m256i {
    let g = g.map(|v| v as i32);
    unsafe { _mm256_setr_epi32(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]) }
}

/// The sign vector of 32 raw sign bits (4 bytes at `p`, bit `j` for value `j`): one broadcast,
/// one `vpshufb` handing lane `j` byte `j / 8`, and a compare with its bit.
#[inline(always)]
unsafe fn bit_signs(p: *const u8) -> __m256i {
    unsafe {
        let v = _mm256_set1_epi32(rd32u(p) as i32);
        let pick = _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, pick), bit), bit);
        _mm256_or_si256(set, _mm256_set1_epi8(1))
    }
}

/// One scale for all 32 values.
#[inline(always)]
unsafe fn scale32(s: i32) -> __m256i {
    unsafe { _mm256_set1_epi16(s as i16) }
}

/// Scales `lo` for values 0..16 and `hi` for 16..32.
#[inline(always)]
unsafe fn scale16(lo: i32, hi: i32) -> __m256i {
    unsafe { _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16)) }
}

/// Magnitudes equal to the grid bytes, signs from the sign vectors.
#[inline(always)]
unsafe fn grid64(g: [u64; 4], s: [i64; 4]) -> (__m256i, __m256i) {
    unsafe {
        (
            _mm256_set_epi64x(g[3] as i64, g[2] as i64, g[1] as i64, g[0] as i64),
            _mm256_set_epi64x(s[3], s[2], s[1], s[0]),
        )
    }
}

pub(crate) struct Iq4Xs;

impl IqSuper for Iq4Xs {
    const BYTES: usize = IQ4_XS_BYTES;
    const FACTOR: f32 = 1.0;
    #[inline(always)]
    unsafe fn chunk(wb: *const u8, c: usize) -> (__m256i, __m256i, __m256i) {
        unsafe {
            let sh = rd16(wb.add(2));
            let lo = i32::from((wb.add(4 + c / 2).read() >> (4 * (c % 2))) & 0x0F);
            let ls = lo | ((i32::from(sh >> (2 * c)) & 3) << 4);
            let v = _mm256_shuffle_epi8(table16(&KVALUES_IQ4NL), nibbles(wb.add(8 + 16 * c)));
            (_mm256_abs_epi8(v), v, scale32(ls - 32))
        }
    }
}

pub(crate) struct Iq2Xxs;

impl IqSuper for Iq2Xxs {
    const BYTES: usize = IQ2_XXS_BYTES;
    #[inline(always)]
    unsafe fn chunk(wb: *const u8, c: usize) -> (__m256i, __m256i, __m256i) {
        unsafe {
            let (a0, a1) = (rd32u(wb.add(2 + 8 * c)), rd32u(wb.add(6 + 8 * c)));
            let g = [0, 1, 2, 3].map(|l| IQ2XXS_GRID[((a0 >> (8 * l)) & 0xFF) as usize]);
            let s = [0, 1, 2, 3].map(|l| ksign(a1 >> (7 * l)));
            let (aq, sg) = grid64(g, s);
            (aq, sg, scale32(2 * (a1 >> 28) as i32 + 1))
        }
    }
}

/// The two 16-value scales of chunk `c` from the nibbles of `wb[at + c]`.
#[inline(always)]
unsafe fn nib_scales(wb: *const u8, at: usize, c: usize) -> __m256i {
    unsafe {
        let b = i32::from(wb.add(at + c).read());
        scale16(2 * (b & 0x0F) + 1, 2 * (b >> 4) + 1)
    }
}

pub(crate) struct Iq2Xs;

impl IqSuper for Iq2Xs {
    const BYTES: usize = IQ2_XS_BYTES;
    #[inline(always)]
    unsafe fn chunk(wb: *const u8, c: usize) -> (__m256i, __m256i, __m256i) {
        unsafe {
            let q = [0, 1, 2, 3].map(|l| rd16(wb.add(2 + 8 * c + 2 * l)));
            let g = q.map(|q| IQ2XS_GRID[usize::from(q & 511)]);
            let s = q.map(|q| ksign(u32::from(q >> 9)));
            let (aq, sg) = grid64(g, s);
            (aq, sg, nib_scales(wb, 66, c))
        }
    }
}

pub(crate) struct Iq2S;

impl IqSuper for Iq2S {
    const BYTES: usize = IQ2_S_BYTES;
    #[inline(always)]
    unsafe fn chunk(wb: *const u8, c: usize) -> (__m256i, __m256i, __m256i) {
        unsafe {
            let qh = usize::from(wb.add(66 + c).read());
            let g = [0, 1, 2, 3].map(|l| {
                let low = usize::from(wb.add(2 + 4 * c + l).read());
                IQ2S_GRID[low | (((qh >> (2 * l)) & 3) << 8)]
            });
            let aq = _mm256_set_epi64x(g[3] as i64, g[2] as i64, g[1] as i64, g[0] as i64);
            (aq, bit_signs(wb.add(34 + 4 * c)), nib_scales(wb, 74, c))
        }
    }
}

pub(crate) struct Iq3Xxs;

impl IqSuper for Iq3Xxs {
    const BYTES: usize = IQ3_XXS_BYTES;
    const FACTOR: f32 = 0.25;
    #[inline(always)]
    unsafe fn chunk(wb: *const u8, c: usize) -> (__m256i, __m256i, __m256i) {
        unsafe {
            let aux = rd32u(wb.add(66 + 4 * c));
            let g: [u32; 8] =
                std::array::from_fn(|i| IQ3XXS_GRID[usize::from(wb.add(2 + 8 * c + i).read())]);
            let aq = rows32(g);
            let s = [0, 1, 2, 3].map(|l| ksign(aux >> (7 * l)));
            let sg = _mm256_set_epi64x(s[3], s[2], s[1], s[0]);
            (aq, sg, scale32(2 * (aux >> 28) as i32 + 1))
        }
    }
}

pub(crate) struct Iq3S;

impl IqSuper for Iq3S {
    const BYTES: usize = IQ3_S_BYTES;
    const FACTOR: f32 = 1.0;
    #[inline(always)]
    unsafe fn chunk(wb: *const u8, c: usize) -> (__m256i, __m256i, __m256i) {
        unsafe {
            let qh = usize::from(wb.add(66 + c).read());
            let g: [u32; 8] = std::array::from_fn(|i| {
                let low = usize::from(wb.add(2 + 8 * c + i).read());
                IQ3S_GRID[low | (((qh >> i) & 1) << 8)]
            });
            let aq = rows32(g);
            let sg = bit_signs(wb.add(74 + 4 * c));
            let ls = i32::from((wb.add(106 + c / 2).read() >> (4 * (c % 2))) & 0x0F);
            (aq, sg, scale32(2 * ls + 1))
        }
    }
}

/// `8 g + δ` from ternary grid rows `g` (i8 -1, 0, 1) and shifts `δ` (±1 per byte).
#[inline(always)]
unsafe fn ternary(g: [u64; 4], delta: __m256i) -> (__m256i, __m256i) {
    unsafe {
        let gv = _mm256_set_epi64x(g[3] as i64, g[2] as i64, g[1] as i64, g[0] as i64);
        let q = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), gv), delta);
        (_mm256_abs_epi8(q), q)
    }
}

pub(crate) struct Iq1S;

impl IqSuper for Iq1S {
    const BYTES: usize = IQ1_S_BYTES;
    #[inline(always)]
    unsafe fn chunk(wb: *const u8, c: usize) -> (__m256i, __m256i, __m256i) {
        unsafe {
            let qh = usize::from(rd16(wb.add(34 + 2 * c)));
            let g = [0, 1, 2, 3].map(|l| {
                let low = usize::from(wb.add(2 + 4 * c + l).read());
                IQ1S_GRID[low | (((qh >> (3 * l)) & 7) << 8)]
            });
            let delta = _mm256_set1_epi8(if qh & 0x8000 != 0 { -1 } else { 1 });
            let (aq, q) = ternary(g, delta);
            (aq, q, scale32(2 * ((qh >> 12) & 7) as i32 + 1))
        }
    }
}

pub(crate) struct Iq1M;

impl IqSuper for Iq1M {
    const BYTES: usize = IQ1_M_BYTES;
    #[inline(always)]
    unsafe fn d(wb: *const u8) -> f32 {
        unsafe {
            let s = [0, 1, 2, 3].map(|i| rd16(wb.add(48 + 2 * i)));
            let bits =
                (s[0] >> 12) | ((s[1] >> 8) & 0xF0) | ((s[2] >> 4) & 0xF00) | (s[3] & 0xF000);
            half::f16::from_bits(bits).to_f32() * 0.125
        }
    }
    #[inline(always)]
    unsafe fn chunk(wb: *const u8, c: usize) -> (__m256i, __m256i, __m256i) {
        unsafe {
            let nib = [0, 1, 2, 3]
                .map(|l| usize::from(wb.add(32 + 2 * c + l / 2).read() >> (4 * (l % 2))));
            let g = [0, 1, 2, 3]
                .map(|l| IQ1S_GRID[usize::from(wb.add(4 * c + l).read()) | ((nib[l] & 7) << 8)]);
            // Bit 3 of each group's nibble (bits 3 and 7 of the two bytes): -1 where set, else 1.
            let qh = _mm256_set1_epi16(rd16(wb.add(32 + 2 * c)) as i16);
            let (lo, hi) = (0x0808_0808_0808_0808_i64, 0x8080_8080_8080_8080_u64 as i64);
            let pick = _mm256_setr_epi64x(0, 0, 0x0101_0101_0101_0101, 0x0101_0101_0101_0101);
            let bit = _mm256_setr_epi64x(lo, hi, lo, hi);
            let neg = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, pick), bit), bit);
            let (aq, q) = ternary(g, _mm256_or_si256(neg, _mm256_set1_epi8(1)));
            let sw = i32::from(rd16(wb.add(48 + 2 * (c / 2))));
            let (lo, hi) = ((sw >> (6 * (c % 2))) & 7, (sw >> (6 * (c % 2) + 3)) & 7);
            (aq, q, scale16(2 * lo + 1, 2 * hi + 1))
        }
    }
}

/// `acc + Σ sc · |q| · (x with q's sign)` over 32 values.
#[inline(always)]
unsafe fn madd32<M: MulSum>(
    acc: __m256i,
    aq: __m256i,
    sg: __m256i,
    sc: __m256i,
    x: *const u8,
) -> __m256i {
    unsafe {
        let p = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(load256(x), sg));
        M::madd_acc(acc, p, sc)
    }
}

/// IQ weights (`nb` super-blocks at `w`) · `R` `Q8_K` activation rows.
#[inline(always)]
pub(crate) unsafe fn iq_dotn<B: IqSuper, M: MulSum, A: ActRowK, const R: usize>(
    nb: usize,
    w: *const u8,
    a: [A; R],
) -> [f32; R] {
    unsafe {
        let mut sum = [0f32; R];
        for b in 0..nb {
            let wb = w.add(b * B::BYTES);
            prefetch_weights(wb);
            let mut acc = [_mm256_setzero_si256(); R];
            for c in 0..QK_K / 32 {
                let (aq, sg, sc) = B::chunk(wb, c);
                for r in 0..R {
                    acc[r] = madd32::<M>(acc[r], aq, sg, sc, a[r].qs(b).add(32 * c));
                }
            }
            let d = B::d(wb);
            for r in 0..R {
                sum[r] += (d * a[r].d(b)) * hsum_i32(acc[r]) as f32;
            }
        }
        sum
    }
}

/// IQ weights · one `Q8_K` row.
#[inline(always)]
pub(crate) unsafe fn iq_dot1<B: IqSuper, M: MulSum, A: ActRowK>(
    nb: usize,
    w: *const u8,
    a: A,
) -> f32 {
    unsafe { iq_dotn::<B, M, A, 1>(nb, w, [a])[0] }
}

/// IQ weights · the rows `a` into `out` (one value per row): each super-block decoded once for
/// all rows, each row taking exactly the operations of [`iq_dot1`] (bitwise equal to it).
#[inline(always)]
pub(crate) unsafe fn iq_dot_rows<B: IqSuper, M: MulSum, A: ActRowK>(
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
            // A plain loop, not `array::from_fn`: its closure is not compiled with the caller's
            // target features, so every SIMD step would become a call.
            let z = _mm256_setzero_si256();
            let mut chunks = [(z, z, z); QK_K / 32];
            for (c, ch) in chunks.iter_mut().enumerate() {
                *ch = B::chunk(wb, c);
            }
            let d = B::d(wb);
            for (r, o) in a.iter().zip(out.iter_mut()) {
                let qs = r.qs(b);
                let mut acc = _mm256_setzero_si256();
                for (c, &(aq, sg, sc)) in chunks.iter().enumerate() {
                    acc = madd32::<M>(acc, aq, sg, sc, qs.add(32 * c));
                }
                *o += (d * r.d(b)) * hsum_i32(acc) as f32;
            }
        }
    }
}
