//! GGML block formats: weight types, activation types and their byte layouts.
//!
//! The "legacy" quantized formats use blocks of [`QK`] = 32 values (values `j < 16` in the low
//! nibbles of `qs[j]`, values `j ≥ 16` in the high nibbles of `qs[j - 16]`):
//! - `Q4_0` (ggml type 2), 18 bytes: f16 `d`, 16 bytes `qs`; value = `d · (q - 8)`.
//! - `Q4_1` (3), 20 bytes: f16 `d`, f16 `m`, 16 bytes `qs`; value = `d · q + m`.
//! - `Q5_0` (6), 22 bytes: f16 `d`, u32 `qh`, 16 bytes `qs`; `q` gets bit 4 from bit `j` of `qh`;
//!   value = `d · (q - 16)`.
//! - `Q5_1` (7), 24 bytes: f16 `d`, f16 `m`, u32 `qh`, 16 bytes `qs`; value = `d · q + m`.
//! - `Q8_0` (8), 34 bytes: f16 `d`, 32 × i8 `qs`; value = `d · qs[j]`.
//!
//! The K-quants use super-blocks of [`QK_K`] = 256 values (a row's length must be a multiple of
//! 256), with sub-block scales quantized against the super-block's f16 `d` (and `dmin`):
//! - `Q4_K` (12), 144 bytes: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins for the eight
//!   32-value sub-blocks (see [`k4_scales`]), 128 bytes `qs`: 64 values per 32 bytes, sub-block
//!   `2i` in the low nibbles, `2i + 1` in the high nibbles; value = `d·sc·q - dmin·m`.
//! - `Q5_K` (13), 176 bytes: as `Q4_K` plus 32 bytes `qh` before `qs`: bit `i` of `qh[l]` is
//!   bit 4 of value `l` of sub-block `i`.
//! - `Q6_K` (14), 210 bytes: 128 bytes `ql`, 64 bytes `qh`, 16 × i8 scales (one per 16 values),
//!   f16 `d`. Each half of 128 values uses 64 bytes of `ql` and 32 of `qh`: value `l + 32t`
//!   (`t` = 0..4, `l` = 0..32) has low bits from nibble `t / 2` of `ql[l + 32 (t % 2)]` and high
//!   bits `(qh[l] >> 2t) & 3`; value = `d · sc · (q - 32)`.
//! - `Q3_K` (11), 110 bytes: 32 bytes `hmask`, 64 bytes `qs`, 12 bytes of 6-bit scales (see
//!   [`k3_scales`]), f16 `d`. Each half of 128 values uses 32 bytes of `qs`: value `l + 32t` has
//!   bits `(qs[l] >> 2t) & 3` and high bit `(hmask[l] >> (4h + t)) & 1` (half `h`); value =
//!   `d · (sc - 32) · (q - 4)` where `q` includes the high bit.
//! - `Q2_K` (10), 84 bytes: 16 bytes of 4-bit scale / 4-bit min pairs (one per 16 values), 64
//!   bytes `qs` (laid out as `Q3_K`'s low bits), f16 `d`, f16 `dmin`; value = `d·sc·q - dmin·m`.
//!
//! Plain formats: `F32`, `F16` (ggml type 1) and `BF16` (30, the top half of an f32).
//!
//! The non-linear and grid formats (layouts and their decoding in `iq`):
//! - 32-value blocks with `Q8_0` activations: `IQ4_NL` (20), 18 bytes: f16 `d`, 16 nibble bytes
//!   (as `Q4_0`) indexing a table of 16 values in -127..113; `MXFP4` (39), 17 bytes: an E8M0
//!   exponent byte `e` (scale `2^(e - 128)`), 16 nibble bytes indexing the doubled E2M1 values.
//! - 256-value super-blocks with `Q8_K` activations: `IQ4_XS` (23, 136 bytes: 6-bit scales per 32
//!   values, `IQ4_NL`'s table); the grid formats, whose values are rows of a fixed table of 8 (or
//!   4) magnitudes with sign bits: `IQ2_XXS` (16, 66 bytes), `IQ2_XS` (17, 74), `IQ2_S` (22, 82),
//!   `IQ3_XXS` (18, 98), `IQ3_S` (21, 110), `IQ1_S` (19, 50), `IQ1_M` (29, 56).
//!
//! Activation formats ([`ActType`], what a matmul quantizes its input to, as ggml pairs them):
//! - `Q8_0` (34-byte blocks: f16 `d`, 32 × i8) for `Q4_0`, `Q5_0` and `Q8_0` weights;
//! - `Q8_1` (36 bytes: f16 `d`, f16 `s = d·Σq`, 32 × i8) for `Q4_1` and `Q5_1`;
//! - `Q8_K` (292 bytes: f32 `d`, 256 × i8, 16 × i16 sums of 16 quants) for the K-quants;
//! - `F32` for `F32`, `F16` and `BF16` weights (plain values, no rounding of the input).
//!
//! All multi-byte fields are little-endian, as in GGUF files.
//!
//! [`Layout`] says how a matrix's blocks are stored: GGML rows as in the file, or groups of
//! [`GROUP`] = 16 rows interleaved per block for the AVX-512 VNNI kernels (`Q4_1` and `Q8_0`
//! only; the byte layout of a group block is described in `x86::avx512`; `packed` builds it).
//!
//! This module is the bottom of the crate: every other module may use it, it uses only `error`.

