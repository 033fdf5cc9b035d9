//! AVX-512 VNNI kernel of `Q6_K` weights repacked into groups of 16 rows
//! ([`crate::Layout::Rows16`]).
//!
//! Group super-block layout (16 × 210 = 3360 bytes: the same bytes as the 16 GGUF blocks,
//! rearranged; `crate::packed` builds it):
//! - `0..32`: `d` of the 16 rows (f16);
//! - `32..288`: the 16 scale bytes (i8), byte `j` of row `L` at `32 + 16 j + L`;
//! - `288..1312` ([`QH`]): the 64 high-bit bytes, 16 chunks of 64: chunk `c`, lane `L` = bytes
//!   `4 c .. + 4` of row `L`'s;
//! - `1312..3360` ([`QL`]): the 128 nibble bytes, 32 chunks of 64: chunk `c`, lane `L` = bytes
//!   `4 c .. + 4` of row `L`'s.
//!
//! So one 64-byte load holds 4 consecutive 6-bit quants of each of the 16 rows: values
//! `32 v + 4 l .. + 4` (vector `v = 4 h + 2 t + s`, lane `l` < 8) are the nibbles `t` of `ql`
//! chunk `16 h + 8 s + l` with bits `4 t + 2 s` of `qh` chunk `8 h + l` on top.
//!
//! The 256-bit and scalar-equal kernels (`kquants::k_dot1_lanes`, `k_dot4`) keep eight `i32`
//! lanes per output and super-block — lane `l` sums values `32 v + 4 l .. + 4` of every vector
//! `v`, each times its 16-value scale, plus the bias `-32 · (sc_2l · S_2l + sc_2l+1 · S_2l+1)`
//! (`S_j` the activations' sums of 16) — and one float FMA per lane, `acc_l = fma(d·d_x, Σ_l,
//! acc_l)`, summed at the end as `((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7))`. Here each lane `l` is a
//! register of 16 rows: `vpmaddubsw` of 4 quants × 4 broadcast activation bytes gives each row's
//! two pair sums, `vpdpwssd` multiplies them by the row's scale (both `i16` halves of the row's
//! dword) and adds them to lane `l`'s `i32`; the bias is one `vpdpwssd` of `(-32 sc_2l, -32
//! sc_2l+1)` with `(S_2l, S_2l+1)`. The same exact integers and the same float steps per lane, so
//! outputs are bitwise equal to the 256-bit kernels. Weights are decoded once per tile of up to
//! [`TILE`] activation rows.

use std::arch::x86_64::*;
use std::ops::Range;

use super::group::{for_each_tile, prefetch_group};
use super::k512::act_rows;
use crate::format::{GROUP, Q6_K_GROUP_BYTES, QK_K};
use crate::gemm::Gemm;

/// Activation rows per tile (one integer accumulator per row and lane in registers; the float
/// lanes are touched once per super-block).
const TILE: usize = 4;

/// Where the scales, high bits and nibbles start in a group super-block.
const SC: usize = 32;
const QH: usize = 288;
const QL: usize = 1312;

/// `pshufb` mask turning the 16 scale bytes (broadcast to every 128-bit lane) into each row's
/// scale `<< 8` in both `i16` halves of its dword (row `4 k + r` is dword `r` of lane `k`).
static SPREAD: [u8; 64] = {
    let mut m = [0x80u8; 64];
    let mut i = 0;
    while i < 16 {
        m[4 * i + 1] = i as u8;
        m[4 * i + 3] = i as u8;
        i += 1;
    }
    m
};

/// Weight groups of `rows` (a range starting at a multiple of 16) against all activation rows.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VNNI; `g.w` holds `n.div_ceil(16) · nb` `Q6_K` group super-blocks and
/// `g.x` holds `Q8_K` activations of `nb` blocks per row (the caller checked both).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn gemm_q6k_tf(g: &Gemm<'_>, rows: Range<usize>) {
    for_each_tile(g, rows, Q6_K_GROUP_BYTES, TILE, |w, grp, r, t| {
        // SAFETY: group `grp` holds `nb` super-blocks; rows r..r+t are activation rows.
        unsafe {
            match t {
                4 => tile::<4>(g, w, grp, r),
                3 => tile::<3>(g, w, grp, r),
                2 => tile::<2>(g, w, grp, r),
                _ => tile::<1>(g, w, grp, r),
            }
        }
    });
}

/// The scales of the group super-block at `wb`: `sc[j]` holds scale `j` of row `L` in both `i16`
/// halves of dword `L`; `bias[l]` holds `(-32 sc_2l, -32 sc_2l+1)` of each row.
#[inline(always)]
unsafe fn scales(wb: *const u8, sc: &mut [__m512i; 16], bias: &mut [__m512i; 8]) {
    unsafe {
        let spread = _mm512_loadu_si512(SPREAD.as_ptr().cast());
        for (j, s) in sc.iter_mut().enumerate() {
            let b = _mm512_broadcast_i32x4(_mm_loadu_si128(wb.add(SC + 16 * j).cast()));
            *s = _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(b, spread));
        }
        let m32 = _mm512_set1_epi16(-32);
        for (l, b) in bias.iter_mut().enumerate() {
            let pair = _mm512_mask_blend_epi16(0xAAAA_AAAA, sc[2 * l], sc[2 * l + 1]);
            *b = _mm512_mullo_epi16(pair, m32);
        }
    }
}

