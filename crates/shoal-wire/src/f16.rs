//! Conversions between `f32` values and the little-endian byte forms used in activation frames.
//! f32 → f16 rounds to nearest even; values beyond ±65504 become ±infinity, NaN stays NaN.
//! The slice conversions of `half` use F16C / NEON instructions when the CPU has them.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::WireError;

/// Values converted per step through a stack buffer (keeps the SIMD path without a temporary Vec).
const BLOCK: usize = 1024;

/// Converts f32 values to f16 and returns their little-endian bytes (2 bytes per value).
pub fn encode_f32_as_f16(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 2);
    encode_f32_as_f16_into(values, &mut out);
    out
}

/// [`encode_f32_as_f16`] appending to `out`.
pub(crate) fn encode_f32_as_f16_into(values: &[f32], out: &mut Vec<u8>) {
    out.reserve(values.len() * 2);
    let mut tmp = [f16::ZERO; BLOCK];
    for chunk in values.chunks(BLOCK) {
        let halves = &mut tmp[..chunk.len()];
        halves.convert_from_f32_slice(chunk);
        for h in halves.iter() {
            out.extend_from_slice(&h.to_le_bytes());
        }
    }
}

/// Decodes little-endian f16 bytes to f32 values; fails on an odd byte length.
pub fn decode_f16_to_f32(bytes: &[u8]) -> Result<Vec<f32>, WireError> {
    if !bytes.len().is_multiple_of(2) {
        return Err(WireError::OddF16Length { len: bytes.len() });
    }
    let n = bytes.len() / 2;
    let mut out = vec![0f32; n];
    let mut tmp = [f16::ZERO; BLOCK];
    for (src, dst) in bytes.chunks(BLOCK * 2).zip(out.chunks_mut(BLOCK)) {
        let halves = &mut tmp[..dst.len()];
        for (h, b) in halves.iter_mut().zip(src.chunks_exact(2)) {
            *h = f16::from_le_bytes([b[0], b[1]]);
        }
        halves.convert_to_f32_slice(dst);
    }
    Ok(out)
}

/// f32 values as little-endian bytes (4 bytes per value).
pub fn encode_f32_le(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 4);
    encode_f32_le_into(values, &mut out);
    out
}

/// [`encode_f32_le`] appending to `out`.
pub(crate) fn encode_f32_le_into(values: &[f32], out: &mut Vec<u8>) {
    out.reserve(values.len() * 4);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Little-endian f32 bytes to values; fails unless the length is a multiple of 4.
pub fn decode_f32_le(bytes: &[u8]) -> Result<Vec<f32>, WireError> {
    if !bytes.len().is_multiple_of(4) {
        let whole = bytes.len() as u64 / 4 * 4;
        return Err(WireError::DataLength {
            expected: whole + 4,
            got: bytes.len() as u64,
        });
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_f16_length_is_an_error() {
        assert_eq!(
            decode_f16_to_f32(&[1, 2, 3]),
            Err(WireError::OddF16Length { len: 3 })
        );
    }

    #[test]
    fn exact_values_survive_and_block_edges_are_handled() {
        let values: Vec<f32> = (0..(BLOCK * 2 + 3))
            .map(|i| (i % 512) as f32 * 0.5)
            .collect();
        let bytes = encode_f32_as_f16(&values);
        assert_eq!(bytes.len(), values.len() * 2);
        assert_eq!(decode_f16_to_f32(&bytes).unwrap(), values);
    }

    #[test]
    fn overflow_becomes_infinity() {
        let back = decode_f16_to_f32(&encode_f32_as_f16(&[1e6, -1e6])).unwrap();
        assert_eq!(back, vec![f32::INFINITY, f32::NEG_INFINITY]);
    }

    #[test]
    fn f32_le_roundtrip_and_bad_length() {
        let v = [1.5f32, -0.0, f32::MAX];
        assert_eq!(decode_f32_le(&encode_f32_le(&v)).unwrap(), v);
        assert!(decode_f32_le(&[0; 5]).is_err());
    }
}
