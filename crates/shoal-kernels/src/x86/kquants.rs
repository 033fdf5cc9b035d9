//! AVX2 kernels of the K-quants (`Q2_K` … `Q6_K`) with `Q8_K` activations, and `Q8_K`
//! quantization.
//!
//! One body ([`k_dot1`], [`k_dot4`]) serves every K-quant through a small per-format decode
//! ([`KBlock`]): per 256-value super-block, a header (f16 `d`, `dmin`; the integer scale per 16
//! values as `i16` and a per-16 "bias" multiplier for the activations' sums of 16 quants), and the
//! quants of each 64 values as two vectors of 32 unsigned bytes (≤ 63). Each 32-value vector is
//! multiplied with `vpmaddubsw` (pairs, ≤ 2·63·127: no saturation) and then with its scales with
//! `vpmaddwd` (lanes 0..8 hold values 0..16, lanes 8..16 values 16..32, so a 16-value scale is one
//! broadcast per 128-bit half), accumulating in `i32` across the whole super-block; the bias term
//! is one `vpmaddwd` of the bias multipliers with the 16 sums. Only then does float arithmetic
//! happen: one FMA with `d·d_x` (and one with `dmin·d_x` for the formats with minimums) per
//! super-block and activation row. So:
//! - `Q4_K`/`Q5_K`: scale per 32 values, bias = the minimum (times `dmin`, subtracted);
//! - `Q2_K`: scale and minimum per 16 values;
//! - `Q6_K`: `q - 32` computed as `q` with bias `-32·sc` (exact integers, folded into the sum);
//! - `Q3_K`: `q - 4` (high bit clear) as `q + 4·hbit` with bias `-4·sc`.
//!
//! On AVX-VNNI the scale multiply-and-add is one `vpdpwssd` ([`MulSum::madd_acc`]); the integer
//! sums are the same, so both backends give bitwise equal results.
//!
//! Two float orders, one per scale width, each shared by every kernel of those formats so results
//! do not depend on the batch:
//! - 16-value scales (`Q2_K`, `Q3_K`, `Q6_K`): eight float lanes per output, one FMA per
//!   super-block, summed at the end ([`k_dot1`] → `k_dot1_lanes`, [`k_dot4`] for four
//!   activation rows);
//! - 32-value scales (`Q4_K`, `Q5_K`): one exact integer per super-block and output, then
//!   `fma(d·d_x, Σ, acc)` and `fnmadd(dmin·d_x, bias, acc)` on one float ([`k_dot1`], and
//!   [`k_dot1x4`] for four weight rows); the prefill tiles in `ktile` do the same per lane.

use std::arch::x86_64::*;

use super::kernels::{MulSum, hsum, load256, prefetch_weights, splat};
use crate::format::{
    Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, Q8_K_BYTES, QK_K, k3_scales,
    k4_scales,
};

/// One activation row as `Q8_K` blocks.
pub(crate) trait ActRowK: Copy {
    /// The 256 quants of block `b`.
    unsafe fn qs(self, b: usize) -> *const u8;
    /// The scale of block `b`.
    unsafe fn d(self, b: usize) -> f32;
    /// The 16 sums of 16 quants of block `b`.
    unsafe fn sums(self, b: usize) -> *const i16;
}

/// A row of ggml `Q8_K` blocks.
#[derive(Clone, Copy)]
pub(crate) struct GgmlQ8K(pub(crate) *const u8);

impl ActRowK for GgmlQ8K {
    #[inline(always)]
    unsafe fn qs(self, b: usize) -> *const u8 {
        unsafe { self.0.add(b * Q8_K_BYTES + 4) }
    }
    #[inline(always)]
    unsafe fn d(self, b: usize) -> f32 {
        unsafe { self.0.add(b * Q8_K_BYTES).cast::<f32>().read_unaligned() }
    }
    #[inline(always)]
    unsafe fn sums(self, b: usize) -> *const i16 {
        unsafe { self.0.add(b * Q8_K_BYTES + 4 + QK_K).cast() }
    }
}

/// A `Q8_K` row of the packed layout: quants at `qs + 256 b`, `d` at `sc + 8 b`, sums at
/// `bs + 16 b`.
#[derive(Clone, Copy)]
pub(crate) struct PackedK {
    pub(crate) qs: *const u8,
    pub(crate) sc: *const f32,
    pub(crate) bs: *const i16,
}

