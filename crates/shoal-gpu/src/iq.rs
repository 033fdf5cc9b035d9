//! The IQ formats and `MXFP4` on the device: their lookup tables, uploaded once per device (by
//! `matrix`) from shoal-kernels' own ([`shoal_kernels::iq_tables`], one source of truth), and their repacking.
//!
//! The tables live in one storage buffer of u32 words (binding 7 of the IQ kernels), in the order
//! of `tables()`: the 16 `IQ4_NL` and the 16 `MXFP4` values and the 128 `ksigns` bytes one per
//! word (table values as i32), the 8-value grids two words per row, the 4-value grids one word per
//! row. Each kernel's WGSL gets the tables' word offsets as constants ([`wgsl_offsets`]), generated
//! from the same list that fills the buffer.
//!
//! Layouts after repacking (what `kernels/matvec_iq*.wgsl` read; "entry" is a super-block's or
//! block's part of the scale buffer):
//! - `IQ4_NL`: the 16 nibble bytes of each block (as `Q4_0`); entry: f16 `d` (f16 pairs);
//! - `MXFP4`: the 16 nibble bytes; entry: the E8M0 byte (four blocks per u32);
//! - `IQ4_XS`: the 128 nibble bytes (16 per 32 values, as `Q4_0`); entry 3 u32: f16 `d`, two
//!   zero bytes, the eight 6-bit scales decoded at upload minus 32, as i8;
//! - `IQ2_XXS`: the 64 `qs` bytes (per 32 values: 4 grid indices, a u32 of 4 × 7 sign bits and
//!   the 4-bit scale); entry: f16 `d` (f16 pairs);
//! - `IQ2_XS`: the 64 `qs` bytes (u16 per 8 values: 9-bit grid index, 7-bit sign index); entry 3
//!   u32: f16 `d`, two zero bytes, the 8 bytes of 4-bit scales as in the file;
//! - `IQ2_S`: the 32 grid index bytes, 32 sign bytes and 8 `qh` bytes (72); entry as `IQ2_XS`;
//! - `IQ3_XXS`: the 64 grid index bytes and the 8 u32 of signs and scales (96); entry: f16 `d`;
//! - `IQ3_S`: the 64 grid index bytes, 8 `qh` bytes and 32 sign bytes (104); entry 2 u32: f16
//!   `d`, two zero bytes, the 4 scale bytes;
//! - `IQ1_S`: the 32 grid index bytes and 8 u16 `qh` (48); entry: f16 `d`;
//! - `IQ1_M`: the 32 grid index bytes and 16 `qh` bytes (48); entry 3 u32: f16 `d` (gathered at
//!   upload from the scale words' top nibbles), two zero bytes, the 4 u16 scale words.

use std::fmt::Write as _;

use shoal_kernels::{QK, QK_K, QType, iq_tables};

/// The WGSL name of each table and its words, in buffer order.
fn tables() -> Vec<(&'static str, Vec<u32>)> {
    let t = iq_tables();
    let signed = |v: &[i8]| v.iter().map(|&b| i32::from(b) as u32).collect();
    let rows64 = |v: &[u64]| {
        v.iter()
            .flat_map(|&r| [r as u32, (r >> 32) as u32])
            .collect()
    };
    vec![
        ("T_IQ4NL", signed(t.kvalues_iq4nl)),
        ("T_MXFP4", signed(t.kvalues_mxfp4)),
        ("T_KSIGNS", t.ksigns.iter().map(|&b| u32::from(b)).collect()),
        ("T_IQ2XXS", rows64(t.iq2xxs)),
        ("T_IQ2XS", rows64(t.iq2xs)),
        ("T_IQ2S", rows64(t.iq2s)),
        ("T_IQ3XXS", t.iq3xxs.to_vec()),
        ("T_IQ3S", t.iq3s.to_vec()),
        ("T_IQ1S", rows64(t.iq1s)),
    ]
}

/// `const T_<TABLE>: u32 = <word offset>u;` for every table, for the IQ kernels' WGSL.
pub(crate) fn wgsl_offsets() -> String {
    let mut out = String::from("// Word offsets of the IQ tables in `tables` (generated).\n");
    let mut at = 0usize;
    for (name, words) in tables() {
        let _ = writeln!(out, "const {name}: u32 = {at}u;");
        at += words.len();
    }
    out
}

/// The tables' words as bytes, in the order [`wgsl_offsets`] numbers them (uploaded once per
/// device by `matrix`).
pub(crate) fn table_bytes() -> Vec<u8> {
    tables()
        .into_iter()
        .flat_map(|(_, words)| words)
        .flat_map(u32::to_le_bytes)
        .collect()
}

