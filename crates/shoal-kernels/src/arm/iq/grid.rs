//! The grid formats' decode for the NEON kernels (`IQ2_XXS`, `IQ2_XS`, `IQ2_S`, `IQ3_XXS`,
//! `IQ3_S`, `IQ1_S`, `IQ1_M`): each super-block becomes sixteen vectors of 16 `i8` (the 16-value
//! groups) and its scales, exactly as `crate::iq::decode` defines the values:
//! - `IQ2_*`, `IQ3_*`: the grid rows' unsigned magnitudes (8 bytes per row, or 4 for `IQ3`),
//!   negated where the value's sign bit is set (sign bits from `KSIGNS` or stored whole), scale
//!   `2·ls + 1` with `d` carrying the format's factor (`/8` for `IQ2_*`, `/4` for `IQ3_XXS`);
//! - `IQ1_*`: `8·g ± 1` for grid value `g` in −1..=1 and the shift's sign, scale `2·ls + 1`, `d/8`.
//!
//! Grid rows are read with scalar table loads and put together into vectors; a sign byte becomes
//! a lane mask through a table ([`MASKS`], or [`KSIGN_MASKS`] straight from a 7-bit `KSIGNS`
//! index), applied as `(g ^ m) − m`; the 4-bit scales per 16 are widened as vectors ([`odd16`]).

use std::arch::aarch64::*;

use super::super::kquants::{KBlock, KScales};
use super::super::ops::{f16_at, f16_to_f32};
use crate::format::{
    IQ1_M_BYTES, IQ1_S_BYTES, IQ2_S_BYTES, IQ2_XS_BYTES, IQ2_XXS_BYTES, IQ3_S_BYTES, IQ3_XXS_BYTES,
};
use crate::iq::grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS,
};

pub(in crate::arm) struct Iq2Xxs;
pub(in crate::arm) struct Iq2Xs;
pub(in crate::arm) struct Iq2S;
pub(in crate::arm) struct Iq3Xxs;
pub(in crate::arm) struct Iq3S;
pub(in crate::arm) struct Iq1S;
pub(in crate::arm) struct Iq1M;

#[inline(always)]
unsafe fn u16_at(p: *const u8) -> u16 {
    unsafe { u16::from_le_bytes([*p, *p.add(1)]) }
}

#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    unsafe { p.cast::<u32>().read_unaligned().to_le() }
}

/// Two 8-byte table rows as one vector (`a` in lanes 0..8), loaded straight into the lanes.
#[inline(always)]
fn rows2(a: &u64, b: &u64) -> uint8x16_t {
    // SAFETY: two references to 8 readable bytes each.
    unsafe {
        let v = vld1q_lane_u64::<0>(a, vdupq_n_u64(0));
        vreinterpretq_u8_u64(vld1q_lane_u64::<1>(b, v))
    }
}

/// Four 4-byte grid rows as one vector, loaded straight into the lanes.
#[inline(always)]
fn rows4(r: [&u32; 4]) -> uint8x16_t {
    // SAFETY: four references to 4 readable bytes each.
    unsafe {
        let v = vld1q_lane_u32::<0>(r[0], vdupq_n_u32(0));
        let v = vld1q_lane_u32::<1>(r[1], v);
        let v = vld1q_lane_u32::<2>(r[2], v);
        vreinterpretq_u8_u32(vld1q_lane_u32::<3>(r[3], v))
    }
}

/// Byte `j` of entry `b` is `0xFF` where bit `j` of `b` is set, else 0: a sign byte as a lane mask.
static MASKS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut j = 0;
        while j < 8 {
            if (b >> j) & 1 == 1 {
                t[b] |= 0xFF << (8 * j);
            }
            j += 1;
        }
        b += 1;
    }
    t
};

/// The lane mask of `KSIGNS[i]` (7 sign bits and their parity), one load instead of two.
static KSIGN_MASKS: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = MASKS[KSIGNS[i] as usize];
        i += 1;
    }
    t
};

/// Which of four sign bytes each lane of a group reads: group 0 of a pair bytes 0, 1, group 1
/// bytes 2, 3 (8 lanes each).
static SIGN_BYTES: [[u8; 16]; 2] = [
    [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1],
    [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3],
];

/// The sign bit of each lane within its byte.
static SIGN_BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];