use crate::error::KernelError;

/// Values per legacy quantization block.
pub const QK: usize = 32;
/// Values per K-quant super-block.
pub const QK_K: usize = 256;

/// Bytes per `Q4_0` block.
pub(crate) const Q4_0_BYTES: usize = 18;
/// Bytes per `Q4_1` block.
pub(crate) const Q4_1_BYTES: usize = 20;
/// Bytes per `Q5_0` block.
pub(crate) const Q5_0_BYTES: usize = 22;
/// Bytes per `Q5_1` block.
pub(crate) const Q5_1_BYTES: usize = 24;
/// Bytes per `Q8_0` block.
pub(crate) const Q8_0_BYTES: usize = 34;
/// Bytes per `Q8_1` block.
pub(crate) const Q8_1_BYTES: usize = 36;
/// Bytes per `Q2_K` super-block.
pub(crate) const Q2_K_BYTES: usize = 84;
/// Bytes per `Q3_K` super-block.
pub(crate) const Q3_K_BYTES: usize = 110;
/// Bytes per `Q4_K` super-block.
pub(crate) const Q4_K_BYTES: usize = 144;
/// Bytes per `Q5_K` super-block.
pub(crate) const Q5_K_BYTES: usize = 176;
/// Bytes per `Q6_K` super-block.
pub(crate) const Q6_K_BYTES: usize = 210;
/// Bytes per block of the IQ formats and `MXFP4`.
pub(crate) const IQ4_NL_BYTES: usize = 18;
pub(crate) const MXFP4_BYTES: usize = 17;
pub(crate) const IQ4_XS_BYTES: usize = 136;
pub(crate) const IQ3_S_BYTES: usize = 110;
pub(crate) const IQ3_XXS_BYTES: usize = 98;
pub(crate) const IQ2_XXS_BYTES: usize = 66;
pub(crate) const IQ2_XS_BYTES: usize = 74;
pub(crate) const IQ2_S_BYTES: usize = 82;
pub(crate) const IQ1_S_BYTES: usize = 50;
pub(crate) const IQ1_M_BYTES: usize = 56;
/// Bytes per `Q8_K` block: f32 `d`, 256 × i8, 16 × i16.
pub(crate) const Q8_K_BYTES: usize = 292;

