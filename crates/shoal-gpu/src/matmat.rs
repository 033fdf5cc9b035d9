//! The tiled matrix-matrix product for prefill and batches: [`Commands::matmat`].

use crate::ops::same_len;
use crate::pipelines::Kernel;
use crate::{Commands, GpuError, GpuMatrix, GpuVec};

/// The tile of a matrix-matrix workgroup, given to the kernel as override constants: it computes
/// `weight_rows` rows of W against `x_rows` rows of X with `weight_rows · x_rows / 4` threads,
/// dequantizing each weight once per tile into workgroup memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmatConfig {
    /// Weight rows per tile (1 ..= 64).
    pub weight_rows: u32,
    /// Rows of X per tile (a multiple of 4, at most 64).
    pub x_rows: u32,
}

impl Default for MatmatConfig {
    /// 32 weight rows × 16 rows of X, 128 threads. Not tuned yet on a real GPU (issue 27).
    fn default() -> Self {
        Self {
            weight_rows: 32,
            x_rows: 16,
        }
    }
}

impl Commands<'_> {
    /// `Y = X · Wᵀ` with the default [`MatmatConfig`]; one row of `X` takes [`Commands::matvec`].
    pub fn matmat(&mut self, w: &GpuMatrix, x: &GpuVec, y: &GpuVec) -> Result<(), GpuError> {
        // One row (a decode step of one sequence, the head's one wanted row): the matrix × vector
        // kernel, which reads each weight once with every thread of a row on it — the decode kernel the
        // GPU probe measures, so the planner's GPU speed is this path's.
        if x.len() == w.cols() && y.len() == w.rows() {
            return self.matvec(w, x, y);
        }
        self.matmat_with(w, x, y, MatmatConfig::default())
    }

    /// `Y = X · Wᵀ`: `x` holds `n` rows of `w.cols()` values, `y` gets `n` rows of `w.rows()`
    /// (row `i` of `y` is `W · x_i`, as [`Commands::matvec`] gives it). One dispatch per row
    /// chunk of `w`.
    pub fn matmat_with(
        &mut self,
        w: &GpuMatrix,
        x: &GpuVec,
        y: &GpuVec,
        config: MatmatConfig,
    ) -> Result<(), GpuError> {
        let (k, m) = (w.cols(), w.rows());
        if k == 0 || !x.len().is_multiple_of(k) {
            return Err(GpuError::Shape(format!(
                "matmat input: {} values are not rows of {k}",
                x.len()
            )));
        }
        let n = x.len() / k;
        same_len("matmat output", y.len(), n * m)?;
        let MatmatConfig {
            weight_rows: tm,
            x_rows: tn,
        } = config;
        let gpu = self.gpu();
        let wg = tm * tn / 4;
        let ok = (1..=64).contains(&tm)
            && (4..=64).contains(&tn)
            && tn % 4 == 0
            && wg <= 256.min(gpu.max_invocations);
        if !ok {
            return Err(GpuError::Config(format!(
                "matmat tile {tm}×{tn}: need 1..=64 weight rows, a multiple of 4 up to 64 rows \
                 of X, and at most {} threads",
                256.min(gpu.max_invocations)
            )));
        }
        let n32 = u32::try_from(n)
            .map_err(|_| GpuError::Shape(format!("{n} rows of X do not fit a u32")))?;
        if n32 == 0 {
            return Ok(());
        }
        let batch = gpu.uniform(&[n32, m as u32, k as u32]);
        let kernel = Kernel::Matmat(w.qtype());
        let constants = [("TM", tm), ("TN", tn), ("WG", wg)];
        for chunk in &w.chunks {
            let mut buffers = vec![(0, &chunk.params), (1, &x.buffer), (2, &y.buffer)];
            buffers.push((3, &chunk.weights));
            if let Some(s) = &chunk.scales {
                buffers.push((4, s));
            }
            buffers.push((5, &batch));
            if w.qtype().is_iq() {
                buffers.push((7, gpu.iq_tables()?));
            }
            let groups = (chunk.rows.div_ceil(tm), n32.div_ceil(tn));
            self.dispatch_grid(kernel, &constants, &buffers, groups)?;
        }
        Ok(())
    }
}
