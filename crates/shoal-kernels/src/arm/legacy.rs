//! NEON kernels of the 32-value formats: `Q4_0`, `Q5_0`, `Q8_0` (signed quants, `value = d·q`)
//! and `Q4_1`, `Q5_1` (unsigned quants, `value = d·q + m`), generic over the 8-bit
//! multiply-accumulate ([`Dot`]), the weight format's decode ([`Block32`]) and where activation
//! blocks come from ([`Act32`]: ggml `Q8_0`/`Q8_1` bytes or the packed layout of
//! [`crate::Activations`]).
//!
//! Each block is decoded into two vectors of 16 `i8` once for `R` activation rows; per row the
//! 32 products are summed exactly (`sdot` or `smull` + `sadalp`, then `addv`) and the block adds
//! `d_w·d_x·Σ (+ m·s_x)` with the float operations of the scalar reference, in its order — so
//! every output is bitwise equal to `scalar::vec_dot`, whatever `R` and the level.

use std::arch::aarch64::*;

use super::ops::{Dot, f16_at, load_i8};
use crate::format::{Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, Q8_0_BYTES, Q8_1_BYTES};

/// One activation row of 32-value `Q8` blocks.
pub(super) trait Act32: Copy {
    /// The 32 quants of block `b`.
    unsafe fn qs(self, b: usize) -> *const u8;
    /// Block `b`'s scale `d`.
    unsafe fn d(self, b: usize) -> f32;
    /// Block `b`'s `s = d·Σq` (`Q8_1` only).
    unsafe fn s(self, b: usize) -> f32;
}

/// A row of ggml `Q8_0` (34-byte) or `Q8_1` (36-byte) blocks.
#[derive(Clone, Copy)]
pub(super) struct GgmlQ8 {
    pub(super) p: *const u8,
    /// Bytes per block, and where the quants start in one.
    pub(super) size: usize,
}

impl GgmlQ8 {
    pub(super) fn q8_0(p: *const u8) -> Self {
        Self {
            p,
            size: Q8_0_BYTES,
        }
    }
    pub(super) fn q8_1(p: *const u8) -> Self {
        Self {
            p,
            size: Q8_1_BYTES,
        }
    }
}

// SAFETY (the impls): the row holds block `b` (the kernels' callers guarantee whole rows).
impl Act32 for GgmlQ8 {
    #[inline(always)]
    unsafe fn qs(self, b: usize) -> *const u8 {
        unsafe { self.p.add(b * self.size + self.size - 32) }
    }
    #[inline(always)]
    unsafe fn d(self, b: usize) -> f32 {
        unsafe { f16_at(self.p.add(b * self.size)) }
    }
    #[inline(always)]
    unsafe fn s(self, b: usize) -> f32 {
        unsafe { f16_at(self.p.add(b * self.size + 2)) }
    }
}

/// A row of the packed layout: its quants, and its lane's `[d, s]` in its group's scales.
#[derive(Clone, Copy)]
pub(super) struct Packed {
    pub(super) qs: *const u8,
    pub(super) sc: *const f32,
}

impl Act32 for Packed {
    #[inline(always)]
    unsafe fn qs(self, b: usize) -> *const u8 {
        unsafe { self.qs.add(32 * b) }
    }
    #[inline(always)]
    unsafe fn d(self, b: usize) -> f32 {
        unsafe { *self.sc.add(8 * b) }
    }
    #[inline(always)]
    unsafe fn s(self, b: usize) -> f32 {
        unsafe { *self.sc.add(8 * b + 1) }
    }
}

/// A 32-value weight format's decode.
pub(super) trait Block32 {
    const BYTES: usize;
    /// Whether blocks have a minimum (`value = d·q + m`).
    const MIN: bool;
    /// Values 0..16 and 16..32 of the block at `w` as `i8`.
    unsafe fn quants(w: *const u8) -> (int8x16_t, int8x16_t);
    /// `d`, and `m` (0 where there is none).
    unsafe fn scales(w: *const u8) -> (f32, f32);
}

pub(super) struct Q40;
pub(super) struct Q41;
pub(super) struct Q50;
pub(super) struct Q51;
pub(super) struct Q80;

