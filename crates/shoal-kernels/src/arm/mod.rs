//! aarch64 NEON backends: [`Level::Neon`] (plain Advanced SIMD, every ARMv8-A CPU),
//! [`Level::Dot`] (plus the ARMv8.2 `dotprod` extension's `sdot`) and [`Level::I8mm`] (plus
//! `i8mm`'s `smmla` in the matmul: [`mmla`] for the 32-value formats, [`mmla_k`] for the
//! K-quants), detected at run time.
//!
//! The functions of this module are safe: each checks that the CPU has the level's features and
//! that the slices have the lengths the kernels read, then enters a `#[target_feature]` function
//! in which the generic `#[inline(always)]` kernels are compiled with the level's 8-bit
//! multiply-accumulate ([`ops::Dot`]: [`ops::Smull`] or [`ops::Sdot`]): [`legacy`] (the 32-value
//! formats), [`kquants`] (the K-quants), [`plain`] (`F32`, `F16`, `BF16`), [`quant`] (`Q8`/`Q8_K`
//! quantization of activations) and [`iq`] (the IQ formats). [`attn`] holds the NEON loops of
//! `crate::attn`, and [`ops`]' f16 conversions serve `crate::math` too.
//!
//! Every kernel takes `R` activation rows at once (the weights decoded once for them) with the
//! same float operations per output as for one row, so [`gemm_rows`] (four rows at a time, the
//! rest one by one, over tiles of [`ACT_TILE`] rows) is bitwise equal to [`vec_dot`]; the
//! quantized formats are bitwise equal to the scalar reference too (exact integer sums, the
//! reference's float steps).
//!
//! Where the IQ formats plug in: `iq.rs` (helper lane M) answers [`iq::vec_dot`] and
//! [`iq::gemm_rows`] for the formats it has kernels for; until then they return `None` / `false`
//! and the scalar reference runs. An IQ kernel can reuse [`ops`] (`Dot::dot16`, f16 helpers),
//! the activation readers [`legacy::Act32`] (`GgmlQ8`, `Packed`) and [`kquants::ActK`]
//! (`GgmlQ8K`, `PackedK`), and the row loop [`gemm_q`] by implementing [`Rows`].

pub(crate) mod attn;
mod iq;
mod kquants;
mod legacy;
mod mmla;
mod mmla_k;
pub(crate) mod ops;
mod plain;
mod quant;

use std::arch::is_aarch64_feature_detected;
use std::ops::Range;

use kquants::{ActK, GgmlQ8K, KBlock, PackedK};
use legacy::{Act32, Block32, GgmlQ8, Packed};
use ops::{Dot, Sdot, Smull};

use crate::acts::Activations;
use crate::format::{QK, QK_K, QType};
use crate::gemm::Gemm;
use crate::scalar;

/// Activation rows per tile: a tile of quantized activations stays in L1/L2 while a chunk of
/// weight rows is multiplied against it. A multiple of 8 (the `i8mm` K-quant tile).
const ACT_TILE: usize = 32;

/// A NEON level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// Advanced SIMD only.
    Neon,
    /// Advanced SIMD and `dotprod`.
    Dot,
    /// Advanced SIMD, `dotprod` and `i8mm` (`smmla` in the matmul of the 32-value formats and
    /// the K-quants).
    I8mm,
}

/// Whether the CPU has Advanced SIMD (every aarch64 Linux and macOS CPU; std caches it).
pub(crate) fn has_neon() -> bool {
    is_aarch64_feature_detected!("neon")
}

/// Whether the CPU also has the `dotprod` extension (`sdot`).
pub(crate) fn has_dotprod() -> bool {
    has_neon() && is_aarch64_feature_detected!("dotprod")
}

/// Whether the CPU also has the `i8mm` extension (`smmla`).
pub(crate) fn has_i8mm() -> bool {
    has_dotprod() && is_aarch64_feature_detected!("i8mm")
}