/// `g` with lanes 0..8 negated where mask `m0` has `0xFF` bytes, lanes 8..16 where `m1` has.
#[inline(always)]
fn signed(g: uint8x16_t, m0: &u64, m1: &u64) -> int8x16_t {
    unsafe {
        let m = rows2(m0, m1);
        vreinterpretq_s8_u8(vsubq_u8(veorq_u8(g, m), m))
    }
}

/// The scales `2·ls + 1` per 16 values of 8 bytes of 4-bit `ls` at `p` (low nibble first).
///
/// # Safety
/// `p` must be readable for 8 bytes.
#[inline(always)]
unsafe fn odd16(p: *const u8) -> [i32; 16] {
    let mut sc = [0i32; 16];
    unsafe {
        let b = vld1_u8(p);
        let (lo, hi) = (vand_u8(b, vdup_n_u8(0x0F)), vshr_n_u8::<4>(b));
        // Interleaved low, high: the scales in order, then 2·ls + 1 (at most 31).
        let v = vcombine_u8(vzip1_u8(lo, hi), vzip2_u8(lo, hi));
        let v = vaddq_u8(vshlq_n_u8::<1>(v), vdupq_n_u8(1));
        let (a, b) = (vmovl_u8(vget_low_u8(v)), vmovl_high_u8(v));
        let out = sc.as_mut_ptr().cast::<u32>();
        vst1q_u32(out, vmovl_u16(vget_low_u16(a)));
        vst1q_u32(out.add(4), vmovl_high_u16(a));
        vst1q_u32(out.add(8), vmovl_u16(vget_low_u16(b)));
        vst1q_u32(out.add(12), vmovl_high_u16(b));
    }
    sc
}

/// Scales per 32 values (`PAIRS`) from eight `ls`, each `2·ls + 1`.
#[inline(always)]
fn pairs(d: f32, ls: [i32; 8]) -> KScales {
    KScales {
        d,
        dmin: 0.0,
        sc: std::array::from_fn(|u| if u < 8 { 2 * ls[u] + 1 } else { 0 }),
        m: [0; 16],
    }
}

/// Scales per 16 values.
#[inline(always)]
fn groups(d: f32, sc: [i32; 16]) -> KScales {
    KScales {
        d,
        dmin: 0.0,
        sc,
        m: [0; 16],
    }
}

// SAFETY (every impl below): `w` points at one whole super-block of the format, and every read
// stays inside it (offsets as in `crate::iq::visit`).

/// `IQ2_XXS`: per 32 values, 4 grid indices (`aux0`) and 4 × 7 sign bits + a 4-bit scale (`aux1`).
impl KBlock for Iq2Xxs {
    const BYTES: usize = IQ2_XXS_BYTES;
    const MIN: bool = false;
    const PAIRS: bool = true;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        std::array::from_fn(|g| {
            let (ib, h) = (g / 2, g % 2);
            let (aux0, aux1) = unsafe { (u32_at(w.add(2 + 8 * ib)), u32_at(w.add(6 + 8 * ib))) };
            let [l0, l1] = [2 * h, 2 * h + 1];
            let row = |l: usize| &IQ2XXS_GRID[((aux0 >> (8 * l)) & 0xFF) as usize];
            let sign = |l: usize| &KSIGN_MASKS[((aux1 >> (7 * l)) & 127) as usize];
            signed(rows2(row(l0), row(l1)), sign(l0), sign(l1))
        })
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> KScales {
        let ls = std::array::from_fn(|ib| (unsafe { u32_at(w.add(6 + 8 * ib)) } >> 28) as i32);
        pairs(unsafe { f16_at(w) } * 0.125, ls)
    }
}

/// `IQ2_XS`: per 8 values a `u16` (9-bit grid index, 7 sign bits), then 4-bit scales per 16.
impl KBlock for Iq2Xs {
    const BYTES: usize = IQ2_XS_BYTES;
    const MIN: bool = false;
    const PAIRS: bool = false;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        std::array::from_fn(|g| {
            let q = |i: usize| unsafe { u16_at(w.add(2 + 2 * i)) };
            let (a, b) = (q(2 * g), q(2 * g + 1));
            let row = |v: u16| &IQ2XS_GRID[usize::from(v & 511)];
            let sign = |v: u16| &KSIGN_MASKS[usize::from(v >> 9)];
            signed(rows2(row(a), row(b)), sign(a), sign(b))
        })
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> KScales {
        groups(unsafe { f16_at(w) } * 0.125, unsafe { odd16(w.add(66)) })
    }
}

