//! GGML block formats: weight types, activation types and their byte layouts.
//!
//! All quantized formats use blocks of [`QK`] = 32 values:
//! - `Q4_1` (ggml type 3), 20 bytes: f16 `d`, f16 `m`, 16 bytes `qs`; value `j` is
//!   `d · q_j + m` with `q_j = qs[j] & 0xF` for `j < 16` and `qs[j - 16] >> 4` for `j ≥ 16`.
//! - `Q8_0` (ggml type 8), 34 bytes: f16 `d`, 32 × i8 `qs`; value `j` is `d · qs[j]`.
//! - `Q8_1` (activations only), 36 bytes: f16 `d`, f16 `s = d · Σ qs`, 32 × i8 `qs`.
//!
//! All multi-byte fields are little-endian, as in GGUF files.
//!
//! [`Layout`] says how a matrix's blocks are stored: GGML rows as in the file, or groups of
//! [`GROUP`] = 16 rows interleaved per block for the AVX-512 VNNI kernels (the byte layout of a
//! group block is described in `x86::avx512`; `packed` builds it).
//!
//! This module is the bottom of the crate: every other module may use it, it uses only `error`.

use crate::error::KernelError;

/// Values per quantization block.
pub const QK: usize = 32;

/// Bytes per `Q4_1` block.
pub(crate) const Q4_1_BYTES: usize = 20;
/// Bytes per `Q8_0` block.
pub(crate) const Q8_0_BYTES: usize = 34;
/// Bytes per `Q8_1` block.
pub(crate) const Q8_1_BYTES: usize = 36;

/// Rows per group in [`Layout::Rows16`].
pub(crate) const GROUP: usize = 16;
/// Bytes of one block of 16 `Q4_1` rows: 16 `d`, 16 `m` (f16), 16 × 16 nibble bytes.
pub(crate) const Q4_1_GROUP_BYTES: usize = GROUP * Q4_1_BYTES;
/// Bytes of one block of 16 `Q8_0` rows: 16 `d` (f16), 16 × 32 quants.
pub(crate) const Q8_0_GROUP_BYTES: usize = GROUP * Q8_0_BYTES;

/// How a [`crate::PackedMatrix`] stores its weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// GGML rows, as in the GGUF file.
    Rows,
    /// Groups of 16 rows interleaved per block (AVX-512 VNNI).
    Rows16,
}

/// Weight storage formats the kernels multiply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QType {
    /// Plain little-endian `f32`.
    F32,
    /// 4-bit with per-block scale and minimum (ggml `Q4_1`).
    Q4_1,
    /// 8-bit with per-block scale (ggml `Q8_0`).
    Q8_0,
}

impl QType {
    /// Values per block (1 for `F32`).
    pub const fn block_size(self) -> usize {
        match self {
            Self::F32 => 1,
            Self::Q4_1 | Self::Q8_0 => QK,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Q4_1 => Q4_1_BYTES,
            Self::Q8_0 => Q8_0_BYTES,
        }
    }

    /// The activation format these weights are multiplied with.
    pub const fn act_type(self) -> ActType {
        match self {
            Self::F32 => ActType::F32,
            Self::Q4_1 => ActType::Q8_1,
            Self::Q8_0 => ActType::Q8_0,
        }
    }

    /// The `ggml_type` id used in GGUF files.
    pub const fn ggml_type_id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::Q4_1 => 3,
            Self::Q8_0 => 8,
        }
    }

    /// The format for a `ggml_type` id, if the kernels support it.
    pub const fn from_ggml_type_id(id: u32) -> Option<Self> {
        match id {
            0 => Some(Self::F32),
            3 => Some(Self::Q4_1),
            8 => Some(Self::Q8_0),
            _ => None,
        }
    }

    /// The format's name as ggml spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::Q4_1 => "Q4_1",
            Self::Q8_0 => "Q8_0",
        }
    }

    /// Bytes of one row of `k` values; errors if `k` is not a multiple of the block size.
    pub fn try_row_bytes(self, k: usize) -> Result<usize, KernelError> {
        row_bytes_of(self.name(), self.block_size(), self.type_size(), k)
    }
}

/// Bytes of one row of `k` values of `qtype`.
///
/// # Panics
/// If `k` is not a multiple of `qtype.block_size()`; use [`QType::try_row_bytes`] for a `Result`.
pub fn row_bytes(qtype: QType, k: usize) -> usize {
    match qtype.try_row_bytes(k) {
        Ok(n) => n,
        Err(e) => panic!("shoal_kernels::row_bytes: {e}"),
    }
}

/// Activation formats: what [`crate::Activations`] holds for each weight type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActType {
    /// Plain `f32` (for `F32` weights).
    F32,
    /// 8-bit with scale and scaled sum (for `Q4_1` weights).
    Q8_1,
    /// 8-bit with scale (for `Q8_0` weights).
    Q8_0,
}

impl ActType {
    /// Values per block (1 for `F32`).
    pub const fn block_size(self) -> usize {
        match self {
            Self::F32 => 1,
            Self::Q8_1 | Self::Q8_0 => QK,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Q8_1 => Q8_1_BYTES,
            Self::Q8_0 => Q8_0_BYTES,
        }
    }

    /// The format's name as ggml spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::Q8_1 => "Q8_1",
            Self::Q8_0 => "Q8_0",
        }
    }

    /// Bytes of one row of `k` values; errors if `k` is not a multiple of the block size.
    pub fn try_row_bytes(self, k: usize) -> Result<usize, KernelError> {
        row_bytes_of(self.name(), self.block_size(), self.type_size(), k)
    }
}

fn row_bytes_of(
    format: &'static str,
    block: usize,
    size: usize,
    k: usize,
) -> Result<usize, KernelError> {
    if !k.is_multiple_of(block) {
        return Err(KernelError::BadRowLength { format, k, block });
    }
    (k / block)
        .checked_mul(size)
        .ok_or(KernelError::Overflow { what: "a row" })
}

/// Reads the little-endian f16 at `b[at..at + 2]` as f32.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Writes `v` rounded to f16 (nearest, ties to even) at `b[at..at + 2]`.
#[inline(always)]
pub(crate) fn put_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
}