/// Panics unless the CPU has the features of `level`.
fn check_level(level: Level) {
    match level {
        Level::Neon => assert!(has_neon(), "the NEON backend needs Advanced SIMD"),
        Level::Dot => assert!(has_dotprod(), "the NEON dotprod backend needs dotprod"),
        Level::I8mm => assert!(has_i8mm(), "the NEON i8mm backend needs dotprod and i8mm"),
    }
}

/// One dot product of ggml rows on `level`.
///
/// # Panics
/// If the CPU lacks the features or the lengths do not match `k`.
pub(crate) fn vec_dot(level: Level, qtype: QType, k: usize, w: &[u8], x: &[u8]) -> f32 {
    let (wb, xb) = match (qtype.try_row_bytes(k), qtype.act_type().try_row_bytes(k)) {
        (Ok(w), Ok(x)) => (w, x),
        _ => panic!("vec_dot: k = {k} is not a multiple of the block size"),
    };
    assert!(
        w.len() == wb && x.len() == xb,
        "vec_dot: slice lengths do not match k = {k}"
    );
    check_level(level);
    // SAFETY: features checked; both rows hold exactly the blocks for `k` values.
    let v = unsafe {
        match level {
            Level::Neon => vec_dot_neon_tf(qtype, k, w, x),
            Level::Dot | Level::I8mm => vec_dot_dot_tf(qtype, k, w, x),
        }
    };
    v.unwrap_or_else(|| scalar::vec_dot(qtype, k, w, x))
}

