//! Weight matrices on the device: [`GpuMatrix`], repacked at upload from GGUF rows.
//!
//! Layouts (what the kernels in `kernels/matvec_*.wgsl` read):
//! - `F32`: rows of `ceil(k / 4)` vec4s, zero-padded;
//! - `F16` / `BF16`: rows of `ceil(k / 4)` groups of four halves, zero-padded (`F16` read with
//!   `unpack2x16float`, `BF16` as the top halves of f32s);
//! - `Q8_0`: each block's 32 quants as 32 bytes (u32-aligned) in one buffer, its f16 scale in a
//!   second buffer of f16 pairs;
//! - `Q4_0`: each block's 16 nibble bytes in ggml's order (u32-aligned), scales as for `Q8_0`;
//! - `Q4_1`: nibbles as for `Q4_0`; the scale buffer holds each block's f16 `d` and `m` as one u32;
//! - `Q5_0` / `Q5_1`: per block 20 bytes, the 16 nibble bytes then the u32 `qh` of fifth bits;
//!   scales as for `Q4_0` / `Q4_1`;
//! - `Q4_K`: each super-block's 128 nibble bytes; its scale entry is 5 u32: f16 `d` and `dmin`,
//!   then the eight 6-bit sub-block scales and the eight mins decoded at upload, one byte each;
//! - `Q6_K`: each super-block's 128 `ql` and 64 `qh` bytes; its scale entry is 5 u32: the 16 i8
//!   scales, then f16 `d` (and two zero bytes).
//! - `Q5_K`: each super-block's 128 nibble bytes then its 32 `qh` bytes; scales as for `Q4_K`;
//! - `Q3_K`: each super-block's 64 `qs` bytes then its 32 `hmask` bytes; its scale entry is 5
//!   u32 as for `Q6_K`: the sixteen 6-bit scales decoded at upload (minus 32, as i8), then f16 `d`;
//! - `Q2_K`: each super-block's 64 `qs` bytes; its scale entry is 5 u32: f16 `d` and `dmin`,
//!   then the 16 bytes of 4-bit scale (low nibble) and min (high nibble) as in the file;
//! - the IQ formats and `MXFP4`: see `iq` (their lookup tables are one more buffer per device).
//!
//! A matrix larger than the device's largest storage binding is split by rows into chunks, each
//! with its own buffers and dispatch; one row larger than a binding is refused
//! ([`GpuError::TooLarge`]).

use shoal_kernels::{QK, QK_K, QMatrix, QType};
use wgpu::util::DeviceExt;

use crate::iq;
use crate::pipelines::Kernel;
use crate::{Gpu, GpuError};

/// One chunk of rows and its buffers.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) rows: u32,
    pub(crate) weights: wgpu::Buffer,
    pub(crate) scales: Option<wgpu::Buffer>,
    /// The kernel's `Params` (rows, padded k, first row): fixed at upload.
    pub(crate) params: wgpu::Buffer,
}

/// A `rows × cols` weight matrix on the device, in the layout its kernel reads; or a
/// mixture-of-experts layer's `experts` stacked matrices of `rows / experts` rows each
/// ([`Gpu::upload_experts`], chunked only at expert boundaries).
#[derive(Debug)]
pub struct GpuMatrix {
    qtype: QType,
    rows: usize,
    cols: usize,
    experts: usize,
    pub(crate) chunks: Vec<Chunk>,
}

impl GpuMatrix {
    pub fn qtype(&self) -> QType {
        self.qtype
    }

    /// Output features (`n`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (`k`).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Stacked matrices (1 for an ordinary matrix).
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// How many row chunks (one per storage binding) the matrix was split into.
    pub fn chunks(&self) -> usize {
        self.chunks.len()
    }

    pub(crate) fn kernel(&self) -> Kernel {
        Kernel::Matvec(self.qtype)
    }
}

/// Where a format's fields sit in its GGUF block: (scale bytes kept together as the block's
/// entry in the scale buffer, the `qh` bytes, the `qs` bytes), for the 32-value formats.
fn legacy_fields(qtype: QType) -> (std::ops::Range<usize>, std::ops::Range<usize>, usize) {
    match qtype {
        QType::Q8_0 | QType::Q4_0 => (0..2, 2..2, 2),
        QType::Q4_1 => (0..4, 4..4, 4),
        QType::Q5_0 => (0..2, 2..6, 6),
        QType::Q5_1 => (0..4, 4..8, 8),
        _ => unreachable!("not a 32-value format"),
    }
}

