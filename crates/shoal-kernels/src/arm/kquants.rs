//! NEON kernels of the K-quants (`Q2_K`, `Q3_K`, `Q4_K`, `Q5_K`, `Q6_K`) against `Q8_K`
//! activations, generic over the 8-bit multiply-accumulate ([`Dot`]), the format's decode
//! ([`KBlock`]) and where activation blocks come from ([`ActK`]: ggml bytes or the packed
//! layout).
//!
//! A super-block is decoded once into sixteen vectors of 16 `i8` (the 16-value groups) for `R`
//! activation rows. Per row, each group's (or, for the formats with 32-value scales, each pair's)
//! products go into one accumulator; four accumulators are reduced with `addp` into the four
//! lanes of one vector and multiplied by four scales (`mla`), so the super-block's
//! `Σ_g sc_g Σ q·x` is one exact integer; the minimums' `Σ_g m_g·bsum_g` likewise from the
//! activations' sums of 16. The float steps are the scalar reference's, in its order, so every
//! output is bitwise equal to `scalar::vec_dot`.

use std::arch::aarch64::*;

use super::ops::{Dot, f16_at, f32_at, load_i8, load_i16};
use crate::format::{
    Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, Q8_K_BYTES, QK_K, k3_scales,
    k4_scales,
};

/// One activation row of `Q8_K` blocks.
pub(super) trait ActK: Copy {
    /// The 256 quants of block `b`.
    unsafe fn qs(self, b: usize) -> *const u8;
    /// Block `b`'s scale.
    unsafe fn d(self, b: usize) -> f32;
    /// Block `b`'s 16 sums of 16 quants (little-endian `i16`).
    unsafe fn bsums(self, b: usize) -> *const u8;
}

/// A row of ggml `Q8_K` blocks.
#[derive(Clone, Copy)]
pub(super) struct GgmlQ8K(pub(super) *const u8);

// SAFETY (the impls): the row holds block `b` (the kernels' callers guarantee whole rows).
impl ActK for GgmlQ8K {
    #[inline(always)]
    unsafe fn qs(self, b: usize) -> *const u8 {
        unsafe { self.0.add(b * Q8_K_BYTES + 4) }
    }
    #[inline(always)]
    unsafe fn d(self, b: usize) -> f32 {
        unsafe { f32_at(self.0.add(b * Q8_K_BYTES)) }
    }
    #[inline(always)]
    unsafe fn bsums(self, b: usize) -> *const u8 {
        unsafe { self.0.add(b * Q8_K_BYTES + 4 + QK_K) }
    }
}

/// A `Q8_K` row of the packed layout: quants, its lane's scales, its sums.
#[derive(Clone, Copy)]
pub(super) struct PackedK {
    pub(super) qs: *const u8,
    pub(super) sc: *const f32,
    pub(super) bs: *const i16,
}

impl ActK for PackedK {
    #[inline(always)]
    unsafe fn qs(self, b: usize) -> *const u8 {
        unsafe { self.qs.add(QK_K * b) }
    }
    #[inline(always)]
    unsafe fn d(self, b: usize) -> f32 {
        unsafe { *self.sc.add(8 * b) }
    }
    #[inline(always)]
    unsafe fn bsums(self, b: usize) -> *const u8 {
        unsafe { self.bs.add(16 * b).cast() }
    }
}

/// A super-block's scales: `d`, `dmin` (formats with minimums), the scales of its units (16-value
/// groups, or 32-value sub-blocks where [`KBlock::PAIRS`]) and the minimums per 16-value group.
pub(super) struct KScales {
    pub(super) d: f32,
    pub(super) dmin: f32,
    pub(super) sc: [i32; 16],
    pub(super) m: [i16; 16],
}

/// [`KScales`] in vectors, as the kernel reads them: the units' scales four per vector, the
/// minimums per 16-value group eight per vector.
pub(super) struct VScales {
    pub(super) d: f32,
    pub(super) dmin: f32,
    pub(super) sc: [int32x4_t; 4],
    pub(super) m: [int16x8_t; 2],
}

