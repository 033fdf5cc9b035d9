//! AVX-512 VNNI kernels for weights repacked into groups of 16 rows ([`crate::Layout::Rows16`]):
//! `Q4_1` and `Q8_0` here, `Q4_K` and `Q5_K` in `x86::k512`, `Q6_K` in `x86::k6512` (dispatched
//! from [`gemm_rows`]).
//!
//! One 512-bit `vpdpbusd` multiplies 4 consecutive weights of 16 different rows by the same 4
//! activation bytes (broadcast straight from memory), so a block of 32 values is 8 instructions per
//! activation row and leaves the 16 rows' integer dot products fully reduced in one register: no
//! horizontal sums, one int → float conversion and one or two FMAs per block, activation row and
//! 16 outputs. Weights are decoded once per block for a tile of up to [`TILE`] activation rows.
//!
//! Every output `(row, j)` goes through the same instructions whatever the tile it falls in, so
//! results do not depend on the batch size, a row's position in it, or the thread count.
//!
//! Group-block layouts ([`crate::Layout::Rows16`]; `crate::packed` builds them):
//! - `Q4_1`, 320 bytes: `d` of the 16 rows (16 × f16), `m` (16 × f16), then 4 chunks of 64 bytes:
//!   chunk `c`, lane `L` = bytes `4c..4c+4` of row `L`'s nibbles — low nibbles are values
//!   `4c..4c+4`, high nibbles values `16+4c..16+4c+4`.
//! - `Q8_0`, 544 bytes: `d` (16 × f16), then 8 chunks of 64 bytes: chunk `j`, lane `L` = values
//!   `4j..4j+4` of row `L` plus 128 (as u8), so `vpdpbusd` (u8 × i8) applies; the activation side
//!   carries `128 · Σq` per block to take the offset back out exactly.

use std::arch::x86_64::*;
use std::ops::Range;

use super::group::{for_each_tile, prefetch_group};
use crate::format::{
    GROUP, Q4_1_GROUP_BYTES, Q4_K_GROUP_BYTES, Q5_K_GROUP_BYTES, Q6_K_GROUP_BYTES,
    Q8_0_GROUP_BYTES, QType,
};
use crate::gemm::Gemm;

/// Activation rows per tile: 8 float accumulators, 8 integer sums and 8 decoded weight vectors fit
/// in the 32 vector registers with room for the scales.
const TILE: usize = 8;

/// Whether the CPU has AVX-512F next to AVX2, FMA and F16C (the attention's value sums).
pub(crate) fn has_avx512f() -> bool {
    super::has_avx2() && is_x86_feature_detected!("avx512f")
}

/// Whether the CPU also has AVX-512DQ (the attention's scores, two keys per register).
pub(crate) fn has_avx512dq() -> bool {
    has_avx512f() && is_x86_feature_detected!("avx512dq")
}

