//! Decoding every weight format: one decoder per format that yields a block's integer quants and
//! scales (shared with the scalar dot products), and the dequantizers built on them.
//!
//! Dequantized values are bitwise those of ggml's `dequantize_row_*` (and of the `gguf` Python
//! package): each value is computed with the same f32 operations in the same order — `d · q` for
//! the formats without a minimum (no `+ 0`, which would turn a `-0` into `+0`), `d · q + m` for
//! `Q4_1`/`Q5_1`, `(d · sc) · q - dmin · m` for the K-quants with minimums.

use crate::format::{
    Q4_1_BYTES, Q8_0_BYTES, Q8_1_BYTES, Q8_K_BYTES, QK, QK_K, QType, f16_at, k3_scales, k4_scales,
    scale_bytes,
};

use super::{check, check_blocks};
use crate::iq::{
    self, e8m0_half,
    grids::{KVALUES_IQ4NL, KVALUES_MXFP4},
};

/// A 32-value block of a legacy format: `value = d · q (+ m)`.
pub(crate) struct Block32 {
    pub(crate) q: [i32; QK],
    pub(crate) d: f32,
    /// The block minimum (`Q4_1`, `Q5_1`), `None` for the symmetric formats.
    pub(crate) m: Option<f32>,
}

/// The 32 5th bits of a `Q5_0`/`Q5_1` block (bit `j` of `qh` for value `j`), as 0 or 16.
fn high_bits(qh: &[u8]) -> impl Fn(usize) -> i32 + '_ {
    move |j| i32::from((qh[j / 8] >> (j % 8)) & 1) << 4
}

/// Decodes one block of a legacy 32-value format (`wb` holds exactly one block).
pub(crate) fn decode32(qtype: QType, wb: &[u8]) -> Block32 {
    let mut q = [0i32; QK];
    let d = f16_at(wb, 0);
    let nibbles = |q: &mut [i32; QK], qs: &[u8]| {
        for j in 0..QK / 2 {
            q[j] = i32::from(qs[j] & 0x0F);
            q[j + QK / 2] = i32::from(qs[j] >> 4);
        }
    };
    let m = match qtype {
        QType::Q4_0 => {
            nibbles(&mut q, &wb[2..18]);
            q.iter_mut().for_each(|v| *v -= 8);
            None
        }
        QType::Q4_1 => {
            nibbles(&mut q, &wb[4..20]);
            Some(f16_at(wb, 2))
        }
        QType::Q5_0 => {
            nibbles(&mut q, &wb[6..22]);
            let hb = high_bits(&wb[2..6]);
            q.iter_mut().enumerate().for_each(|(j, v)| *v += hb(j) - 16);
            None
        }
        QType::Q5_1 => {
            nibbles(&mut q, &wb[8..24]);
            let hb = high_bits(&wb[4..8]);
            q.iter_mut().enumerate().for_each(|(j, v)| *v += hb(j));
            Some(f16_at(wb, 2))
        }
        QType::Q8_0 => {
            q.iter_mut()
                .zip(&wb[2..34])
                .for_each(|(v, &b)| *v = i32::from(b as i8));
            None
        }
        QType::IQ4_NL => {
            nibbles(&mut q, &wb[2..18]);
            q.iter_mut()
                .for_each(|v| *v = i32::from(KVALUES_IQ4NL[*v as usize]));
            None
        }
        QType::MXFP4 => {
            nibbles(&mut q, &wb[1..17]);
            q.iter_mut()
                .for_each(|v| *v = i32::from(KVALUES_MXFP4[*v as usize]));
            return Block32 {
                q,
                d: e8m0_half(wb[0]),
                m: None,
            };
        }
        _ => unreachable!("decode32: {} is not a 32-value format", qtype.name()),
    };
    Block32 { q, d, m }
}

