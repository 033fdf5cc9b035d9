//! AVX2 tile kernels of the K-quants: four weight rows × one or four `Q8_K` activation rows.
//!
//! The weight rows stay in GGUF order; the kernel interleaves them in registers. Per 32-value
//! vector of a super-block, the four rows' decoded quants ([`KBlock::pair`]) are transposed by
//! 8-byte chunks ([`transpose`]) into four vectors `R_k = [A_k | B_k | C_k | D_k]` (chunk `k` of
//! rows A–D). One `vpmaddubsw` of `R_k` with chunk `k` of an activation row, broadcast to the four
//! quarters, gives eight values of each of the four weight rows; the products of the chunks that
//! share a scale (all four for 32-value scales, two for 16-value ones) are added as `i16` (no
//! saturation: ≤ 4 · 2 · 31 · 127 for `Q5_K`, ≤ 2 · 2 · 63 · 127 for `Q6_K`) and only then
//! multiplied by their scales with one `vpmaddwd` ([`ScaleTile`]: each row's scale in its
//! quarter). So a 32-value vector of four weight rows costs five multiplies per activation row
//! instead of eight, and the decode and transposition are shared by four activation rows.
//!
//! The `i32` accumulator of an activation row holds `[A A B B | C C D D]`; the bias term
//! (`vpmaddwd` of the bias multipliers with the activations' sums of 16) is brought into the same
//! lanes. Per super-block, a horizontal add turns each (weight row, activation row) into one exact
//! integer — the super-block's scaled sum (bias folded in for `Q6_K`/`Q3_K`; separate for the
//! formats with minimums) — and the float work per output and super-block is `acc = fma(d·d_x, Σ,
//! acc)` (then `acc = fnmadd(dmin·d_x, bias, acc)`), one output per float lane. That is exactly
//! what [`super::kquants::k_dot1`] computes for one weight row and one activation row, so results
//! are bitwise independent of the batch, of the row's place in a tile and of the thread count.

use std::arch::x86_64::*;

use super::kernels::{MulSum, load256};
use super::kquants::{Header, KBlock, flat_scales, prefetch_block_at};
use crate::format::QK_K;

/// Interleaves four rows' 32-byte vectors by 8-byte chunks: `R_k = [A_k | B_k | C_k | D_k]`.
#[inline(always)]
unsafe fn transpose(q: [__m256i; 4]) -> [__m256i; 4] {
    unsafe {
        let x0 = _mm256_unpacklo_epi64(q[0], q[1]); // [A0 B0 | A2 B2]
        let x1 = _mm256_unpackhi_epi64(q[0], q[1]); // [A1 B1 | A3 B3]
        let y0 = _mm256_unpacklo_epi64(q[2], q[3]); // [C0 D0 | C2 D2]
        let y1 = _mm256_unpackhi_epi64(q[2], q[3]); // [C1 D1 | C3 D3]
        [
            _mm256_permute2x128_si256::<0x20>(x0, y0),
            _mm256_permute2x128_si256::<0x20>(x1, y1),
            _mm256_permute2x128_si256::<0x31>(x0, y0),
            _mm256_permute2x128_si256::<0x31>(x1, y1),
        ]
    }
}

/// `pshufb` mask spreading `i16` lanes `[A, B, C, D]` (a broadcast 8-byte group) into
/// `[A ×4, B ×4 | C ×4, D ×4]`.
static EXPAND: [u8; 32] = {
    let mut m = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        let quarter = i / 8; // 0..4: the row whose scale this byte carries
        m[i] = (2 * (quarter % 2) + 4 * (quarter / 2) + i % 2) as u8;
        i += 1;
    }
    m
};

/// The scales of four weight rows per scale unit (32 or 16 values), each row's in its quarter of
/// the 16 `i16` lanes, as `vpmaddwd` wants them against a transposed product.
struct ScaleTile {
    s: [__m256i; 16],
}

impl ScaleTile {
    #[inline(always)]
    unsafe fn new<K: KBlock>(h: &[Header; 4]) -> Self {
        unsafe {
            let f = [
                flat_scales::<K>(&h[0]),
                flat_scales::<K>(&h[1]),
                flat_scales::<K>(&h[2]),
                flat_scales::<K>(&h[3]),
            ];
            let t0 = _mm256_unpacklo_epi16(f[0], f[1]);
            let t1 = _mm256_unpackhi_epi16(f[0], f[1]);
            let t2 = _mm256_unpacklo_epi16(f[2], f[3]);
            let t3 = _mm256_unpackhi_epi16(f[2], f[3]);
            // Unit `s` as 8 bytes `[A B C D]` in vector (s % 8) / 2, half s / 8, qword s % 2.
            let u = [
                _mm256_unpacklo_epi32(t0, t2),
                _mm256_unpackhi_epi32(t0, t2),
                _mm256_unpacklo_epi32(t1, t3),
                _mm256_unpackhi_epi32(t1, t3),
            ];
            let mut bytes = [0i64; 16];
            for (i, v) in u.iter().enumerate() {
                _mm256_storeu_si256(bytes.as_mut_ptr().add(4 * i).cast(), *v);
            }
            let expand = load256(EXPAND.as_ptr());
            let units = if K::SCALE32 { 8 } else { 16 };
            let mut s = [_mm256_setzero_si256(); 16];
            for (unit, o) in s.iter_mut().enumerate().take(units) {
                let at = 4 * ((unit % 8) / 2) + 2 * (unit / 8) + unit % 2;
                *o = _mm256_shuffle_epi8(_mm256_set1_epi64x(bytes[at]), expand);
            }
            Self { s }
        }
    }
}

