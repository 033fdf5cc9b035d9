//! Quantizing activations on the detected backend, and checked public entry points for
//! quantizing and dequantizing single rows.
//!
//! The quantizing methods of [`Activations`] live here rather than in `acts` (which holds only the
//! buffer and its layout, read by the kernels) because they call the `backend` dispatch, which sits
//! above the kernels.

use std::sync::Mutex;

use crate::acts::Activations;
use crate::backend::Backend;
use crate::error::{KernelError, check_len};
use crate::format::{ActType, QK, QType, put_f16};
use crate::pool::Parallel;
use crate::scalar;

impl Activations {
    /// Quantizes `x` (`m × k`, row-major) into a new buffer.
    pub fn quantize(act: ActType, x: &[f32], m: usize, k: usize) -> Result<Self, KernelError> {
        let mut a = Self::default();
        a.quantize_into(act, x, m, k)?;
        Ok(a)
    }

    /// Quantizes `x` (`m × k`, row-major) into this buffer, replacing its contents.
    pub fn quantize_into(
        &mut self,
        act: ActType,
        x: &[f32],
        m: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        self.prepare(act, x, m, k)?;
        if m == 0 || k == 0 {
            return Ok(());
        }
        let nb = self.nb();
        let (qs, sc, f) = self.bufs_mut();
        let groups = (qs.chunks_mut(4 * nb * QK)).zip(sc.chunks_mut(8 * nb));
        fill(Backend::detect(), act, x, k, nb, f, groups);
        Ok(())
    }

    /// [`Activations::quantize_into`], splitting groups of four rows over `pool`'s threads.
    pub fn quantize_into_par<P: Parallel + ?Sized>(
        &mut self,
        act: ActType,
        x: &[f32],
        m: usize,
        k: usize,
        pool: &P,
    ) -> Result<(), KernelError> {
        let nt = pool.n_threads();
        if nt <= 1 || m < 8 * nt || act == ActType::F32 || k == 0 {
            return self.quantize_into(act, x, m, k);
        }
        self.prepare(act, x, m, k)?;
        let (nb, backend) = (self.nb(), Backend::detect());
        let per = m.div_ceil(4).div_ceil(nt); // groups per part
        // One part per thread, each owning whole groups of rows (disjoint `&mut` slices).
        type Part<'a> = (&'a [f32], &'a mut [u8], &'a mut [f32]);
        let (qs, sc, _) = self.bufs_mut();
        let parts: Vec<Mutex<Option<Part<'_>>>> = x
            .chunks(per * 4 * k)
            .zip(qs.chunks_mut(per * 4 * nb * QK))
            .zip(sc.chunks_mut(per * 8 * nb))
            .map(|((x, q), s)| Mutex::new(Some((x, q, s))))
            .collect();
        pool.run_parts(&|t, n| {
            for part in parts.iter().skip(t).step_by(n.max(1)) {
                let taken = part.lock().map(|mut p| p.take()).unwrap_or(None);
                if let Some((x, q, s)) = taken {
                    let groups = q.chunks_mut(4 * nb * QK).zip(s.chunks_mut(8 * nb));
                    fill(backend, act, x, k, nb, &mut [], groups);
                }
            }
        });
        Ok(())
    }
}

/// Quantizes the rows of `x` into `groups` (quants and scales of four rows each); `F32` rows are
/// copied into `f` instead.
fn fill<'a>(
    backend: Backend,
    act: ActType,
    x: &[f32],
    k: usize,
    nb: usize,
    f: &mut [f32],
    groups: impl Iterator<Item = (&'a mut [u8], &'a mut [f32])>,
) {
    if act == ActType::F32 {
        f.copy_from_slice(x);
        return;
    }
    let mut ds = vec![(0f32, 0i32); nb];
    for ((qg, sg), xg) in groups.zip(x.chunks(4 * k)) {
        for (lane, (qr, xr)) in qg
            .chunks_exact_mut(nb * QK)
            .zip(xg.chunks_exact(k))
            .enumerate()
        {
            backend.quantize_q8(xr, qr, &mut ds);
            for (b, &(d, sum)) in ds.iter().enumerate() {
                let d16 = half::f16::from_f32(d);
                sg[b * 8 + 2 * lane] = d16.to_f32();
                sg[b * 8 + 2 * lane + 1] = if act == ActType::Q8_1 {
                    half::f16::from_f32(sum as f32 * d).to_f32()
                } else {
                    128.0 * sum as f32 // exact; the AVX-512 kernel's offset correction
                };
            }
        }
    }
}

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