/// The eight 6-bit scales and eight 6-bit mins of a `Q4_K` super-block's 12 scale bytes
/// (ggml's `get_scale_min_k4`).
fn q4k_scales_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        (sc[j], m[j]) = if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            (
                (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
                (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
            )
        };
    }
    (sc, m)
}

/// The sixteen 6-bit scales of a `Q3_K` super-block's 12 scale bytes, unsigned (0..64; the
/// format subtracts 32): as shoal-kernels' `k3_scales`.
fn q3k_scales(s: &[u8]) -> [u8; 16] {
    std::array::from_fn(|j| {
        ((s[j % 8] >> (4 * (j / 8))) & 0x0F) | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)
    })
}

/// One GGUF row repacked: (weight bytes, scale bytes) appended to the two outputs.
fn repack_row(qtype: QType, row: &[u8], k: usize, weights: &mut Vec<u8>, scales: &mut Vec<u8>) {
    let blocks = row.chunks_exact(qtype.type_size());
    match qtype {
        QType::F32 | QType::F16 | QType::BF16 => {
            weights.extend_from_slice(row);
            let elem = qtype.type_size();
            weights.resize(weights.len() + (k.div_ceil(4) * 4 - k) * elem, 0);
        }
        QType::Q8_0 | QType::Q4_0 | QType::Q4_1 | QType::Q5_0 | QType::Q5_1 => {
            let (sc, qh, qs) = legacy_fields(qtype);
            for block in blocks {
                scales.extend_from_slice(&block[sc.clone()]);
                weights.extend_from_slice(&block[qs..]);
                weights.extend_from_slice(&block[qh.clone()]);
            }
        }
        QType::Q4_K | QType::Q5_K => {
            for block in blocks {
                let (sc, m) = q4k_scales_mins(&block[4..16]);
                scales.extend_from_slice(&block[..4]);
                scales.extend_from_slice(&sc);
                scales.extend_from_slice(&m);
                if qtype == QType::Q4_K {
                    weights.extend_from_slice(&block[16..144]);
                } else {
                    weights.extend_from_slice(&block[48..176]);
                    weights.extend_from_slice(&block[16..48]);
                }
            }
        }
        QType::Q3_K => {
            for block in blocks {
                scales.extend(q3k_scales(&block[96..108]).map(|s| s.wrapping_sub(32)));
                scales.extend_from_slice(&block[108..110]);
                scales.extend_from_slice(&[0, 0]);
                weights.extend_from_slice(&block[32..96]);
                weights.extend_from_slice(&block[..32]);
            }
        }
        QType::Q2_K => {
            for block in blocks {
                scales.extend_from_slice(&block[80..84]);
                scales.extend_from_slice(&block[..16]);
                weights.extend_from_slice(&block[16..80]);
            }
        }
        QType::Q6_K => {
            for block in blocks {
                scales.extend_from_slice(&block[192..208]);
                scales.extend_from_slice(&block[208..210]);
                scales.extend_from_slice(&[0, 0]);
                weights.extend_from_slice(&block[..192]);
            }
        }
        iq => iq::repack_row(iq, row, weights, scales),
    }
}

/// Repacked bytes per row: (weights, scales).
fn repacked_row_bytes(qtype: QType, k: usize) -> (u64, u64) {
    let (k4, nb, nk) = (k.div_ceil(4) as u64, (k / QK) as u64, (k / QK_K) as u64);
    match qtype {
        QType::F32 => (k4 * 16, 0),
        QType::F16 | QType::BF16 => (k4 * 8, 0),
        QType::Q8_0 => (nb * 32, nb * 2),
        QType::Q4_0 => (nb * 16, nb * 2),
        QType::Q4_1 => (nb * 16, nb * 4),
        QType::Q5_0 => (nb * 20, nb * 2),
        QType::Q5_1 => (nb * 20, nb * 4),
        QType::Q4_K => (nk * 128, nk * 20),
        QType::Q6_K => (nk * 192, nk * 20),
        QType::Q5_K => (nk * 160, nk * 20),
        QType::Q3_K => (nk * 96, nk * 20),
        QType::Q2_K => (nk * 64, nk * 20),
        iq => iq::repacked_row_bytes(iq, k),
    }
}