/// `IQ2_S`: 32 grid index bytes, 32 sign bytes, 2 high index bits per 8 values, 4-bit scales
/// per 16.
impl KBlock for Iq2S {
    const BYTES: usize = IQ2_S_BYTES;
    const MIN: bool = false;
    const PAIRS: bool = false;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        std::array::from_fn(|g| {
            let row = |g8: usize| unsafe {
                let high = (usize::from(*w.add(66 + g8 / 4)) >> (2 * (g8 % 4))) & 3;
                &IQ2S_GRID[usize::from(*w.add(2 + g8)) | (high << 8)]
            };
            let sign = |g8: usize| &MASKS[usize::from(unsafe { *w.add(34 + g8) })];
            let (a, b) = (2 * g, 2 * g + 1);
            signed(rows2(row(a), row(b)), sign(a), sign(b))
        })
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> KScales {
        groups(unsafe { f16_at(w) } * 0.125, unsafe { odd16(w.add(74)) })
    }
}

/// `IQ3_XXS`: 64 grid index bytes (4 values each), then per 32 values a `u32` of 4 × 7 sign bits
/// and a 4-bit scale.
impl KBlock for Iq3Xxs {
    const BYTES: usize = IQ3_XXS_BYTES;
    const MIN: bool = false;
    const PAIRS: bool = true;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        std::array::from_fn(|g| {
            let (ib, h) = (g / 2, g % 2);
            let aux = unsafe { u32_at(w.add(66 + 4 * ib)) };
            let rows = std::array::from_fn(|i| unsafe {
                &IQ3XXS_GRID[usize::from(*w.add(2 + 8 * ib + 4 * h + i))]
            });
            let sign = |l: usize| &KSIGN_MASKS[((aux >> (7 * l)) & 127) as usize];
            signed(rows4(rows), sign(2 * h), sign(2 * h + 1))
        })
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> KScales {
        let ls = std::array::from_fn(|ib| (unsafe { u32_at(w.add(66 + 4 * ib)) } >> 28) as i32);
        pairs(unsafe { f16_at(w) } * 0.25, ls)
    }
}

/// `IQ3_S`: 64 grid index bytes, one high index bit per 4 values (8 bytes), 32 sign bytes, 4-bit
/// scales per 32.
impl KBlock for Iq3S {
    const BYTES: usize = IQ3_S_BYTES;
    const MIN: bool = false;
    const PAIRS: bool = true;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        // The 9-bit grid indices of two groups (8 indices, one `qh` byte) built in a vector:
        // the index bytes widened, or'ed with bit `j` of `qh` moved to bit 8 in lane `j`.
        const SHIFT: [i16; 8] = [8, 7, 6, 5, 4, 3, 2, 1];
        let mut out = [unsafe { vdupq_n_s8(0) }; 16];
        for (p, pair) in out.chunks_exact_mut(2).enumerate() {
            // SAFETY: bytes of the super-block at `w`; register operations otherwise.
            let ix: [u16; 8] = unsafe {
                let lo = vmovl_u8(vld1_u8(w.add(2 + 8 * p)));
                let qh = vdupq_n_u16(u16::from(*w.add(66 + p)));
                let hi = vandq_u16(vshlq_u16(qh, vld1q_s16(SHIFT.as_ptr())), vdupq_n_u16(256));
                let v = vorrq_u16(lo, hi);
                [
                    vgetq_lane_u16::<0>(v),
                    vgetq_lane_u16::<1>(v),
                    vgetq_lane_u16::<2>(v),
                    vgetq_lane_u16::<3>(v),
                    vgetq_lane_u16::<4>(v),
                    vgetq_lane_u16::<5>(v),
                    vgetq_lane_u16::<6>(v),
                    vgetq_lane_u16::<7>(v),
                ]
            };
            // The two groups' 4 sign bytes in every 32-bit lane; group `h`'s lane `l` takes
            // bit `l % 8` of byte `2 h + l / 8` (`tbl`, then `cmtst` against the bit: a mask).
            // SAFETY: bytes of the super-block at `w`.
            let signs = unsafe { vreinterpretq_u8_u32(vdupq_n_u32(u32_at(w.add(74 + 4 * p)))) };
            for (h, q) in pair.iter_mut().enumerate() {
                // SAFETY: an index byte or'ed with 256 at most: below the grid's 512 rows.
                let rows = std::array::from_fn(|i| unsafe {
                    IQ3S_GRID.get_unchecked(usize::from(ix[4 * h + i]))
                });
                // SAFETY: register operations and 16-byte constant tables.
                *q = unsafe {
                    let sel = vqtbl1q_u8(signs, vld1q_u8(SIGN_BYTES[h].as_ptr()));
                    let m = vtstq_u8(sel, vld1q_u8(SIGN_BITS.as_ptr()));
                    vreinterpretq_s8_u8(vsubq_u8(veorq_u8(rows4(rows), m), m))
                };
            }
        }
        out
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> KScales {
        let ls = std::array::from_fn(|ib| {
            i32::from((unsafe { *w.add(106 + ib / 2) } >> (4 * (ib % 2))) & 0x0F)
        });
        pairs(unsafe { f16_at(w) }, ls)
    }
}