impl ActRowK for PackedK {
    #[inline(always)]
    unsafe fn qs(self, b: usize) -> *const u8 {
        unsafe { self.qs.add(b * QK_K) }
    }
    #[inline(always)]
    unsafe fn d(self, b: usize) -> f32 {
        unsafe { self.sc.add(b * 8).read() }
    }
    #[inline(always)]
    unsafe fn sums(self, b: usize) -> *const i16 {
        unsafe { self.bs.add(b * 16) }
    }
}

/// A decoded super-block header.
pub(crate) struct Header {
    pub(crate) d: f32,
    pub(crate) dmin: f32,
    /// `i16` scales: for 32-value scales, all eight in both 128-bit halves (`sc[0]`); for
    /// 16-value scales, those of values `128 h..128 h + 128` in both halves of `sc[h]`.
    sc: [__m256i; 2],
    /// Per 16 values, the multiplier of the activations' sum of those 16 quants.
    pub(crate) bias: __m256i,
}

/// The `i16` scales in order: per 32 values in lanes 0..8, or per 16 values in lanes 0..16.
#[inline(always)]
pub(crate) unsafe fn flat_scales<K: KBlock>(h: &Header) -> __m256i {
    unsafe {
        if K::SCALE32 {
            h.sc[0]
        } else {
            _mm256_permute2x128_si256::<0x20>(h.sc[0], h.sc[1])
        }
    }
}

/// A K-quant super-block format.
pub(crate) trait KBlock {
    const BYTES: usize;
    /// Whether the bias is a minimum (`- dmin · m · Σx`, a second FMA) rather than an integer
    /// correction folded into the sum.
    const MINS: bool;
    /// Whether scales are per 32 values (else per 16).
    const SCALE32: bool;
    unsafe fn header(wb: *const u8) -> Header;
    /// The unsigned quants of values `64 p..64 p + 64` (`p` < 4) as two vectors of 32.
    unsafe fn pair(wb: *const u8, p: usize) -> (__m256i, __m256i);
}

/// `pshufb` masks broadcasting `i16` lane `v` (32-value scales).
static MASK32: [[u8; 32]; 8] = {
    let mut m = [[0u8; 32]; 8];
    let mut v = 0;
    while v < 8 {
        let mut i = 0;
        while i < 32 {
            m[v][i] = (2 * v + i % 2) as u8;
            i += 1;
        }
        v += 1;
    }
    m
};

/// `pshufb` masks putting `i16` lane `2 v` in the low half and `2 v + 1` in the high half
/// (16-value scales of vector `v` of a 128-value half).
static MASK16: [[u8; 32]; 4] = {
    let mut m = [[0u8; 32]; 4];
    let mut v = 0;
    while v < 4 {
        let mut i = 0;
        while i < 32 {
            m[v][i] = (2 * (2 * v + i / 16) + i % 2) as u8;
            i += 1;
        }
        v += 1;
    }
    m
};

/// The `i16` scale vector of 32-value vector `v` (0..8).
#[inline(always)]
unsafe fn scale_of<K: KBlock>(h: &Header, v: usize) -> __m256i {
    unsafe {
        if K::SCALE32 {
            _mm256_shuffle_epi8(h.sc[0], load256(MASK32[v].as_ptr()))
        } else {
            _mm256_shuffle_epi8(h.sc[v / 4], load256(MASK16[v % 4].as_ptr()))
        }
    }
}

/// Broadcasts the 128-bit half `H` of `v` to both halves.
#[inline(always)]
unsafe fn half<const H: i32>(v: __m256i) -> __m256i {
    unsafe { _mm256_permute2x128_si256::<H>(v, v) }
}

#[inline(always)]
unsafe fn f16(p: *const u8) -> f32 {
    unsafe {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
            p.cast::<u16>().read_unaligned(),
        ))))
    }
}

#[inline(always)]
unsafe fn low4(v: __m256i) -> __m256i {
    unsafe { _mm256_and_si256(v, _mm256_set1_epi8(0x0F)) }
}

/// Bits `n..n + w` of every byte of `v` (`w` given as the mask `(1 << w) - 1`).
#[inline(always)]
unsafe fn bits(v: __m256i, n: usize, mask: i8) -> __m256i {
    unsafe {
        let s = _mm256_srl_epi16(v, _mm_cvtsi32_si128(n as i32));
        _mm256_and_si256(s, _mm256_set1_epi8(mask))
    }
}

/// `v << 4` per byte for bytes < 16.
#[inline(always)]
unsafe fn shl4(v: __m256i) -> __m256i {
    unsafe { _mm256_slli_epi16::<4>(v) }
}

