//! Weight matrices owned by the kernels, in the layout the best backend of this CPU reads fastest.
//!
//! [`PackedMatrix::new`] copies a [`QMatrix`]'s GGUF rows once at load time. On CPUs with AVX-512
//! VNNI, `Q4_1` and `Q8_0` weights are repacked into groups of 16 rows ([`Layout::Rows16`]: per
//! block, the 16 rows' scales and then their quants interleaved four bytes at a time, the layout one
//! 512-bit `vpdpbusd` consumes; see `x86::avx512`). Everywhere else the rows stay as they are
//! ([`Layout::Rows`]) and the 256-bit or scalar kernels run. Repacking keeps the byte count (except
//! the padding of a last partial group) and is exact: the same quants and f16 scales.

use crate::acts::Activations;
use crate::backend::Backend;
use crate::error::KernelError;
use crate::format::{
    GROUP, Layout, Q4_1_BYTES, Q4_1_GROUP_BYTES, Q8_0_BYTES, Q8_0_GROUP_BYTES, QK, QType,
};
use crate::matmul::{QMatrix, run_gemm};
use crate::pool::Parallel;

/// An owned weight matrix (`rows` output features × `cols` input features) laid out for a backend.
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    qtype: QType,
    rows: usize,
    cols: usize,
    layout: Layout,
    backend: Backend,
    data: Vec<u8>,
}

impl PackedMatrix {
    /// Copies `w` into the layout of the detected backend.
    pub fn new(w: &QMatrix<'_>) -> Result<Self, KernelError> {
        Self::with_backend(w, Backend::detect())
    }

    /// Copies `w` into the layout `backend` reads (`Rows` unless it is AVX-512 VNNI on this CPU).
    pub fn with_backend(w: &QMatrix<'_>, backend: Backend) -> Result<Self, KernelError> {
        Self::build(w, backend, || w.data.to_vec())
    }

    /// [`PackedMatrix::new`] taking the GGUF rows by value: kept as they are (no copy) when the
    /// detected backend reads rows.
    pub fn from_rows(
        qtype: QType,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
    ) -> Result<Self, KernelError> {
        let w = QMatrix::new(qtype, rows, cols, &data)?;
        let packed = Self::build(&w, Backend::detect(), Vec::new)?;
        Ok(match packed.layout {
            Layout::Rows => Self { data, ..packed },
            Layout::Rows16 => packed,
        })
    }

    /// The matrix in `backend`'s layout; `rows_copy` gives the bytes when that layout is `Rows`.
    fn build(
        w: &QMatrix<'_>,
        backend: Backend,
        rows_copy: impl FnOnce() -> Vec<u8>,
    ) -> Result<Self, KernelError> {
        let row_bytes = w.row_bytes()?;
        let backend = backend.usable();
        let quantized = matches!(w.qtype, QType::Q4_1 | QType::Q8_0);
        let (layout, data) = if backend == Backend::Avx512Vnni && quantized && w.cols > 0 {
            (Layout::Rows16, repack16(w, row_bytes))
        } else {
            (Layout::Rows, rows_copy())
        };
        Ok(Self {
            qtype: w.qtype,
            rows: w.rows,
            cols: w.cols,
            layout,
            backend,
            data,
        })
    }

