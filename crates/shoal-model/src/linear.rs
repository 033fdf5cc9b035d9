//! Quantized linear layers and the token embedding, on the `shoal-kernels` SIMD kernels.
//!
//! The GGUF block bytes are kept as they are (or repacked once for AVX-512 VNNI) in a
//! [`PackedMatrix`]; a tied token embedding and output head share one matrix ([`Embedding::shared`]).
//! [`LinearSet`] is what a layer multiplies by: one or several weight matrices reading the same input
//! whose outputs sit side by side (Q | K | V, gate | up). Matrices of the same type are stacked into one
//! at load time; the input is quantized once per activation format the set needs.

use std::sync::Arc;

use shoal_kernels::{ActType, Activations, PackedMatrix, Parallel, QType};

use crate::error::{ModelError, Result};
use crate::gguf::types::GgmlType;
use crate::gguf::{GgufFile, RawTensor};

/// The kernels' format for a tensor of type `ty`, or the load error naming the tensor and its type.
pub fn kernel_qtype(name: &str, ty: &GgmlType) -> Result<QType> {
    ty.qtype().ok_or_else(|| ModelError::UnsupportedTensorType {
        name: name.into(),
        dtype: format!("{} (id {})", ty.name, ty.id),
    })
}

/// A weight tensor's `(rows, cols, format)`: it must be a `[rows, cols]` matrix of a format the
/// kernels read.
pub(crate) fn matrix_shape(name: &str, raw: &RawTensor) -> Result<(usize, usize, QType)> {
    let [rows, cols] = raw.dims[..] else {
        return Err(ModelError::BadShape {
            name: name.into(),
            got: raw.dims.clone(),
            expected: vec![0, 0],
        });
    };
    Ok((rows, cols, kernel_qtype(name, raw.ty)?))
}

/// A `[rows, cols]` weight tensor as a packed matrix.
fn packed(name: &str, raw: RawTensor) -> Result<PackedMatrix> {
    let (rows, cols, qtype) = matrix_shape(name, &raw)?;
    PackedMatrix::from_rows(qtype, rows, cols, raw.data)
        .map_err(|e| ModelError::BadInput(format!("{name}: {e}")))
}

/// `y = x · Wᵀ (+ b)` with `W` quantized, `out_features × in_features`; a clone shares the matrix.
#[derive(Clone)]
pub struct QLinear {
    w: Arc<PackedMatrix>,
    bias: Option<Vec<f32>>,
}

impl QLinear {
    pub fn new(w: Arc<PackedMatrix>, bias: Option<Vec<f32>>) -> Result<Self> {
        if let Some(b) = &bias
            && b.len() != w.rows()
        {
            return Err(ModelError::BadShape {
                name: "bias".into(),
                got: vec![b.len()],
                expected: vec![w.rows()],
            });
        }
        Ok(Self { w, bias })
    }

    pub fn out_features(&self) -> usize {
        self.w.rows()
    }

    pub fn in_features(&self) -> usize {
        self.w.cols()
    }

    /// The activation format this matrix multiplies.
    pub fn act_type(&self) -> ActType {
        self.w.qtype().act_type()
    }

    /// `out = acts · Wᵀ + b`, `acts` already quantized as [`QLinear::act_type`]; `out` is resized to
    /// `m × out_features`.
    pub fn forward_quantized<P: Parallel + ?Sized>(
        &self,
        acts: &Activations,
        out: &mut Vec<f32>,
        pool: &P,
    ) -> Result<()> {
        let n = self.w.rows();
        // Every value is written, so a buffer reused between calls is never cleared.
        out.resize(acts.m() * n, 0.0);
        self.w
            .matmul_quantized(acts, out, pool)
            .map_err(|e| ModelError::BadInput(format!("matmul: {e}")))?;
        if let Some(b) = &self.bias {
            for row in out.chunks_exact_mut(n) {
                for (o, &bv) in row.iter_mut().zip(b) {
                    *o += bv;
                }
            }
        }
        Ok(())
    }
}

/// One weight tensor of a [`LinearSet`]: its name and whether a bias may follow it.
pub struct Part<'a> {
    pub weight: &'a str,
    /// The bias tensor's name, used when the file has it.
    pub bias: Option<&'a str>,
}