/// A K-quant's decode.
pub(super) trait KBlock {
    const BYTES: usize;
    /// Whether blocks have minimums (`value = d·sc·q − dmin·m`).
    const MIN: bool;
    /// Whether scales cover 32 values (two groups of 16), else 16.
    const PAIRS: bool;
    /// The 256 quants of the super-block at `w`, 16 per vector in order.
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16];
    unsafe fn scales(w: *const u8) -> KScales;
    /// [`KBlock::scales`] in vectors (a format may build them without the arrays).
    #[inline(always)]
    unsafe fn vscales(w: *const u8) -> VScales {
        unsafe {
            let s = Self::scales(w);
            VScales {
                d: s.d,
                dmin: s.dmin,
                sc: std::array::from_fn(|c| vld1q_s32(s.sc.as_ptr().add(4 * c))),
                m: [vld1q_s16(s.m.as_ptr()), vld1q_s16(s.m.as_ptr().add(8))],
            }
        }
    }
}

pub(super) struct Q2K;
pub(super) struct Q3K;
pub(super) struct Q4K;
pub(super) struct Q5K;
pub(super) struct Q6K;

/// Bytes `at..at + 16` and `at + 16..at + 32` of `w`.
#[inline(always)]
unsafe fn load32(w: *const u8, at: usize) -> [uint8x16_t; 2] {
    unsafe { [vld1q_u8(w.add(at)), vld1q_u8(w.add(at + 16))] }
}

#[inline(always)]
fn s8(v: uint8x16_t) -> int8x16_t {
    unsafe { vreinterpretq_s8_u8(v) }
}

/// The scales and minimums of `Q4_K`/`Q5_K` (6 bits each, per 32 values).
#[inline(always)]
unsafe fn k4(w: *const u8) -> KScales {
    let s: &[u8; 12] = unsafe { &*w.add(4).cast() };
    let (sc, m) = k4_scales(s);
    let (sc, m) = (sc.to_le_bytes(), m.to_le_bytes());
    KScales {
        d: unsafe { f16_at(w) },
        dmin: unsafe { f16_at(w.add(2)) },
        sc: std::array::from_fn(|j| if j < 8 { i32::from(sc[j]) } else { 0 }),
        m: std::array::from_fn(|g| i16::from(m[g / 2])),
    }
}

/// [`k4`] in vectors: the 6-bit values widened lane by lane (no arrays), each minimum repeated
/// for the two 16-value groups of its sub-block.
#[inline(always)]
unsafe fn k4v(w: *const u8) -> VScales {
    unsafe {
        let (sc, m) = k4_scales(&*w.add(4).cast());
        let sc = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(sc)));
        let m = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(m)));
        let zero = vdupq_n_s32(0);
        VScales {
            d: f16_at(w),
            dmin: f16_at(w.add(2)),
            sc: [vmovl_s16(vget_low_s16(sc)), vmovl_high_s16(sc), zero, zero],
            m: [vzip1q_s16(m, m), vzip2q_s16(m, m)],
        }
    }
}

/// Sixteen 16-value scales (`i8`) and minimums widened into [`VScales`].
#[inline(always)]
unsafe fn widen(d: f32, dmin: f32, sc: int8x16_t, m: int8x16_t) -> VScales {
    unsafe {
        let (lo, hi) = (vmovl_s8(vget_low_s8(sc)), vmovl_high_s8(sc));
        VScales {
            d,
            dmin,
            sc: [
                vmovl_s16(vget_low_s16(lo)),
                vmovl_high_s16(lo),
                vmovl_s16(vget_low_s16(hi)),
                vmovl_high_s16(hi),
            ],
            m: [vmovl_s8(vget_low_s8(m)), vmovl_high_s8(m)],
        }
    }
}