/// Rows per group in [`Layout::Rows16`].
pub(crate) const GROUP: usize = 16;
/// Bytes of one block of 16 `Q4_1` rows: 16 `d`, 16 `m` (f16), 16 × 16 nibble bytes.
pub(crate) const Q4_1_GROUP_BYTES: usize = GROUP * Q4_1_BYTES;
/// Bytes of one block of 16 `Q8_0` rows: 16 `d` (f16), 16 × 32 quants.
pub(crate) const Q8_0_GROUP_BYTES: usize = GROUP * Q8_0_BYTES;
/// Bytes of one super-block of 16 `Q4_K` rows: 16 `d`, 16 `dmin` (f16), 16 × 12 scale bytes,
/// 16 × 128 nibble bytes (layout in `x86::k512`).
pub(crate) const Q4_K_GROUP_BYTES: usize = GROUP * Q4_K_BYTES;
/// Bytes of one super-block of 16 `Q5_K` rows: as `Q4_K`'s plus 16 × 32 high-bit bytes.
pub(crate) const Q5_K_GROUP_BYTES: usize = GROUP * Q5_K_BYTES;
/// Bytes of one super-block of 16 `Q6_K` rows: 16 `d` (f16), 16 × 16 scales, 16 × 64 high-bit
/// bytes, 16 × 128 nibble bytes (layout in `x86::k6512`).
pub(crate) const Q6_K_GROUP_BYTES: usize = GROUP * Q6_K_BYTES;

/// How a [`crate::PackedMatrix`] stores its weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// GGML rows, as in the GGUF file.
    Rows,
    /// Groups of 16 rows interleaved per block (AVX-512 VNNI; `Q4_1`, `Q8_0`, `Q4_K`, `Q5_K`, `Q6_K`).
    Rows16,
}

/// Weight storage formats the kernels multiply.
#[allow(non_camel_case_types)] // ggml's names
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QType {
    /// Plain little-endian `f32`.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16 (the upper 16 bits of an `f32`).
    BF16,
    /// 4-bit with per-block scale, offset 8 (ggml `Q4_0`).
    Q4_0,
    /// 4-bit with per-block scale and minimum (ggml `Q4_1`).
    Q4_1,
    /// 5-bit with per-block scale, offset 16 (ggml `Q5_0`).
    Q5_0,
    /// 5-bit with per-block scale and minimum (ggml `Q5_1`).
    Q5_1,
    /// 8-bit with per-block scale (ggml `Q8_0`).
    Q8_0,
    /// 2-bit K-quant: 4-bit scales and mins per 16 values.
    Q2_K,
    /// 3-bit K-quant: 6-bit signed scales per 16 values.
    Q3_K,
    /// 4-bit K-quant: 6-bit scales and mins per 32 values.
    Q4_K,
    /// 5-bit K-quant: 6-bit scales and mins per 32 values.
    Q5_K,
    /// 6-bit K-quant: 8-bit signed scales per 16 values.
    Q6_K,
    /// 4-bit non-linear values with a per-block f16 scale (ggml `IQ4_NL`).
    IQ4_NL,
    /// 4-bit E2M1 values with a per-block power-of-two scale (OCP microscaling, ggml `MXFP4`).
    MXFP4,
    /// `IQ4_NL`'s values in 256-value super-blocks with 6-bit scales per 32.
    IQ4_XS,
    /// 3.44 bits per value: 4-value grid rows of 512, sign bits, 4-bit scales per 32.
    IQ3_S,
    /// 3.06 bits per value: 4-value grid rows of 256, sign indices, 4-bit scales per 32.
    IQ3_XXS,
    /// 2.06 bits per value: 8-value grid rows of 256, sign indices, 4-bit scales per 32.
    IQ2_XXS,
    /// 2.31 bits per value: 8-value grid rows of 512, sign indices, 4-bit scales per 16.
    IQ2_XS,
    /// 2.56 bits per value: 8-value grid rows of 1024, sign bits, 4-bit scales per 16.
    IQ2_S,
    /// 1.56 bits per value: 8-value ternary grid rows of 2048, 3-bit scales and a shift per 32.
    IQ1_S,
    /// 1.75 bits per value: as `IQ1_S` with 3-bit scales per 16 and a shift per 8.
    IQ1_M,
}

impl QType {
    /// The IQ formats and `MXFP4` (CPU kernels only; not in [`QType::ALL`]).
    pub const IQ: [QType; 10] = [
        Self::IQ4_NL,
        Self::MXFP4,
        Self::IQ4_XS,
        Self::IQ3_S,
        Self::IQ3_XXS,
        Self::IQ2_XXS,
        Self::IQ2_XS,
        Self::IQ2_S,
        Self::IQ1_S,
        Self::IQ1_M,
    ];

