//! Weight matrices owned by the kernels, in the layout the best backend of this CPU reads fastest.
//!
//! [`PackedMatrix::new`] copies a [`QMatrix`]'s GGUF rows once at load time. On CPUs with AVX-512
//! VNNI, `Q4_1`, `Q8_0`, `Q4_K`, `Q5_K` and `Q6_K` weights are repacked into groups of 16 rows
//! ([`Layout::Rows16`]: per block, the 16 rows' scales and then their quants interleaved four
//! bytes at a time, the layout one 512-bit `vpdpbusd` consumes; see `x86::avx512` and, for the
//! K-quants, `x86::k512` and `x86::k6512`). Everywhere else the rows stay as they are
//! ([`Layout::Rows`]) and the 256-bit or scalar kernels run; every other format stays in rows on
//! every backend. Repacking keeps the byte count (except the padding of a last partial group) and
//! is exact: the same quants and f16 scales; [`PackedMatrix::dequantize_row`] reads a row back from
//! either layout (an embedding lookup from the matrix that is also the tied output head).
//!
//! The bytes sit behind an `Arc`: clones share them, and [`PackedMatrix::from_shared_rows`] keeps
//! bytes the caller also holds (one copy for two users) where the layout is `Rows`.

use std::sync::Arc;

use crate::acts::Activations;
use crate::backend::Backend;
use crate::error::KernelError;
use crate::format::{
    GROUP, Layout, Q4_1_BYTES, Q4_1_GROUP_BYTES, Q4_K_BYTES, Q4_K_GROUP_BYTES, Q5_K_BYTES,
    Q5_K_GROUP_BYTES, Q6_K_BYTES, Q6_K_GROUP_BYTES, Q8_0_BYTES, Q8_0_GROUP_BYTES, QType,
};
use crate::matmul::{QMatrix, run_gemm};
use crate::pool::Parallel;