/// A 256-value K-quant super-block: `value = (d · sc) · q - dmin · m` per 16 values.
pub(crate) struct BlockK {
    /// Signed quants (the format's offset already subtracted).
    pub(crate) q: [i32; QK_K],
    /// Scale per 16 values.
    pub(crate) sc: [i32; 16],
    /// Minimum per 16 values (all 0 for `Q3_K`, `Q6_K`).
    pub(crate) m: [i32; 16],
    pub(crate) d: f32,
    /// `Some(dmin)` for the formats with minimums (`Q2_K`, `Q4_K`, `Q5_K`).
    pub(crate) dmin: Option<f32>,
}

/// Decodes one K-quant super-block (`wb` holds exactly one).
pub(crate) fn decode_k(qtype: QType, wb: &[u8]) -> BlockK {
    let mut k = BlockK {
        q: [0; QK_K],
        sc: [0; 16],
        m: [0; 16],
        d: 0.0,
        dmin: None,
    };
    match qtype {
        QType::Q4_K | QType::Q5_K => {
            let (sc, m) = k4_scales(scale_bytes(wb, 4));
            let (sc, m) = (sc.to_le_bytes(), m.to_le_bytes());
            for g in 0..16 {
                (k.sc[g], k.m[g]) = (i32::from(sc[g / 2]), i32::from(m[g / 2]));
            }
            (k.d, k.dmin) = (f16_at(wb, 0), Some(f16_at(wb, 2)));
            let qs = if qtype == QType::Q4_K {
                &wb[16..144]
            } else {
                &wb[48..176]
            };
            for (i, v) in k.q.iter_mut().enumerate() {
                let (sub, l) = (i / 32, i % 32);
                *v = i32::from((qs[32 * (sub / 2) + l] >> (4 * (sub % 2))) & 0x0F);
                if qtype == QType::Q5_K {
                    *v |= i32::from((wb[16 + l] >> sub) & 1) << 4;
                }
            }
        }
        QType::Q6_K => {
            let (ql, qh) = (&wb[..128], &wb[128..192]);
            for (g, s) in k.sc.iter_mut().enumerate() {
                *s = i32::from(wb[192 + g] as i8);
            }
            k.d = f16_at(wb, 208);
            for (i, v) in k.q.iter_mut().enumerate() {
                let (h, t, l) = (i / 128, (i % 128) / 32, i % 32);
                let low = (ql[64 * h + l + 32 * (t % 2)] >> (4 * (t / 2))) & 0x0F;
                let high = (qh[32 * h + l] >> (2 * t)) & 3;
                *v = i32::from(low | (high << 4)) - 32;
            }
        }
        QType::Q3_K => {
            let (hmask, qs) = (&wb[..32], &wb[32..96]);
            for (s, v) in k.sc.iter_mut().zip(k3_scales(scale_bytes(wb, 96))) {
                *s = i32::from(v) - 32;
            }
            k.d = f16_at(wb, 108);
            for (i, v) in k.q.iter_mut().enumerate() {
                let (h, t, l) = (i / 128, (i % 128) / 32, i % 32);
                let low = i32::from((qs[32 * h + l] >> (2 * t)) & 3);
                let high = (hmask[l] >> (4 * h + t)) & 1;
                *v = low - if high == 1 { 0 } else { 4 };
            }
        }
        QType::Q2_K => {
            for (g, &b) in wb[..16].iter().enumerate() {
                (k.sc[g], k.m[g]) = (i32::from(b & 0x0F), i32::from(b >> 4));
            }
            (k.d, k.dmin) = (f16_at(wb, 80), Some(f16_at(wb, 82)));
            let qs = &wb[16..80];
            for (i, v) in k.q.iter_mut().enumerate() {
                let (h, t, l) = (i / 128, (i % 128) / 32, i % 32);
                *v = i32::from((qs[32 * h + l] >> (2 * t)) & 3);
            }
        }
        _ => unreachable!("decode_k: {} is not a K-quant", qtype.name()),
    }
    k
}