/// The header of `Q4_K`/`Q5_K`: 6-bit scales and mins per 32 values.
#[inline(always)]
unsafe fn header_k4(wb: *const u8) -> Header {
    unsafe {
        let (sc, m) = k4_scales(&*wb.add(4).cast::<[u8; 12]>());
        let sc = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64));
        let m = _mm_cvtsi64_si128(m as i64);
        Header {
            d: f16(wb),
            dmin: f16(wb.add(2)),
            sc: [_mm256_broadcastsi128_si256(sc), _mm256_setzero_si256()],
            bias: _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m)),
        }
    }
}

pub(crate) struct Q4K;
pub(crate) struct Q5K;
pub(crate) struct Q6K;
pub(crate) struct Q3K;
pub(crate) struct Q2K;

impl KBlock for Q4K {
    const BYTES: usize = Q4_K_BYTES;
    const MINS: bool = true;
    const SCALE32: bool = true;
    #[inline(always)]
    unsafe fn header(wb: *const u8) -> Header {
        unsafe { header_k4(wb) }
    }
    #[inline(always)]
    unsafe fn pair(wb: *const u8, p: usize) -> (__m256i, __m256i) {
        unsafe {
            let q = load256(wb.add(16 + 32 * p));
            (low4(q), low4(_mm256_srli_epi16::<4>(q)))
        }
    }
}

impl KBlock for Q5K {
    const BYTES: usize = Q5_K_BYTES;
    const MINS: bool = true;
    const SCALE32: bool = true;
    #[inline(always)]
    unsafe fn header(wb: *const u8) -> Header {
        unsafe { header_k4(wb) }
    }
    #[inline(always)]
    unsafe fn pair(wb: *const u8, p: usize) -> (__m256i, __m256i) {
        unsafe {
            let q = load256(wb.add(48 + 32 * p));
            let qh = load256(wb.add(16));
            let lo = _mm256_or_si256(low4(q), shl4(bits(qh, 2 * p, 1)));
            let hi = _mm256_srli_epi16::<4>(q);
            (lo, _mm256_or_si256(low4(hi), shl4(bits(qh, 2 * p + 1, 1))))
        }
    }
}

impl KBlock for Q6K {
    const BYTES: usize = Q6_K_BYTES;
    const MINS: bool = false;
    const SCALE32: bool = false;
    #[inline(always)]
    unsafe fn header(wb: *const u8) -> Header {
        unsafe {
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(192).cast()));
            Header {
                d: f16(wb.add(208)),
                dmin: 0.0,
                sc: [half::<0x00>(sc), half::<0x11>(sc)],
                bias: _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16::<5>(sc)),
            }
        }
    }
    #[inline(always)]
    unsafe fn pair(wb: *const u8, p: usize) -> (__m256i, __m256i) {
        unsafe {
            let (h, t) = (p / 2, p % 2);
            let (qa, qb) = (load256(wb.add(64 * h)), load256(wb.add(64 * h + 32)));
            let qh = load256(wb.add(128 + 32 * h));
            let v0 = _mm256_or_si256(bits(qa, 4 * t, 0x0F), shl4(bits(qh, 4 * t, 3)));
            let v1 = _mm256_or_si256(bits(qb, 4 * t, 0x0F), shl4(bits(qh, 4 * t + 2, 3)));
            (v0, v1)
        }
    }
}

impl KBlock for Q3K {
    const BYTES: usize = Q3_K_BYTES;
    const MINS: bool = false;
    const SCALE32: bool = false;
    #[inline(always)]
    unsafe fn header(wb: *const u8) -> Header {
        unsafe {
            let s = k3_scales(&*wb.add(96).cast::<[u8; 12]>());
            let s = _mm256_cvtepu8_epi16(_mm_loadu_si128(s.as_ptr().cast()));
            let sc = _mm256_sub_epi16(s, _mm256_set1_epi16(32));
            Header {
                d: f16(wb.add(108)),
                dmin: 0.0,
                sc: [half::<0x00>(sc), half::<0x11>(sc)],
                bias: _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16::<2>(sc)),
            }
        }
    }
    #[inline(always)]
    unsafe fn pair(wb: *const u8, p: usize) -> (__m256i, __m256i) {
        unsafe {
            let (h, t) = (p / 2, 2 * (p % 2));
            let qs = load256(wb.add(32 + 32 * h));
            let hm = load256(wb);
            let hb = |t: usize| _mm256_slli_epi16::<2>(bits(hm, 4 * h + t, 1));
            let v0 = _mm256_or_si256(bits(qs, 2 * t, 3), hb(t));
            let v1 = _mm256_or_si256(bits(qs, 2 * t + 2, 3), hb(t + 1));
            (v0, v1)
        }
    }
}