/// Several matrices reading the same input, outputs side by side.
#[derive(Clone)]
pub struct LinearSet {
    /// Groups of stacked same-type matrices, with the column each group's output starts at.
    groups: Vec<(QLinear, usize)>,
    out_features: usize,
    in_features: usize,
}

/// Buffers a [`LinearSet`] reuses between calls: one quantized input per activation format (valid for
/// the current call only) and the output of a group before it is placed.
#[derive(Default)]
pub struct LinearScratch {
    acts: Vec<(ActType, Activations)>,
    tmp: Vec<f32>,
}

impl LinearSet {
    /// Reads `parts` from `gguf` (stacking neighbours of the same type, with their biases if present).
    pub fn load(gguf: &mut GgufFile, parts: &[Part<'_>]) -> Result<Self> {
        let mut raws = Vec::with_capacity(parts.len());
        for p in parts {
            let raw = gguf.read_raw(p.weight)?;
            let bias = match p.bias {
                Some(b) if gguf.has_tensor(b) => Some(gguf.read_f32_vec(b)?),
                _ => None,
            };
            raws.push((p.weight.to_string(), raw, bias));
        }
        Self::from_raws(raws)
    }

    /// The set of matrices already read: `(name, weight, bias)` in output order (neighbours of the
    /// same type stacked). Mixture-of-experts layers build each expert's set from slices of the
    /// 3-D expert tensors this way.
    pub fn from_raws(raws: Vec<(String, RawTensor, Option<Vec<f32>>)>) -> Result<Self> {
        let mut groups = Vec::new();
        let (mut col, mut in_features) = (0, None);
        let mut iter = raws.into_iter().peekable();
        while let Some((name, first, bias)) = iter.next() {
            let (ty, mut stack) = (first.ty.id, vec![(first, bias)]);
            while let Some((_, next, _)) = iter.peek()
                && next.ty.id == ty
            {
                if let Some((_, raw, bias)) = iter.next() {
                    stack.push((raw, bias));
                }
            }
            let w = packed(&name, stack_rows(&name, &mut stack)?)?;
            if *in_features.get_or_insert(w.cols()) != w.cols() {
                return Err(ModelError::BadShape {
                    name,
                    got: vec![w.rows(), w.cols()],
                    expected: vec![w.rows(), in_features.unwrap_or(0)],
                });
            }
            let bias = stack_biases(&stack);
            let rows = w.rows();
            groups.push((QLinear::new(Arc::new(w), bias)?, col));
            col += rows;
        }
        Ok(Self {
            groups,
            out_features: col,
            in_features: in_features.unwrap_or(0),
        })
    }

    /// A set of one matrix.
    pub fn single(w: QLinear) -> Self {
        let (out_features, in_features) = (w.out_features(), w.in_features());
        Self {
            groups: vec![(w, 0)],
            out_features,
            in_features,
        }
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// `out = x · [W₁ | W₂ | …]ᵀ`: `x` is `m × in_features`, `out` becomes `m × out_features`.
    pub fn forward<P: Parallel + ?Sized>(
        &self,
        x: &[f32],
        m: usize,
        out: &mut Vec<f32>,
        s: &mut LinearScratch,
        pool: &P,
    ) -> Result<()> {
        // Bit `i`: `s.acts[i]` holds this call's input already.
        let mut fresh = 0u64;
        for (w, col) in &self.groups {
            let act = w.act_type();
            let at = match s.acts.iter().position(|(a, _)| *a == act) {
                Some(i) => i,
                None => {
                    s.acts.push((act, Activations::default()));
                    s.acts.len() - 1
                }
            };
            let acts = &mut s.acts[at].1;
            if fresh & (1 << at) == 0 {
                acts.quantize_into_par(act, x, m, self.in_features, pool)
                    .map_err(|e| ModelError::BadInput(format!("matmul input: {e}")))?;
                fresh |= 1 << at;
            }
            if self.groups.len() == 1 {
                return w.forward_quantized(acts, out, pool);
            }
            w.forward_quantized(acts, &mut s.tmp, pool)?;
            out.resize(m * self.out_features, 0.0);
            let n = w.out_features();
            for (r, src) in s.tmp.chunks_exact(n).enumerate() {
                out[r * self.out_features + col..][..n].copy_from_slice(src);
            }
        }
        Ok(())
    }
}

/// Stacks the rows of same-type matrices with the same input size into one tensor.
fn stack_rows(name: &str, stack: &mut [(RawTensor, Option<Vec<f32>>)]) -> Result<RawTensor> {
    if stack.len() == 1 {
        let (raw, _) = &mut stack[0];
        return Ok(RawTensor {
            ty: raw.ty,
            dims: raw.dims.clone(),
            data: std::mem::take(&mut raw.data),
        });
    }
    let (ty, cols) = (stack[0].0.ty, stack[0].0.dims.get(1).copied().unwrap_or(0));
    let mut rows = 0;
    let mut data = Vec::with_capacity(stack.iter().map(|(p, _)| p.data.len()).sum());
    for (p, _) in stack.iter_mut() {
        if p.dims.len() != 2 || p.dims[1] != cols {
            return Err(ModelError::BadShape {
                name: name.into(),
                got: p.dims.clone(),
                expected: vec![0, cols],
            });
        }
        rows += p.dims[0];
        data.extend_from_slice(&std::mem::take(&mut p.data));
    }
    Ok(RawTensor {
        ty,
        dims: vec![rows, cols],
        data,
    })
}

/// The stacked matrices' biases (zeros for a matrix without one), or `None` when none has a bias.
fn stack_biases(stack: &[(RawTensor, Option<Vec<f32>>)]) -> Option<Vec<f32>> {
    if stack.iter().all(|(_, b)| b.is_none()) {
        return None;
    }
    let mut out = Vec::new();
    for (raw, b) in stack {
        let rows = raw.dims.first().copied().unwrap_or(0);
        match b {
            Some(b) => out.extend_from_slice(b),
            None => out.resize(out.len() + rows, 0.0),
        }
    }
    Some(out)
}

/// The token embedding table, kept in its GGUF encoding; rows are dequantized on lookup. With tied
/// embeddings the output head multiplies the same matrix ([`Embedding::shared`]); a clone shares it.
#[derive(Clone)]
pub struct Embedding {
    w: Arc<PackedMatrix>,
}

impl Embedding {
    pub fn from_raw(name: &str, raw: RawTensor) -> Result<Self> {
        Ok(Self {
            w: Arc::new(packed(name, raw)?),
        })
    }

    /// The matrix, to serve as a tied output head.
    pub fn shared(&self) -> Arc<PackedMatrix> {
        self.w.clone()
    }

    pub fn dim(&self) -> usize {
        self.w.cols()
    }

    /// Looks up token rows into a host buffer `ids.len() × dim`, each multiplied by `scale`.
    pub fn lookup(&self, ids: &[u32], scale: f32) -> Result<Vec<f32>> {
        let cols = self.w.cols();
        let mut out = vec![0f32; ids.len() * cols];
        for (&id, row) in ids.iter().zip(out.chunks_exact_mut(cols)) {
            let id = id as usize;
            if id >= self.w.rows() {
                return Err(ModelError::BadInput(format!(
                    "token id {id} outside vocabulary of {}",
                    self.w.rows()
                )));
            }
            self.w
                .dequantize_row(id, row)
                .map_err(|e| ModelError::BadInput(format!("embedding: {e}")))?;
            if scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_type_the_kernels_cannot_multiply_names_the_tensor_and_the_type() {
        use crate::gguf::types::ggml_type;
        let q8k = ggml_type(15).expect("Q8_K");
        let err = kernel_qtype("blk.3.ffn_up.weight", q8k)
            .map(|_| ())
            .expect_err("Q8_K is an activation format")
            .to_string();
        assert!(
            err.contains("blk.3.ffn_up.weight") && err.contains("Q8_K (id 15)"),
            "{err}"
        );
        assert!(err.contains("Q4_K") && err.contains("IQ4_XS"), "{err}");
        for (id, q) in [(12, QType::Q4_K), (23, QType::IQ4_XS), (39, QType::MXFP4)] {
            let t = ggml_type(id).expect("a type");
            assert_eq!(kernel_qtype("w", t).ok(), Some(q));
        }
    }
}