/// The low and high nibbles of the 16 bytes at `p`.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    unsafe {
        let v = vld1q_u8(p);
        (vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(v))
    }
}

/// The 32 fifth bits of a `Q5` block (`qh` at `p`, bit `j` for value `j`) as `16` or `0` bytes.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    unsafe {
        let h = [*p, *p.add(1), *p.add(2), *p.add(3)];
        let bits = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
        let spread = |a: u8, b: u8| vcombine_u8(vdup_n_u8(a), vdup_n_u8(b));
        let set = |v: uint8x16_t| vandq_u8(vtstq_u8(v, bits), vdupq_n_u8(16));
        (set(spread(h[0], h[1])), set(spread(h[2], h[3])))
    }
}

// SAFETY (the impls): `w` points at one whole block of the format.
impl Block32 for Q40 {
    const BYTES: usize = Q4_0_BYTES;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> (int8x16_t, int8x16_t) {
        unsafe {
            let (lo, hi) = nibbles(w.add(2));
            let eight = vdupq_n_s8(8);
            let s = |v: uint8x16_t| vsubq_s8(vreinterpretq_s8_u8(v), eight);
            (s(lo), s(hi))
        }
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (f32, f32) {
        (unsafe { f16_at(w) }, 0.0)
    }
}

impl Block32 for Q41 {
    const BYTES: usize = Q4_1_BYTES;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> (int8x16_t, int8x16_t) {
        unsafe {
            let (lo, hi) = nibbles(w.add(4));
            (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
        }
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (f32, f32) {
        unsafe { (f16_at(w), f16_at(w.add(2))) }
    }
}

impl Block32 for Q50 {
    const BYTES: usize = Q5_0_BYTES;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> (int8x16_t, int8x16_t) {
        unsafe {
            let (lo, hi) = nibbles(w.add(6));
            let (h0, h1) = fifth_bits(w.add(2));
            let sixteen = vdupq_n_s8(16);
            let s = |v: uint8x16_t, h| vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(v, h)), sixteen);
            (s(lo, h0), s(hi, h1))
        }
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (f32, f32) {
        (unsafe { f16_at(w) }, 0.0)
    }
}

impl Block32 for Q51 {
    const BYTES: usize = Q5_1_BYTES;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> (int8x16_t, int8x16_t) {
        unsafe {
            let (lo, hi) = nibbles(w.add(8));
            let (h0, h1) = fifth_bits(w.add(4));
            let s = |v: uint8x16_t, h| vreinterpretq_s8_u8(vorrq_u8(v, h));
            (s(lo, h0), s(hi, h1))
        }
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (f32, f32) {
        unsafe { (f16_at(w), f16_at(w.add(2))) }
    }
}

impl Block32 for Q80 {
    const BYTES: usize = Q8_0_BYTES;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> (int8x16_t, int8x16_t) {
        unsafe { (load_i8(w.add(2)), load_i8(w.add(18))) }
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (f32, f32) {
        (unsafe { f16_at(w) }, 0.0)
    }
}

/// One weight row of `nb` blocks at `w` · `R` activation rows, each output bitwise equal to the
/// scalar reference's.
///
/// # Safety
/// `w` and every row of `a` must hold `nb` whole blocks.
#[inline(always)]
pub(super) unsafe fn dotn<B: Block32, D: Dot, A: Act32, const R: usize>(
    nb: usize,
    w: *const u8,
    a: [A; R],
) -> [f32; R] {
    let mut sum = [0f32; R];
    for b in 0..nb {
        // SAFETY: block `b` of every row (the caller's guarantee).
        unsafe {
            let wb = w.add(b * B::BYTES);
            let (lo, hi) = B::quants(wb);
            let (d, m) = B::scales(wb);
            for (s, x) in sum.iter_mut().zip(a) {
                let xq = x.qs(b);
                let acc = D::dot16(vdupq_n_s32(0), lo, load_i8(xq));
                let sumi = vaddvq_s32(D::dot16(acc, hi, load_i8(xq.add(16))));
                let dx = x.d(b);
                *s += if B::MIN {
                    d * dx * sumi as f32 + m * x.s(b)
                } else {
                    d * dx * sumi as f32
                };
            }
        }
    }
    sum
}