/// Decodes whole blocks of `qtype` (lengths checked by the caller: `bytes` holds the blocks of
/// `out.len()` values).
pub(crate) fn dequantize_blocks(qtype: QType, bytes: &[u8], out: &mut [f32]) {
    let size = qtype.type_size();
    match qtype {
        QType::F32 => dequantize_row_f32(bytes, out),
        QType::F16 => {
            for (v, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *v = f16_at(b, 0);
            }
        }
        QType::BF16 => {
            for (v, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *v = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
        QType::Q4_0
        | QType::Q4_1
        | QType::Q5_0
        | QType::Q5_1
        | QType::Q8_0
        | QType::IQ4_NL
        | QType::MXFP4 => {
            for (wb, o) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(QK)) {
                let blk = decode32(qtype, wb);
                for (v, &q) in o.iter_mut().zip(&blk.q) {
                    *v = match blk.m {
                        Some(m) => q as f32 * blk.d + m,
                        None => q as f32 * blk.d,
                    };
                }
            }
        }
        QType::Q2_K | QType::Q3_K | QType::Q4_K | QType::Q5_K | QType::Q6_K => {
            for (wb, o) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(QK_K)) {
                let blk = decode_k(qtype, wb);
                for (g, og) in o.chunks_exact_mut(16).enumerate() {
                    let dl = blk.d * blk.sc[g] as f32;
                    let ml = blk.dmin.map(|dmin| dmin * blk.m[g] as f32);
                    for (v, &q) in og.iter_mut().zip(&blk.q[16 * g..]) {
                        *v = match ml {
                            Some(ml) => dl * q as f32 - ml,
                            None => dl * q as f32,
                        };
                    }
                }
            }
        }
        QType::IQ4_XS
        | QType::IQ3_S
        | QType::IQ3_XXS
        | QType::IQ2_XXS
        | QType::IQ2_XS
        | QType::IQ2_S
        | QType::IQ1_S
        | QType::IQ1_M => {
            for (wb, o) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(QK_K)) {
                iq::dequantize_block(qtype, wb, o);
            }
        }
    }
}

/// Dequantizes `Q4_1` blocks into `out`.
///
/// # Panics
/// If the lengths do not match.
pub fn dequantize_row_q4_1(bytes: &[u8], out: &mut [f32]) {
    check("dequantize_row_q4_1", out.len(), Q4_1_BYTES, bytes.len());
    dequantize_blocks(QType::Q4_1, bytes, out);
}

/// Dequantizes `Q8_0` blocks into `out`.
///
/// # Panics
/// If the lengths do not match.
pub fn dequantize_row_q8_0(bytes: &[u8], out: &mut [f32]) {
    check("dequantize_row_q8_0", out.len(), Q8_0_BYTES, bytes.len());
    dequantize_blocks(QType::Q8_0, bytes, out);
}

/// Dequantizes `Q8_1` blocks into `out` (for tests of activation quantization).
///
/// # Panics
/// If the lengths do not match.
pub fn dequantize_row_q8_1(bytes: &[u8], out: &mut [f32]) {
    check("dequantize_row_q8_1", out.len(), Q8_1_BYTES, bytes.len());
    for (b, o) in bytes.chunks_exact(Q8_1_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (v, &q) in o.iter_mut().zip(&b[4..]) {
            *v = f32::from(q as i8) * d;
        }
    }
}

/// Dequantizes `Q8_K` blocks into `out` (for tests of activation quantization).
///
/// # Panics
/// If the lengths do not match.
pub fn dequantize_row_q8_k(bytes: &[u8], out: &mut [f32]) {
    check_blocks(
        "dequantize_row_q8_k",
        out.len(),
        QK_K,
        Q8_K_BYTES,
        bytes.len(),
    );
    for (b, o) in bytes
        .chunks_exact(Q8_K_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        for (v, &q) in o.iter_mut().zip(&b[4..4 + QK_K]) {
            *v = d * f32::from(q as i8);
        }
    }
}

/// Decodes little-endian f32 bytes into `out`.
///
/// # Panics
/// If `bytes.len() != 4 * out.len()`.
pub fn dequantize_row_f32(bytes: &[u8], out: &mut [f32]) {
    assert!(
        bytes.len() == out.len() * 4,
        "dequantize_row_f32: {} bytes for {} values",
        bytes.len(),
        out.len()
    );
    for (v, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}
