//! x86-64 backends: AVX2 + FMA + F16C, optionally with AVX-VNNI.
//!
//! The functions of this module are safe: each checks that the CPU has the features and that the
//! slices have the lengths the kernels read, then enters a `#[target_feature]` function in which
//! the generic `#[inline(always)]` kernels are compiled: [`kernels`] (the 32-value formats and
//! the shared helpers), [`kquants`] (the K-quants, `Q8_K` quantization), [`ktile`] (the
//! four-weight-row × four-activation-row tiles of `Q4_K`/`Q5_K`), [`iq`] (the IQ formats and
//! `MXFP4`) and [`plain`] (`F32`, `F16`, `BF16`). [`avx512`] holds the 16-row-group kernels of
//! the AVX-512 VNNI backend (`Q4_1`, `Q8_0`; [`k512`]: `Q4_K`, `Q5_K`; [`k6512`]: `Q6_K`) and
//! [`iq512`] its 512-bit IQ kernels on GGUF rows
//! (`IQ4_NL`, `IQ4_XS`, `IQ3_S`, `IQ2_S`, `IQ1_M`); the other formats run the AVX-VNNI kernels
//! there. [`gemm_iq`] takes either width's IQ kernels ([`IqKernel`]); from 2 activation rows the
//! AVX-512 VNNI backend multiplies the 256-value IQ formats with [`iqtile`] instead (16 weight
//! rows in the lanes, each super-block of 16 rows decoded once for the whole batch), and
//! `IQ4_NL` / `MXFP4` with [`symtile`] (the same for their 32-value blocks).
//!
//! [`gemm_rows`] is the weight-stationary loop every format shares: for each tile of activation
//! rows, each weight row of the chunk is dotted against four activation rows at a time (one
//! decode of each weight block for four rows, [`QDots::dot4`]), the rest one by one
//! ([`QDots::dot1`], the same float operations per output). The K-quants with 32-value scales
//! take four weight rows at a time as well ([`gemm_k`]); the 256-value IQ formats decode each
//! super-block once per tile when the batch has 8 rows or more ([`gemm_iq`]).

pub(crate) mod avx512;
mod group;
mod iq;
mod iq512;
mod iqtile;
mod k512;
mod k6512;
mod kernels;
mod kquants;
mod ktile;
mod plain;
mod symtile;

use std::arch::is_x86_feature_detected;
use std::ops::Range;

use kernels::{GgmlQ80, GgmlQ81, Madd, MinBlock, MulSum, Packed, SymBlock, Vnni};
use kquants::{GgmlQ8K, KBlock, PackedK};
use ktile::TileRow;

use crate::acts::Activations;
use crate::format::{QK, QK_K, QType};
use crate::gemm::Gemm;

/// Activation rows per tile: a tile of quantized activations (≤ 32 × 1.5 KB for k = 1536) stays
/// in L1/L2 while a chunk of weight rows is multiplied against it. A multiple of 4.
const ACT_TILE: usize = 32;

/// Activation rows from which the IQ formats decode each super-block once per tile rather than
/// once per four rows (measured on the dev VM: at 32 rows 1.2–1.4× faster; at one row the
/// register-resident kernel is 1.2× faster).
const IQ_TILE_MIN: usize = 8;

/// Activation rows from which the AVX-512 VNNI backend runs the 256-value IQ formats through
/// [`iqtile`] (16 weight rows in the lanes, each super-block decoded once for all rows).
const IQ_LANES_MIN: usize = 2;

/// Activation rows from which the AVX-512 VNNI backend runs `IQ4_NL` and `MXFP4` through
/// [`symtile`] (16 weight rows in the lanes, each group of rows decoded once for all rows).
const SYM_LANES_MIN: usize = 2;

/// How far ahead (bytes, at least) the four-weight-row kernels of `Q4_K`/`Q5_K` prefetch: one
/// group of four rows is only 2.3 KB at 1024 values, less than a memory latency's worth of weights
/// (measured on the dev VM, 1024 × 1024 at m = 1: 15.9 GB/s one group ahead).
const DECODE_AHEAD: usize = 8192;

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

/// Panics unless the CPU has the features of the chosen backend.
fn check_features(vnni: bool) {
    if vnni {
        assert!(
            has_vnni(),
            "the AVX-VNNI backend needs AVX2, FMA, F16C and AVX-VNNI"
        );
    } else {
        assert!(has_avx2(), "the AVX2 backend needs AVX2, FMA and F16C");
    }
}

