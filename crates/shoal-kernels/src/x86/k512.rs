//! AVX-512 VNNI kernels of `Q4_K` and `Q5_K` weights repacked into groups of 16 rows
//! ([`crate::Layout::Rows16`]).
//!
//! Group super-block layout (16 × 144 = 2304 bytes for `Q4_K`, 16 × 176 = 2816 for `Q5_K`: the
//! same bytes as the 16 GGUF blocks, rearranged; `crate::packed` builds it):
//! - `0..32`: `d` of the 16 rows (f16), `32..64`: `dmin`;
//! - `64..256`: the 12 scale bytes, byte `t` of row `L` at `64 + 16 t + L` (so one 128-bit load
//!   holds byte `t` of every row and the 6-bit scales and minimums decode for 16 rows at once);
//! - `Q5_K` only, `256..768`: the 32 high-bit bytes, 8 chunks of 64: chunk `c`, lane `L` = bytes
//!   `4 c .. + 4` of row `L`'s (bit `j` of byte `i`: the fifth bit of value `32 j + i`);
//! - then the nibbles ([`KGroup::QS`]), 4 pairs × 8 chunks of 64 bytes: chunk `c` of pair `p`,
//!   lane `L` = bytes `32 p + 4 c .. + 4` of row `L`'s quants, whose low nibbles are values
//!   `64 p + 4 c .. + 4` and high nibbles values `64 p + 32 + 4 c .. + 4`.
//!
//! One `vpdpbusd` multiplies 4 values of 16 rows by 4 broadcast activation bytes, so each
//! 32-value sub-block's dot products end fully reduced per row (lane); they are scaled by the
//! 6-bit scales (`vpmulld`) and summed as exact `i32`s over the super-block, and the minimums'
//! term is `Σ m_j · (sum of the activations' 32 quants)`, also exact. Then, per row, the float
//! steps of every other `Q4_K` path: `acc = fma(d·d_x, Σ, acc)`, `acc = fnmadd(dmin·d_x, bias,
//! acc)` — so outputs are bitwise equal to the 256-bit and scalar kernels. Weights are decoded
//! once per tile of up to [`TILE`] activation rows.

use std::arch::x86_64::*;
use std::ops::Range;

use super::group::{for_each_tile, prefetch_group};
use crate::format::{GROUP, Q4_K_GROUP_BYTES, Q5_K_GROUP_BYTES, QK_K};
use crate::gemm::Gemm;

/// Activation rows per tile (two integer accumulators per row and pair, plus the row's sum and
/// float accumulator, stay in registers).
const TILE: usize = 4;

/// A K-quant with 32-value scales in the 16-row layout.
trait KGroup {
    const BYTES: usize;
    /// Where the nibbles start in a group super-block.
    const QS: usize;
    /// The unsigned quants of pair `p`, chunk `c` (low nibbles: sub-block `2 p`, high: `2 p + 1`).
    unsafe fn quants(wb: *const u8, p: usize, c: usize) -> (__m512i, __m512i);
}

struct Q4K;
struct Q5K;

#[inline(always)]
unsafe fn nibbles(wb: *const u8, at: usize) -> (__m512i, __m512i) {
    unsafe {
        let (q, low) = (
            _mm512_loadu_si512(wb.add(at).cast()),
            _mm512_set1_epi8(0x0F),
        );
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), low);
        (_mm512_and_si512(q, low), hi)
    }
}

impl KGroup for Q4K {
    const BYTES: usize = Q4_K_GROUP_BYTES;
    const QS: usize = 256;
    #[inline(always)]
    unsafe fn quants(wb: *const u8, p: usize, c: usize) -> (__m512i, __m512i) {
        unsafe { nibbles(wb, Self::QS + 64 * (8 * p + c)) }
    }
}

