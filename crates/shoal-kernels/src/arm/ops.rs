//! The pieces every NEON kernel shares: the 8-bit multiply-accumulate of each level ([`Dot`]:
//! plain NEON [`Smull`], `dotprod` [`Sdot`]), f16 conversion (`fcvt`/`fcvtl`, base ARMv8, through
//! `asm!` because Rust's f16 vector types are not stable), and unaligned byte-wise loads.
//!
//! Everything here is `#[inline(always)]` and is compiled inside the `#[target_feature]` entry
//! points of `super` (`neon`, or `neon,dotprod` for [`Sdot`]); the f16 vector conversions are
//! also used by `crate::math`.

use std::arch::aarch64::*;
use std::arch::asm;

/// Sixteen `i8 × i8` products added into four `i32` lanes. Only the total of the four lanes is
/// the same on every level (how products are grouped into lanes differs), so kernels reduce a
/// whole accumulator or scale all its lanes alike.
pub(super) trait Dot {
    /// `acc` plus the products of `a` and `b`, exact (no 16-bit intermediate sums can overflow).
    unsafe fn dot16(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

/// Plain NEON: `smull`/`smull2` into 16-bit products, `sadalp` adds their pairs into 32 bits.
pub(super) struct Smull;

impl Dot for Smull {
    #[inline(always)]
    unsafe fn dot16(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        unsafe {
            let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
            let hi = vmull_high_s8(a, b);
            vpadalq_s16(vpadalq_s16(acc, lo), hi)
        }
    }
}

/// ARMv8.2 `dotprod`: one `sdot` (four products per lane). The intrinsic `vdotq_s32` is not
/// stable in Rust yet, so the instruction is written out; `.arch_extension` lets the assembler
/// accept it in helpers (closures, unoptimized builds) that do not inherit the entry point's
/// `dotprod` feature — it is still only executed behind the run-time check.
pub(super) struct Sdot;

impl Dot for Sdot {
    #[inline(always)]
    unsafe fn dot16(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: only compiled into functions with the `dotprod` feature (checked at run time
        // by the entry points); registers only.
        unsafe {
            asm!(
                ".arch_extension dotprod",
                "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
                acc = inout(vreg) acc,
                a = in(vreg) a,
                b = in(vreg) b,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        acc
    }
}

/// The f16 with bits `h` as f32 (`fcvt`, exact).
#[inline(always)]
pub(super) fn f16_to_f32(h: u16) -> f32 {
    let out: f32;
    // SAFETY: a register-only conversion of the base ARMv8 floating point unit.
    unsafe {
        asm!(
            "fcvt {o:s}, {i:h}",
            i = in(vreg) h as i16,
            o = out(vreg) out,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    out
}

/// The little-endian f16 at `p` as f32.
///
/// # Safety
/// `p` must be readable for 2 bytes.
#[inline(always)]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees 2 readable bytes.
    f16_to_f32(u16::from_le_bytes(unsafe { [*p, *p.add(1)] }))
}

/// Four f16 (as `u16` bits) widened to f32 (`fcvtl`, exact).
#[inline(always)]
pub(crate) unsafe fn cvt_f16x4(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: a register-only conversion of base ARMv8 Advanced SIMD.
    unsafe {
        asm!(
            "fcvtl {o:v}.4s, {i:v}.4h",
            i = in(vreg) h,
            o = out(vreg) out,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    out
}

/// Four f32 narrowed to f16 bits, rounding to nearest, ties to even (`fcvtn`, as
/// `half::f16::from_f32`).
#[inline(always)]
pub(crate) unsafe fn cvt_f32x4_f16(f: float32x4_t) -> uint16x4_t {
    let out: uint16x4_t;
    // SAFETY: a register-only conversion of base ARMv8 Advanced SIMD.
    unsafe {
        asm!(
            "fcvtn {o:v}.4h, {i:v}.4s",
            i = in(vreg) f,
            o = out(vreg) out,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    out
}

/// Sixteen bytes at `p` (any alignment) as i8 lanes.
///
/// # Safety
/// `p` must be readable for 16 bytes.
#[inline(always)]
pub(super) unsafe fn load_i8(p: *const u8) -> int8x16_t {
    unsafe { vreinterpretq_s8_u8(vld1q_u8(p)) }
}

/// Four little-endian f32 at `p` (any alignment).
///
/// # Safety
/// `p` must be readable for 16 bytes.
#[inline(always)]
pub(super) unsafe fn load_f32(p: *const u8) -> float32x4_t {
    unsafe { vreinterpretq_f32_u8(vld1q_u8(p)) }
}

/// The little-endian f32 at `p` (any alignment).
///
/// # Safety
/// `p` must be readable for 4 bytes.
#[inline(always)]
pub(super) unsafe fn f32_at(p: *const u8) -> f32 {
    unsafe { p.cast::<f32>().read_unaligned() }
}

/// Eight little-endian i16 at `p` (any alignment).
///
/// # Safety
/// `p` must be readable for 16 bytes.
#[inline(always)]
pub(super) unsafe fn load_i16(p: *const u8) -> int16x8_t {
    unsafe { vreinterpretq_s16_u8(vld1q_u8(p)) }
}
