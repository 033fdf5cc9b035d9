//! x86-64 backends: AVX2 + FMA + F16C, optionally with AVX-VNNI.
//!
//! The functions of this module are safe: each checks that the CPU has the features and that the
//! slices have the lengths the kernels read, then enters a `#[target_feature]` function in which
//! the generic `#[inline(always)]` kernels of [`kernels`] are compiled.

pub(crate) mod avx512;
mod kernels;

use std::arch::is_x86_feature_detected;
use std::ops::Range;

use kernels::{GgmlQ80, GgmlQ81, Madd, MulSum, Packed, Vnni};

use crate::format::{Q4_1_BYTES, Q8_0_BYTES, QK, QType};
use crate::gemm::Gemm;

/// Activation rows per tile: a tile of quantized activations (≤ 32 × 1.5 KB for k = 1536) stays
/// in L1/L2 while a chunk of weight rows is multiplied against it. A multiple of 4.
const ACT_TILE: usize = 32;

/// Whether the CPU has AVX2, FMA and F16C (std caches the detection).
pub(crate) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Whether the CPU also has AVX-VNNI.
pub(crate) fn has_vnni() -> bool {
    has_avx2() && is_x86_feature_detected!("avxvnni")
}

/// One dot product of ggml rows on the AVX2 (`vnni = false`) or AVX-VNNI backend.
///
/// # Panics
/// If the CPU lacks the features or the lengths do not match `k`.
pub(crate) fn vec_dot(vnni: bool, qtype: QType, k: usize, w: &[u8], x: &[u8]) -> f32 {
    let (wb, xb) = match (qtype.try_row_bytes(k), qtype.act_type().try_row_bytes(k)) {
        (Ok(w), Ok(x)) => (w, x),
        _ => panic!("vec_dot: k = {k} is not a multiple of the block size"),
    };
    assert!(
        w.len() == wb && x.len() == xb,
        "vec_dot: slice lengths do not match k = {k}"
    );
    if !matches!(qtype, QType::F32 | QType::Q4_1 | QType::Q8_0) {
        return crate::scalar::vec_dot(qtype, k, w, x);
    }
    if vnni {
        assert!(
            has_vnni(),
            "the AVX-VNNI backend needs AVX2, FMA, F16C and AVX-VNNI"
        );
        // SAFETY: features checked; both rows hold exactly the blocks for `k` values.
        unsafe { vec_dot_vnni_tf(qtype, k, w, x) }
    } else {
        assert!(has_avx2(), "the AVX2 backend needs AVX2, FMA and F16C");
        // SAFETY: as above.
        unsafe { vec_dot_avx2_tf(qtype, k, w, x) }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_avx2_tf(qtype: QType, k: usize, w: &[u8], x: &[u8]) -> f32 {
    // SAFETY: the caller guarantees the features and the lengths.
    unsafe { dot_ggml::<Madd>(qtype, k, w, x) }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn vec_dot_vnni_tf(qtype: QType, k: usize, w: &[u8], x: &[u8]) -> f32 {
    // SAFETY: the caller guarantees the features and the lengths.
    unsafe { dot_ggml::<Vnni>(qtype, k, w, x) }
}

#[inline(always)]
unsafe fn dot_ggml<M: MulSum>(qtype: QType, k: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x, nb) = (w.as_ptr(), x.as_ptr(), k / QK);
    // SAFETY: the caller guarantees complete rows of `k` values.
    unsafe {
        match qtype {
            QType::Q4_1 => kernels::q4_1_dot1::<M, _>(nb, w, GgmlQ81(x)),
            QType::Q8_0 => kernels::q8_0_dot1::<M, _>(nb, w, GgmlQ80(x)),
            QType::F32 => kernels::f32_dot(k, w, x.cast::<f32>()),
            _ => unreachable!("no SIMD kernel yet"),
        }
    }
}

/// Weight rows `rows` of `g` against all its activation rows, AVX2 (`vnni = false`) or AVX-VNNI.
///
/// # Panics
/// If the CPU lacks the features or the operands are inconsistent.
pub(crate) fn gemm_rows(vnni: bool, g: &Gemm<'_>, rows: Range<usize>) {
    g.check_rows(&rows);
    if !matches!(g.qtype, QType::F32 | QType::Q4_1 | QType::Q8_0) {
        return crate::scalar::gemm_rows(g, rows);
    }
    let nb = g.x.nb();
    let block_bytes = match g.qtype {
        QType::Q4_1 => Q4_1_BYTES,
        QType::Q8_0 => Q8_0_BYTES,
        QType::F32 => 4,
        _ => unreachable!("no SIMD kernel yet"),
    };
    let blocks_ok = if g.qtype == QType::F32 {
        nb == g.k
    } else {
        nb * QK == g.k
    };
    assert!(
        blocks_ok && g.w_row_bytes == nb * block_bytes,
        "gemm: row sizes do not match k = {}",
        g.k
    );
    if vnni {
        assert!(
            has_vnni(),
            "the AVX-VNNI backend needs AVX2, FMA, F16C and AVX-VNNI"
        );
        // SAFETY: features checked above; `gemm` reads rows through bounds-checked slices.
        unsafe { gemm_vnni_tf(g, rows) }
    } else {
        assert!(has_avx2(), "the AVX2 backend needs AVX2, FMA and F16C");
        // SAFETY: as above.
        unsafe { gemm_avx2_tf(g, rows) }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_avx2_tf(g: &Gemm<'_>, rows: Range<usize>) {
    // SAFETY: the caller guarantees the features.
    unsafe { gemm::<Madd>(g, rows) }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn gemm_vnni_tf(g: &Gemm<'_>, rows: Range<usize>) {
    // SAFETY: the caller guarantees the features.
    unsafe { gemm::<Vnni>(g, rows) }
}

/// The weight-stationary loop: for each tile of activation rows, each weight row of the chunk is
/// decoded once per block and dotted against four activation rows at a time.
#[inline(always)]
unsafe fn gemm<M: MulSum>(g: &Gemm<'_>, rows: Range<usize>) {
    match g.qtype {
        // SAFETY (both): the caller checked that weight rows hold `nb` blocks; activation rows
        // come from `Activations`, whose slices hold `nb` blocks of quants and 8·nb scales.
        QType::Q4_1 => unsafe { gemm_q::<Q41<M>>(g, rows) },
        QType::Q8_0 => unsafe { gemm_q::<Q80<M>>(g, rows) },
        QType::F32 => {
            for r in 0..g.m {
                let x = g.x.f_row(r);
                for j in rows.clone() {
                    let w = g.weight_row(j);
                    // SAFETY: `w` holds `k` f32 values (checked by the caller), `x` holds `k`.
                    g.store(r, j, unsafe {
                        kernels::f32_dot(x.len(), w.as_ptr(), x.as_ptr())
                    });
                }
            }
        }
        _ => unreachable!("no SIMD kernel yet"),
    }
}

/// The one-row and four-row kernels of a quantized weight format.
trait QDots {
    unsafe fn dot4(nb: usize, w: *const u8, qs: [*const u8; 4], sc: *const f32) -> [f32; 4];
    unsafe fn dot1(nb: usize, w: *const u8, a: Packed) -> f32;
}

struct Q41<M>(std::marker::PhantomData<M>);
struct Q80<M>(std::marker::PhantomData<M>);

impl<M: MulSum> QDots for Q41<M> {
    #[inline(always)]
    unsafe fn dot4(nb: usize, w: *const u8, qs: [*const u8; 4], sc: *const f32) -> [f32; 4] {
        unsafe { kernels::q4_1_dot4::<M>(nb, w, qs, sc) }
    }
    #[inline(always)]
    unsafe fn dot1(nb: usize, w: *const u8, a: Packed) -> f32 {
        unsafe { kernels::q4_1_dot1::<M, Packed>(nb, w, a) }
    }
}

impl<M: MulSum> QDots for Q80<M> {
    #[inline(always)]
    unsafe fn dot4(nb: usize, w: *const u8, qs: [*const u8; 4], sc: *const f32) -> [f32; 4] {
        unsafe { kernels::q8_0_dot4::<M>(nb, w, qs, sc) }
    }
    #[inline(always)]
    unsafe fn dot1(nb: usize, w: *const u8, a: Packed) -> f32 {
        unsafe { kernels::q8_0_dot1::<M, Packed>(nb, w, a) }
    }
}

#[inline(always)]
unsafe fn gemm_q<K: QDots>(g: &Gemm<'_>, rows: Range<usize>) {
    let (nb, m) = (g.x.nb(), g.m);
    if !rows.is_empty() {
        // SAFETY: prefetching touches no memory.
        unsafe { kernels::prefetch_start(g.weight_row(rows.start).as_ptr()) };
    }
    let mut r0 = 0;
    while r0 < m {
        let r1 = (r0 + ACT_TILE).min(m);
        for j in rows.clone() {
            let w = g.weight_row(j).as_ptr();
            let mut r = r0;
            // `r0` is a multiple of 4, so `r` starts each group of four rows here.
            while r + 4 <= r1 {
                let x = &g.x;
                let qs = [
                    x.q_row(r).as_ptr(),
                    x.q_row(r + 1).as_ptr(),
                    x.q_row(r + 2).as_ptr(),
                    x.q_row(r + 3).as_ptr(),
                ];
                // SAFETY: four complete rows of `nb` blocks and their group's 8·nb scales.
                let v = unsafe { K::dot4(nb, w, qs, x.sc_group(r / 4).as_ptr()) };
                g.store(r, j, v[0]);
                g.store(r + 1, j, v[1]);
                g.store(r + 2, j, v[2]);
                g.store(r + 3, j, v[3]);
                r += 4;
            }
            while r < r1 {
                let a = Packed {
                    qs: g.x.q_row(r).as_ptr(),
                    sc: g.x.sc_group(r / 4)[2 * (r % 4)..].as_ptr(),
                };
                // SAFETY: a complete row; its scales start at lane `r % 4` of the group, whose
                // last block still has the 2 floats read at `8 (nb - 1) + 2 lane`.
                g.store(r, j, unsafe { K::dot1(nb, w, a) });
                r += 1;
            }
        }
        r0 = r1;
    }
}

/// Quantizes with AVX2 (bitwise equal to the scalar reference); see `Backend::quantize_q8`.
///
/// # Panics
/// If the CPU lacks the features or the lengths disagree.
pub(crate) fn quantize_q8(x: &[f32], qs: &mut [u8], ds: &mut [(f32, i32)]) {
    assert!(has_avx2(), "the AVX2 backend needs AVX2, FMA and F16C");
    assert!(
        x.len() == qs.len() && ds.len() * QK == x.len(),
        "quantize_q8: mismatched lengths"
    );
    // SAFETY: features checked above.
    unsafe { quantize_q8_tf(x, qs, ds) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_tf(x: &[f32], qs: &mut [u8], ds: &mut [(f32, i32)]) {
    for ((xb, qb), o) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(ds) {
        // SAFETY: `xb` has 32 floats and `qb` 32 bytes (exact chunks).
        *o = unsafe { kernels::quantize_block_q8(xb.as_ptr(), qb.as_mut_ptr()) };
    }
}