impl KGroup for Q5K {
    const BYTES: usize = Q5_K_GROUP_BYTES;
    const QS: usize = 768;
    #[inline(always)]
    unsafe fn quants(wb: *const u8, p: usize, c: usize) -> (__m512i, __m512i) {
        unsafe {
            let (lo, hi) = nibbles(wb, Self::QS + 64 * (8 * p + c));
            let qh = _mm512_loadu_si512(wb.add(256 + 64 * c).cast());
            let sixteen = _mm512_set1_epi8(16);
            let (b0, b1) = (
                _mm512_set1_epi8(1 << (2 * p)),
                _mm512_set1_epi8(2 << (2 * p)),
            );
            let lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, b0), lo, sixteen);
            let hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, b1), hi, sixteen);
            (lo, hi)
        }
    }
}

/// Weight groups of `rows` (a range starting at a multiple of 16) against all activation rows,
/// `Q4_K` or `Q5_K` (`q5`).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VNNI; `g.w` holds `n.div_ceil(16) · nb` group super-blocks of the
/// format and `g.x` holds `Q8_K` activations of `nb` blocks per row (the caller checked both).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn gemm_k_tf(g: &Gemm<'_>, rows: Range<usize>, q5: bool) {
    let bytes = if q5 { Q5K::BYTES } else { Q4K::BYTES };
    // The closure is written here, in the `target_feature` function, so it is compiled with its
    // features (a closure in an `inline(always)` helper is not, and its kernels would not inline).
    for_each_tile(g, rows, bytes, TILE, |w, grp, r, t| {
        // SAFETY: as the caller guarantees; group `grp` holds `nb` super-blocks; rows r..r+t are
        // activation rows.
        unsafe {
            if q5 {
                tiles::<Q5K>(g, w, grp, r, t)
            } else {
                tiles::<Q4K>(g, w, grp, r, t)
            }
        }
    });
}

/// [`tile`] for `t` activation rows from `r`.
#[inline(always)]
unsafe fn tiles<K: KGroup>(g: &Gemm<'_>, w: *const u8, grp: usize, r: usize, t: usize) {
    // SAFETY: as the caller guarantees.
    unsafe {
        match t {
            4 => tile::<K, 4>(g, w, grp, r),
            3 => tile::<K, 3>(g, w, grp, r),
            2 => tile::<K, 2>(g, w, grp, r),
            _ => tile::<K, 1>(g, w, grp, r),
        }
    }
}

/// The 8 scales (bytes `0..128`, scale `j` of row `L` at `16 j + L`) and 8 minimums (from byte
/// 128) of the 16 rows of the group super-block at `wb`, as `k4_scales` decodes them per row.
#[inline(always)]
unsafe fn scales(wb: *const u8, out: &mut [u8; 256]) {
    unsafe {
        let b = |t: usize| _mm_loadu_si128(wb.add(64 + 16 * t).cast());
        let (lo6, lo4, hi2) = (
            _mm_set1_epi8(0x3F),
            _mm_set1_epi8(0x0F),
            _mm_set1_epi8(0x03),
        );
        let top2 = |v: __m128i| _mm_slli_epi16::<4>(_mm_and_si128(_mm_srli_epi16::<6>(v), hi2));
        let o = out.as_mut_ptr();
        for j in 0..4 {
            let (a, m, c) = (b(j), b(j + 4), b(j + 8));
            let sc_hi = _mm_or_si128(_mm_and_si128(c, lo4), top2(a));
            let m_hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16::<4>(c), lo4), top2(m));
            _mm_storeu_si128(o.add(16 * j).cast(), _mm_and_si128(a, lo6));
            _mm_storeu_si128(o.add(16 * (j + 4)).cast(), sc_hi);
            _mm_storeu_si128(o.add(128 + 16 * j).cast(), _mm_and_si128(m, lo6));
            _mm_storeu_si128(o.add(128 + 16 * (j + 4)).cast(), m_hi);
        }
    }
}

/// 16 bytes at `p` as `i32` lanes.
#[inline(always)]
unsafe fn widen(p: *const u8) -> __m512i {
    unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast())) }
}