#[target_feature(enable = "neon")]
unsafe fn vec_dot_neon_tf(qtype: QType, k: usize, w: &[u8], x: &[u8]) -> Option<f32> {
    // SAFETY: the caller guarantees the features and the lengths.
    unsafe { dot_ggml::<Smull>(qtype, k, w, x) }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn vec_dot_dot_tf(qtype: QType, k: usize, w: &[u8], x: &[u8]) -> Option<f32> {
    // SAFETY: the caller guarantees the features and the lengths.
    unsafe { dot_ggml::<Sdot>(qtype, k, w, x) }
}

/// One ggml row pair on level `D`; `None` for an IQ format without a NEON kernel.
#[inline(always)]
unsafe fn dot_ggml<D: Dot>(qtype: QType, k: usize, w: &[u8], x: &[u8]) -> Option<f32> {
    use kquants::{Q2K, Q3K, Q4K, Q5K, Q6K};
    use legacy::{Q40, Q41, Q50, Q51, Q80};
    let (wp, xp, nb, nbk) = (w.as_ptr(), x.as_ptr(), k / QK, k / QK_K);
    let (q80, q81, q8k) = ([GgmlQ8::q8_0(xp)], [GgmlQ8::q8_1(xp)], [GgmlQ8K(xp)]);
    // SAFETY: the caller guarantees complete rows of `k` values.
    unsafe {
        Some(match qtype {
            QType::F32 => plain::plain_dot::<plain::F32>(k, wp, xp),
            QType::F16 => plain::plain_dot::<plain::F16>(k, wp, xp),
            QType::BF16 => plain::plain_dot::<plain::Bf16>(k, wp, xp),
            QType::Q4_0 => legacy::dotn::<Q40, D, _, 1>(nb, wp, q80)[0],
            QType::Q4_1 => legacy::dotn::<Q41, D, _, 1>(nb, wp, q81)[0],
            QType::Q5_0 => legacy::dotn::<Q50, D, _, 1>(nb, wp, q80)[0],
            QType::Q5_1 => legacy::dotn::<Q51, D, _, 1>(nb, wp, q81)[0],
            QType::Q8_0 => legacy::dotn::<Q80, D, _, 1>(nb, wp, q80)[0],
            QType::Q2_K => kquants::dotn::<Q2K, D, _, 1>(nbk, wp, q8k)[0],
            QType::Q3_K => kquants::dotn::<Q3K, D, _, 1>(nbk, wp, q8k)[0],
            QType::Q4_K => kquants::dotn::<Q4K, D, _, 1>(nbk, wp, q8k)[0],
            QType::Q5_K => kquants::dotn::<Q5K, D, _, 1>(nbk, wp, q8k)[0],
            QType::Q6_K => kquants::dotn::<Q6K, D, _, 1>(nbk, wp, q8k)[0],
            _ => return iq::vec_dot::<D>(qtype, k, w, x),
        })
    }
}

/// Weight rows `rows` of `g` (GGUF rows) against all its activation rows on `level`.
///
/// # Panics
/// If the CPU lacks the features or the operands are inconsistent.
pub(crate) fn gemm_rows(level: Level, g: &Gemm<'_>, rows: Range<usize>) {
    g.check_ggml(&rows);
    check_level(level);
    // SAFETY: features checked above; weight rows hold `nb` blocks (checked above) and are read
    // through bounds-checked slices; activation rows come from `Activations` in the format of
    // the weights (checked above).
    let done = unsafe {
        match level {
            Level::Neon => gemm_neon_tf(g, rows.clone()),
            Level::Dot => gemm_dot_tf(g, rows.clone()),
            Level::I8mm => gemm_i8mm_tf(g, rows.clone()),
        }
    };
    if !done {
        scalar::gemm_rows(g, rows);
    }
}

#[target_feature(enable = "neon")]
unsafe fn gemm_neon_tf(g: &Gemm<'_>, rows: Range<usize>) -> bool {
    // SAFETY: the caller guarantees the features and the operands.
    unsafe { gemm::<Smull>(g, rows) }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn gemm_dot_tf(g: &Gemm<'_>, rows: Range<usize>) -> bool {
    // SAFETY: the caller guarantees the features and the operands.
    unsafe { gemm::<Sdot>(g, rows) }
}

#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn gemm_i8mm_tf(g: &Gemm<'_>, rows: Range<usize>) -> bool {
    use kquants::{Q2K, Q3K, Q4K, Q5K, Q6K};
    use legacy::{Q40, Q41, Q50, Q51, Q80};
    let p = |r: usize| packed(g.x, r);
    let pk = |r: usize| packed_k(g.x, r);
    // SAFETY (all): the caller guarantees the features and the operands.
    unsafe {
        match g.qtype {
            QType::Q4_0 => mmla::gemm_rows::<Q40>(g, rows, ACT_TILE, p),
            QType::Q4_1 => mmla::gemm_rows::<Q41>(g, rows, ACT_TILE, p),
            QType::Q5_0 => mmla::gemm_rows::<Q50>(g, rows, ACT_TILE, p),
            QType::Q5_1 => mmla::gemm_rows::<Q51>(g, rows, ACT_TILE, p),
            QType::Q8_0 => mmla::gemm_rows::<Q80>(g, rows, ACT_TILE, p),
            QType::Q2_K => mmla_k::gemm_rows::<Q2K>(g, rows, ACT_TILE, pk),
            QType::Q3_K => mmla_k::gemm_rows::<Q3K>(g, rows, ACT_TILE, pk),
            QType::Q4_K => mmla_k::gemm_rows::<Q4K>(g, rows, ACT_TILE, pk),
            QType::Q5_K => mmla_k::gemm_rows::<Q5K>(g, rows, ACT_TILE, pk),
            QType::Q6_K => mmla_k::gemm_rows::<Q6K>(g, rows, ACT_TILE, pk),
            _ => return gemm::<Sdot>(g, rows),
        }
    }
    true
}

/// The matmul rows of every format on level `D`; `false` for an IQ format without a kernel.
#[inline(always)]
unsafe fn gemm<D: Dot>(g: &Gemm<'_>, rows: Range<usize>) -> bool {
    use kquants::{Q2K, Q3K, Q4K, Q5K, Q6K};
    use legacy::{Q40, Q41, Q50, Q51, Q80};
    // SAFETY (all): the caller checked the operands.
    unsafe {
        match g.qtype {
            QType::F32 => gemm_q::<Plain<plain::F32>>(g, rows),
            QType::F16 => gemm_q::<Plain<plain::F16>>(g, rows),
            QType::BF16 => gemm_q::<Plain<plain::Bf16>>(g, rows),
            QType::Q4_0 => gemm_q::<Legacy<Q40, D>>(g, rows),
            QType::Q4_1 => gemm_q::<Legacy<Q41, D>>(g, rows),
            QType::Q5_0 => gemm_q::<Legacy<Q50, D>>(g, rows),
            QType::Q5_1 => gemm_q::<Legacy<Q51, D>>(g, rows),
            QType::Q8_0 => gemm_q::<Legacy<Q80, D>>(g, rows),
            QType::Q2_K => gemm_q::<KQuant<Q2K, D>>(g, rows),
            QType::Q3_K => gemm_q::<KQuant<Q3K, D>>(g, rows),
            QType::Q4_K => gemm_q::<KQuant<Q4K, D>>(g, rows),
            QType::Q5_K => gemm_q::<KQuant<Q5K, D>>(g, rows),
            QType::Q6_K => gemm_q::<KQuant<Q6K, D>>(g, rows),
            _ => return iq::gemm_rows::<D>(g, rows),
        }
    }
    true
}

/// The one-row and four-row kernels of a weight format over the packed activations of
/// [`Activations`] (row `r`, or rows `r..r + 4` with `r` a multiple of 4), with the same float
/// operations per output.
pub(super) trait Rows {
    /// Whether to group activation rows by four (the plain formats dot one row at a time).
    const FOUR: bool = true;
    unsafe fn dot4(nb: usize, w: *const u8, x: &Activations, r: usize) -> [f32; 4];
    unsafe fn dot1(nb: usize, w: *const u8, x: &Activations, r: usize) -> f32;
}

struct Legacy<B, D>(std::marker::PhantomData<(B, D)>);
struct KQuant<B, D>(std::marker::PhantomData<(B, D)>);
struct Plain<P>(std::marker::PhantomData<P>);

/// Row `r` of the packed layout: its quants and its lane's scales.
#[inline(always)]
fn packed(x: &Activations, r: usize) -> Packed {
    Packed {
        qs: x.q_row(r).as_ptr(),
        sc: x.sc_group(r / 4)[2 * (r % 4)..].as_ptr(),
    }
}

/// Row `r` of the packed layout as a `Q8_K` row.
#[inline(always)]
fn packed_k(x: &Activations, r: usize) -> PackedK {
    let Packed { qs, sc } = packed(x, r);
    PackedK {
        qs,
        sc,
        bs: x.bsums_row(r).as_ptr(),
    }
}

// SAFETY (every `dot4`/`dot1` below): four (or one) complete rows of `nb` blocks and their
// group's 8·nb scales (and, for `Q8_K`, 16·nb sums per row); a single row's scales start at lane
// `r % 4` of the group, whose last block still has the 2 floats read at `8 (nb - 1) + 2 lane`.

impl<B: Block32, D: Dot> Rows for Legacy<B, D> {
    #[inline(always)]
    unsafe fn dot4(nb: usize, w: *const u8, x: &Activations, r: usize) -> [f32; 4] {
        let a = [0, 1, 2, 3].map(|i| packed(x, r + i));
        unsafe { legacy::dotn::<B, D, _, 4>(nb, w, a) }
    }
    #[inline(always)]
    unsafe fn dot1(nb: usize, w: *const u8, x: &Activations, r: usize) -> f32 {
        unsafe { legacy::dotn::<B, D, _, 1>(nb, w, [packed(x, r)])[0] }
    }
}

impl<B: KBlock, D: Dot> Rows for KQuant<B, D> {
    #[inline(always)]
    unsafe fn dot4(nb: usize, w: *const u8, x: &Activations, r: usize) -> [f32; 4] {
        let a = [0, 1, 2, 3].map(|i| packed_k(x, r + i));
        unsafe { kquants::dotn::<B, D, _, 4>(nb, w, a) }
    }
    #[inline(always)]
    unsafe fn dot1(nb: usize, w: *const u8, x: &Activations, r: usize) -> f32 {
        unsafe { kquants::dotn::<B, D, _, 1>(nb, w, [packed_k(x, r)])[0] }
    }
}

impl<P: plain::Plain> Rows for Plain<P> {
    const FOUR: bool = false;
    #[inline(always)]
    unsafe fn dot4(nb: usize, w: *const u8, x: &Activations, r: usize) -> [f32; 4] {
        // SAFETY: as `dot1`, for each of the four rows.
        std::array::from_fn(|i| unsafe { Self::dot1(nb, w, x, r + i) })
    }
    #[inline(always)]
    unsafe fn dot1(nb: usize, w: *const u8, x: &Activations, r: usize) -> f32 {
        // (For plain formats a block is one value: `nb = k`.)
        unsafe { plain::plain_dot::<P>(nb, w, x.f_row(r).as_ptr().cast()) }
    }
}

/// The weight-stationary loop: for each tile of activation rows, each weight row of the chunk is
/// decoded once per block and dotted against four activation rows at a time.
///
/// # Safety
/// The operands of `g` must have been checked (as [`gemm_rows`] does) and the CPU must have the
/// features `D` was compiled for.
#[inline(always)]
pub(super) unsafe fn gemm_q<K: Rows>(g: &Gemm<'_>, rows: Range<usize>) {
    let (nb, m) = (g.x.nb(), g.m);
    let mut r0 = 0;
    while r0 < m {
        let r1 = (r0 + ACT_TILE).min(m);
        for j in rows.clone() {
            let w = g.weight_row(j).as_ptr();
            let mut r = r0;
            // `r0` is a multiple of 4, so `r` starts each group of four rows here.
            while K::FOUR && r + 4 <= r1 {
                // SAFETY: see the `Rows` impls.
                let v = unsafe { K::dot4(nb, w, g.x, r) };
                for (i, &o) in v.iter().enumerate() {
                    g.store(r + i, j, o);
                }
                r += 4;
            }
            while r < r1 {
                // SAFETY: see the `Rows` impls.
                g.store(r, j, unsafe { K::dot1(nb, w, g.x, r) });
                r += 1;
            }
        }
        r0 = r1;
    }
}

/// Quantizes with NEON (bitwise equal to the scalar reference); see `Backend::quantize_q8`.
///
/// # Panics
/// If the CPU lacks NEON or the lengths disagree.
pub(crate) fn quantize_q8(x: &[f32], qs: &mut [u8], ds: &mut [(f32, i32)]) {
    check_level(Level::Neon);
    assert!(
        x.len() == qs.len() && ds.len() * QK == x.len(),
        "quantize_q8: mismatched lengths"
    );
    // SAFETY: features and lengths checked above.
    unsafe { quant::quantize_q8_tf(x, qs, ds) }
}

/// Quantizes into `Q8_K` with NEON (bitwise equal to the scalar reference); see
/// `Backend::quantize_q8k`.
///
/// # Panics
/// If the CPU lacks NEON or the lengths disagree.
pub(crate) fn quantize_q8k(x: &[f32], qs: &mut [u8], d: &mut [f32], sums: &mut [i16]) {
    check_level(Level::Neon);
    assert!(
        x.len() == qs.len() && d.len() * QK_K == x.len() && sums.len() == 16 * d.len(),
        "quantize_q8k: mismatched lengths"
    );
    // SAFETY: features and lengths checked above.
    unsafe { quant::quantize_q8k_tf(x, qs, d, sums) }
}

// The activation readers are used by the IQ kernels too (see the overview).
#[allow(unused_imports)]
use {Act32 as _, ActK as _};