    pub fn qtype(&self) -> QType {
        self.qtype
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The backend the matrix was laid out for (the one its matmuls run on).
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Decodes row `i` into `out` (`cols` values), whatever the layout: an embedding lookup from the
    /// matrix that also serves as the tied output head.
    pub fn dequantize_row(&self, i: usize, out: &mut [f32]) -> Result<(), KernelError> {
        let row_bytes = self.qtype.try_row_bytes(self.cols)?;
        if i >= self.rows {
            return Err(KernelError::BadSliceLength {
                what: "row index (rows)",
                expected: self.rows,
                actual: i,
            });
        }
        match self.layout {
            Layout::Rows => crate::quant::dequantize_row(
                self.qtype,
                &self.data[i * row_bytes..(i + 1) * row_bytes],
                out,
            ),
            Layout::Rows16 => {
                crate::quant::dequantize_row(self.qtype, &unpack16_row(self, i, row_bytes), out)
            }
        }
    }

    /// `out = x · Wᵀ`: `x` is `m × cols`, `out` is `m × rows`, both row-major.
    ///
    /// Results are bitwise identical for every thread count and do not depend on `m` or on a
    /// row's position among the `m` rows.
    pub fn matmul<P: Parallel + ?Sized>(
        &self,
        x: &[f32],
        m: usize,
        out: &mut [f32],
        pool: &P,
    ) -> Result<(), KernelError> {
        let mut acts = Activations::default();
        acts.quantize_into_par(self.qtype.act_type(), x, m, self.cols, pool)?;
        self.matmul_quantized(&acts, out, pool)
    }

    /// [`PackedMatrix::matmul`] for activations quantized beforehand.
    pub fn matmul_quantized<P: Parallel + ?Sized>(
        &self,
        x: &Activations,
        out: &mut [f32],
        pool: &P,
    ) -> Result<(), KernelError> {
        // (The bytes were checked against the shape when the matrix was built.)
        run_gemm(
            self.backend,
            self.qtype,
            self.rows,
            self.cols,
            &self.data,
            self.layout,
            x,
            out,
            pool,
        )
    }
}

/// Repacks GGML rows into 16-row groups (the last group padded with zero rows).
fn repack16(w: &QMatrix<'_>, row_bytes: usize) -> Vec<u8> {
    let nb = w.cols / QK;
    let (block, group_bytes) = match w.qtype {
        QType::Q4_1 => (Q4_1_BYTES, Q4_1_GROUP_BYTES),
        _ => (Q8_0_BYTES, Q8_0_GROUP_BYTES),
    };
    let groups = w.rows.div_ceil(GROUP);
    let mut out = vec![0u8; groups * nb * group_bytes];
    for (g, dst) in out.chunks_exact_mut(nb * group_bytes).enumerate() {
        for (b, gb) in dst.chunks_exact_mut(group_bytes).enumerate() {
            for l in 0..GROUP {
                let r = g * GROUP + l;
                if r >= w.rows {
                    continue; // padding: scales 0, outputs never stored
                }
                let src = &w.data[r * row_bytes + b * block..r * row_bytes + (b + 1) * block];
                match w.qtype {
                    QType::Q4_1 => {
                        gb[2 * l..2 * l + 2].copy_from_slice(&src[0..2]);
                        gb[32 + 2 * l..32 + 2 * l + 2].copy_from_slice(&src[2..4]);
                        for c in 0..4 {
                            let at = 64 + 64 * c + 4 * l;
                            gb[at..at + 4].copy_from_slice(&src[4 + 4 * c..8 + 4 * c]);
                        }
                    }
                    _ => {
                        gb[2 * l..2 * l + 2].copy_from_slice(&src[0..2]);
                        for j in 0..8 {
                            let at = 32 + 64 * j + 4 * l;
                            for t in 0..4 {
                                gb[at + t] = src[2 + 4 * j + t] ^ 0x80;
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Row `i` of a 16-row-group matrix back in GGML's row encoding (the inverse of [`repack16`]).
fn unpack16_row(w: &PackedMatrix, i: usize, row_bytes: usize) -> Vec<u8> {
    let nb = w.cols / QK;
    let (block, group_bytes) = match w.qtype {
        QType::Q4_1 => (Q4_1_BYTES, Q4_1_GROUP_BYTES),
        _ => (Q8_0_BYTES, Q8_0_GROUP_BYTES),
    };
    let (g, l) = (i / GROUP, i % GROUP);
    let mut row = vec![0u8; row_bytes];
    let groups = &w.data[g * nb * group_bytes..(g + 1) * nb * group_bytes];
    for (gb, dst) in groups
        .chunks_exact(group_bytes)
        .zip(row.chunks_exact_mut(block))
    {
        match w.qtype {
            QType::Q4_1 => {
                dst[0..2].copy_from_slice(&gb[2 * l..2 * l + 2]);
                dst[2..4].copy_from_slice(&gb[32 + 2 * l..32 + 2 * l + 2]);
                for c in 0..4 {
                    let at = 64 + 64 * c + 4 * l;
                    dst[4 + 4 * c..8 + 4 * c].copy_from_slice(&gb[at..at + 4]);
                }
            }
            _ => {
                dst[0..2].copy_from_slice(&gb[2 * l..2 * l + 2]);
                for j in 0..8 {
                    let at = 32 + 64 * j + 4 * l;
                    for t in 0..4 {
                        dst[2 + 4 * j + t] = gb[at + t] ^ 0x80;
                    }
                }
            }
        }
    }
    row
}