/// `8·g ± 1` of two `IQ1` grid rows (`i8` values −1..=1), the shift's sign per row.
#[inline(always)]
fn iq1(a: &u64, b: &u64, neg_a: bool, neg_b: bool) -> int8x16_t {
    unsafe {
        let g = vreinterpretq_s8_u8(rows2(a, b));
        let one = |neg: bool| vdup_n_s8(if neg { -1 } else { 1 });
        vaddq_s8(vshlq_n_s8::<3>(g), vcombine_s8(one(neg_a), one(neg_b)))
    }
}

/// `IQ1_S`: 32 grid index bytes, then per 32 values a `u16`: 4 × 3 high index bits, a 3-bit scale
/// and the shift's sign.
impl KBlock for Iq1S {
    const BYTES: usize = IQ1_S_BYTES;
    const MIN: bool = false;
    const PAIRS: bool = true;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        std::array::from_fn(|g| {
            let (ib, h) = (g / 2, g % 2);
            let qh = usize::from(unsafe { u16_at(w.add(34 + 2 * ib)) });
            let row = |l: usize| {
                let high = (qh >> (3 * l)) & 7;
                &IQ1S_GRID[usize::from(unsafe { *w.add(2 + 4 * ib + l) }) | (high << 8)]
            };
            let neg = qh & 0x8000 != 0;
            iq1(row(2 * h), row(2 * h + 1), neg, neg)
        })
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> KScales {
        let ls =
            std::array::from_fn(|ib| i32::from((unsafe { u16_at(w.add(34 + 2 * ib)) } >> 12) & 7));
        pairs(unsafe { f16_at(w) } * 0.125, ls)
    }
}

/// `IQ1_M`: 32 grid index bytes, a nibble per 8 values (3 high index bits, the shift's sign), and
/// four `u16` of 3-bit scales per 16 whose top nibbles make the f16 `d`.
impl KBlock for Iq1M {
    const BYTES: usize = IQ1_M_BYTES;
    const MIN: bool = false;
    const PAIRS: bool = false;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        std::array::from_fn(|g| {
            let nib = |g8: usize| usize::from(unsafe { *w.add(32 + g8 / 2) } >> (4 * (g8 % 2)));
            let row =
                |g8: usize| &IQ1S_GRID[usize::from(unsafe { *w.add(g8) }) | ((nib(g8) & 7) << 8)];
            let (a, b) = (2 * g, 2 * g + 1);
            iq1(row(a), row(b), nib(a) & 8 != 0, nib(b) & 8 != 0)
        })
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> KScales {
        let s: [u16; 4] = std::array::from_fn(|i| unsafe { u16_at(w.add(48 + 2 * i)) });
        let bits = (s[0] >> 12) | ((s[1] >> 8) & 0x00F0) | ((s[2] >> 4) & 0x0F00) | (s[3] & 0xF000);
        let sc = std::array::from_fn(|g| 2 * i32::from((s[g / 4] >> (3 * (g % 4))) & 7) + 1);
        groups(f16_to_f32(bits) * 0.125, sc)
    }
}
