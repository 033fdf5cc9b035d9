//! Quantizing activations on the detected backend, and checked public entry points for
//! quantizing and dequantizing single rows.
//!
//! The quantizing methods of [`Activations`] live here rather than in `acts` (which holds only the
//! buffer and its layout, read by the kernels) because they call the `backend` dispatch, which sits
//! above the kernels.

use std::sync::Mutex;

use crate::acts::{Activations, Bufs};
use crate::backend::Backend;
use crate::error::{KernelError, check_len};
use crate::format::{ActType, QK, QK_K, QType, put_f16};
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
        let Bufs { qs, sc, bs, f } = self.bufs_mut();
        if act == ActType::F32 {
            f.copy_from_slice(x);
            return Ok(());
        }
        fill(
            Backend::detect(),
            act,
            x,
            k,
            nb,
            groups(qs, sc, bs, k, nb, 1),
        );
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
        type Part<'a> = (&'a [f32], Group<'a>);
        let Bufs { qs, sc, bs, .. } = self.bufs_mut();
        let parts: Vec<Mutex<Option<Part<'_>>>> = x
            .chunks(per * 4 * k)
            .zip(groups(qs, sc, bs, k, nb, per))
            .map(|(x, g)| Mutex::new(Some((x, g))))
            .collect();
        pool.run_parts(&|t, n| {
            for part in parts.iter().skip(t).step_by(n.max(1)) {
                let taken = part.lock().map(|mut p| p.take()).unwrap_or(None);
                if let Some((x, (q, s, b))) = taken {
                    fill(backend, act, x, k, nb, groups(q, s, b, k, nb, 1));
                }
            }
        });
        Ok(())
    }
}

/// The buffers of some groups of four rows: quants, interleaved scales and (`Q8_K`) sums.
type Group<'a> = (&'a mut [u8], &'a mut [f32], &'a mut [i16]);

/// Splits the buffers into parts of `per` groups of four rows each (the last may be shorter).
fn groups<'a>(
    qs: &'a mut [u8],
    sc: &'a mut [f32],
    bs: &'a mut [i16],
    k: usize,
    nb: usize,
    per: usize,
) -> impl Iterator<Item = Group<'a>> {
    let bs_rows = if bs.is_empty() { 0 } else { 16 * nb };
    let n_parts = sc.len().div_ceil((8 * nb * per).max(1));
    let bs_chunk = (per * 4 * bs_rows).max(1);
    let mut bs_parts: Vec<&'a mut [i16]> = bs.chunks_mut(bs_chunk).collect();
    bs_parts.resize_with(n_parts, Default::default);
    qs.chunks_mut(per * 4 * k)
        .zip(sc.chunks_mut(per * 8 * nb))
        .zip(bs_parts)
        .map(|((q, s), b)| (q, s, b))
}

/// Quantizes the rows of `x` into `groups` (quants, scales and `Q8_K` sums of four rows each).
fn fill<'a>(
    backend: Backend,
    act: ActType,
    x: &[f32],
    k: usize,
    nb: usize,
    groups: impl Iterator<Item = Group<'a>>,
) {
    let mut ds = vec![(0f32, 0i32); if act == ActType::Q8_K { 0 } else { nb }];
    let mut dk = vec![0f32; if act == ActType::Q8_K { nb } else { 0 }];
    for ((qg, sg, bg), xg) in groups.zip(x.chunks(4 * k)) {
        for (lane, (qr, xr)) in qg.chunks_exact_mut(k).zip(xg.chunks_exact(k)).enumerate() {
            if act == ActType::Q8_K {
                let sums = &mut bg[lane * 16 * nb..(lane + 1) * 16 * nb];
                backend.quantize_q8k(xr, qr, &mut dk, sums);
                for (b, &d) in dk.iter().enumerate() {
                    sg[b * 8 + 2 * lane] = d;
                    sg[b * 8 + 2 * lane + 1] = 0.0;
                }
                continue;
            }
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

/// Quantizes activations `x` (length a multiple of 256) into ggml `Q8_K` blocks (for K-quant
/// weights: the input of [`crate::vec_dot`]).
pub fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    check_row(
        "Q8_K output (bytes)",
        ActType::Q8_K.try_row_bytes(x.len()),
        out.len(),
    )?;
    let nb = x.len() / QK_K;
    let mut qs = vec![0u8; x.len()];
    let (mut d, mut sums) = (vec![0f32; nb], vec![0i16; 16 * nb]);
    Backend::detect().quantize_q8k(x, &mut qs, &mut d, &mut sums);
    scalar::write_q8k(&qs, &d, &sums, out);
    Ok(())
}

/// Decodes one row of `qtype` (`bytes`) into `out.len()` values, e.g. a token's embedding row;
/// bitwise ggml's `dequantize_row_*`.
pub fn dequantize_row(qtype: QType, bytes: &[u8], out: &mut [f32]) -> Result<(), KernelError> {
    check_row(
        "encoded row (bytes)",
        qtype.try_row_bytes(out.len()),
        bytes.len(),
    )?;
    scalar::dequantize_blocks(qtype, bytes, out);
    Ok(())
}