/// Whether the CPU has the AVX-512 subsets the kernels use.
pub(crate) fn has_avx512_vnni() -> bool {
    super::has_vnni()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

/// Whether the CPU also has AVX-512 VBMI and BITALG (byte permutes across the register and bit
/// shuffles into a mask: `IQ3_S`'s gathered decode in `iqtile`).
pub(crate) fn has_vbmi_bitalg() -> bool {
    is_x86_feature_detected!("avx512vbmi") && is_x86_feature_detected!("avx512bitalg")
}

/// Weight rows `rows` (a range starting at a multiple of 16) of a repacked matrix against all
/// activation rows of `g`.
///
/// # Panics
/// If the CPU lacks the features or the operands are inconsistent.
pub(crate) fn gemm_rows(g: &Gemm<'_>, rows: Range<usize>) {
    g.check_rows(&rows);
    assert!(
        rows.start.is_multiple_of(GROUP),
        "gemm (16-row groups): rows {rows:?} do not start at a group"
    );
    let nb = g.x.nb();
    let group_bytes = match g.qtype {
        QType::Q4_1 => Q4_1_GROUP_BYTES,
        QType::Q8_0 => Q8_0_GROUP_BYTES,
        QType::Q4_K => Q4_K_GROUP_BYTES,
        QType::Q5_K => Q5_K_GROUP_BYTES,
        QType::Q6_K => Q6_K_GROUP_BYTES,
        other => panic!(
            "gemm (16-row groups): {} weights are never repacked",
            other.name()
        ),
    };
    assert!(
        nb * g.qtype.block_size() == g.k
            && g.w.len() == g.n.div_ceil(GROUP) * nb * group_bytes
            && g.x.act_type() == Some(g.qtype.act_type()),
        "gemm (16-row groups): weight bytes do not match {} × {}",
        g.n,
        g.k
    );
    assert!(
        has_avx512_vnni(),
        "the AVX-512 VNNI backend needs AVX-512 F/BW/VNNI"
    );
    // SAFETY: features checked; the weight buffer holds every group of `nb` blocks (checked above)
    // and activation rows come from `Activations` in the weights' activation format (nb blocks of
    // quants, 8·nb scales per group, and for `Q8_K` 16·nb sums per row).
    unsafe {
        match g.qtype {
            QType::Q4_K | QType::Q5_K => super::k512::gemm_k_tf(g, rows, g.qtype == QType::Q5_K),
            QType::Q6_K => super::k6512::gemm_q6k_tf(g, rows),
            _ => gemm_tf(g, rows, group_bytes),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn gemm_tf(g: &Gemm<'_>, rows: Range<usize>, group_bytes: usize) {
    for_each_tile(g, rows, group_bytes, TILE, |w, grp, r, t| {
        // SAFETY: group `grp` holds `nb` blocks; rows r..r+t are activation rows.
        unsafe {
            match (g.qtype, t) {
                (QType::Q4_1, 8) => tile::<Q41, 8>(g, w, grp, r),
                (QType::Q4_1, 7) => tile::<Q41, 7>(g, w, grp, r),
                (QType::Q4_1, 6) => tile::<Q41, 6>(g, w, grp, r),
                (QType::Q4_1, 5) => tile::<Q41, 5>(g, w, grp, r),
                (QType::Q4_1, 4) => tile::<Q41, 4>(g, w, grp, r),
                (QType::Q4_1, 3) => tile::<Q41, 3>(g, w, grp, r),
                (QType::Q4_1, 2) => tile::<Q41, 2>(g, w, grp, r),
                (QType::Q4_1, _) => tile::<Q41, 1>(g, w, grp, r),
                (_, 8) => tile::<Q80, 8>(g, w, grp, r),
                (_, 7) => tile::<Q80, 7>(g, w, grp, r),
                (_, 6) => tile::<Q80, 6>(g, w, grp, r),
                (_, 5) => tile::<Q80, 5>(g, w, grp, r),
                (_, 4) => tile::<Q80, 4>(g, w, grp, r),
                (_, 3) => tile::<Q80, 3>(g, w, grp, r),
                (_, 2) => tile::<Q80, 2>(g, w, grp, r),
                (_, _) => tile::<Q80, 1>(g, w, grp, r),
            }
        }
    });
}

/// A weight format in the 16-row layout.
trait Group {
    const BYTES: usize;
    /// Decodes a group-block at `wb`: the 8 u8 weight vectors (vector `j` = values `4j..4j+4` of
    /// each row) and the per-row scales `(d, m)` (`m` unused for `Q8_0`).
    unsafe fn decode(wb: *const u8) -> ([__m512i; 8], __m512, __m512);
    /// Adds one block's contribution of one activation row to `acc`: `sum` is `Σ w·q` of the 16
    /// rows, `d`/`s` the row's scale and `Q8_1` sum (`Q4_1`) or `128 · Σq` (`Q8_0`).
    unsafe fn accumulate(
        acc: __m512,
        sum: __m512i,
        dw: __m512,
        mw: __m512,
        d: f32,
        s: f32,
    ) -> __m512;
}

struct Q41;
struct Q80;

#[inline(always)]
unsafe fn scales16(p: *const u8) -> __m512 {
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
}

impl Group for Q41 {
    const BYTES: usize = Q4_1_GROUP_BYTES;

    #[inline(always)]
    unsafe fn decode(wb: *const u8) -> ([__m512i; 8], __m512, __m512) {
        unsafe {
            let low = _mm512_set1_epi8(0x0F);
            let mut w = [_mm512_setzero_si512(); 8];
            for c in 0..4 {
                let q = _mm512_loadu_si512(wb.add(64 + 64 * c).cast());
                w[c] = _mm512_and_si512(q, low);
                w[c + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(q), low);
            }
            (w, scales16(wb), scales16(wb.add(32)))
        }
    }

    #[inline(always)]
    unsafe fn accumulate(
        acc: __m512,
        sum: __m512i,
        dw: __m512,
        mw: __m512,
        d: f32,
        s: f32,
    ) -> __m512 {
        unsafe {
            let p = _mm512_mul_ps(dw, _mm512_set1_ps(d));
            let acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), p, acc);
            _mm512_fmadd_ps(mw, _mm512_set1_ps(s), acc)
        }
    }
}

impl Group for Q80 {
    const BYTES: usize = Q8_0_GROUP_BYTES;

    #[inline(always)]
    unsafe fn decode(wb: *const u8) -> ([__m512i; 8], __m512, __m512) {
        unsafe {
            let mut w = [_mm512_setzero_si512(); 8];
            for (j, v) in w.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(wb.add(32 + 64 * j).cast());
            }
            let dw = scales16(wb);
            (w, dw, dw)
        }
    }

    #[inline(always)]
    unsafe fn accumulate(
        acc: __m512,
        sum: __m512i,
        dw: __m512,
        _mw: __m512,
        d: f32,
        s: f32,
    ) -> __m512 {
        unsafe {
            // Σ(w+128)·q − 128·Σq = Σ w·q, exact in f32 (|values| < 2^24).
            let t = _mm512_sub_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(s));
            _mm512_fmadd_ps(t, _mm512_mul_ps(dw, _mm512_set1_ps(d)), acc)
        }
    }
}