// SAFETY (the impls): `w` points at one whole super-block of the format.
impl KBlock for Q2K {
    const BYTES: usize = Q2_K_BYTES;
    const MIN: bool = true;
    const PAIRS: bool = false;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        unsafe {
            let three = vdupq_n_u8(3);
            let [a0, a1] = load32(w, 16);
            let [b0, b1] = load32(w, 48);
            let sh = |v: uint8x16_t, t: i8| s8(vandq_u8(vshlq_u8(v, vdupq_n_s8(-2 * t)), three));
            std::array::from_fn(|g| {
                let (h, t, i) = (g / 8, (g % 8 / 2) as i8, g % 2);
                let v = [[a0, a1], [b0, b1]][h][i];
                sh(v, t)
            })
        }
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> KScales {
        unsafe {
            let b: [u8; 16] = *w.cast();
            KScales {
                d: f16_at(w.add(80)),
                dmin: f16_at(w.add(82)),
                sc: std::array::from_fn(|g| i32::from(b[g] & 0x0F)),
                m: std::array::from_fn(|g| i16::from(b[g] >> 4)),
            }
        }
    }
    #[inline(always)]
    unsafe fn vscales(w: *const u8) -> VScales {
        unsafe {
            let b = vld1q_u8(w);
            let (sc, m) = (vandq_u8(b, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(b));
            widen(f16_at(w.add(80)), f16_at(w.add(82)), s8(sc), s8(m))
        }
    }
}

impl KBlock for Q3K {
    const BYTES: usize = Q3_K_BYTES;
    const MIN: bool = false;
    const PAIRS: bool = false;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        unsafe {
            let (three, four) = (vdupq_n_u8(3), vdupq_n_u8(4));
            let hm = load32(w, 0);
            let qs = [load32(w, 32), load32(w, 64)];
            std::array::from_fn(|g| {
                let (h, t, i) = (g / 8, g % 8 / 2, g % 2);
                let low = vandq_u8(vshlq_u8(qs[h][i], vdupq_n_s8(-2 * t as i8)), three);
                let set = vtstq_u8(hm[i], vdupq_n_u8(1 << (4 * h + t)));
                vsubq_s8(s8(low), s8(vbicq_u8(four, set)))
            })
        }
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> KScales {
        let s = k3_scales(unsafe { &*w.add(96).cast() });
        KScales {
            d: unsafe { f16_at(w.add(108)) },
            dmin: 0.0,
            sc: std::array::from_fn(|g| i32::from(s[g]) - 32),
            m: [0; 16],
        }
    }
    #[inline(always)]
    unsafe fn vscales(w: *const u8) -> VScales {
        unsafe {
            let s = vld1q_u8(k3_scales(&*w.add(96).cast()).as_ptr());
            let sc = vsubq_s8(s8(s), vdupq_n_s8(32));
            widen(f16_at(w.add(108)), 0.0, sc, vdupq_n_s8(0))
        }
    }
}

/// The 256 nibbles of a `Q4_K`/`Q5_K` super-block whose quant bytes start at `at` (32 bytes per
/// 64 values: low nibbles the first 32, high nibbles the next), 16 per vector in order.
#[inline(always)]
unsafe fn k4_nibbles(w: *const u8, at: usize) -> [uint8x16_t; 16] {
    unsafe {
        let qs: [[uint8x16_t; 2]; 4] = std::array::from_fn(|j| load32(w, at + 32 * j));
        let low = vdupq_n_u8(0x0F);
        std::array::from_fn(|g| {
            let (j, hi, i) = (g / 4, g % 4 / 2, g % 2);
            if hi == 0 {
                vandq_u8(qs[j][i], low)
            } else {
                vshrq_n_u8::<4>(qs[j][i])
            }
        })
    }
}

/// The `KBlock` impl of `Q4_K` / `Q5_K` (same scales; `quants` given).
macro_rules! k4_block {
    ($t:ty, $bytes:expr, $quants:item) => {
        impl KBlock for $t {
            const BYTES: usize = $bytes;
            const MIN: bool = true;
            const PAIRS: bool = true;
            $quants
            #[inline(always)]
            unsafe fn scales(w: *const u8) -> KScales {
                unsafe { k4(w) }
            }
            #[inline(always)]
            unsafe fn vscales(w: *const u8) -> VScales {
                unsafe { k4v(w) }
            }
        }
    };
}

k4_block!(
    Q4K,
    Q4_K_BYTES,
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        unsafe {
            let n = k4_nibbles(w, 16);
            std::array::from_fn(|g| s8(n[g]))
        }
    }
);

k4_block!(
    Q5K,
    Q5_K_BYTES,
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        unsafe {
            let qh = load32(w, 16);
            let n = k4_nibbles(w, 48);
            let sixteen = vdupq_n_u8(16);
            std::array::from_fn(|g| {
                let (j, hi, i) = (g / 4, g % 4 / 2, g % 2);
                let bit = vtstq_u8(qh[i], vdupq_n_u8(1 << (2 * j + hi)));
                s8(vorrq_u8(n[g], vandq_u8(bit, sixteen)))
            })
        }
    }
);

