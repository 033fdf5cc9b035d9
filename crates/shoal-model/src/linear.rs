//! Quantized linear layers and the token embedding.
//!
//! On CPU the GGUF block bytes are copied once into the layout of this CPU's best `shoal-kernels`
//! backend (as they are, or in 16-row groups for AVX-512 VNNI) and multiplied by its SIMD kernels;
//! on other devices candle's `QMatMul` runs them.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, ggml_file::qtensor_from_ggml};
use candle_core::{Device, Module, Tensor};
use shoal_kernels::{Activations, PackedMatrix, QType, ThreadPool};

use crate::error::{ModelError, Result};
use crate::gguf::RawTensor;

fn kernel_qtype(dtype: GgmlDType) -> Option<QType> {
    match dtype {
        GgmlDType::F32 => Some(QType::F32),
        GgmlDType::Q4_1 => Some(QType::Q4_1),
        GgmlDType::Q8_0 => Some(QType::Q8_0),
        _ => None,
    }
}

/// Weights for the CPU kernels, laid out for this CPU's best backend (`rows × cols`).
struct CpuWeights {
    w: PackedMatrix,
    pool: Arc<ThreadPool>,
}

enum Backend {
    Cpu(CpuWeights),
    Candle(QMatMul),
}

/// `y = x · Wᵀ` with `W` quantized, `out_features × in_features`.
pub struct QLinear {
    backend: Backend,
    out_features: usize,
    in_features: usize,
}

impl QLinear {
    pub fn from_raw(
        name: &str,
        raw: RawTensor,
        device: &Device,
        pool: &Arc<ThreadPool>,
    ) -> Result<Self> {
        let [rows, cols] = raw.dims[..] else {
            return Err(ModelError::BadShape {
                name: name.into(),
                got: raw.dims.clone(),
                expected: vec![0, 0],
            });
        };
        let backend = match (device, kernel_qtype(raw.dtype)) {
            (Device::Cpu, Some(qtype)) => {
                let bad =
                    |e: shoal_kernels::KernelError| ModelError::BadInput(format!("{name}: {e}"));
                Backend::Cpu(CpuWeights {
                    w: PackedMatrix::from_rows(qtype, rows, cols, raw.data).map_err(bad)?,
                    pool: pool.clone(),
                })
            }
            (_, _) => {
                let qt = qtensor_from_ggml(raw.dtype, &raw.data, vec![rows, cols], device)?;
                Backend::Candle(QMatMul::from_qtensor(qt)?)
            }
        };
        Ok(Self {
            backend,
            out_features: rows,
            in_features: cols,
        })
    }

    /// Stacks several weight matrices with the same input size and type into one (fused QKV, gate+up).
    pub fn concat_rows(name: &str, parts: Vec<RawTensor>) -> Result<RawTensor> {
        let Some(first) = parts.first() else {
            return Err(ModelError::BadInput(format!(
                "{name}: nothing to concatenate"
            )));
        };
        let (dtype, cols) = (first.dtype, first.dims.get(1).copied().unwrap_or(0));
        let mut rows = 0;
        let mut data = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
        for p in parts {
            if p.dtype != dtype || p.dims.len() != 2 || p.dims[1] != cols {
                return Err(ModelError::BadShape {
                    name: name.into(),
                    got: p.dims,
                    expected: vec![0, cols],
                });
            }
            rows += p.dims[0];
            data.extend_from_slice(&p.data);
        }
        Ok(RawTensor {
            dtype,
            dims: vec![rows, cols],
            data,
        })
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Host path: `x` is `m × in_features` row-major; returns `m × out_features`. CPU weights only.
    pub fn forward_host(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        self.forward_host_into(x, m, &mut out, &mut Activations::default())?;
        Ok(out)
    }

    /// [`QLinear::forward_host`] into buffers kept between calls: `out` becomes `m × out_features`,
    /// `acts` holds the quantized input.
    pub fn forward_host_into(
        &self,
        x: &[f32],
        m: usize,
        out: &mut Vec<f32>,
        acts: &mut Activations,
    ) -> Result<()> {
        let Backend::Cpu(CpuWeights { w, pool }) = &self.backend else {
            return Err(ModelError::BadInput("host matmul on device weights".into()));
        };
        let err = |e: shoal_kernels::KernelError| ModelError::BadInput(format!("matmul: {e}"));
        acts.quantize_into_par(w.qtype().act_type(), x, m, w.cols(), &**pool)
            .map_err(err)?;
        // Every value is written, so a buffer reused between calls is never cleared.
        out.resize(m * w.rows(), 0.0);
        w.matmul_quantized(acts, out, &**pool).map_err(err)
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match &self.backend {
            Backend::Cpu(_) => {
                let dims = x.dims().to_vec();
                let m = x.elem_count() / self.in_features.max(1);
                let out = self.forward_host(&x.flatten_all()?.to_vec1::<f32>()?, m)?;
                let mut out_dims = dims;
                if let Some(last) = out_dims.last_mut() {
                    *last = self.out_features;
                }
                Tensor::from_vec(out, out_dims, x.device())?
            }
            Backend::Candle(m) => m.forward(x)?,
        })
    }
}

/// Token embedding table kept in its GGUF encoding; rows are dequantized on lookup.
pub struct Embedding {
    qtype: QType,
    rows: usize,
    cols: usize,
    data: Arc<Vec<u8>>,
}

impl Embedding {
    pub fn from_raw(name: &str, raw: &RawTensor) -> Result<Self> {
        let [rows, cols] = raw.dims[..] else {
            return Err(ModelError::BadShape {
                name: name.into(),
                got: raw.dims.clone(),
                expected: vec![0, 0],
            });
        };
        let qtype = kernel_qtype(raw.dtype).ok_or_else(|| ModelError::UnsupportedTensorType {
            name: name.into(),
            dtype: format!("{:?}", raw.dtype),
        })?;
        Ok(Self {
            qtype,
            rows,
            cols,
            data: Arc::new(raw.data.clone()),
        })
    }

    /// Looks up token rows: `(ids.len(), dim)`.
    pub fn forward(&self, ids: &[u32], device: &Device) -> Result<Tensor> {
        let out = self.lookup(ids)?;
        Ok(Tensor::from_vec(out, (ids.len(), self.cols), device)?)
    }

    /// Looks up token rows into a host buffer `ids.len() × dim`.
    pub fn lookup(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let row_bytes = shoal_kernels::row_bytes(self.qtype, self.cols);
        let mut out = vec![0f32; ids.len() * self.cols];
        for (i, &id) in ids.iter().enumerate() {
            let id = id as usize;
            if id >= self.rows {
                return Err(ModelError::BadInput(format!(
                    "token id {id} outside vocabulary of {}",
                    self.rows
                )));
            }
            let row = &self.data[id * row_bytes..(id + 1) * row_bytes];
            shoal_kernels::dequantize_row(
                self.qtype,
                row,
                &mut out[i * self.cols..(i + 1) * self.cols],
            )
            .map_err(|e| ModelError::BadInput(format!("embedding: {e}")))?;
        }
        Ok(out)
    }
}
