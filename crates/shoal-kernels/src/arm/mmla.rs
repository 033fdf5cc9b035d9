//! The `i8mm` level's matmul of the 32-value formats: `smmla` multiplies a 2 × 8 block of `i8` by
//! another's transpose into a 2 × 2 block of `i32`, so two weight rows × two activation rows take
//! four `smmla` per 32 values (the four products `sdot` needs eight for) and the four sums come out
//! in the lanes, without a reduction. The rows of each pair are interleaved by 8 bytes (`zip1`/`zip2`
//! on 64-bit lanes). Each output then takes the float steps of [`super::legacy::dotn`] (the scalar
//! reference's), so it is bitwise equal to the other levels and to [`crate::vec_dot`]. Weight rows
//! or activation rows left over from the pairs go through the `sdot` kernel.

use std::arch::aarch64::*;
use std::arch::asm;
use std::ops::Range;

use super::legacy::{self, Act32, Block32, Packed};
use super::ops::{Sdot, load_i8};
use crate::gemm::Gemm;

/// `acc + a · bᵀ` for `a`, `b` two rows of 8 `i8` each (`smmla`).
#[inline(always)]
pub(super) unsafe fn smmla(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: only compiled into functions with the `i8mm` feature (checked at run time by the
    // entry point); `.arch_extension` as for `sdot` in `ops`. Registers only.
    unsafe {
        asm!(
            ".arch_extension i8mm",
            "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// Bytes 0..8 of `x` and of `y` (`lo`), and bytes 8..16 of each (`hi`).
#[inline(always)]
pub(super) unsafe fn zip(x: int8x16_t, y: int8x16_t) -> (int8x16_t, int8x16_t) {
    unsafe {
        let (x, y) = (vreinterpretq_s64_s8(x), vreinterpretq_s64_s8(y));
        (
            vreinterpretq_s8_s64(vzip1q_s64(x, y)),
            vreinterpretq_s8_s64(vzip2q_s64(x, y)),
        )
    }
}

/// Weight rows `w[0]`, `w[1]` (`nb` blocks each) · activation rows `a[0]`, `a[1]`: `out[j][i]` is
/// weight row `i` · activation row `j`.
///
/// # Safety
/// Every row must hold `nb` whole blocks; the CPU must have `i8mm`.
#[inline(always)]
unsafe fn dot2x2<B: Block32, A: Act32>(nb: usize, w: [*const u8; 2], a: [A; 2]) -> [[f32; 2]; 2] {
    let mut out = [[0f32; 2]; 2];
    for b in 0..nb {
        // SAFETY: block `b` of every row (the caller's guarantee).
        unsafe {
            let (wa, wb) = (w[0].add(b * B::BYTES), w[1].add(b * B::BYTES));
            let ((l0, h0), (l1, h1)) = (B::quants(wa), B::quants(wb));
            let (x0, x1) = (a[0].qs(b), a[1].qs(b));
            let mut acc = vdupq_n_s32(0);
            for (wv, xv) in [
                (zip(l0, l1), zip(load_i8(x0), load_i8(x1))),
                (zip(h0, h1), zip(load_i8(x0.add(16)), load_i8(x1.add(16)))),
            ] {
                acc = smmla(acc, wv.0, xv.0);
                acc = smmla(acc, wv.1, xv.1);
            }
            let mut sums = [0i32; 4];
            vst1q_s32(sums.as_mut_ptr(), acc);
            let scales = [B::scales(wa), B::scales(wb)];
            for (j, o) in out.iter_mut().enumerate() {
                let dx = a[j].d(b);
                for (i, &(d, m)) in scales.iter().enumerate() {
                    let sumi = sums[2 * i + j];
                    o[i] += if B::MIN {
                        d * dx * sumi as f32 + m * a[j].s(b)
                    } else {
                        d * dx * sumi as f32
                    };
                }
            }
        }
    }
    out
}

/// Weight rows `rows` of `g` (a 32-value format `B`) against all its activation rows: pairs of
/// weight rows × pairs of activation rows through [`dot2x2`], the rest through `sdot`, over tiles
/// of `tile` activation rows.
///
/// # Safety
/// The operands of `g` must have been checked (`Gemm::check_ggml`) and the CPU must have
/// `dotprod` and `i8mm`.
#[inline(always)]
pub(super) unsafe fn gemm_rows<B: Block32>(
    g: &Gemm<'_>,
    rows: Range<usize>,
    tile: usize,
    packed: impl Fn(usize) -> Packed,
) {
    let (nb, m) = (g.x.nb(), g.m);
    let one = |j: usize, r: usize| {
        let w = g.weight_row(j).as_ptr();
        // SAFETY: one complete weight row and activation row (the caller's guarantee).
        g.store(r, j, unsafe {
            legacy::dotn::<B, Sdot, _, 1>(nb, w, [packed(r)])[0]
        });
    };
    let mut r0 = 0;
    while r0 < m {
        let r1 = (r0 + tile).min(m);
        let mut j = rows.start;
        while j < rows.end {
            if j + 1 == rows.end {
                (r0..r1).for_each(|r| one(j, r));
                break;
            }
            let w = [g.weight_row(j).as_ptr(), g.weight_row(j + 1).as_ptr()];
            let mut r = r0;
            while r + 2 <= r1 {
                // SAFETY: two complete weight rows and activation rows (the caller's guarantee).
                let v = unsafe { dot2x2::<B, _>(nb, w, [packed(r), packed(r + 1)]) };
                for (i, row) in v.iter().enumerate() {
                    g.store(r + i, j, row[0]);
                    g.store(r + i, j + 1, row[1]);
                }
                r += 2;
            }
            if r < r1 {
                one(j, r);
                one(j + 1, r);
            }
            j += 2;
        }
        r0 = r1;
    }
}
