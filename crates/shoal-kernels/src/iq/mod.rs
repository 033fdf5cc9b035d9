//! The IQ formats and `MXFP4`: their lookup tables ([`grids`]) and portable decoding.
//!
//! Every format here decodes to small signed integers times scales, so a dot product with 8-bit
//! activations is exact integer arithmetic plus one float multiply per block:
//! - `IQ4_NL`, `MXFP4` (32-value blocks, `Q8_0` activations) decode to a [`Block32`] (`d`, and
//!   the table value of each nibble) like the legacy formats, in `scalar::dequant::decode32`;
//!   `MXFP4`'s `d` is the E8M0 byte as a power of two ([`e8m0_half`]).
//! - The 256-value formats (`Q8_K` activations) decode to an [`IqBlock`]: value `i` is
//!   `d · sc[i / 16] · q[i]` with `q` in i8 and `sc` a small integer: `IQ4_XS` as `(ls - 32)` and
//!   the table value; the grid formats as `2·ls + 1` (their `(0.5 + ls)` doubled, the factor
//!   folded into `d`: `/8` for `IQ2_*`, `/4` for `IQ3_XXS`) and the signed grid byte; `IQ1_*` as
//!   `2·ls + 1` and `8·g ± 1` (the grid value `g` in -1..=1 plus its ±1/8 shift, times 8, so `d`
//!   carries `/8`).
//!
//! [`dequantize_block`] turns one super-block into floats with the same f32 operations, in the
//! same order, as the `gguf` Python package's `dequantize_blocks` (scales first, `dl · value`
//! after), so the values are bitwise the package's — sign of zero included.
//!
//! Layer: below the kernels (`scalar`, `x86` read [`decode`] and the tables); uses only `format`.

pub(crate) mod grids;

use crate::format::{QK_K, QType, f16_at};
use grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS, KVALUES_IQ4NL,
};

/// The lookup tables of the IQ formats and `MXFP4` as other back ends read them (shoal-gpu uploads
/// them to the device once): the very tables of [`grids`], so there is one source of truth.
#[derive(Debug, Clone, Copy)]
pub struct IqTables {
    /// `IQ4_NL` / `IQ4_XS`: the 16 non-linear 4-bit values.
    pub kvalues_iq4nl: &'static [i8; 16],
    /// `MXFP4`: the 16 E2M1 values doubled (the E8M0 scale taken as `2^(e - 128)`, its half).
    pub kvalues_mxfp4: &'static [i8; 16],
    /// `IQ2_XXS` / `IQ2_XS` / `IQ3_XXS`: 7 sign bits plus an even-parity 8th, per 7-bit index.
    pub ksigns: &'static [u8; 128],
    /// Grid rows, 8 unsigned byte values each, little-endian.
    pub iq2xxs: &'static [u64; 256],
    pub iq2xs: &'static [u64; 512],
    pub iq2s: &'static [u64; 1024],
    /// Grid rows, 4 unsigned byte values each, little-endian.
    pub iq3xxs: &'static [u32; 256],
    pub iq3s: &'static [u32; 512],
    /// `IQ1_S` / `IQ1_M` grid rows: 8 values in -1..=1, one i8 byte each.
    pub iq1s: &'static [u64; 2048],
}

/// The IQ lookup tables ([`IqTables`]).
pub fn iq_tables() -> IqTables {
    IqTables {
        kvalues_iq4nl: &KVALUES_IQ4NL,
        kvalues_mxfp4: &grids::KVALUES_MXFP4,
        ksigns: &KSIGNS,
        iq2xxs: &IQ2XXS_GRID,
        iq2xs: &IQ2XS_GRID,
        iq2s: &IQ2S_GRID,
        iq3xxs: &IQ3XXS_GRID,
        iq3s: &IQ3S_GRID,
        iq1s: &IQ1S_GRID,
    }
}

/// A decoded 256-value super-block: value `i` = `d · sc[i / 16] · q[i]`, exactly.
pub(crate) struct IqBlock {
    pub(crate) q: [i8; QK_K],
    pub(crate) sc: [i16; 16],
    pub(crate) d: f32,
}

/// The `MXFP4` scale of E8M0 byte `e`: `2^(e - 128)` (half the E8M0 value, since the table holds
/// doubled E2M1 values), built from bits as ggml's `ggml_e8m0_to_fp32_half` (subnormal below
/// `e = 2`).
#[inline(always)]
pub(crate) const fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e - 1) as u32) << 23
    };
    f32::from_bits(bits)
}

