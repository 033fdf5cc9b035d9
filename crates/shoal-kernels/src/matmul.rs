//! Weight matrices, quantized activations and the threaded matmul driver.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::acts::Activations;
use crate::backend::Backend;
use crate::error::{KernelError, check_len};
use crate::format::{ActType, Layout, QType};
use crate::gemm::Gemm;
use crate::pool::Parallel;

/// A borrowed weight matrix in a GGML format: `rows` (output features, `n`) rows of `cols` (input
/// features, `k`) values each, row-major, exactly as stored in a GGUF tensor of dims `[cols, rows]`.
///
/// The fields are public so the engine can build one over any byte buffer; every function taking a
/// `QMatrix` checks them (`cols` a multiple of the block size, `data.len() == rows · row_bytes`).
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    pub qtype: QType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> QMatrix<'a> {
    /// A checked matrix.
    pub fn new(
        qtype: QType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, KernelError> {
        let w = Self {
            qtype,
            rows,
            cols,
            data,
        };
        w.row_bytes()?;
        Ok(w)
    }

    /// Bytes per row, after checking the shape against `data`.
    pub fn row_bytes(&self) -> Result<usize, KernelError> {
        let rb = self.qtype.try_row_bytes(self.cols)?;
        let total = rb.checked_mul(self.rows).ok_or(KernelError::Overflow {
            what: "the weight matrix",
        })?;
        check_len("weight data (bytes)", total, self.data.len())?;
        Ok(rb)
    }

    /// The encoded bytes of row `i`.
    pub fn row(&self, i: usize) -> Result<&'a [u8], KernelError> {
        let rb = self.row_bytes()?;
        if i >= self.rows {
            return Err(KernelError::BadSliceLength {
                what: "row index (rows)",
                expected: self.rows,
                actual: i,
            });
        }
        Ok(&self.data[i * rb..(i + 1) * rb])
    }

    /// Dequantizes row `i` into `out` (`cols` values): the embedding lookup of token `i`.
    pub fn dequantize_row(&self, i: usize, out: &mut [f32]) -> Result<(), KernelError> {
        crate::quant::dequantize_row(self.qtype, self.row(i)?, out)
    }
}

/// `out = x · Wᵀ`: `x` is `m × w.cols` and `out` is `m × w.rows`, both row-major.
///
/// Quantizes `x` once (in the format `w.qtype.act_type()`), then runs [`matmul_quantized`].
/// Results are bitwise identical for every thread count.
pub fn matmul<P: Parallel + ?Sized>(
    w: &QMatrix<'_>,
    x: &[f32],
    m: usize,
    out: &mut [f32],
    pool: &P,
) -> Result<(), KernelError> {
    let mut acts = Activations::default();
    acts.quantize_into_par(w.qtype.act_type(), x, m, w.cols, pool)?;
    matmul_quantized(w, &acts, out, pool)
}

/// `out = x · Wᵀ` for activations quantized beforehand; `out` is `x.m() × w.rows`.
pub fn matmul_quantized<P: Parallel + ?Sized>(
    w: &QMatrix<'_>,
    x: &Activations,
    out: &mut [f32],
    pool: &P,
) -> Result<(), KernelError> {
    matmul_quantized_with(Backend::detect(), w, x, out, pool)
}

/// [`matmul_quantized`] on a chosen backend (`Scalar` if this CPU cannot run it).
pub fn matmul_quantized_with<P: Parallel + ?Sized>(
    backend: Backend,
    w: &QMatrix<'_>,
    x: &Activations,
    out: &mut [f32],
    pool: &P,
) -> Result<(), KernelError> {
    w.row_bytes()?; // checks the shape against the bytes
    run_gemm(
        backend,
        w.qtype,
        w.rows,
        w.cols,
        w.data,
        Layout::Rows,
        x,
        out,
        pool,
    )
}

/// Checks the activations and output against an `n × k` matrix of `qtype` stored in `layout`
/// (its bytes already checked by the caller) and runs the matmul on `backend`, split over `pool`.
#[allow(clippy::too_many_arguments)] // one matrix's description plus operands
pub(crate) fn run_gemm<P: Parallel + ?Sized>(
    backend: Backend,
    qtype: QType,
    n: usize,
    k: usize,
    data: &[u8],
    layout: Layout,
    x: &Activations,
    out: &mut [f32],
    pool: &P,
) -> Result<(), KernelError> {
    let act = qtype.act_type();
    match x.act_type() {
        Some(a) if a == act => {}
        other => {
            let activations = other.map_or("unquantized", ActType::name);
            return Err(KernelError::FormatMismatch {
                weights: qtype.name(),
                activations,
            });
        }
    }
    check_len("activation row length (k)", k, x.k())?;
    let m = x.m();
    let total = m
        .checked_mul(n)
        .ok_or(KernelError::Overflow { what: "the output" })?;
    check_len("output (f32 values)", total, out.len())?;
    if total == 0 {
        return Ok(());
    }
    if k == 0 {
        out.fill(0.0); // empty dot products
        return Ok(());
    }
    let w_row_bytes = qtype.try_row_bytes(k)?;
    let g = Gemm::new(qtype, k, n, data, w_row_bytes, layout, x, out);
    let nt = pool.n_threads().max(1);
    let chunk = chunk_rows(n, nt);
    let n_chunks = n.div_ceil(chunk);
    if nt == 1 || n_chunks == 1 {
        backend.gemm_rows(&g, 0..n);
        return Ok(());
    }
    let next = AtomicUsize::new(0);
    pool.run_parts(&|_, _| {
        loop {
            let c = next.fetch_add(1, Ordering::Relaxed);
            if c >= n_chunks {
                break;
            }
            backend.gemm_rows(&g, c * chunk..((c + 1) * chunk).min(n));
        }
    });
    Ok(())
}

/// Weight rows per work item: about four items per thread so a late thread costs little, a
/// multiple of 16 (whole cache lines of `f32` outputs), at most 256 rows so a chunk's weights stay
/// in L2 while activation tiles stream past them.
fn chunk_rows(n: usize, nt: usize) -> usize {
    let c = n.div_ceil(nt * 4).clamp(16, 256);
    c.div_ceil(16) * 16
}