/// One dot product of ggml rows on the AVX2 (`vnni = false`) or AVX-VNNI backend.
///
/// # Panics
/// If the CPU lacks the features or the lengths do not match `k`.
pub(crate) fn vec_dot(vnni: bool, qtype: QType, k: usize, w: &[u8], x: &[u8]) -> f32 {
    check_dot(qtype, k, w, x);
    check_features(vnni);
    if vnni {
        // SAFETY: features checked; both rows hold exactly the blocks for `k` values.
        unsafe { vec_dot_vnni_tf(qtype, k, w, x) }
    } else {
        // SAFETY: as above.
        unsafe { vec_dot_avx2_tf(qtype, k, w, x) }
    }
}

/// Panics unless `w` and `x` are complete ggml rows of `k` values.
fn check_dot(qtype: QType, k: usize, w: &[u8], x: &[u8]) {
    let (wb, xb) = match (qtype.try_row_bytes(k), qtype.act_type().try_row_bytes(k)) {
        (Ok(w), Ok(x)) => (w, x),
        _ => panic!("vec_dot: k = {k} is not a multiple of the block size"),
    };
    assert!(
        w.len() == wb && x.len() == xb,
        "vec_dot: slice lengths do not match k = {k}"
    );
}

/// Whether `qtype` has a 512-bit kernel on GGUF rows ([`iq512`]). The other IQ formats
/// (`MXFP4`, `IQ3_XXS`, `IQ2_XXS`, `IQ2_XS`, `IQ1_S`) run their 256-bit kernels on the AVX-512
/// backend: their 512-bit versions (two chunks per vector, the signs as masks, the grid rows
/// gathered or loaded one by one) measured 4–35 % slower on the dev VM's Zen 5, where decoding
/// the grid rows with scalar loads, not the multiplies, bounds them.
fn has_zmm_kernel(qtype: QType) -> bool {
    matches!(
        qtype,
        QType::IQ4_NL | QType::IQ4_XS | QType::IQ3_S | QType::IQ2_S | QType::IQ1_M
    )
}

