//! Checked public entry points for quantizing and dequantizing single rows.

use crate::backend::Backend;
use crate::error::{KernelError, check_len};
use crate::format::{ActType, QK, QType, put_f16};
use crate::scalar;

/// Checks `x.len()` (a multiple of the block size) against `out.len()` for format `rb`.
fn check_row(
    what: &'static str,
    row_bytes: Result<usize, KernelError>,
    bytes: usize,
) -> Result<(), KernelError> {
    check_len(what, row_bytes?, bytes)
}

/// Quantizes activations `x` (length a multiple of 32) into `Q8_1` blocks (for `Q4_1` weights).
pub fn quantize_row_q8_1(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    check_row(
        "Q8_1 output (bytes)",
        ActType::Q8_1.try_row_bytes(x.len()),
        out.len(),
    )?;
    quantize_ggml(ActType::Q8_1, x, out);
    Ok(())
}

/// Quantizes `x` (length a multiple of 32) into `Q8_0` blocks (activations for `Q8_0` weights,
/// or `Q8_0` weights themselves).
pub fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    check_row(
        "Q8_0 output (bytes)",
        ActType::Q8_0.try_row_bytes(x.len()),
        out.len(),
    )?;
    quantize_ggml(ActType::Q8_0, x, out);
    Ok(())
}

/// Quantizes on the detected backend and writes ggml blocks (lengths checked by the caller).
fn quantize_ggml(act: ActType, x: &[f32], out: &mut [u8]) {
    let mut qs = vec![0u8; x.len()];
    let mut ds = vec![(0f32, 0i32); x.len() / QK];
    Backend::detect().quantize_q8(x, &mut qs, &mut ds);
    let at = if act == ActType::Q8_1 { 4 } else { 2 };
    for ((o, q), &(d, sum)) in out
        .chunks_exact_mut(act.type_size())
        .zip(qs.chunks_exact(QK))
        .zip(&ds)
    {
        put_f16(o, 0, d);
        if act == ActType::Q8_1 {
            put_f16(o, 2, sum as f32 * d);
        }
        o[at..].copy_from_slice(q);
    }
}

/// Quantizes weights `x` (length a multiple of 32) into `Q4_1` blocks (ggml's reference rule);
/// for building test models.
pub fn quantize_row_q4_1(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    check_row(
        "Q4_1 output (bytes)",
        QType::Q4_1.try_row_bytes(x.len()),
        out.len(),
    )?;
    scalar::quantize_row_q4_1(x, out);
    Ok(())
}

/// Decodes one row of `qtype` (`bytes`) into `out.len()` values, e.g. a token's embedding row.
pub fn dequantize_row(qtype: QType, bytes: &[u8], out: &mut [f32]) -> Result<(), KernelError> {
    check_row(
        "encoded row (bytes)",
        qtype.try_row_bytes(out.len()),
        bytes.len(),
    )?;
    match qtype {
        QType::F32 => scalar::dequantize_row_f32(bytes, out),
        QType::Q4_1 => scalar::dequantize_row_q4_1(bytes, out),
        QType::Q8_0 => scalar::dequantize_row_q8_0(bytes, out),
    }
    Ok(())
}