/// Chunk `k` of the 32 activation quants at `x`, broadcast to the four quarters.
#[inline(always)]
unsafe fn chunk(x: *const u8, k: usize) -> __m256i {
    unsafe { _mm256_set1_epi64x(x.add(8 * k).cast::<i64>().read_unaligned()) }
}

/// `acc + Σ scale · Σ q·x` over one 32-value vector `v` of the four transposed weight rows `r`,
/// for the activation quants at `x` (this vector's 32).
#[inline(always)]
unsafe fn vector_sum<K: KBlock, M: MulSum>(
    acc: __m256i,
    r: &[__m256i; 4],
    x: *const u8,
    st: &ScaleTile,
    v: usize,
) -> __m256i {
    unsafe {
        let p = [
            _mm256_maddubs_epi16(r[0], chunk(x, 0)),
            _mm256_maddubs_epi16(r[1], chunk(x, 1)),
            _mm256_maddubs_epi16(r[2], chunk(x, 2)),
            _mm256_maddubs_epi16(r[3], chunk(x, 3)),
        ];
        if K::SCALE32 {
            let s = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
            M::madd_acc(acc, s, st.s[v])
        } else {
            let acc = M::madd_acc(acc, _mm256_add_epi16(p[0], p[1]), st.s[2 * v]);
            M::madd_acc(acc, _mm256_add_epi16(p[2], p[3]), st.s[2 * v + 1])
        }
    }
}

/// The bias term of one activation row (sums of 16 at `bs`) against the four rows' multipliers,
/// in the accumulator's lanes `[A A B B | C C D D]` (two partial sums per row).
#[inline(always)]
unsafe fn bias_sum(h: &[Header; 4], bs: *const i16) -> __m256i {
    unsafe {
        let s = load256(bs.cast());
        let m = [
            _mm256_madd_epi16(h[0].bias, s),
            _mm256_madd_epi16(h[1].bias, s),
            _mm256_madd_epi16(h[2].bias, s),
            _mm256_madd_epi16(h[3].bias, s),
        ];
        let ab = _mm256_hadd_epi32(m[0], m[1]); // [A A B B | A A B B]
        let cd = _mm256_hadd_epi32(m[2], m[3]);
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(ab, cd),
            _mm256_permute2x128_si256::<0x31>(ab, cd),
        )
    }
}

/// One activation row of a tile: its quants, its sums of 16, and its `d` at `sc + 8 b`.
#[derive(Clone, Copy)]
pub(crate) struct TileRow {
    pub(crate) qs: *const u8,
    pub(crate) bs: *const i16,
}

/// The decoded header of super-block `b` of the weight row at `w`, prefetching `ahead` bytes on.
#[inline(always)]
unsafe fn header<K: KBlock>(w: *const u8, b: usize, ahead: usize) -> Header {
    unsafe {
        let wb = w.add(b * K::BYTES);
        prefetch_block_at::<K>(wb.wrapping_add(ahead));
        K::header(wb)
    }
}

/// The decoded headers of the four weight rows' super-block `b`, prefetching `ahead` bytes on.
#[inline(always)]
unsafe fn headers<K: KBlock>(w: &[*const u8; 4], b: usize, ahead: usize) -> [Header; 4] {
    unsafe {
        [
            header::<K>(w[0], b, ahead),
            header::<K>(w[1], b, ahead),
            header::<K>(w[2], b, ahead),
            header::<K>(w[3], b, ahead),
        ]
    }
}