/// An owned weight matrix (`rows` output features × `cols` input features) laid out for a backend.
/// Cloning shares the bytes.
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    qtype: QType,
    rows: usize,
    cols: usize,
    layout: Layout,
    backend: Backend,
    data: Arc<Vec<u8>>,
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
        Self::from_shared_rows(qtype, rows, cols, Arc::new(data))
    }

    /// [`PackedMatrix::from_rows`] on bytes the caller may share with other users (a tied token
    /// embedding and output head): where the detected backend reads rows the matrix holds `data`
    /// itself, so there is one copy of the bytes. Where it repacks (AVX-512 VNNI, `Q4_1`/`Q8_0`/`Q4_K`/`Q5_K`/`Q6_K`)
    /// the matrix holds the repacked copy instead; to have one copy on every backend, share the
    /// `PackedMatrix` (an `Arc` of it) and read rows with [`PackedMatrix::dequantize_row`].
    pub fn from_shared_rows(
        qtype: QType,
        rows: usize,
        cols: usize,
        data: Arc<Vec<u8>>,
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
        let (layout, data) = match layout_for(w.qtype, w.cols, backend) {
            Layout::Rows16 => (Layout::Rows16, repack16(w, row_bytes)),
            Layout::Rows => (Layout::Rows, rows_copy()),
        };
        Ok(Self {
            qtype: w.qtype,
            rows: w.rows,
            cols: w.cols,
            layout,
            backend,
            data: Arc::new(data),
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
                let row = unpack16_row(self.qtype, self.cols, &self.data, i, row_bytes);
                crate::quant::dequantize_row(self.qtype, &row, out)
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

/// The layout a matrix of `qtype` with `cols` input features gets on `backend` (a usable one):
/// 16-row groups for `Q4_1`/`Q8_0`/`Q4_K`/`Q5_K`/`Q6_K` on AVX-512 VNNI, GGUF rows otherwise.
pub(crate) fn layout_for(qtype: QType, cols: usize, backend: Backend) -> Layout {
    let repacked = matches!(
        qtype,
        QType::Q4_1 | QType::Q8_0 | QType::Q4_K | QType::Q5_K | QType::Q6_K
    );
    if backend == Backend::Avx512Vnni && repacked && cols > 0 {
        Layout::Rows16
    } else {
        Layout::Rows
    }
}

/// The bytes of one block of row `l` of a 16-row group: for each piece, its offset in the GGML
/// block, its offset in the group block, its length, and the byte XORed on the way (the `Q8_0`
/// quants are stored `+ 128` as u8).
fn pieces(qtype: QType, l: usize) -> Box<dyn Iterator<Item = (usize, usize, usize, u8)>> {
    if qtype == QType::Q6_K {
        // d, byte j of the 16 scales at 32 + 16 j, the 64 high-bit bytes in 16 chunks of 4, the
        // 128 nibble bytes in 32 chunks of 4 (see `x86::k6512`).
        let head = [(208, 2 * l, 2, 0)];
        let sc = (0..16).map(move |j| (192 + j, 32 + 16 * j + l, 1, 0));
        let qh = (0..16).map(move |c| (128 + 4 * c, 288 + 64 * c + 4 * l, 4, 0));
        let ql = (0..32).map(move |c| (4 * c, 1312 + 64 * c + 4 * l, 4, 0));
        return Box::new(head.into_iter().chain(sc).chain(qh).chain(ql));
    }
    if matches!(qtype, QType::Q4_K | QType::Q5_K) {
        // d, dmin, byte t of the 12 scale bytes at 64 + 16 t, (Q5_K) the 32 high-bit bytes in 8
        // chunks of 4, then per pair p of 32 nibble bytes 8 chunks of 4 (see `x86::k512`).
        let q5 = qtype == QType::Q5_K;
        let head = [(0, 2 * l, 2, 0), (2, 32 + 2 * l, 2, 0)];
        let sc = (0..12).map(move |t| (4 + t, 64 + 16 * t + l, 1, 0));
        let qh = (0..if q5 { 8 } else { 0 }).map(move |c| (16 + 4 * c, 256 + 64 * c + 4 * l, 4, 0));
        let (src, dst) = if q5 { (48, 768) } else { (16, 256) };
        let qs = (0..32).map(move |pc| (src + 4 * pc, dst + 64 * pc + 4 * l, 4, 0));
        return Box::new(head.into_iter().chain(sc).chain(qh).chain(qs));
    }
    let q41 = qtype == QType::Q4_1;
    // Q4_1: d, m, then 4 chunks of 4 nibble bytes; Q8_0: d, then 8 chunks of 4 quants.
    let scales = if q41 {
        vec![(0, 2 * l, 2, 0), (2, 32 + 2 * l, 2, 0)]
    } else {
        vec![(0, 2 * l, 2, 0)]
    };
    let (chunks, src0, dst0, xor) = if q41 { (4, 4, 64, 0) } else { (8, 2, 32, 0x80) };
    let quants = (0..chunks).map(move |c| (src0 + 4 * c, dst0 + 64 * c + 4 * l, 4, xor));
    Box::new(scales.into_iter().chain(quants))
}

fn group_sizes(qtype: QType) -> (usize, usize) {
    match qtype {
        QType::Q4_1 => (Q4_1_BYTES, Q4_1_GROUP_BYTES),
        QType::Q4_K => (Q4_K_BYTES, Q4_K_GROUP_BYTES),
        QType::Q5_K => (Q5_K_BYTES, Q5_K_GROUP_BYTES),
        QType::Q6_K => (Q6_K_BYTES, Q6_K_GROUP_BYTES),
        _ => (Q8_0_BYTES, Q8_0_GROUP_BYTES),
    }
}

/// Repacks GGML rows into 16-row groups (the last group padded with zero rows).
fn repack16(w: &QMatrix<'_>, row_bytes: usize) -> Vec<u8> {
    let nb = w.cols / w.qtype.block_size();
    let (block, group_bytes) = group_sizes(w.qtype);
    let groups = w.rows.div_ceil(GROUP);
    let mut out = vec![0u8; groups * nb * group_bytes];
    for (g, dst) in out.chunks_exact_mut(nb * group_bytes).enumerate() {
        for (b, gb) in dst.chunks_exact_mut(group_bytes).enumerate() {
            // Rows past the end are padding: scales 0, outputs never stored.
            for l in 0..GROUP.min(w.rows - g * GROUP) {
                let at = (g * GROUP + l) * row_bytes + b * block;
                let src = &w.data[at..at + block];
                for (s, d, len, xor) in pieces(w.qtype, l) {
                    for t in 0..len {
                        gb[d + t] = src[s + t] ^ xor;
                    }
                }
            }
        }
    }
    out
}

/// Row `i` of a 16-row-group matrix (`cols` values, `data` its group blocks) back in GGML's row
/// encoding: the inverse of [`repack16`].
fn unpack16_row(qtype: QType, cols: usize, data: &[u8], i: usize, row_bytes: usize) -> Vec<u8> {
    let nb = cols / qtype.block_size();
    let (block, group_bytes) = group_sizes(qtype);
    let (g, l) = (i / GROUP, i % GROUP);
    let mut row = vec![0u8; row_bytes];
    let groups = &data[g * nb * group_bytes..(g + 1) * nb * group_bytes];
    for (gb, dst) in groups
        .chunks_exact(group_bytes)
        .zip(row.chunks_exact_mut(block))
    {
        for (s, d, len, xor) in pieces(qtype, l) {
            for t in 0..len {
                dst[s + t] = gb[d + t] ^ xor;
            }
        }
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// The 16-row layout is exercised by the kernels only on AVX-512 VNNI CPUs; its byte mapping
    /// is checked everywhere: every row of a repacked matrix (37 rows: a padded last group) comes
    /// back exactly, and a different row never does.
    #[test]
    fn rows_come_back_from_16_row_groups() {
        let mut rng = SplitMix64::new(3);
        let cases = [
            (QType::Q4_1, 96),
            (QType::Q8_0, 96),
            (QType::Q4_K, 512),
            (QType::Q5_K, 512),
            (QType::Q6_K, 512),
        ];
        for (qtype, cols) in cases {
            let rows = 37;
            let rb = qtype.try_row_bytes(cols).expect("k");
            let data: Vec<u8> = (0..rows * rb).map(|_| rng.next_u64() as u8).collect();
            let w = QMatrix::new(qtype, rows, cols, &data).expect("matrix");
            let packed = repack16(&w, rb);
            assert_eq!(packed.len(), 48 * rb, "{qtype:?}: three groups of 16 rows");
            for i in 0..rows {
                let row = unpack16_row(qtype, cols, &packed, i, rb);
                assert_eq!(row, &data[i * rb..(i + 1) * rb], "{qtype:?} row {i}");
            }
            assert_ne!(unpack16_row(qtype, cols, &packed, 1, rb), &data[..rb]);
        }
    }
}