impl KBlock for Q2K {
    const BYTES: usize = Q2_K_BYTES;
    const MINS: bool = true;
    const SCALE32: bool = false;
    #[inline(always)]
    unsafe fn header(wb: *const u8) -> Header {
        unsafe {
            let b = _mm_loadu_si128(wb.cast());
            let low = _mm_set1_epi8(0x0F);
            let sc = _mm256_cvtepu8_epi16(_mm_and_si128(b, low));
            let m = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(b), low));
            Header {
                d: f16(wb.add(80)),
                dmin: f16(wb.add(82)),
                sc: [half::<0x00>(sc), half::<0x11>(sc)],
                bias: m,
            }
        }
    }
    #[inline(always)]
    unsafe fn pair(wb: *const u8, p: usize) -> (__m256i, __m256i) {
        unsafe {
            let (h, t) = (p / 2, 2 * (p % 2));
            let qs = load256(wb.add(16 + 32 * h));
            (bits(qs, 2 * t, 3), bits(qs, 2 * t + 2, 3))
        }
    }
}

/// Prefetches the weight bytes of the super-block after the prefetch distance.
#[inline(always)]
unsafe fn prefetch_block<K: KBlock>(wb: *const u8) {
    let mut o = 0;
    while o < K::BYTES {
        unsafe { prefetch_weights(wb.wrapping_add(o)) };
        o += 64;
    }
}

/// Prefetches the `K::BYTES` at `p` (no access: any address is fine).
#[inline(always)]
pub(crate) unsafe fn prefetch_block_at<K: KBlock>(p: *const u8) {
    let mut o = 0;
    while o < K::BYTES {
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o).cast()) };
        o += 64;
    }
}

/// `Σ` over the super-block of `scale · Σ q·x` for one activation row (quants at `x`).
#[inline(always)]
unsafe fn block_sum<K: KBlock, M: MulSum>(wb: *const u8, h: &Header, x: *const u8) -> __m256i {
    unsafe {
        let mut acc = _mm256_setzero_si256();
        for p in 0..4 {
            let (q0, q1) = K::pair(wb, p);
            let p0 = _mm256_maddubs_epi16(q0, load256(x.add(64 * p)));
            acc = M::madd_acc(acc, p0, scale_of::<K>(h, 2 * p));
            let p1 = _mm256_maddubs_epi16(q1, load256(x.add(64 * p + 32)));
            acc = M::madd_acc(acc, p1, scale_of::<K>(h, 2 * p + 1));
        }
        acc
    }
}

/// The sum of the eight `i32` lanes of `v` (exact: the callers' sums stay far below 2³¹).
#[inline(always)]
pub(crate) unsafe fn hsum_i32(v: __m256i) -> i32 {
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s)))
    }
}

/// K-quant weights (`nb` super-blocks at `w`) · one `Q8_K` row. With 32-value scales: per
/// super-block, the exact
/// integer `Σ` (bias folded in unless the format has minimums), then `acc = fma(d·d_x, Σ, acc)`
/// and, with minimums, `acc = fnmadd(dmin·d_x, bias, acc)` — the float operations of each output
/// lane of the tile kernels in `ktile`, so a `vec_dot` equals the matmul's output bitwise.
#[inline(always)]
pub(crate) unsafe fn k_dot1<K: KBlock, M: MulSum, A: ActRowK>(
    nb: usize,
    w: *const u8,
    a: A,
) -> f32 {
    if !K::SCALE32 {
        // SAFETY: as below.
        return unsafe { k_dot1_lanes::<K, M, A>(nb, w, a) };
    }
    unsafe {
        let mut acc = _mm_setzero_ps();
        for b in 0..nb {
            let wb = w.add(b * K::BYTES);
            prefetch_block::<K>(wb);
            let h = K::header(wb);
            let sum = hsum_i32(block_sum::<K, M>(wb, &h, a.qs(b)));
            let bias = hsum_i32(_mm256_madd_epi16(h.bias, load256(a.sums(b).cast())));
            let dx = a.d(b);
            let z = _mm_setzero_ps();
            if K::MINS {
                acc = _mm_fmadd_ss(_mm_set_ss(h.d * dx), _mm_cvtsi32_ss(z, sum), acc);
                acc = _mm_fnmadd_ss(_mm_set_ss(h.dmin * dx), _mm_cvtsi32_ss(z, bias), acc);
            } else {
                let s = _mm_cvtsi32_ss(z, sum.wrapping_add(bias));
                acc = _mm_fmadd_ss(_mm_set_ss(h.d * dx), s, acc);
            }
        }
        _mm_cvtss_f32(acc)
    }
}