/// The integer sums of one super-block for `R` activation rows, in `[A A B B | C C D D]` lanes:
/// `(scaled sums, bias terms)`, the bias folded into the sums unless the format has minimums.
#[inline(always)]
unsafe fn super_block<K: KBlock, M: MulSum, const R: usize>(
    w: &[*const u8; 4],
    b: usize,
    h: &[Header; 4],
    x: &[TileRow; R],
) -> ([__m256i; R], [__m256i; R]) {
    unsafe {
        let st = ScaleTile::new::<K>(h);
        let mut acc = [_mm256_setzero_si256(); R];
        for p in 0..4 {
            let o = b * K::BYTES;
            let (a0, a1) = K::pair(w[0].add(o), p);
            let (b0, b1) = K::pair(w[1].add(o), p);
            let (c0, c1) = K::pair(w[2].add(o), p);
            let (d0, d1) = K::pair(w[3].add(o), p);
            for t in 0..2 {
                let v = 2 * p + t;
                let r = if t == 0 {
                    transpose([a0, b0, c0, d0])
                } else {
                    transpose([a1, b1, c1, d1])
                };
                for (a, row) in acc.iter_mut().zip(x) {
                    let xq = row.qs.add(b * QK_K + 32 * v);
                    *a = vector_sum::<K, M>(*a, &r, xq, &st, v);
                }
            }
        }
        let mut bias = [_mm256_setzero_si256(); R];
        for ((bi, a), row) in bias.iter_mut().zip(acc.iter_mut()).zip(x) {
            *bi = bias_sum(h, row.bs.add(b * 16));
            if !K::MINS {
                *a = _mm256_add_epi32(*a, *bi);
            }
        }
        (acc, bias)
    }
}

/// `[d_A, d_B, d_A, d_B | d_C, d_D, d_C, d_D]` and the same of `dmin`: the weight scales in the
/// lanes of a horizontal add of two accumulators.
#[inline(always)]
unsafe fn weight_scales(h: &[Header; 4]) -> (__m256, __m256) {
    unsafe {
        let d = _mm256_setr_ps(
            h[0].d, h[1].d, h[0].d, h[1].d, h[2].d, h[3].d, h[2].d, h[3].d,
        );
        let (a, b, c, e) = (h[0].dmin, h[1].dmin, h[2].dmin, h[3].dmin);
        (d, _mm256_setr_ps(a, b, a, b, c, e, c, e))
    }
}

/// `acc = fma(d·d_x, Σ, acc)` (then `fnmadd(dmin·d_x, bias, acc)`) per lane.
#[inline(always)]
unsafe fn accumulate<K: KBlock>(
    acc: __m256,
    (dw, mw): (__m256, __m256),
    dx: __m256,
    sum: __m256i,
    bias: __m256i,
) -> __m256 {
    unsafe {
        let acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(sum), acc);
        if K::MINS {
            _mm256_fnmadd_ps(_mm256_mul_ps(mw, dx), _mm256_cvtepi32_ps(bias), acc)
        } else {
            acc
        }
    }
}

/// Four weight rows (`nb` super-blocks each at `w[i]`) · `R` packed `Q8_K` rows (4 or 8), whose
/// scales are interleaved by groups of four at `sc[g] + 8 b` (`[d0, 0, d1, 0, d2, 0, d3, 0]`).
/// Returns `out[r][i]`. Prefetches each block `ahead` bytes on (the same block of the next group
/// of rows).
#[inline(always)]
pub(crate) unsafe fn k_tile<K: KBlock, M: MulSum, const R: usize>(
    nb: usize,
    w: [*const u8; 4],
    x: [TileRow; R],
    sc: [*const f32; 2],
    ahead: usize,
) -> [[f32; 4]; R] {
    unsafe {
        // Pair `p` of rows (2p, 2p + 1) in lanes [r0A r0B r1A r1B | r0C r0D r1C r1D].
        let mut f = [_mm256_setzero_ps(); 4];
        let pick = [
            _mm256_setr_epi32(0, 0, 2, 2, 0, 0, 2, 2),
            _mm256_setr_epi32(4, 4, 6, 6, 4, 4, 6, 6),
        ];
        for b in 0..nb {
            let h = headers::<K>(&w, b, ahead);
            let (s, bias) = super_block::<K, M, R>(&w, b, &h, &x);
            let ws = weight_scales(&h);
            for p in 0..R / 2 {
                let dx = _mm256_loadu_ps(sc[p / 2].add(8 * b));
                let dx = _mm256_permutevar8x32_ps(dx, pick[p % 2]);
                let sp = _mm256_hadd_epi32(s[2 * p], s[2 * p + 1]);
                let bp = _mm256_hadd_epi32(bias[2 * p], bias[2 * p + 1]);
                f[p] = accumulate::<K>(f[p], ws, dx, sp, bp);
            }
        }
        let mut out = [[0f32; 4]; R];
        for p in 0..R / 2 {
            let mut a = [0f32; 8];
            _mm256_storeu_ps(a.as_mut_ptr(), f[p]);
            out[2 * p] = [a[0], a[1], a[4], a[5]];
            out[2 * p + 1] = [a[2], a[3], a[6], a[7]];
        }
        out
    }
}
