//! Quantized activations in the packed layout the matmul kernels read.
//!
//! For `Q8_1`/`Q8_0` the values are those of ggml's blocks (the same i8 quants, `d` and `s`
//! rounded to f16), laid out for the kernels:
//! - `qs`: row `r`, block `b` at `(r · nb + b) · 32`, 32 × i8;
//! - `sc`: rows in groups of four; group `g`, block `b` holds `[d0, s0, d1, s1, d2, s2, d3, s3]`
//!   as f32 at `(g · nb + b) · 8`, so one 32-byte load gives the scales of four rows, and the
//!   f16 → f32 conversion happens once here instead of once per weight row (for `Q8_0`, `s` is
//!   `128 · Σq`, exact, which the AVX-512 kernel needs for its unsigned weights).
//!
//! For `Q8_K` (the K-quants' activations) the quants and their ggml scale `d` (exactly, as f32)
//! are laid out the same way per 256-value block (`s` is 0), and `bs` holds each block's 16 sums
//! of 16 quants as i16: row `r`, block `b` at `(r · nb + b) · 16`.
//!
//! For `F32` the rows are stored as they are.
//!
//! This module holds the buffer and its layout only (the kernels read it through `gemm`); the
//! methods that fill it, [`Activations::quantize`] and friends, are in `quant`, above the backend
//! dispatch.

use crate::error::{KernelError, check_len};
use crate::format::{ActType, QK, QK_K, put_f16};

/// `m` activation rows of `k` values, quantized into the format some weights need.
///
/// Quantize once and pass to several [`crate::matmul_quantized`] calls that share the input
/// (Q/K/V, gate/up); [`Activations::quantize_into`] reuses the buffers across calls.
#[derive(Debug, Clone, Default)]
pub struct Activations {
    act: Option<ActType>,
    m: usize,
    k: usize,
    nb: usize,
    qs: Vec<u8>,
    sc: Vec<f32>,
    bs: Vec<i16>,
    f: Vec<f32>,
}

impl Activations {
    /// Sets the format and shape for `x` (`m × k` values of `act`, length checked) and sizes the
    /// buffers; the quantizer (`quant`) then fills them through [`Activations::bufs_mut`].
    pub(crate) fn prepare(
        &mut self,
        act: ActType,
        x: &[f32],
        m: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        act.try_row_bytes(k)?;
        let n = m.checked_mul(k).ok_or(KernelError::Overflow {
            what: "the activations",
        })?;
        check_len("activations (f32 values)", n, x.len())?;
        let nb = k / act.block_size();
        self.act = Some(act);
        (self.m, self.k, self.nb) = (m, k, nb);
        if act == ActType::F32 {
            self.qs.clear();
            self.sc.clear();
            self.f.resize(n, 0.0);
        } else {
            self.f.clear();
            self.qs.resize(n, 0);
            self.sc.resize(m.div_ceil(4) * nb * 8, 0.0);
            let sums = if act == ActType::Q8_K { m * nb * 16 } else { 0 };
            self.bs.resize(sums, 0);
        }
        Ok(())
    }

    /// The format, or `None` before the first quantization.
    pub fn act_type(&self) -> Option<ActType> {
        self.act
    }

    /// Number of rows.
    pub fn m(&self) -> usize {
        self.m
    }

    /// Values per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Row `r` re-encoded as ggml blocks (`Q8_1`, `Q8_0`, `Q8_K`, or little-endian `f32`), the input
    /// [`crate::vec_dot`] takes.
    pub fn ggml_row(&self, r: usize) -> Result<Vec<u8>, KernelError> {
        let act = self.act.ok_or(KernelError::FormatMismatch {
            weights: "any",
            activations: "unquantized",
        })?;
        if r >= self.m {
            return Err(KernelError::BadSliceLength {
                what: "activation row index (rows)",
                expected: self.m,
                actual: r,
            });
        }
        let mut out = vec![0u8; act.try_row_bytes(self.k)?];
        if act == ActType::F32 {
            for (o, v) in out.chunks_exact_mut(4).zip(self.f_row(r)) {
                o.copy_from_slice(&v.to_le_bytes());
            }
            return Ok(out);
        }
        let (qs, sc, lane) = (self.q_row(r), self.sc_group(r / 4), r % 4);
        if act == ActType::Q8_K {
            let sums = self.bsums_row(r);
            for (b, o) in out.chunks_exact_mut(act.type_size()).enumerate() {
                o[..4].copy_from_slice(&sc[b * 8 + 2 * lane].to_le_bytes());
                o[4..4 + QK_K].copy_from_slice(&qs[b * QK_K..(b + 1) * QK_K]);
                for (d, s) in o[4 + QK_K..].chunks_exact_mut(2).zip(&sums[b * 16..]) {
                    d.copy_from_slice(&s.to_le_bytes());
                }
            }
            return Ok(out);
        }
        let (size, at) = (act.type_size(), if act == ActType::Q8_1 { 4 } else { 2 });
        for (b, o) in out.chunks_exact_mut(size).enumerate() {
            put_f16(o, 0, sc[b * 8 + 2 * lane]);
            if act == ActType::Q8_1 {
                put_f16(o, 2, sc[b * 8 + 2 * lane + 1]);
            }
            o[at..].copy_from_slice(&qs[b * QK..(b + 1) * QK]);
        }
        Ok(out)
    }

    /// Blocks per row.
    pub(crate) fn nb(&self) -> usize {
        self.nb
    }

    /// The buffers sized by [`Activations::prepare`], to be filled: the quants (`m · k` bytes),
    /// the interleaved scales (`⌈m/4⌉ · nb · 8` floats), for `Q8_K` the sums of 16 quants
    /// (`m · nb · 16`) and, for `F32`, the values.
    pub(crate) fn bufs_mut(&mut self) -> Bufs<'_> {
        Bufs {
            qs: &mut self.qs,
            sc: &mut self.sc,
            bs: &mut self.bs,
            f: &mut self.f,
        }
    }

    /// The quants of row `r` (`k` bytes).
    #[inline]
    pub(crate) fn q_row(&self, r: usize) -> &[u8] {
        let n = self.k;
        &self.qs[r * n..(r + 1) * n]
    }

    /// The `Q8_K` sums of 16 quants of row `r` (`nb · 16` values).
    #[inline]
    pub(crate) fn bsums_row(&self, r: usize) -> &[i16] {
        let n = self.nb * 16;
        &self.bs[r * n..(r + 1) * n]
    }

    /// The interleaved scales of row group `g` (`nb · 8` floats).
    #[inline]
    pub(crate) fn sc_group(&self, g: usize) -> &[f32] {
        let n = self.nb * 8;
        &self.sc[g * n..(g + 1) * n]
    }

    /// Row `r` of `F32` activations.
    #[inline]
    pub(crate) fn f_row(&self, r: usize) -> &[f32] {
        &self.f[r * self.k..(r + 1) * self.k]
    }
}

/// The mutable buffers of an [`Activations`] (see [`Activations::bufs_mut`]).
pub(crate) struct Bufs<'a> {
    pub(crate) qs: &'a mut [u8],
    pub(crate) sc: &'a mut [f32],
    pub(crate) bs: &'a mut [i16],
    pub(crate) f: &'a mut [f32],
}
