//! The IQ formats and `MXFP4` on the device: their lookup tables, uploaded once per device (by
//! `matrix`) from shoal-kernels' own ([`shoal_kernels::iq_tables`], one source of truth), and
//! their repacking.
//!
//! The tables live in one storage buffer of u32 words (binding 7 of the IQ kernels), in the order
//! of `tables()`: the 16 `IQ4_NL` and the 16 `MXFP4` values and the 128 `ksigns` bytes one per
//! word (table values as i32), the 8-value grids two words per row, the 4-value grids one word per
//! row. Each kernel's WGSL gets the tables' word offsets as constants ([`wgsl_offsets`]), generated
//! from the same list that fills the buffer.
//!
//! Repacking splits each block into two byte ranges of the GGUF block, nothing decoded and nothing
//! added ([`fields`]): the quants (u32-aligned, one buffer) and the scale entry (another buffer:
//! f16 `d` as f16 pairs, `MXFP4`'s E8M0 byte four blocks per u32, or two u32 for `IQ4_XS` and
//! `IQ1_M`), so a matrix takes on the device exactly its bytes in the file. What
//! `kernels/matvec_iq*.wgsl` read, per block or 256-value super-block:
//! - `IQ4_NL`: the 16 nibble bytes (as `Q4_0`); entry f16 `d`;
//! - `MXFP4`: the 16 nibble bytes; entry the E8M0 byte;
//! - `IQ4_XS`: the 128 nibble bytes (16 per 32 values, as `Q4_0`); entry the block's first 8 bytes:
//!   f16 `d`, u16 `scales_h` (2 high bits per 32 values), 4 bytes `scales_l` (a low nibble per 32);
//! - `IQ2_XXS`: the 64 `qs` bytes (per 32 values: 4 grid indices, a u32 of 4 × 7 sign bits and
//!   the 4-bit scale); entry f16 `d`;
//! - `IQ2_XS`: the 64 `qs` bytes (u16 per 8 values: 9-bit grid index, 7-bit sign index), then the
//!   8 scale bytes (72); entry f16 `d`;
//! - `IQ2_S`: 32 grid index bytes, 32 sign bytes, 8 `qh` bytes, 8 scale bytes (80); entry f16 `d`;
//! - `IQ3_XXS`: the 64 grid index bytes and the 8 u32 of signs and scales (96); entry f16 `d`;
//! - `IQ3_S`: 64 grid index bytes, 8 `qh` bytes, 32 sign bytes, 4 scale bytes (108); entry f16 `d`;
//! - `IQ1_S`: the 32 grid index bytes and 8 u16 `qh` (48); entry f16 `d`;
//! - `IQ1_M`: the 32 grid index bytes and 16 `qh` bytes (48); entry the 4 u16 scale words (3-bit
//!   scales, and f16 `d` in their top nibbles).

use std::fmt::Write as _;
use std::ops::Range;

use shoal_kernels::{QType, iq_tables};

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

/// Where a block's quants and its scale entry sit in the GGUF block of `qtype`.
fn fields(qtype: QType) -> (Range<usize>, Range<usize>) {
    match qtype {
        QType::IQ4_NL => (2..18, 0..2),
        QType::MXFP4 => (1..17, 0..1),
        QType::IQ4_XS => (8..136, 0..8),
        QType::IQ2_XXS => (2..66, 0..2),
        QType::IQ2_XS => (2..74, 0..2),
        QType::IQ2_S => (2..82, 0..2),
        QType::IQ3_XXS => (2..98, 0..2),
        QType::IQ3_S => (2..110, 0..2),
        QType::IQ1_S => (2..50, 0..2),
        QType::IQ1_M => (0..48, 48..56),
        other => unreachable!("{} is not an IQ format", other.name()),
    }
}

/// Appends one GGUF row of an IQ format (or `MXFP4`), repacked, to `weights` and `scales`.
pub(crate) fn repack_row(qtype: QType, row: &[u8], weights: &mut Vec<u8>, scales: &mut Vec<u8>) {
    let (quants, entry) = fields(qtype);
    for block in row.chunks_exact(qtype.type_size()) {
        weights.extend_from_slice(&block[quants.clone()]);
        scales.extend_from_slice(&block[entry.clone()]);
    }
}

/// Repacked bytes per row of `k` values: (weights, scales).
pub(crate) fn repacked_row_bytes(qtype: QType, k: usize) -> (u64, u64) {
    let blocks = (k / qtype.block_size()) as u64;
    let (quants, entry) = fields(qtype);
    (blocks * quants.len() as u64, blocks * entry.len() as u64)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Repacking keeps every byte of a block exactly once (so a matrix takes on the device its
    /// size in the file) and the quants of a block stay whole u32s.
    #[test]
    fn repacking_keeps_every_byte_of_a_block_once() {
        for qtype in QType::IQ {
            let (quants, entry) = fields(qtype);
            let mut seen = vec![0u8; qtype.type_size()];
            for i in quants.clone().chain(entry) {
                seen[i] += 1;
            }
            assert!(seen.iter().all(|&n| n == 1), "{}: {seen:?}", qtype.name());
            assert_eq!(quants.len() % 4, 0, "{}", qtype.name());
            let (w, s) = repacked_row_bytes(qtype, 512);
            assert_eq!(w + s, shoal_kernels::row_bytes(qtype, 512) as u64);
        }
    }
}