/// Activation rows `r0..r0+T` against weight group `grp` (at `w`), all blocks; stores 16 × T
/// outputs.
#[inline(always)]
unsafe fn tile<G: Group, const T: usize>(g: &Gemm<'_>, w: *const u8, grp: usize, r0: usize) {
    let nb = g.x.nb();
    let x = g.x;
    let qs: [*const u8; T] = std::array::from_fn(|i| x.q_row(r0 + i).as_ptr());
    let sc: [*const f32; T] = std::array::from_fn(|i| {
        let r = r0 + i;
        x.sc_group(r / 4)[2 * (r % 4)..].as_ptr()
    });
    let mut acc = [unsafe { _mm512_setzero_ps() }; T];
    for b in 0..nb {
        // SAFETY (whole block): the caller guarantees `nb` group-blocks at `w` and `nb` blocks of
        // quants / scales per activation row; prefetching touches no memory.
        unsafe {
            let wb = w.add(b * G::BYTES);
            if r0 == 0 {
                prefetch_group(wb, G::BYTES);
            }
            let (wq, dw, mw) = G::decode(wb);
            for i in 0..T {
                let xq = qs[i].add(b * 32);
                // Two chains (even and odd weight vectors): integer sums, so exact in any order.
                let mut s2 = [_mm512_setzero_si512(); 2];
                for (j, wj) in wq.iter().enumerate() {
                    let a = _mm512_set1_epi32(xq.add(4 * j).cast::<i32>().read_unaligned());
                    s2[j % 2] = _mm512_dpbusd_epi32(s2[j % 2], *wj, a);
                }
                let sum = _mm512_add_epi32(s2[0], s2[1]);
                let (d, s) = (sc[i].add(b * 8).read(), sc[i].add(b * 8 + 1).read());
                acc[i] = G::accumulate(acc[i], sum, dw, mw, d, s);
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