    /// The plain formats, the 32-value formats and the K-quants, in ggml type id order (the IQ
    /// formats are in [`QType::IQ`]).
    pub const ALL: [QType; 13] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::BF16,
    ];

    /// Values per block (1 for the plain formats, 256 for the K-quants).
    pub const fn block_size(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 => QK,
            Self::IQ4_NL | Self::MXFP4 => QK,
            Self::Q2_K | Self::Q3_K | Self::Q4_K | Self::Q5_K | Self::Q6_K => QK_K,
            Self::IQ4_XS | Self::IQ3_S | Self::IQ3_XXS => QK_K,
            Self::IQ2_XXS | Self::IQ2_XS | Self::IQ2_S | Self::IQ1_S | Self::IQ1_M => QK_K,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => Q4_0_BYTES,
            Self::Q4_1 => Q4_1_BYTES,
            Self::Q5_0 => Q5_0_BYTES,
            Self::Q5_1 => Q5_1_BYTES,
            Self::Q8_0 => Q8_0_BYTES,
            Self::Q2_K => Q2_K_BYTES,
            Self::Q3_K => Q3_K_BYTES,
            Self::Q4_K => Q4_K_BYTES,
            Self::Q5_K => Q5_K_BYTES,
            Self::Q6_K => Q6_K_BYTES,
            Self::IQ4_NL => IQ4_NL_BYTES,
            Self::MXFP4 => MXFP4_BYTES,
            Self::IQ4_XS => IQ4_XS_BYTES,
            Self::IQ3_S => IQ3_S_BYTES,
            Self::IQ3_XXS => IQ3_XXS_BYTES,
            Self::IQ2_XXS => IQ2_XXS_BYTES,
            Self::IQ2_XS => IQ2_XS_BYTES,
            Self::IQ2_S => IQ2_S_BYTES,
            Self::IQ1_S => IQ1_S_BYTES,
            Self::IQ1_M => IQ1_M_BYTES,
        }
    }

    /// The activation format these weights are multiplied with.
    pub const fn act_type(self) -> ActType {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => ActType::F32,
            Self::Q4_1 | Self::Q5_1 => ActType::Q8_1,
            Self::Q4_0 | Self::Q5_0 | Self::Q8_0 | Self::IQ4_NL | Self::MXFP4 => ActType::Q8_0,
            Self::Q2_K | Self::Q3_K | Self::Q4_K | Self::Q5_K | Self::Q6_K => ActType::Q8_K,
            Self::IQ4_XS | Self::IQ3_S | Self::IQ3_XXS | Self::IQ2_XXS | Self::IQ2_XS => {
                ActType::Q8_K
            }
            Self::IQ2_S | Self::IQ1_S | Self::IQ1_M => ActType::Q8_K,
        }
    }

    /// Whether this is one of the IQ formats or `MXFP4` ([`QType::IQ`]).
    pub const fn is_iq(self) -> bool {
        matches!(
            self,
            Self::IQ4_NL
                | Self::MXFP4
                | Self::IQ4_XS
                | Self::IQ3_S
                | Self::IQ3_XXS
                | Self::IQ2_XXS
                | Self::IQ2_XS
                | Self::IQ2_S
                | Self::IQ1_S
                | Self::IQ1_M
        )
    }

    /// Whether this format has 256-value super-blocks and `Q8_K` activations (the K-quants and
    /// the 256-value IQ formats).
    pub const fn is_k_quant(self) -> bool {
        matches!(self.act_type(), ActType::Q8_K)
    }

    /// The `ggml_type` id used in GGUF files.
    pub const fn ggml_type_id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::IQ2_XXS => 16,
            Self::IQ2_XS => 17,
            Self::IQ3_XXS => 18,
            Self::IQ1_S => 19,
            Self::IQ4_NL => 20,
            Self::IQ3_S => 21,
            Self::IQ2_S => 22,
            Self::IQ4_XS => 23,
            Self::IQ1_M => 29,
            Self::BF16 => 30,
            Self::MXFP4 => 39,
        }
    }

    /// The format for a `ggml_type` id, if the kernels support it.
    pub const fn from_ggml_type_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            10 => Self::Q2_K,
            11 => Self::Q3_K,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            16 => Self::IQ2_XXS,
            17 => Self::IQ2_XS,
            18 => Self::IQ3_XXS,
            19 => Self::IQ1_S,
            20 => Self::IQ4_NL,
            21 => Self::IQ3_S,
            22 => Self::IQ2_S,
            23 => Self::IQ4_XS,
            29 => Self::IQ1_M,
            30 => Self::BF16,
            39 => Self::MXFP4,
            _ => return None,
        })
    }

    /// The format's name as ggml spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q2_K => "Q2_K",
            Self::Q3_K => "Q3_K",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::IQ4_NL => "IQ4_NL",
            Self::MXFP4 => "MXFP4",
            Self::IQ4_XS => "IQ4_XS",
            Self::IQ3_S => "IQ3_S",
            Self::IQ3_XXS => "IQ3_XXS",
            Self::IQ2_XXS => "IQ2_XXS",
            Self::IQ2_XS => "IQ2_XS",
            Self::IQ2_S => "IQ2_S",
            Self::IQ1_S => "IQ1_S",
            Self::IQ1_M => "IQ1_M",
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
#[allow(non_camel_case_types)] // ggml's names
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActType {
    /// Plain `f32` (for `F32`, `F16` and `BF16` weights).
    F32,
    /// 8-bit with scale and scaled sum (for `Q4_1` and `Q5_1` weights).
    Q8_1,
    /// 8-bit with scale (for `Q4_0`, `Q5_0` and `Q8_0` weights).
    Q8_0,
    /// 8-bit with an f32 scale per 256 values and sums of 16 quants (for the K-quants).
    Q8_K,
}