/// The f16 `d` of an `IQ1_M` super-block from the top nibbles of its four scale words at 48.
fn iq1m_d(block: &[u8]) -> [u8; 2] {
    let s = |i: usize| u16::from_le_bytes([block[48 + 2 * i], block[49 + 2 * i]]);
    let bits = (s(0) >> 12) | ((s(1) >> 8) & 0x00F0) | ((s(2) >> 4) & 0x0F00) | (s(3) & 0xF000);
    bits.to_le_bytes()
}

/// The eight `IQ4_XS` scales of a super-block (6 bits: low nibbles at 4, high pairs at 2) minus 32.
fn iq4xs_scales(block: &[u8]) -> [u8; 8] {
    let sh = u16::from_le_bytes([block[2], block[3]]);
    std::array::from_fn(|ib| {
        let lo = (block[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let ls = lo | (((sh >> (2 * ib)) & 3) as u8) << 4;
        ls.wrapping_sub(32)
    })
}

/// Appends one GGUF row of an IQ format (or `MXFP4`), repacked, to `weights` and `scales`.
pub(crate) fn repack_row(qtype: QType, row: &[u8], weights: &mut Vec<u8>, scales: &mut Vec<u8>) {
    for block in row.chunks_exact(qtype.type_size()) {
        // (weight bytes of the block, the scale entry's bytes after `d`, where `d` has a padded entry)
        let (quants, extra): (&[u8], Option<&[u8]>) = match qtype {
            QType::IQ4_NL => (&block[2..18], None),
            QType::MXFP4 => {
                scales.push(block[0]);
                weights.extend_from_slice(&block[1..17]);
                continue;
            }
            QType::IQ4_XS => {
                scales.extend_from_slice(&block[..2]);
                scales.extend_from_slice(&[0, 0]);
                scales.extend_from_slice(&iq4xs_scales(block));
                weights.extend_from_slice(&block[8..136]);
                continue;
            }
            QType::IQ2_XXS => (&block[2..66], None),
            QType::IQ2_XS => (&block[2..66], Some(&block[66..74])),
            QType::IQ2_S => (&block[2..74], Some(&block[74..82])),
            QType::IQ3_XXS => (&block[2..98], None),
            QType::IQ3_S => (&block[2..106], Some(&block[106..110])),
            QType::IQ1_S => (&block[2..50], None),
            QType::IQ1_M => {
                scales.extend_from_slice(&iq1m_d(block));
                scales.extend_from_slice(&[0, 0]);
                scales.extend_from_slice(&block[48..56]);
                weights.extend_from_slice(&block[..48]);
                continue;
            }
            other => unreachable!("{} is not an IQ format", other.name()),
        };
        scales.extend_from_slice(&block[..2]);
        if let Some(extra) = extra {
            scales.extend_from_slice(&[0, 0]);
            scales.extend_from_slice(extra);
        }
        weights.extend_from_slice(quants);
    }
}

/// Repacked bytes per row of `k` values: (weights, scales).
pub(crate) fn repacked_row_bytes(qtype: QType, k: usize) -> (u64, u64) {
    let (nb, nk) = ((k / QK) as u64, (k / QK_K) as u64);
    match qtype {
        QType::IQ4_NL => (nb * 16, nb * 2),
        QType::MXFP4 => (nb * 16, nb),
        QType::IQ4_XS => (nk * 128, nk * 12),
        QType::IQ2_XXS => (nk * 64, nk * 2),
        QType::IQ2_XS => (nk * 64, nk * 12),
        QType::IQ2_S => (nk * 72, nk * 12),
        QType::IQ3_XXS => (nk * 96, nk * 2),
        QType::IQ3_S => (nk * 104, nk * 8),
        QType::IQ1_S => (nk * 48, nk * 2),
        QType::IQ1_M => (nk * 48, nk * 12),
        other => unreachable!("{} is not an IQ format", other.name()),
    }
}

/// The WGSL of one IQ format's weight bindings and decode (`kernels/matvec_<type>.wgsl`).
pub(crate) fn format_source(qtype: QType) -> &'static str {
    match qtype {
        QType::IQ4_NL => include_str!("kernels/matvec_iq4_nl.wgsl"),
        QType::MXFP4 => include_str!("kernels/matvec_mxfp4.wgsl"),
        QType::IQ4_XS => include_str!("kernels/matvec_iq4_xs.wgsl"),
        QType::IQ2_XXS => include_str!("kernels/matvec_iq2_xxs.wgsl"),
        QType::IQ2_XS => include_str!("kernels/matvec_iq2_xs.wgsl"),
        QType::IQ2_S => include_str!("kernels/matvec_iq2_s.wgsl"),
        QType::IQ3_XXS => include_str!("kernels/matvec_iq3_xxs.wgsl"),
        QType::IQ3_S => include_str!("kernels/matvec_iq3_s.wgsl"),
        QType::IQ1_S => include_str!("kernels/matvec_iq1_s.wgsl"),
        QType::IQ1_M => include_str!("kernels/matvec_iq1_m.wgsl"),
        other => unreachable!("{} is not an IQ format", other.name()),
    }
}