/// Four weight rows with 32-value scales (`nb` super-blocks each at `w[i]`) · one `Q8_K` row:
/// per row the integer sums of [`k_dot1`], reduced together, and its float operations in four
/// lanes (so each output is bitwise [`k_dot1`]'s). Prefetches each block `ahead` bytes on (the
/// same block of the next group of rows).
#[inline(always)]
pub(crate) unsafe fn k_dot1x4<K: KBlock, M: MulSum, A: ActRowK>(
    nb: usize,
    w: [*const u8; 4],
    a: A,
    ahead: usize,
) -> [f32; 4] {
    unsafe {
        let mut acc = _mm_setzero_ps();
        for b in 0..nb {
            let (x, sums) = (a.qs(b), load256(a.sums(b).cast()));
            let mut s = [_mm256_setzero_si256(); 4];
            let mut bias = [_mm256_setzero_si256(); 4];
            let (mut d, mut dm) = ([0f32; 4], [0f32; 4]);
            for i in 0..4 {
                let wb = w[i].add(b * K::BYTES);
                prefetch_block_at::<K>(wb.wrapping_add(ahead));
                let h = K::header(wb);
                s[i] = block_sum::<K, M>(wb, &h, x);
                bias[i] = _mm256_madd_epi16(h.bias, sums);
                if !K::MINS {
                    s[i] = _mm256_add_epi32(s[i], bias[i]);
                }
                (d[i], dm[i]) = (h.d, h.dmin);
            }
            let dx = _mm_set1_ps(a.d(b));
            let dd = _mm_mul_ps(_mm_loadu_ps(d.as_ptr()), dx);
            acc = _mm_fmadd_ps(dd, _mm_cvtepi32_ps(hsum4(s)), acc);
            if K::MINS {
                let dm = _mm_mul_ps(_mm_loadu_ps(dm.as_ptr()), dx);
                acc = _mm_fnmadd_ps(dm, _mm_cvtepi32_ps(hsum4(bias)), acc);
            }
        }
        let mut out = [0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), acc);
        out
    }
}

/// The lane sums of four vectors: `[Σ v0, Σ v1, Σ v2, Σ v3]`.
#[inline(always)]
unsafe fn hsum4(v: [__m256i; 4]) -> __m128i {
    unsafe {
        let s = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s))
    }
}

/// Adds one super-block of one row to `acc`: `sum` the scaled integer sums, `bias` the bias
/// term, `dd = d·d_x`, `dm = dmin·d_x`.
#[inline(always)]
unsafe fn accumulate<K: KBlock>(
    acc: __m256,
    sum: __m256i,
    bias: __m256i,
    dd: __m256,
    dm: __m256,
) -> __m256 {
    unsafe {
        if K::MINS {
            let acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sum), acc);
            _mm256_fnmadd_ps(dm, _mm256_cvtepi32_ps(bias), acc)
        } else {
            _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(_mm256_add_epi32(sum, bias)), acc)
        }
    }
}

/// K-quant weights with 16-value scales · one `Q8_K` row, accumulating eight float lanes
/// (the order of [`k_dot4`]).
#[inline(always)]
unsafe fn k_dot1_lanes<K: KBlock, M: MulSum, A: ActRowK>(nb: usize, w: *const u8, a: A) -> f32 {
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for b in 0..nb {
            let wb = w.add(b * K::BYTES);
            prefetch_block::<K>(wb);
            let h = K::header(wb);
            let sum = block_sum::<K, M>(wb, &h, a.qs(b));
            let bias = _mm256_madd_epi16(h.bias, load256(a.sums(b).cast()));
            let dx = a.d(b);
            let (dd, dm) = (_mm256_set1_ps(h.d * dx), _mm256_set1_ps(h.dmin * dx));
            acc = accumulate::<K>(acc, sum, bias, dd, dm);
        }
        hsum(acc)
    }
}