/// One dot product of ggml rows on the AVX-512 VNNI backend: the formats of
/// [`has_zmm_kernel`] take their 512-bit kernels ([`iq512`]), every other format the AVX-VNNI
/// ones.
///
/// # Panics
/// If the CPU lacks the features or the lengths do not match `k`.
pub(crate) fn vec_dot_512(qtype: QType, k: usize, w: &[u8], x: &[u8]) -> f32 {
    if !has_zmm_kernel(qtype) {
        return vec_dot(true, qtype, k, w, x);
    }
    check_dot(qtype, k, w, x);
    assert!(
        avx512::has_avx512_vnni(),
        "the AVX-512 VNNI backend needs AVX-512 F/BW/VNNI"
    );
    // SAFETY: features checked; both rows hold exactly the blocks for `k` values.
    unsafe { vec_dot_512_tf(qtype, k, w, x) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c,avxvnni")]
unsafe fn vec_dot_512_tf(qtype: QType, k: usize, w: &[u8], x: &[u8]) -> f32 {
    use iq::{Iq1M, Iq2S, Iq3S, Iq4Nl, Iq4Xs};
    use iq512::{iq_dotn, sym_dotn};
    let (wp, nb, nbk) = (w.as_ptr(), k / QK, k / QK_K);
    let (x0, xk) = ([GgmlQ80(x.as_ptr())], [GgmlQ8K(x.as_ptr())]);
    // SAFETY: the caller guarantees complete rows of `k` values.
    unsafe {
        match qtype {
            QType::IQ4_NL => sym_dotn::<Iq4Nl, _, 1>(nb, wp, x0)[0],
            QType::IQ4_XS => iq_dotn::<Iq4Xs, _, 1>(nbk, wp, xk)[0],
            QType::IQ3_S => iq_dotn::<Iq3S, _, 1>(nbk, wp, xk)[0],
            QType::IQ2_S => iq_dotn::<Iq2S, _, 1>(nbk, wp, xk)[0],
            QType::IQ1_M => iq_dotn::<Iq1M, _, 1>(nbk, wp, xk)[0],
            _ => dot_ggml::<Vnni>(qtype, k, w, x),
        }
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
    use iq::{Iq1M, Iq1S, Iq2S, Iq2Xs, Iq2Xxs, Iq3S, Iq3Xxs, Iq4Nl, Iq4Xs, Mxfp4, iq_dot1};
    use kernels::{Q40, Q41, Q50, Q51, Q80};
    use kquants::{Q2K, Q3K, Q4K, Q5K, Q6K};
    let (w, x, nb, nbk) = (w.as_ptr(), x.as_ptr(), k / QK, k / QK_K);
    let xf = x.cast::<f32>();
    // SAFETY: the caller guarantees complete rows of `k` values.
    unsafe {
        match qtype {
            QType::F32 => plain::plain_dot::<plain::F32>(k, w, xf),
            QType::F16 => plain::plain_dot::<plain::F16>(k, w, xf),
            QType::BF16 => plain::plain_dot::<plain::BF16>(k, w, xf),
            QType::Q4_1 => kernels::min_dot1::<Q41, M, _>(nb, w, GgmlQ81(x)),
            QType::Q5_1 => kernels::min_dot1::<Q51, M, _>(nb, w, GgmlQ81(x)),
            QType::Q8_0 => kernels::sym_dot1::<Q80, M, _>(nb, w, GgmlQ80(x)),
            QType::Q4_0 => kernels::sym_dot1::<Q40, M, _>(nb, w, GgmlQ80(x)),
            QType::Q5_0 => kernels::sym_dot1::<Q50, M, _>(nb, w, GgmlQ80(x)),
            QType::Q2_K => kquants::k_dot1::<Q2K, M, _>(nbk, w, GgmlQ8K(x)),
            QType::Q3_K => kquants::k_dot1::<Q3K, M, _>(nbk, w, GgmlQ8K(x)),
            QType::Q4_K => kquants::k_dot1::<Q4K, M, _>(nbk, w, GgmlQ8K(x)),
            QType::Q5_K => kquants::k_dot1::<Q5K, M, _>(nbk, w, GgmlQ8K(x)),
            QType::Q6_K => kquants::k_dot1::<Q6K, M, _>(nbk, w, GgmlQ8K(x)),
            QType::IQ4_NL => kernels::sym_dot1::<Iq4Nl, M, _>(nb, w, GgmlQ80(x)),
            QType::MXFP4 => kernels::sym_dot1::<Mxfp4, M, _>(nb, w, GgmlQ80(x)),
            QType::IQ4_XS => iq_dot1::<Iq4Xs, M, _>(nbk, w, GgmlQ8K(x)),
            QType::IQ3_S => iq_dot1::<Iq3S, M, _>(nbk, w, GgmlQ8K(x)),
            QType::IQ3_XXS => iq_dot1::<Iq3Xxs, M, _>(nbk, w, GgmlQ8K(x)),
            QType::IQ2_XXS => iq_dot1::<Iq2Xxs, M, _>(nbk, w, GgmlQ8K(x)),
            QType::IQ2_XS => iq_dot1::<Iq2Xs, M, _>(nbk, w, GgmlQ8K(x)),
            QType::IQ2_S => iq_dot1::<Iq2S, M, _>(nbk, w, GgmlQ8K(x)),
            QType::IQ1_S => iq_dot1::<Iq1S, M, _>(nbk, w, GgmlQ8K(x)),
            QType::IQ1_M => iq_dot1::<Iq1M, M, _>(nbk, w, GgmlQ8K(x)),
        }
    }
}

/// Weight rows `rows` of `g` against all its activation rows, AVX2 (`vnni = false`) or AVX-VNNI.
///
/// # Panics
/// If the CPU lacks the features or the operands are inconsistent.
pub(crate) fn gemm_rows(vnni: bool, g: &Gemm<'_>, rows: Range<usize>) {
    check_gemm(g, &rows);
    check_features(vnni);
    if vnni {
        // SAFETY: features checked above; weight rows hold `nb` blocks (checked by `check_gemm`)
        // and are read through bounds-checked slices; activation rows come from `Activations` in
        // the format of the weights (checked there).
        unsafe { gemm_vnni_tf(g, rows) }
    } else {
        // SAFETY: as above.
        unsafe { gemm_avx2_tf(g, rows) }
    }
}

/// Weight rows `rows` of `g` (GGUF rows) against all its activation rows on the AVX-512 VNNI
/// backend: the formats of [`has_zmm_kernel`] with their 512-bit kernels ([`iq512`]), every
/// other format with the AVX-VNNI ones.
///
/// # Panics
/// If the CPU lacks the features or the operands are inconsistent.
pub(crate) fn gemm_rows_512(g: &Gemm<'_>, rows: Range<usize>) {
    if g.m >= IQ_LANES_MIN && g.qtype.is_iq() && g.qtype.block_size() == QK_K {
        check_gemm(g, &rows);
        assert!(
            avx512::has_avx512_vnni(),
            "the AVX-512 VNNI backend needs AVX-512 F/BW/VNNI"
        );
        if g.qtype == QType::IQ3_S && avx512::has_vbmi_bitalg() {
            // SAFETY: as in `gemm_rows`, and the CPU has AVX-512 VBMI and BITALG.
            return unsafe { gemm_iq3s_lanes_tf(g, rows) };
        }
        // SAFETY: as in `gemm_rows`.
        return unsafe { gemm_iq_lanes_tf(g, rows) };
    }
    if g.m >= SYM_LANES_MIN && matches!(g.qtype, QType::IQ4_NL | QType::MXFP4) {
        check_gemm(g, &rows);
        assert!(
            avx512::has_avx512_vnni(),
            "the AVX-512 VNNI backend needs AVX-512 F/BW/VNNI"
        );
        // SAFETY: as in `gemm_rows`.
        return unsafe { gemm_sym_lanes_tf(g, rows) };
    }
    if !has_zmm_kernel(g.qtype) {
        return gemm_rows(true, g, rows);
    }
    check_gemm(g, &rows);
    assert!(
        avx512::has_avx512_vnni(),
        "the AVX-512 VNNI backend needs AVX-512 F/BW/VNNI"
    );
    // SAFETY: as in `gemm_rows`.
    unsafe { gemm_512_tf(g, rows) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c,avxvnni")]
unsafe fn gemm_512_tf(g: &Gemm<'_>, rows: Range<usize>) {
    use iq::{Iq1M, Iq2S, Iq3S, Iq4Nl, Iq4Xs};
    // SAFETY (all): the caller checked the operands, as for `gemm`.
    unsafe {
        match g.qtype {
            QType::IQ4_NL => gemm_q::<SymZ<Iq4Nl>>(g, rows),
            QType::IQ4_XS => gemm_iq::<Zmm<Iq4Xs>>(g, rows),
            QType::IQ3_S => gemm_iq::<Zmm<Iq3S>>(g, rows),
            QType::IQ2_S => gemm_iq::<Zmm<Iq2S>>(g, rows),
            QType::IQ1_M => gemm_iq::<Zmm<Iq1M>>(g, rows),
            _ => gemm::<Vnni>(g, rows),
        }
    }
}

/// The 256-value IQ formats' batched kernel ([`iqtile`]: 16 weight rows in the lanes).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn gemm_iq_lanes_tf(g: &Gemm<'_>, rows: Range<usize>) {
    use iq::{Iq1M, Iq1S, Iq2S, Iq2Xs, Iq2Xxs, Iq3S, Iq3Xxs, Iq4Xs};
    use iqtile::gemm_iq_tile;
    // SAFETY (all): the caller checked the operands and the features.
    unsafe {
        match g.qtype {
            QType::IQ4_XS => gemm_iq_tile::<Iq4Xs>(g, rows),
            QType::IQ3_S => gemm_iq_tile::<Iq3S>(g, rows),
            QType::IQ3_XXS => gemm_iq_tile::<Iq3Xxs>(g, rows),
            QType::IQ2_XXS => gemm_iq_tile::<Iq2Xxs>(g, rows),
            QType::IQ2_XS => gemm_iq_tile::<Iq2Xs>(g, rows),
            QType::IQ2_S => gemm_iq_tile::<Iq2S>(g, rows),
            QType::IQ1_S => gemm_iq_tile::<Iq1S>(g, rows),
            QType::IQ1_M => gemm_iq_tile::<Iq1M>(g, rows),
            other => unreachable!("{other:?} is not a 256-value IQ format"),
        }
    }
}

/// `IQ4_NL` and `MXFP4`'s batched kernel ([`symtile`]: 16 weight rows in the lanes).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn gemm_sym_lanes_tf(g: &Gemm<'_>, rows: Range<usize>) {
    use iq::{Iq4Nl, Mxfp4};
    // SAFETY (both): the caller checked the operands and the features.
    unsafe {
        match g.qtype {
            QType::IQ4_NL => symtile::gemm_sym_tile::<Iq4Nl>(g, rows),
            QType::MXFP4 => symtile::gemm_sym_tile::<Mxfp4>(g, rows),
            other => unreachable!("{other:?} is not IQ4_NL or MXFP4"),
        }
    }
}

/// `IQ3_S` through [`iqtile`] with its gathered decode (AVX-512 VBMI and BITALG).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c")]
unsafe fn gemm_iq3s_lanes_tf(g: &Gemm<'_>, rows: Range<usize>) {
    // SAFETY: the caller checked the operands and the features.
    unsafe { iqtile::gemm_iq_tile::<iqtile::Iq3SGather>(g, rows) }
}

/// Panics unless the operands of `g` are consistent for weight rows `rows` in GGUF rows.
fn check_gemm(g: &Gemm<'_>, rows: &Range<usize>) {
    g.check_ggml(rows);
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

#[inline(always)]
unsafe fn gemm<M: MulSum>(g: &Gemm<'_>, rows: Range<usize>) {
    use iq::{Iq1M, Iq1S, Iq2S, Iq2Xs, Iq2Xxs, Iq3S, Iq3Xxs, Iq4Nl, Iq4Xs, Mxfp4};
    use kernels::{Q40, Q41, Q50, Q51, Q80};
    use kquants::{Q2K, Q3K, Q4K, Q5K, Q6K};
    // SAFETY (all): the caller checked that weight rows hold `nb` blocks of the format and that
    // the activations are in its activation format with `nb` blocks per row.
    unsafe {
        match g.qtype {
            QType::F32 => gemm_q::<Plain<plain::F32>>(g, rows),
            QType::F16 => gemm_q::<Plain<plain::F16>>(g, rows),
            QType::BF16 => gemm_q::<Plain<plain::BF16>>(g, rows),
            QType::Q4_1 => gemm_q::<Min<Q41, M>>(g, rows),
            QType::Q5_1 => gemm_q::<Min<Q51, M>>(g, rows),
            QType::Q8_0 => gemm_q::<Sym<Q80, M>>(g, rows),
            QType::Q4_0 => gemm_q::<Sym<Q40, M>>(g, rows),
            QType::Q5_0 => gemm_q::<Sym<Q50, M>>(g, rows),
            QType::Q2_K => gemm_k::<Q2K, M>(g, rows),
            QType::Q3_K => gemm_k::<Q3K, M>(g, rows),
            QType::Q4_K => gemm_k::<Q4K, M>(g, rows),
            QType::Q5_K => gemm_k::<Q5K, M>(g, rows),
            QType::Q6_K => gemm_k::<Q6K, M>(g, rows),
            QType::IQ4_NL => gemm_q::<Sym<Iq4Nl, M>>(g, rows),
            QType::MXFP4 => gemm_q::<Sym<Mxfp4, M>>(g, rows),
            QType::IQ4_XS => gemm_iq::<Ymm<Iq4Xs, M>>(g, rows),
            QType::IQ3_S => gemm_iq::<Ymm<Iq3S, M>>(g, rows),
            QType::IQ3_XXS => gemm_iq::<Ymm<Iq3Xxs, M>>(g, rows),
            QType::IQ2_XXS => gemm_iq::<Ymm<Iq2Xxs, M>>(g, rows),
            QType::IQ2_XS => gemm_iq::<Ymm<Iq2Xs, M>>(g, rows),
            QType::IQ2_S => gemm_iq::<Ymm<Iq2S, M>>(g, rows),
            QType::IQ1_S => gemm_iq::<Ymm<Iq1S, M>>(g, rows),
            QType::IQ1_M => gemm_iq::<Ymm<Iq1M, M>>(g, rows),
        }
    }
}

/// The one-row and four-row kernels of a weight format, reading activation rows `r..r + 4` (or
/// `r`) of `x`; `r` is a multiple of 4 for `dot4`.
trait QDots {
    /// Whether to group activation rows by four (the plain formats dot one row at a time).
    const FOUR: bool = true;
    unsafe fn dot4(nb: usize, w: *const u8, x: &Activations, r: usize) -> [f32; 4];
    unsafe fn dot1(nb: usize, w: *const u8, x: &Activations, r: usize) -> f32;
}

struct Min<B, M>(std::marker::PhantomData<(B, M)>);
struct Sym<B, M>(std::marker::PhantomData<(B, M)>);
struct Plain<P>(std::marker::PhantomData<P>);
struct Iqs<K>(std::marker::PhantomData<K>);
/// The 512-bit kernels of `IQ4_NL` / `MXFP4`.
struct SymZ<B>(std::marker::PhantomData<B>);

/// The kernels of a 256-value IQ format at one vector width ([`Ymm`]: AVX2 / AVX-VNNI, [`Zmm`]:
/// AVX-512), each output with the operations of `iq::iq_dot1`.
trait IqKernel {
    /// `R` activation rows, each super-block decoded once for them.
    unsafe fn dotn<const R: usize>(nb: usize, w: *const u8, a: [PackedK; R]) -> [f32; R];
    /// Any number of rows, the decoded super-block kept in memory.
    unsafe fn rows(nb: usize, w: *const u8, a: &[PackedK], out: &mut [f32]);
}

struct Ymm<B, M>(std::marker::PhantomData<(B, M)>);
struct Zmm<B>(std::marker::PhantomData<B>);

// SAFETY (the impls): as the kernels they call (complete weight and activation rows).
impl<B: iq::IqSuper, M: MulSum> IqKernel for Ymm<B, M> {
    #[inline(always)]
    unsafe fn dotn<const R: usize>(nb: usize, w: *const u8, a: [PackedK; R]) -> [f32; R] {
        unsafe { iq::iq_dotn::<B, M, PackedK, R>(nb, w, a) }
    }
    #[inline(always)]
    unsafe fn rows(nb: usize, w: *const u8, a: &[PackedK], out: &mut [f32]) {
        unsafe { iq::iq_dot_rows::<B, M, PackedK>(nb, w, a, out) }
    }
}

impl<B: iq512::IqPair> IqKernel for Zmm<B> {
    #[inline(always)]
    unsafe fn dotn<const R: usize>(nb: usize, w: *const u8, a: [PackedK; R]) -> [f32; R] {
        unsafe { iq512::iq_dotn::<B, PackedK, R>(nb, w, a) }
    }
    #[inline(always)]
    unsafe fn rows(nb: usize, w: *const u8, a: &[PackedK], out: &mut [f32]) {
        unsafe { iq512::iq_dot_rows::<B, PackedK>(nb, w, a, out) }
    }
}

/// The quants of rows `r..r + 4` and their group's scales.
#[inline(always)]
fn rows4(x: &Activations, r: usize) -> ([*const u8; 4], *const f32) {
    let qs = std::array::from_fn(|i| x.q_row(r + i).as_ptr());
    (qs, x.sc_group(r / 4).as_ptr())
}

/// Row `r` of the packed layout: its quants and its lane's scales.
#[inline(always)]
fn row1(x: &Activations, r: usize) -> Packed {
    Packed {
        qs: x.q_row(r).as_ptr(),
        sc: x.sc_group(r / 4)[2 * (r % 4)..].as_ptr(),
    }
}

// SAFETY (every `dot4`/`dot1` below): four (or one) complete rows of `nb` blocks and their
// group's 8·nb scales (and, for `Q8_K`, 16·nb sums per row); a single row's scales start at lane
// `r % 4` of the group, whose last block still has the 2 floats read at `8 (nb - 1) + 2 lane`.

impl<B: MinBlock, M: MulSum> QDots for Min<B, M> {
    #[inline(always)]
    unsafe fn dot4(nb: usize, w: *const u8, x: &Activations, r: usize) -> [f32; 4] {
        let (qs, sc) = rows4(x, r);
        unsafe { kernels::min_dot4::<B, M>(nb, w, qs, sc) }
    }
    #[inline(always)]
    unsafe fn dot1(nb: usize, w: *const u8, x: &Activations, r: usize) -> f32 {
        unsafe { kernels::min_dot1::<B, M, Packed>(nb, w, row1(x, r)) }
    }
}

impl<B: SymBlock, M: MulSum> QDots for Sym<B, M> {
    #[inline(always)]
    unsafe fn dot4(nb: usize, w: *const u8, x: &Activations, r: usize) -> [f32; 4] {
        let (qs, sc) = rows4(x, r);
        unsafe { kernels::sym_dot4::<B, M>(nb, w, qs, sc) }
    }
    #[inline(always)]
    unsafe fn dot1(nb: usize, w: *const u8, x: &Activations, r: usize) -> f32 {
        unsafe { kernels::sym_dot1::<B, M, Packed>(nb, w, row1(x, r)) }
    }
}

impl<K: IqKernel> QDots for Iqs<K> {
    #[inline(always)]
    unsafe fn dot4(nb: usize, w: *const u8, x: &Activations, r: usize) -> [f32; 4] {
        let rows = [0, 1, 2, 3].map(|i| packed_k(x, r + i));
        unsafe { K::dotn::<4>(nb, w, rows) }
    }
    #[inline(always)]
    unsafe fn dot1(nb: usize, w: *const u8, x: &Activations, r: usize) -> f32 {
        unsafe { K::dotn::<1>(nb, w, [packed_k(x, r)])[0] }
    }
}

impl<B: iq512::SymPair> QDots for SymZ<B> {
    #[inline(always)]
    unsafe fn dot4(nb: usize, w: *const u8, x: &Activations, r: usize) -> [f32; 4] {
        let rows = [0, 1, 2, 3].map(|i| row1(x, r + i));
        unsafe { iq512::sym_dotn::<B, Packed, 4>(nb, w, rows) }
    }
    #[inline(always)]
    unsafe fn dot1(nb: usize, w: *const u8, x: &Activations, r: usize) -> f32 {
        unsafe { iq512::sym_dotn::<B, Packed, 1>(nb, w, [row1(x, r)])[0] }
    }
}

impl<P: plain::Plain> QDots for Plain<P> {
    const FOUR: bool = false;
    #[inline(always)]
    unsafe fn dot4(nb: usize, w: *const u8, x: &Activations, r: usize) -> [f32; 4] {
        // SAFETY: as `dot1`, for each of the four rows.
        std::array::from_fn(|i| unsafe { Self::dot1(nb, w, x, r + i) })
    }
    #[inline(always)]
    unsafe fn dot1(nb: usize, w: *const u8, x: &Activations, r: usize) -> f32 {
        // (For plain formats a block is one value: `nb = k`.)
        unsafe { plain::plain_dot::<P>(nb, w, x.f_row(r).as_ptr()) }
    }
}

/// The weight-stationary loop: for each tile of activation rows, each weight row of the chunk is
/// decoded once per block and dotted against four activation rows at a time.
#[inline(always)]
unsafe fn gemm_q<D: QDots>(g: &Gemm<'_>, rows: Range<usize>) {
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
            while D::FOUR && r + 4 <= r1 {
                // SAFETY: see the `QDots` impls.
                let v = unsafe { D::dot4(nb, w, g.x, r) };
                g.store(r, j, v[0]);
                g.store(r + 1, j, v[1]);
                g.store(r + 2, j, v[2]);
                g.store(r + 3, j, v[3]);
                r += 4;
            }
            while r < r1 {
                // SAFETY: see the `QDots` impls.
                g.store(r, j, unsafe { D::dot1(nb, w, g.x, r) });
                r += 1;
            }
        }
        r0 = r1;
    }
}

/// The 256-value IQ formats' loop. Below [`IQ_TILE_MIN`] activation rows, [`gemm_q`] (one or
/// four rows at a time, decoded chunks kept in registers); from there, for each tile of activation
/// rows, each weight row's super-blocks are decoded once and multiplied with every row of the
/// tile ([`iq::iq_dot_rows`]). Every path takes the operations of [`iq::iq_dot1`] per row.
#[inline(always)]
unsafe fn gemm_iq<K: IqKernel>(g: &Gemm<'_>, rows: Range<usize>) {
    let (nb, m) = (g.x.nb(), g.m);
    if m < IQ_TILE_MIN {
        // SAFETY: as for every format of `gemm_q` (the caller checked the operands).
        return unsafe { gemm_q::<Iqs<K>>(g, rows) };
    }
    if rows.is_empty() {
        return;
    }
    // SAFETY: prefetching touches no memory.
    unsafe { kernels::prefetch_start(g.weight_row(rows.start).as_ptr()) };
    let mut out = [0f32; ACT_TILE];
    let mut r0 = 0;
    while r0 < m {
        let r1 = (r0 + ACT_TILE).min(m);
        let acts: Vec<PackedK> = (r0..r1).map(|r| packed_k(g.x, r)).collect();
        for j in rows.clone() {
            let (w, out) = (g.weight_row(j).as_ptr(), &mut out[..r1 - r0]);
            // SAFETY: one complete weight row of `nb` super-blocks; activation rows of `nb`
            // blocks with their sums, each row's `d` of the last block at `8 (nb - 1) + 2 lane`.
            unsafe { K::rows(nb, w, &acts, out) };
            for (i, &v) in out.iter().enumerate() {
                g.store(r0 + i, j, v);
            }
        }
        r0 = r1;
    }
}

/// Stores a tile's outputs `v[i][c]` at `(r + i, j0 + c)` for the first `cols` columns.
#[inline(always)]
fn store_tile<const R: usize>(g: &Gemm<'_>, r: usize, j0: usize, cols: usize, v: &[[f32; 4]; R]) {
    for (i, row) in v.iter().enumerate() {
        for (c, &o) in row.iter().enumerate().take(cols) {
            g.store(r + i, j0 + c, o);
        }
    }
}

/// Activation row `r` as a `Q8_K` row of the packed layout.
#[inline(always)]
fn packed_k(x: &Activations, r: usize) -> PackedK {
    let Packed { qs, sc } = row1(x, r);
    PackedK {
        qs,
        sc,
        bs: x.bsums_row(r).as_ptr(),
    }
}

/// The K-quants' loop. Formats with 32-value scales (`Q4_K`, `Q5_K`): for each tile of
/// activation rows, each group of four weight rows of the chunk (the last group repeating its last
/// row) is multiplied with eight (then four) activation rows at a time ([`ktile::k_tile`]). The others go
/// one weight row at a time, four activation rows at a time ([`kquants::k_dot4`]). Rows left over
/// take [`kquants::k_dot1x4`] (four weight rows) or [`kquants::k_dot1`] — the same float
/// operations per output in every case.
#[inline(always)]
unsafe fn gemm_k<B: KBlock, M: MulSum>(g: &Gemm<'_>, rows: Range<usize>) {
    let (nb, m) = (g.x.nb(), g.m);
    if rows.is_empty() {
        return;
    }
    // SAFETY: prefetching touches no memory.
    unsafe { kernels::prefetch_start(g.weight_row(rows.start).as_ptr()) };
    let tile_row = |r: usize| TileRow {
        qs: g.x.q_row(r).as_ptr(),
        bs: g.x.bsums_row(r).as_ptr(),
    };
    let mut r0 = 0;
    while r0 < m {
        let r1 = (r0 + ACT_TILE).min(m);
        // `r0` is a multiple of 4, so `r0 + 4 i` starts a group of four rows.
        let full = r0 + (r1 - r0) / 4 * 4;
        if B::SCALE32 {
            // Each row prefetches the same block of a later group's row: the next group's, or
            // for short rows (an expert's 1024 values: 2.3 KB a group) the first group at least
            // `DECODE_AHEAD` bytes on, so a one-row decode does not outrun its prefetches.
            let group = 4 * g.w_row_bytes;
            let ahead = group * DECODE_AHEAD.div_ceil(group).max(1);
            for j0 in rows.clone().step_by(4) {
                let w = [0, 1, 2, 3].map(|i| g.weight_row((j0 + i).min(rows.end - 1)).as_ptr());
                let cols = (rows.end - j0).min(4);
                let mut r = r0;
                while r + 8 <= full {
                    let x = std::array::from_fn(|i| tile_row(r + i));
                    let sc = [r / 4, r / 4 + 1].map(|q| g.x.sc_group(q).as_ptr());
                    // SAFETY: four complete weight rows of `nb` super-blocks; eight activation
                    // rows of `nb` blocks with 16 sums each, and their groups' `8 nb` scales.
                    let v = unsafe { ktile::k_tile::<B, M, 8>(nb, w, x, sc, ahead) };
                    store_tile(g, r, j0, cols, &v);
                    r += 8;
                }
                if r < full {
                    let x = std::array::from_fn(|i| tile_row(r + i));
                    let sc = [g.x.sc_group(r / 4).as_ptr(); 2];
                    // SAFETY: as above, for four activation rows (one group of scales).
                    let v = unsafe { ktile::k_tile::<B, M, 4>(nb, w, x, sc, ahead) };
                    store_tile(g, r, j0, cols, &v);
                }
                for r in full..r1 {
                    // SAFETY: four complete weight rows; one activation row as for `k_dot1`.
                    let v = unsafe {
                        kquants::k_dot1x4::<B, M, PackedK>(nb, w, packed_k(g.x, r), ahead)
                    };
                    for (c, &o) in v.iter().enumerate().take(cols) {
                        g.store(r, j0 + c, o);
                    }
                }
            }
        } else {
            for j in rows.clone() {
                let w = g.weight_row(j).as_ptr();
                for r in (r0..full).step_by(4) {
                    let x = [0, 1, 2, 3].map(|i| tile_row(r + i));
                    let sc = g.x.sc_group(r / 4).as_ptr();
                    // SAFETY: as above, for one weight row.
                    let v = unsafe {
                        kquants::k_dot4::<B, M>(nb, w, x.map(|t| t.qs), x.map(|t| t.bs), sc)
                    };
                    for (i, &o) in v.iter().enumerate() {
                        g.store(r + i, j, o);
                    }
                }
                for r in full..r1 {
                    // SAFETY: one complete weight row and activation row; the row's `d` of the last
                    // block lies at `8 (nb - 1) + 2 (r % 4)` of its group's scales.
                    let v = unsafe { kquants::k_dot1::<B, M, PackedK>(nb, w, packed_k(g.x, r)) };
                    g.store(r, j, v);
                }
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

/// Quantizes into `Q8_K` with AVX2 (bitwise equal to the scalar reference); see
/// `Backend::quantize_q8k`.
///
/// # Panics
/// If the CPU lacks the features or the lengths disagree.
pub(crate) fn quantize_q8k(x: &[f32], qs: &mut [u8], d: &mut [f32], sums: &mut [i16]) {
    assert!(has_avx2(), "the AVX2 backend needs AVX2, FMA and F16C");
    assert!(
        x.len() == qs.len() && d.len() * QK_K == x.len() && sums.len() == 16 * d.len(),
        "quantize_q8k: mismatched lengths"
    );
    // SAFETY: features checked above.
    unsafe { quantize_q8k_tf(x, qs, d, sums) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8k_tf(x: &[f32], qs: &mut [u8], d: &mut [f32], sums: &mut [i16]) {
    let blocks = x.chunks_exact(QK_K).zip(qs.chunks_exact_mut(QK_K));
    for ((xb, qb), (db, sb)) in blocks.zip(d.iter_mut().zip(sums.chunks_exact_mut(16))) {
        // SAFETY: 256 floats, 256 bytes and 16 sums (exact chunks).
        *db = unsafe { kquants::quantize_block_q8k(xb.as_ptr(), qb.as_mut_ptr(), sb.as_mut_ptr()) };
    }
}
