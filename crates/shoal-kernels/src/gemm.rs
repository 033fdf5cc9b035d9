//! [`Gemm`]: one matmul's validated operands, the unit of work every backend's row kernels take.
//!
//! It sits below the kernels (`scalar`, `x86`) and the dispatch (`backend`), which read weight rows
//! and activation rows through it and write outputs with [`Gemm::store`] / [`Gemm::store_run`];
//! `matmul` builds one after checking the shapes and splits its weight rows over threads.

use std::ops::Range;

use crate::acts::Activations;
use crate::format::{Layout, QType};

/// One matmul's operands, validated: `w` holds `n` rows of `w_row_bytes` (`k` values each), `x`
/// holds `m` rows of `k` values in the activation format of `qtype`, and `out` points at `m × n`
/// writable `f32`s.
pub(crate) struct Gemm<'a> {
    pub(crate) qtype: QType,
    pub(crate) k: usize,
    pub(crate) n: usize,
    pub(crate) m: usize,
    pub(crate) w: &'a [u8],
    pub(crate) w_row_bytes: usize,
    pub(crate) layout: Layout,
    pub(crate) x: &'a Activations,
    out: *mut f32,
}

// SAFETY: `out` is only written through `store`, and the driver hands each weight row (each
// output column) to exactly one thread, so no two threads write the same element; the borrowed
// `&mut [f32]` outlives every thread's use because `Parallel::run_parts` returns only after all
// parts have finished.
unsafe impl Sync for Gemm<'_> {}

impl<'a> Gemm<'a> {
    /// The operands of `out = x · Wᵀ` for the `n × k` matrix `w` of `qtype` stored in `layout`
    /// (`w_row_bytes` per row), all checked by the caller; `m` is `x.m()`.
    ///
    /// # Panics
    /// If `out` does not hold `x.m() × n` values (the bound every [`Gemm::store`] relies on).
    #[allow(clippy::too_many_arguments)] // one matrix's description plus operands
    #[inline]
    pub(crate) fn new(
        qtype: QType,
        k: usize,
        n: usize,
        w: &'a [u8],
        w_row_bytes: usize,
        layout: Layout,
        x: &'a Activations,
        out: &'a mut [f32],
    ) -> Self {
        let m = x.m();
        assert!(
            m.checked_mul(n) == Some(out.len()),
            "gemm: {} outputs for {m} × {n}",
            out.len()
        );
        Self {
            qtype,
            k,
            n,
            m,
            w,
            w_row_bytes,
            layout,
            x,
            out: out.as_mut_ptr(),
        }
    }

    /// Encoded weight row `j`.
    #[inline]
    pub(crate) fn weight_row(&self, j: usize) -> &'a [u8] {
        &self.w[j * self.w_row_bytes..(j + 1) * self.w_row_bytes]
    }

    /// Writes output `(r, j)`; panics if out of bounds.
    #[inline]
    pub(crate) fn store(&self, r: usize, j: usize, v: f32) {
        assert!(
            r < self.m && j < self.n,
            "output ({r}, {j}) outside {} × {}",
            self.m,
            self.n
        );
        // SAFETY: in bounds (checked above) of the `m × n` buffer; see the `Sync` impl for why no
        // other thread writes this element.
        unsafe { self.out.add(r * self.n + j).write(v) }
    }

    /// Writes outputs `(r, j0..)` from `vals`, dropping those past the last column.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the 16-row groups' kernels
    #[inline]
    pub(crate) fn store_run<const N: usize>(&self, r: usize, j0: usize, vals: &[f32; N]) {
        assert!(
            r < self.m && j0 < self.n,
            "output ({r}, {j0}) outside {} × {}",
            self.m,
            self.n
        );
        // SAFETY (both writes): `(r, j0..j0+len)` lies in row `r` of the `m × n` buffer (checked
        // above); see the `Sync` impl for why no other thread writes these elements.
        let dst = unsafe { self.out.add(r * self.n + j0) };
        if j0 + N <= self.n {
            // The whole run: a fixed-size copy the compiler turns into vector moves.
            unsafe { dst.cast::<[f32; N]>().write_unaligned(*vals) }
        } else {
            unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), dst, self.n - j0) }
        }
    }

    /// Writes outputs `(r, j0 .. j0 + count)` from the first `count` of `vals` (a group of rows
    /// whose last `N - count` lanes are padding).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the 16-row groups' kernels
    #[inline]
    pub(crate) fn store_first<const N: usize>(
        &self,
        r: usize,
        j0: usize,
        count: usize,
        vals: &[f32; N],
    ) {
        if count == N {
            self.store_run(r, j0, vals);
        } else {
            for (l, &o) in vals.iter().enumerate().take(count) {
                self.store(r, j0 + l, o);
            }
        }
    }

    /// Checks that `rows` lies within the weight matrix and that the operands are consistent for
    /// the SIMD kernels of GGUF rows: the activations in the weights' activation format with
    /// `k` values per row, and weight rows of whole blocks.
    ///
    /// # Panics
    /// If not.
    pub(crate) fn check_ggml(&self, rows: &Range<usize>) {
        self.check_rows(rows);
        let (nb, act) = (self.x.nb(), self.qtype.act_type());
        assert!(
            self.x.act_type() == Some(act)
                && nb * act.block_size() == self.k
                && self.x.k() == self.k
                && self.w_row_bytes == nb * self.qtype.type_size(),
            "gemm: row sizes do not match k = {}",
            self.k
        );
    }

    /// Checks that `rows` lies within the weight matrix.
    #[inline]
    pub(crate) fn check_rows(&self, rows: &Range<usize>) {
        assert!(
            rows.start <= rows.end && rows.end <= self.n,
            "weight rows {rows:?} outside 0..{}",
            self.n
        );
    }
}