/// K-quant weights · four packed `Q8_K` rows (quants `qs[r]`, sums `bs[r]`, scales interleaved
/// at `sc + 8 b`: `[d0, 0, d1, 0, d2, 0, d3, 0]`). Bitwise equal to four [`k_dot1`] calls.
/// (The formats with 16-value scales; those with 32-value scales use the tiles of `ktile`.)
#[inline(always)]
pub(crate) unsafe fn k_dot4<K: KBlock, M: MulSum>(
    nb: usize,
    w: *const u8,
    qs: [*const u8; 4],
    bs: [*const i16; 4],
    sc: *const f32,
) -> [f32; 4] {
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..nb {
            let wb = w.add(b * K::BYTES);
            prefetch_block::<K>(wb);
            let h = K::header(wb);
            let mut sum = [_mm256_setzero_si256(); 4];
            for p in 0..4 {
                let (q0, q1) = K::pair(wb, p);
                let (s0, s1) = (scale_of::<K>(&h, 2 * p), scale_of::<K>(&h, 2 * p + 1));
                for r in 0..4 {
                    let x = qs[r].add(b * QK_K + 64 * p);
                    let p0 = _mm256_maddubs_epi16(q0, load256(x));
                    sum[r] = M::madd_acc(sum[r], p0, s0);
                    let p1 = _mm256_maddubs_epi16(q1, load256(x.add(32)));
                    sum[r] = M::madd_acc(sum[r], p1, s1);
                }
            }
            let dx = _mm256_loadu_ps(sc.add(b * 8));
            let dd = _mm256_mul_ps(_mm256_set1_ps(h.d), dx);
            let dm = _mm256_mul_ps(_mm256_set1_ps(h.dmin), dx);
            for r in 0..4 {
                let bias = _mm256_madd_epi16(h.bias, load256(bs[r].add(b * 16).cast()));
                let i = 2 * r as i32;
                acc[r] = accumulate::<K>(acc[r], sum[r], bias, splat(dd, i), splat(dm, i));
            }
        }
        [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
    }
}

/// Quantizes 256 floats at `x` into `Q8_K` (quants at `qs`, 16 sums at `sums`); returns `d`.
/// Bitwise equal to the scalar reference (ggml's rule).
#[inline(always)]
pub(crate) unsafe fn quantize_block_q8k(x: *const f32, qs: *mut u8, sums: *mut i16) -> f32 {
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        for i in 0..32 {
            // `max(new, acc)` keeps `acc` where `new` is NaN, as the scalar `>` does.
            m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x.add(8 * i))), m);
        }
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        if amax == 0.0 {
            std::ptr::write_bytes(qs, 0, QK_K);
            std::ptr::write_bytes(sums, 0, 16);
            return 0.0;
        }
        // The first value of largest magnitude, with its sign.
        let av = _mm256_set1_ps(amax);
        let mut max = amax;
        for i in 0..32 {
            let v = _mm256_loadu_ps(x.add(8 * i));
            let hit = _mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(sign, v), av);
            let bits = _mm256_movemask_ps(hit);
            if bits != 0 {
                max = x.add(8 * i + bits.trailing_zeros() as usize).read();
                break;
            }
        }
        let (d, iscale) = crate::scalar::q8k_scales(max);
        let is = _mm256_set1_ps(iscale);
        let top = _mm256_set1_epi32(127);
        let q = |i: usize| {
            let v = _mm256_loadu_ps(x.add(8 * i));
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(v, is),
            );
            // NaN (which the scalar cast makes 0) would convert to i32::MIN.
            let ordered = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_ORD_Q>(r, r));
            _mm256_and_si256(_mm256_min_epi32(_mm256_cvtps_epi32(r), top), ordered)
        };
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let bias = _mm256_set1_epi8(-128);
        for j in 0..8 {
            let p = _mm256_packs_epi16(
                _mm256_packs_epi32(q(4 * j), q(4 * j + 1)),
                _mm256_packs_epi32(q(4 * j + 2), q(4 * j + 3)),
            );
            let p = _mm256_permutevar8x32_epi32(p, order);
            _mm256_storeu_si256(qs.add(32 * j).cast(), p);
            // Sums of 8 (q + 128) per 64-bit lane; two lanes make a sum of 16.
            let s = _mm256_sad_epu8(_mm256_xor_si256(p, bias), _mm256_setzero_si256());
            let mut l = [0i64; 4];
            _mm256_storeu_si256(l.as_mut_ptr().cast(), s);
            sums.add(2 * j).write((l[0] + l[1] - 16 * 128) as i16);
            sums.add(2 * j + 1).write((l[2] + l[3] - 16 * 128) as i16);
        }
        d
    }
}