/// The `Params` uniform of the matrix-vector kernels.
fn params_bytes(rows: u32, k: u32, row_offset: u32) -> Vec<u8> {
    [rows, k, row_offset, 0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

impl Gpu {
    /// The IQ formats' lookup tables on this device (see `iq`), uploaded on first use.
    pub(crate) fn iq_tables(&self) -> Result<&wgpu::Buffer, GpuError> {
        if let Some(b) = self.iq_tables.get() {
            return Ok(b);
        }
        let buffer = self.checked(|| {
            self.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("shoal iq tables"),
                    contents: &iq::table_bytes(),
                    usage: wgpu::BufferUsages::STORAGE,
                })
        })?;
        Ok(self.iq_tables.get_or_init(|| buffer))
    }

    /// Uploads a GGUF weight matrix of any format shoal-kernels reads, repacked for its kernels
    /// and split by rows where it exceeds the largest storage binding (an IQ or `MXFP4` matrix
    /// also uploads the IQ lookup tables, once per device).
    pub fn upload_matrix(&self, w: &QMatrix<'_>) -> Result<GpuMatrix, GpuError> {
        self.upload_stacked(w, 1)
    }

    /// Uploads a GGUF 3-D expert tensor (`[experts, rows, cols]`, given as one `experts·rows × cols`
    /// matrix) for [`crate::Commands::matvec_id`], as [`Gpu::upload_matrix`] but split into chunks
    /// only between experts (one expert above a storage binding is refused).
    pub fn upload_experts(&self, w: &QMatrix<'_>, experts: usize) -> Result<GpuMatrix, GpuError> {
        if experts == 0 || !w.rows.is_multiple_of(experts) {
            return Err(GpuError::Shape(format!(
                "{} rows are not {experts} experts",
                w.rows
            )));
        }
        self.upload_stacked(w, experts)
    }

    fn upload_stacked(&self, w: &QMatrix<'_>, experts: usize) -> Result<GpuMatrix, GpuError> {
        let row_bytes = w.row_bytes()?;
        if w.qtype.is_iq() {
            self.iq_tables()?;
        }
        let k = w.cols;
        let k_padded = if w.qtype.block_size() == 1 {
            k.div_ceil(4) * 4
        } else {
            k
        };
        let k_u32 = u32::try_from(k_padded)
            .map_err(|_| GpuError::Shape(format!("{k} columns do not fit a u32")))?;
        let rows_u32 = u32::try_from(w.rows)
            .map_err(|_| GpuError::Shape(format!("{} rows do not fit a u32", w.rows)))?;
        let (wrow, srow) = repacked_row_bytes(w.qtype, k);
        // Scale buffers are f16 pairs: one spare half of room for an odd count.
        let fits =
            |rows: u64| rows * wrow <= self.max_binding && rows * srow + 2 <= self.max_binding;
        if !fits(1) {
            return Err(GpuError::TooLarge {
                what: "one weight row",
                bytes: wrow.max(srow + 2),
                limit: self.max_binding,
            });
        }
        let group = (w.rows / experts) as u64;
        let per_chunk = {
            let by_w = self.max_binding / wrow.max(1);
            let by_s = (self.max_binding - 2).checked_div(srow).unwrap_or(u64::MAX);
            let rows = by_w.min(by_s).min(u64::from(rows_u32.max(1)));
            if experts > 1 && rows < group {
                return Err(GpuError::TooLarge {
                    what: "one expert",
                    bytes: group * wrow.max(srow + 2),
                    limit: self.max_binding,
                });
            }
            match experts {
                1 => rows as u32,
                _ => (rows / group * group) as u32,
            }
        };
        let mut chunks = Vec::new();
        let mut first = 0u32;
        while first < rows_u32 {
            let rows = per_chunk.min(rows_u32 - first);
            let (mut weights, mut scales) = (Vec::new(), Vec::new());
            for r in first..first + rows {
                let start = r as usize * row_bytes;
                let row = &w.data[start..start + row_bytes];
                repack_row(w.qtype, row, k, &mut weights, &mut scales);
            }
            scales.resize(scales.len().div_ceil(4) * 4, 0);
            let chunk = self.checked(|| {
                let storage = |label, contents: &[u8]| {
                    self.device
                        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                            label: Some(label),
                            contents,
                            usage: wgpu::BufferUsages::STORAGE,
                        })
                };
                Chunk {
                    rows,
                    weights: storage("shoal weights", &weights),
                    scales: (srow > 0).then(|| storage("shoal scales", &scales)),
                    params: self
                        .device
                        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                            label: Some("shoal matvec params"),
                            contents: &params_bytes(rows, k_u32, first),
                            usage: wgpu::BufferUsages::UNIFORM,
                        }),
                }
            })?;
            chunks.push(chunk);
            first += rows;
        }
        Ok(GpuMatrix {
            qtype: w.qtype,
            rows: w.rows,
            cols: w.cols,
            experts,
            chunks,
        })
    }
}