/// The `Q8_K` activation rows `r0..r0+T` of `g`: their quants, their sums of 16 and their `d`
/// (block `b`'s at `8 b`).
#[inline(always)]
pub(super) fn act_rows<const T: usize>(
    g: &Gemm<'_>,
    r0: usize,
) -> ([*const u8; T], [*const i16; T], [*const f32; T]) {
    let x = g.x;
    let qs = std::array::from_fn(|i| x.q_row(r0 + i).as_ptr());
    let bs = std::array::from_fn(|i| x.bsums_row(r0 + i).as_ptr());
    let sc = std::array::from_fn(|i| {
        let r = r0 + i;
        x.sc_group(r / 4)[2 * (r % 4)..].as_ptr()
    });
    (qs, bs, sc)
}

/// Activation rows `r0..r0+T` against weight group `grp` (at `w`), all super-blocks; stores
/// 16 × T outputs.
#[inline(always)]
unsafe fn tile<K: KGroup, const T: usize>(g: &Gemm<'_>, w: *const u8, grp: usize, r0: usize) {
    let nb = g.x.nb();
    let (qs, bs, sc) = act_rows::<T>(g, r0);
    let mut acc = [unsafe { _mm512_setzero_ps() }; T];
    let mut sm = [0u8; 256];
    for b in 0..nb {
        // SAFETY (whole block): the caller guarantees `nb` group super-blocks at `w` and `nb`
        // blocks of quants, sums and scales per activation row; prefetching touches no memory.
        unsafe {
            let wb = w.add(b * K::BYTES);
            if r0 == 0 {
                prefetch_group(wb, K::BYTES);
            }
            scales(wb, &mut sm);
            let mut isum = [_mm512_setzero_si512(); T];
            for p in 0..4 {
                let z = _mm512_setzero_si512();
                let (mut slo, mut shi) = ([z; T], [z; T]);
                for c in 0..8 {
                    let (lo, hi) = K::quants(wb, p, c);
                    for i in 0..T {
                        let xa = qs[i].add(b * QK_K + 64 * p + 4 * c);
                        let a0 = _mm512_set1_epi32(xa.cast::<i32>().read_unaligned());
                        let a1 = _mm512_set1_epi32(xa.add(32).cast::<i32>().read_unaligned());
                        slo[i] = _mm512_dpbusd_epi32(slo[i], lo, a0);
                        shi[i] = _mm512_dpbusd_epi32(shi[i], hi, a1);
                    }
                }
                let (s0, s1) = (
                    widen(sm.as_ptr().add(32 * p)),
                    widen(sm.as_ptr().add(32 * p + 16)),
                );
                for i in 0..T {
                    let t = _mm512_add_epi32(
                        _mm512_mullo_epi32(slo[i], s0),
                        _mm512_mullo_epi32(shi[i], s1),
                    );
                    isum[i] = _mm512_add_epi32(isum[i], t);
                }
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(wb.cast()));
            let mw = _mm512_cvtph_ps(_mm256_loadu_si256(wb.add(32).cast()));
            for i in 0..T {
                let s = bs[i].add(b * 16);
                let mut bias = _mm512_setzero_si512();
                for j in 0..8 {
                    let sj = i32::from(s.add(2 * j).read()) + i32::from(s.add(2 * j + 1).read());
                    let m = widen(sm.as_ptr().add(128 + 16 * j));
                    bias = _mm512_add_epi32(bias, _mm512_mullo_epi32(m, _mm512_set1_epi32(sj)));
                }
                let dx = _mm512_set1_ps(sc[i].add(b * 8).read());
                let (dd, dm) = (_mm512_mul_ps(dw, dx), _mm512_mul_ps(mw, dx));
                acc[i] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(isum[i]), acc[i]);
                acc[i] = _mm512_fnmadd_ps(dm, _mm512_cvtepi32_ps(bias), acc[i]);
            }
        }
    }
    for (i, a) in acc.iter().enumerate() {
        let mut v = [0f32; GROUP];
        // SAFETY: `v` holds 16 floats.
        unsafe { _mm512_storeu_ps(v.as_mut_ptr(), *a) };
        g.store_run(r0 + i, grp * GROUP, &v);
    }
}