#[inline(always)]
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Byte `j` of a packed grid row.
#[inline(always)]
fn byte(row: u64, j: usize) -> u8 {
    (row >> (8 * j)) as u8
}

/// One value of a grid super-block: the magnitude (or IQ1 grid value), its sign and the index of
/// its scale, visited in order; `f(i, g, neg, s)`.
///
/// For the grid formats `s` is the raw 4-bit (IQ2, IQ3) or 3-bit (IQ1) scale, the value being
/// `d · (0.5 + s) · factor · g` (IQ2, IQ3_XXS), `d · (1 + 2s) · g` (IQ3_S) or
/// `d · (2s + 1) · (g ± 1/8)` (IQ1, `neg` giving the shift's sign); `IQ4_XS` passes the table
/// value as `g` and `ls` as `s`.
fn visit(qtype: QType, wb: &[u8], mut f: impl FnMut(usize, i32, bool, i32)) {
    match qtype {
        QType::IQ4_XS => {
            let sh = u16_at(wb, 2);
            for ib in 0..8 {
                let lo = (wb[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
                let ls = i32::from(lo) | ((i32::from(sh >> (2 * ib)) & 3) << 4);
                let qs = &wb[8 + 16 * ib..24 + 16 * ib];
                for j in 0..32 {
                    let nib = (qs[j % 16] >> (4 * (j / 16))) & 0x0F;
                    f(
                        32 * ib + j,
                        i32::from(KVALUES_IQ4NL[nib as usize]),
                        false,
                        ls,
                    );
                }
            }
        }
        QType::IQ2_XXS => {
            for ib in 0..8 {
                let (aux0, aux1) = (u32_at(wb, 2 + 8 * ib), u32_at(wb, 6 + 8 * ib));
                let ls = (aux1 >> 28) as i32;
                for l in 0..4 {
                    let row = IQ2XXS_GRID[((aux0 >> (8 * l)) & 0xFF) as usize];
                    let signs = KSIGNS[((aux1 >> (7 * l)) & 127) as usize];
                    for j in 0..8 {
                        let neg = (signs >> j) & 1 == 1;
                        f(32 * ib + 8 * l + j, i32::from(byte(row, j)), neg, ls);
                    }
                }
            }
        }
        QType::IQ2_XS => {
            for g8 in 0..32 {
                let q = u16_at(wb, 2 + 2 * g8);
                let row = IQ2XS_GRID[usize::from(q & 511)];
                let signs = KSIGNS[usize::from(q >> 9)];
                let ls = i32::from((wb[66 + g8 / 4] >> (4 * ((g8 / 2) % 2))) & 0x0F);
                for j in 0..8 {
                    let neg = (signs >> j) & 1 == 1;
                    f(8 * g8 + j, i32::from(byte(row, j)), neg, ls);
                }
            }
        }
        QType::IQ2_S => {
            for g8 in 0..32 {
                let high = (usize::from(wb[66 + g8 / 4]) >> (2 * (g8 % 4))) & 3;
                let row = IQ2S_GRID[usize::from(wb[2 + g8]) | (high << 8)];
                let signs = wb[34 + g8];
                let ls = i32::from((wb[74 + g8 / 4] >> (4 * ((g8 / 2) % 2))) & 0x0F);
                for j in 0..8 {
                    let neg = (signs >> j) & 1 == 1;
                    f(8 * g8 + j, i32::from(byte(row, j)), neg, ls);
                }
            }
        }
        QType::IQ3_XXS => {
            for ib in 0..8 {
                let aux = u32_at(wb, 66 + 4 * ib);
                let ls = (aux >> 28) as i32;
                for l in 0..4 {
                    let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
                    for j in 0..8 {
                        let row = IQ3XXS_GRID[usize::from(wb[2 + 8 * ib + 2 * l + j / 4])];
                        let g = i32::from((row >> (8 * (j % 4))) as u8);
                        f(32 * ib + 8 * l + j, g, (signs >> j) & 1 == 1, ls);
                    }
                }
            }
        }
        QType::IQ3_S => {
            for i in 0..QK_K {
                let (g4, ib) = (i / 4, i / 32);
                let high = (usize::from(wb[66 + ib]) >> (g4 % 8)) & 1;
                let row = IQ3S_GRID[usize::from(wb[2 + g4]) | (high << 8)];
                let g = i32::from((row >> (8 * (i % 4))) as u8);
                let neg = (wb[74 + i / 8] >> (i % 8)) & 1 == 1;
                let ls = i32::from((wb[106 + ib / 2] >> (4 * (ib % 2))) & 0x0F);
                f(i, g, neg, ls);
            }
        }
        QType::IQ1_S => {
            for ib in 0..8 {
                let qh = u16_at(wb, 34 + 2 * ib);
                let ls = i32::from((qh >> 12) & 7);
                for l in 0..4 {
                    let high = (usize::from(qh) >> (3 * l)) & 7;
                    let row = IQ1S_GRID[usize::from(wb[2 + 4 * ib + l]) | (high << 8)];
                    for j in 0..8 {
                        let g = i32::from(byte(row, j) as i8);
                        f(32 * ib + 8 * l + j, g, qh & 0x8000 != 0, ls);
                    }
                }
            }
        }
        QType::IQ1_M => {
            let sc = [0, 1, 2, 3].map(|i| u16_at(wb, 48 + 2 * i));
            for g8 in 0..32 {
                let nib = usize::from(wb[32 + g8 / 2] >> (4 * (g8 % 2)));
                let row = IQ1S_GRID[usize::from(wb[g8]) | ((nib & 7) << 8)];
                let ls = i32::from((sc[g8 / 8] >> (3 * ((g8 / 2) % 4))) & 7);
                for j in 0..8 {
                    let g = i32::from(byte(row, j) as i8);
                    f(8 * g8 + j, g, nib & 8 != 0, ls);
                }
            }
        }
        _ => unreachable!("iq: {} is not a 256-value IQ format", qtype.name()),
    }
}

/// The f16 `d` of an `IQ1_M` super-block, spread over the top nibbles of its four scale words.
fn iq1m_d(wb: &[u8]) -> f32 {
    let s = [0, 1, 2, 3].map(|i| u16_at(wb, 48 + 2 * i));
    let bits = (s[0] >> 12) | ((s[1] >> 8) & 0x00F0) | ((s[2] >> 4) & 0x0F00) | (s[3] & 0xF000);
    half::f16::from_bits(bits).to_f32()
}

/// Decodes one 256-value IQ super-block (`wb` holds exactly one) into integers.
pub(crate) fn decode(qtype: QType, wb: &[u8]) -> IqBlock {
    let mut blk = IqBlock {
        q: [0; QK_K],
        sc: [0; 16],
        d: 0.0,
    };
    let (d, factor) = match qtype {
        QType::IQ4_XS | QType::IQ3_S => (f16_at(wb, 0), 1.0),
        QType::IQ3_XXS => (f16_at(wb, 0), 0.25),
        QType::IQ1_M => (iq1m_d(wb), 0.125),
        _ => (f16_at(wb, 0), 0.125),
    };
    blk.d = d * factor; // a power of two: exact
    visit(qtype, wb, |i, g, neg, ls| {
        let (q, s) = match qtype {
            QType::IQ4_XS => (g, ls - 32),
            QType::IQ1_S | QType::IQ1_M => (8 * g + if neg { -1 } else { 1 }, 2 * ls + 1),
            _ => (if neg { -g } else { g }, 2 * ls + 1),
        };
        blk.q[i] = q as i8;
        blk.sc[i / 16] = s as i16;
    });
    blk
}

/// Dequantizes one 256-value IQ super-block into `out` (256 values), bitwise as the `gguf`
/// package: the scale `dl` first (as the package computes it), then `dl · g`, negated for a set
/// sign bit (`(dl · g) · -1` there), or `dl · (g ± 0.125)` for `IQ1_*`.
pub(crate) fn dequantize_block(qtype: QType, wb: &[u8], out: &mut [f32]) {
    let d = if qtype == QType::IQ1_M {
        iq1m_d(wb)
    } else {
        f16_at(wb, 0)
    };
    visit(qtype, wb, |i, g, neg, ls| {
        let gf = g as f32;
        out[i] = match qtype {
            QType::IQ4_XS => d * (ls - 32) as f32 * gf,
            QType::IQ3_S => {
                let v = d * (1 + 2 * ls) as f32 * gf;
                if neg { -v } else { v }
            }
            QType::IQ1_S | QType::IQ1_M => {
                let delta = if neg { -0.125f32 } else { 0.125 };
                d * (2 * ls + 1) as f32 * (gf + delta)
            }
            _ => {
                let half = if qtype == QType::IQ3_XXS { 0.5 } else { 0.25 };
                let v = d * (0.5 + ls as f32) * half * gf;
                if neg { -v } else { v }
            }
        };
    });
}