/// The 6-bit quants of values `32 v + 4 l .. + 4` (`v = 4 h + 2 t + s`) of the 16 rows, for the
/// four `(t, s)` of lane `l` and half `h`: `[(0, 0), (0, 1), (1, 0), (1, 1)]`.
#[inline(always)]
unsafe fn quants(wb: *const u8, h: usize, l: usize) -> [__m512i; 4] {
    unsafe {
        let qh = _mm512_loadu_si512(wb.add(QH + 64 * (8 * h + l)).cast());
        let q0 = _mm512_loadu_si512(wb.add(QL + 64 * (16 * h + l)).cast());
        let q1 = _mm512_loadu_si512(wb.add(QL + 64 * (16 * h + 8 + l)).cast());
        let m30 = _mm512_set1_epi8(0x30);
        // High bits 4 t + 2 s moved to bits 4..6 of each byte.
        let hb = [
            _mm512_and_si512(_mm512_slli_epi16::<4>(qh), m30),
            _mm512_and_si512(_mm512_slli_epi16::<2>(qh), m30),
            _mm512_and_si512(qh, m30),
            _mm512_and_si512(_mm512_srli_epi16::<2>(qh), m30),
        ];
        let (n0, n1) = (_mm512_srli_epi16::<4>(q0), _mm512_srli_epi16::<4>(q1));
        [
            join(q0, hb[0]),
            join(q1, hb[1]),
            join(n0, hb[2]),
            join(n1, hb[3]),
        ]
    }
}

/// `(n & 0x0F) | hi`: a nibble with its high bits (already at bits 4..6) on top.
#[inline(always)]
unsafe fn join(n: __m512i, hi: __m512i) -> __m512i {
    unsafe { _mm512_ternarylogic_epi32::<0xEC>(n, hi, _mm512_set1_epi8(0x0F)) }
}

/// Activation rows `r0..r0+T` against weight group `grp` (at `w`), all super-blocks; stores
/// 16 × T outputs.
#[inline(always)]
unsafe fn tile<const T: usize>(g: &Gemm<'_>, w: *const u8, grp: usize, r0: usize) {
    let nb = g.x.nb();
    let (qs, bs, dx) = act_rows::<T>(g, r0);
    let mut acc = [[unsafe { _mm512_setzero_ps() }; 8]; T];
    let mut sc = [unsafe { _mm512_setzero_si512() }; 16];
    let mut bias = [unsafe { _mm512_setzero_si512() }; 8];
    for b in 0..nb {
        // SAFETY (whole block): the caller guarantees `nb` group super-blocks at `w` and `nb`
        // blocks of quants, sums and scales per activation row; prefetching touches no memory.
        unsafe {
            let wb = w.add(b * Q6_K_GROUP_BYTES);
            if r0 == 0 {
                prefetch_group(wb, Q6_K_GROUP_BYTES);
            }
            scales(wb, &mut sc, &mut bias);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(wb.cast()));
            // Plain loops, not `from_fn`: a closure is not compiled with the caller's features.
            let mut dd = [_mm512_setzero_ps(); T];
            for i in 0..T {
                dd[i] = _mm512_mul_ps(dw, _mm512_set1_ps(dx[i].add(b * 8).read()));
            }
            for l in 0..8 {
                let mut s = [_mm512_setzero_si512(); T];
                for i in 0..T {
                    let pair = bs[i].add(b * 16 + 2 * l).cast::<i32>().read_unaligned();
                    s[i] = _mm512_dpwssd_epi32(s[i], bias[l], _mm512_set1_epi32(pair));
                }
                for h in 0..2 {
                    let q = quants(wb, h, l);
                    for (ts, qv) in q.iter().enumerate() {
                        let v = 4 * h + ts;
                        let scale = sc[2 * v + l / 4];
                        for i in 0..T {
                            let xa = qs[i].add(b * QK_K + 32 * v + 4 * l);
                            let a = _mm512_set1_epi32(xa.cast::<i32>().read_unaligned());
                            let p = _mm512_maddubs_epi16(*qv, a);
                            s[i] = _mm512_dpwssd_epi32(s[i], p, scale);
                        }
                    }
                }
                for i in 0..T {
                    acc[i][l] = _mm512_fmadd_ps(dd[i], _mm512_cvtepi32_ps(s[i]), acc[i][l]);
                }
            }
        }
    }
    for (i, a) in acc.iter().enumerate() {
        let mut v = [0f32; GROUP];
        // SAFETY: `v` holds 16 floats; the lanes are summed in `kernels::hsum`'s order.
        unsafe {
            let lo = _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6]));
            let hi = _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]));
            _mm512_storeu_ps(v.as_mut_ptr(), _mm512_add_ps(lo, hi));
        }
        g.store_run(r0 + i, grp * GROUP, &v);
    }
}