impl KBlock for Q6K {
    const BYTES: usize = Q6_K_BYTES;
    const MIN: bool = false;
    const PAIRS: bool = false;
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        unsafe {
            let ql: [[uint8x16_t; 4]; 2] =
                std::array::from_fn(|h| std::array::from_fn(|i| vld1q_u8(w.add(64 * h + 16 * i))));
            let qh = [load32(w, 128), load32(w, 160)];
            let (low, three, off) = (vdupq_n_u8(0x0F), vdupq_n_u8(3), vdupq_n_s8(32));
            std::array::from_fn(|g| {
                let (h, t, i) = (g / 8, g % 8 / 2, g % 2);
                let l = ql[h][2 * (t % 2) + i];
                let l = if t < 2 {
                    vandq_u8(l, low)
                } else {
                    vshrq_n_u8::<4>(l)
                };
                let hb = vandq_u8(vshlq_u8(qh[h][i], vdupq_n_s8(-2 * t as i8)), three);
                vsubq_s8(s8(vorrq_u8(l, vshlq_n_u8::<4>(hb))), off)
            })
        }
    }
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> KScales {
        unsafe {
            let s: [u8; 16] = *w.add(192).cast();
            KScales {
                d: f16_at(w.add(208)),
                dmin: 0.0,
                sc: std::array::from_fn(|g| i32::from(s[g] as i8)),
                m: [0; 16],
            }
        }
    }
    #[inline(always)]
    unsafe fn vscales(w: *const u8) -> VScales {
        unsafe { widen(f16_at(w.add(208)), 0.0, load_i8(w.add(192)), vdupq_n_s8(0)) }
    }
}

/// `Σ_g sc_g · Σ q·x` of one super-block (quants `q`) and one activation block at `x`: exact.
#[inline(always)]
unsafe fn block_sum<B: KBlock, D: Dot>(
    q: &[int8x16_t; 16],
    sc: &[int32x4_t; 4],
    x: *const u8,
) -> i32 {
    unsafe {
        let z = vdupq_n_s32(0);
        let xv = |g: usize| load_i8(x.add(16 * g));
        let units: [int32x4_t; 16] = if B::PAIRS {
            std::array::from_fn(|u| {
                if u < 8 {
                    D::dot16(
                        D::dot16(z, q[2 * u], xv(2 * u)),
                        q[2 * u + 1],
                        xv(2 * u + 1),
                    )
                } else {
                    z
                }
            })
        } else {
            std::array::from_fn(|g| D::dot16(z, q[g], xv(g)))
        };
        let n = if B::PAIRS { 2 } else { 4 };
        let mut acc = z;
        for (c, s) in sc.iter().enumerate().take(n) {
            let u = &units[4 * c..4 * c + 4];
            let r = vpaddq_s32(vpaddq_s32(u[0], u[1]), vpaddq_s32(u[2], u[3]));
            acc = vmlaq_s32(acc, r, *s);
        }
        vaddvq_s32(acc)
    }
}

/// `Σ_g m_g · bsum_g` of one super-block's minimums and an activation block's sums: exact.
#[inline(always)]
unsafe fn min_sum(m: &[int16x8_t; 2], bsums: *const u8) -> i32 {
    unsafe {
        let [m0, m1] = *m;
        let (b0, b1) = (load_i16(bsums), load_i16(bsums.add(16)));
        let acc = vmull_s16(vget_low_s16(m0), vget_low_s16(b0));
        let acc = vmlal_high_s16(acc, m0, b0);
        let acc = vmlal_s16(acc, vget_low_s16(m1), vget_low_s16(b1));
        vaddvq_s32(vmlal_high_s16(acc, m1, b1))
    }
}

/// One weight row of `nb` super-blocks at `w` · `R` activation rows, each output bitwise equal
/// to the scalar reference's.
///
/// # Safety
/// `w` and every row of `a` must hold `nb` whole super-blocks.
#[inline(always)]
pub(super) unsafe fn dotn<B: KBlock, D: Dot, A: ActK, const R: usize>(
    nb: usize,
    w: *const u8,
    a: [A; R],
) -> [f32; R] {
    let mut sum = [0f32; R];
    for b in 0..nb {
        // SAFETY: super-block `b` of every row (the caller's guarantee).
        unsafe {
            let wb = w.add(b * B::BYTES);
            let q = B::quants(wb);
            let s = B::vscales(wb);
            for (acc, x) in sum.iter_mut().zip(a) {
                let sumi = block_sum::<B, D>(&q, &s.sc, x.qs(b));
                let dx = x.d(b);
                *acc += s.d * dx * sumi as f32;
                if B::MIN {
                    let summ = min_sum(&s.m, x.bsums(b));
                    *acc -= s.dmin * dx * summ as f32;
                }
            }
        }
    }
    sum
}
