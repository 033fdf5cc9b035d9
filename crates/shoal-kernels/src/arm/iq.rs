//! The IQ formats' NEON kernels (`IQ4_NL`, `MXFP4`, `IQ4_XS`, `IQ3_S`, `IQ3_XXS`, `IQ2_XXS`,
//! `IQ2_XS`, `IQ2_S`, `IQ1_S`, `IQ1_M`), reached by `super` through [`vec_dot`] and [`gemm_rows`].
//!
//! Every format decodes to small signed integers (`crate::iq` defines them), so each plugs into a
//! kernel `super` already has, and is bitwise equal to the scalar reference for the same reasons:
//! - `IQ4_NL` and `MXFP4` (32-value blocks, `Q8_0` activations) are [`Block32`]s: their nibbles
//!   become the table's signed values with one `tbl` each, and `legacy::dotn` sums
//!   `d_w·d_x·Σ q·x` per block (`MXFP4`'s `d` is its E8M0 byte as a power of two);
//! - the 256-value formats (`Q8_K` activations) are [`KBlock`]s without minimums: `IQ4_XS` here
//!   (the table's values, scales `ls − 32` per 32), the grid formats in [`grid`] (grid rows with
//!   their signs applied, scales `2·ls + 1` per 32 or per 16, the constant factor folded into
//!   `d`); `kquants::dotn` sums `Σ_g sc_g Σ q·x` exactly and adds `(d·d_x)·Σ` per super-block —
//!   `scalar::dot_iq`'s one float step.
//!
//! Both levels ([`super::ops::Smull`], [`super::ops::Sdot`]) sum the same integers, so they agree
//! bitwise with each other and with the scalar reference (`tests/iq.rs`).

mod grid;

use std::arch::aarch64::*;
use std::ops::Range;

use super::kquants::{GgmlQ8K, KBlock, KScales};
use super::legacy::{Block32, GgmlQ8};
use super::ops::{Dot, f16_at};
use super::{KQuant, Legacy, gemm_q};
use crate::format::{IQ4_NL_BYTES, IQ4_XS_BYTES, MXFP4_BYTES, QK, QK_K, QType};
use crate::gemm::Gemm;
use crate::iq::e8m0_half;
use crate::iq::grids::{KVALUES_IQ4NL, KVALUES_MXFP4};
use grid::{Iq1M, Iq1S, Iq2S, Iq2Xs, Iq2Xxs, Iq3S, Iq3Xxs};

/// One IQ weight row · one ggml activation row (`Q8_0` for `IQ4_NL`/`MXFP4`, else `Q8_K`), `k`
/// values, on the level of `D`; `None` for a format that is not an IQ format.
///
/// # Safety
/// The caller checked the CPU features of `D` and that `w` and `x` are whole rows of `k` values.
#[inline(always)]
pub(super) unsafe fn vec_dot<D: Dot>(qtype: QType, k: usize, w: &[u8], x: &[u8]) -> Option<f32> {
    use super::{kquants::dotn as kdot, legacy::dotn as ldot};
    let (wp, xp, nb, nbk) = (w.as_ptr(), x.as_ptr(), k / QK, k / QK_K);
    let (q80, q8k) = ([GgmlQ8::q8_0(xp)], [GgmlQ8K(xp)]);
    // SAFETY: the caller guarantees complete rows of `k` values.
    unsafe {
        Some(match qtype {
            QType::IQ4_NL => ldot::<Iq4Nl, D, _, 1>(nb, wp, q80)[0],
            QType::MXFP4 => ldot::<Mxfp4, D, _, 1>(nb, wp, q80)[0],
            QType::IQ4_XS => kdot::<Iq4Xs, D, _, 1>(nbk, wp, q8k)[0],
            QType::IQ3_S => kdot::<Iq3S, D, _, 1>(nbk, wp, q8k)[0],
            QType::IQ3_XXS => kdot::<Iq3Xxs, D, _, 1>(nbk, wp, q8k)[0],
            QType::IQ2_XXS => kdot::<Iq2Xxs, D, _, 1>(nbk, wp, q8k)[0],
            QType::IQ2_XS => kdot::<Iq2Xs, D, _, 1>(nbk, wp, q8k)[0],
            QType::IQ2_S => kdot::<Iq2S, D, _, 1>(nbk, wp, q8k)[0],
            QType::IQ1_S => kdot::<Iq1S, D, _, 1>(nbk, wp, q8k)[0],
            QType::IQ1_M => kdot::<Iq1M, D, _, 1>(nbk, wp, q8k)[0],
            _ => return None,
        })
    }
}