impl ActType {
    /// Values per block (1 for `F32`).
    pub const fn block_size(self) -> usize {
        match self {
            Self::F32 => 1,
            Self::Q8_1 | Self::Q8_0 => QK,
            Self::Q8_K => QK_K,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Q8_1 => Q8_1_BYTES,
            Self::Q8_0 => Q8_0_BYTES,
            Self::Q8_K => Q8_K_BYTES,
        }
    }

    /// The format's name as ggml spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::Q8_1 => "Q8_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_K => "Q8_K",
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

/// The eight 6-bit scales and eight 6-bit mins of a `Q4_K` / `Q5_K` super-block from its 12
/// scale bytes, each as the bytes of a little-endian `u64` (byte `j` = sub-block `j`).
///
/// Bytes 0..4 hold scales 0..4 in their low 6 bits, bytes 4..8 mins 0..4; bytes 8..12 hold the
/// low 4 bits of scales 4..8 (low nibble) and mins 4..8 (high nibble), whose top 2 bits are the
/// top bits of bytes 0..4 (scales) and 4..8 (mins).
#[inline(always)]
pub(crate) fn k4_scales(s: &[u8; 12]) -> (u64, u64) {
    let a = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let b = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let c = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let lo6 = 0x3F3F_3F3F;
    let (lo4, hi2) = (0x0F0F_0F0F, 0x0303_0303);
    let sc_hi = (c & lo4) | (((a >> 6) & hi2) << 4);
    let m_hi = ((c >> 4) & lo4) | (((b >> 6) & hi2) << 4);
    let sc = u64::from(a & lo6) | (u64::from(sc_hi) << 32);
    let m = u64::from(b & lo6) | (u64::from(m_hi) << 32);
    (sc, m)
}

/// The sixteen 6-bit scales of a `Q3_K` super-block from its 12 scale bytes, as unsigned values
/// 0..64 (the format subtracts 32): byte `j < 8` holds the low 4 bits of scales `j` (low nibble)
/// and `j + 8` (high nibble); byte `8 + i` holds the top 2 bits of scales `i`, `i + 4`, `i + 8`,
/// `i + 12` (bits 0-1, 2-3, 4-5, 6-7).
#[inline(always)]
pub(crate) fn k3_scales(s: &[u8; 12]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = (s[j % 8] >> (4 * (j / 8))) & 0x0F;
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 0x03;
        *o = low | (high << 4);
    }
    out
}

/// The 12 scale bytes of a K-quant super-block starting at `at`.
#[inline(always)]
pub(crate) fn scale_bytes(b: &[u8], at: usize) -> &[u8; 12] {
    b[at..at + 12].try_into().expect("12 scale bytes")
}