/// Weight rows `rows` of `g` (an IQ format) against all its activation rows on the level of `D`
/// (`super::gemm_q`: four activation rows per decoded block); `false` for a format that is not an
/// IQ format (nothing was written).
///
/// # Safety
/// The caller checked the CPU features of `D` and the operands of `g` (`super::check_gemm`).
#[inline(always)]
pub(super) unsafe fn gemm_rows<D: Dot>(g: &Gemm<'_>, rows: Range<usize>) -> bool {
    // SAFETY (all): the caller checked the operands.
    unsafe {
        match g.qtype {
            QType::IQ4_NL => gemm_q::<Legacy<Iq4Nl, D>>(g, rows),
            QType::MXFP4 => gemm_q::<Legacy<Mxfp4, D>>(g, rows),
            QType::IQ4_XS => gemm_q::<KQuant<Iq4Xs, D>>(g, rows),
            QType::IQ3_S => gemm_q::<KQuant<Iq3S, D>>(g, rows),
            QType::IQ3_XXS => gemm_q::<KQuant<Iq3Xxs, D>>(g, rows),
            QType::IQ2_XXS => gemm_q::<KQuant<Iq2Xxs, D>>(g, rows),
            QType::IQ2_XS => gemm_q::<KQuant<Iq2Xs, D>>(g, rows),
            QType::IQ2_S => gemm_q::<KQuant<Iq2S, D>>(g, rows),
            QType::IQ1_S => gemm_q::<KQuant<Iq1S, D>>(g, rows),
            QType::IQ1_M => gemm_q::<KQuant<Iq1M, D>>(g, rows),
            _ => return false,
        }
    }
    true
}

struct Iq4Nl;
struct Mxfp4;
struct Iq4Xs;

/// The 32 values of 16 nibble bytes at `p` (value `j` the low nibble of byte `j`, value `16 + j`
/// its high nibble, as `Q4_0`) looked up in the 16-entry `table`.
#[inline(always)]
unsafe fn lookup32(table: &[i8; 16], p: *const u8) -> (int8x16_t, int8x16_t) {
    unsafe {
        let t = vld1q_s8(table.as_ptr());
        let v = vld1q_u8(p);
        (
            vqtbl1q_s8(t, vandq_u8(v, vdupq_n_u8(0x0F))),
            vqtbl1q_s8(t, vshrq_n_u8::<4>(v)),
        )
    }
}

// SAFETY (the impls): `w` points at one whole block of the format.
impl Block32 for Iq4Nl {
    const BYTES: usize = IQ4_NL_BYTES;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> (int8x16_t, int8x16_t) {
        unsafe { lookup32(&KVALUES_IQ4NL, w.add(2)) }
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (f32, f32) {
        (unsafe { f16_at(w) }, 0.0)
    }
}

impl Block32 for Mxfp4 {
    const BYTES: usize = MXFP4_BYTES;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> (int8x16_t, int8x16_t) {
        unsafe { lookup32(&KVALUES_MXFP4, w.add(1)) }
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (f32, f32) {
        (e8m0_half(unsafe { *w }), 0.0)
    }
}

/// `IQ4_XS`: f16 `d`, the scales' high bits (`u16`) and low nibbles (4 bytes), then 8 × 16
/// nibble bytes, each 32 values as `IQ4_NL`'s; scale `ls − 32` per 32 values.
impl KBlock for Iq4Xs {
    const BYTES: usize = IQ4_XS_BYTES;
    const MIN: bool = false;
    const PAIRS: bool = true;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        let mut q = [unsafe { vdupq_n_s8(0) }; 16];
        for ib in 0..8 {
            // SAFETY: sub-block `ib`'s 16 bytes lie inside the super-block.
            let (lo, hi) = unsafe { lookup32(&KVALUES_IQ4NL, w.add(8 + 16 * ib)) };
            q[2 * ib] = lo;
            q[2 * ib + 1] = hi;
        }
        q
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> KScales {
        // SAFETY: bytes 0..8 of the super-block.
        let (d, sh, sl) = unsafe {
            (
                f16_at(w),
                u16::from_le_bytes([*w.add(2), *w.add(3)]),
                [*w.add(4), *w.add(5), *w.add(6), *w.add(7)],
            )
        };
        KScales {
            d,
            dmin: 0.0,
            sc: std::array::from_fn(|ib| {
                if ib < 8 {
                    let lo = i32::from((sl[ib / 2] >> (4 * (ib % 2))) & 0x0F);
                    (lo | ((i32::from(sh >> (2 * ib)) & 3) << 4)) - 32
                } else {
                    0
                }
            }),
            m: [0; 16],
        }
    }
}
