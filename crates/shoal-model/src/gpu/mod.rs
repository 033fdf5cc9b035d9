//! One pipeline stage of a decoder-only model on a GPU (shoal-gpu's WGSL kernels through wgpu):
//! [`GpuDecoderStage`], the device twin of [`crate::DecoderStage`].
//!
//! [`GpuDecoderStage::load`] uploads, once, exactly the tensors the CPU stage reads for its layer
//! range (the same [`crate::block::StageSpec`] names them): each layer's matrices stay quantized
//! on the device (repacked at upload), norms and biases as f32 vectors; the token embedding on the
//! first stage, the final norm and output head (or the tied embedding) on the last.
//! [`GpuDecoderStage::run`] takes the same [`StageInput`] and [`SeqChunk`]s (each with its
//! sequence's [`GpuKv`]: keys and values live on the device) and returns the same
//! [`StageOutput`]: hidden states in and out as [`HostMatrix`], logits read back for the chunks that
//! want them, or for a chunk's last n positions ([`GpuDecoderStage::run_rows`]: what speculative
//! decoding verifies; sampling stays on the host), pooled rows computed on the host from the final hidden
//! states exactly as the CPU stage pools them. One command buffer per batch; the layer chain is
//! in `layers`, the feed-forward (dense, or routed experts with their device routing: qwen3moe,
//! qwen2moe, glm4moe, gpt-oss, deepseek2) in `ffn`; gpt-oss's attention sinks and YaRN rope are the
//! attention and rope kernels' options; deepseek2's latent attention is `mla` (its device cache one
//! KV head of `kv_lora + rope`). Refused at load, by name, with a pointer to `--device cpu`: latent
//! attention of the older `attn_kv_b` layout.
//!
//! Numerics: activations stay f32 into every matrix product (the CPU path quantizes them to 8
//! bits as ggml does), so logits differ from the CPU's by that rounding; attention follows
//! llama.cpp's CPU numerics as the CPU stage does (f16 keys, values and queries).

mod ffn;
mod kv;
mod layers;
mod mla;

use std::sync::Arc;

use shoal_gpu::{Gpu, GpuMatrix, GpuVec, KvShape, Rope, RopeMode, RopeYarn};
use shoal_kernels::QMatrix;

pub use kv::GpuKv;

use ffn::GpuFfn;
use mla::GpuMla;

use crate::arch::RopeStyle;
use crate::block::{MatrixSpec, StageSpec, read_norm, read_opt_norm};
use crate::config::{LayerRange, ModelConfig};
use crate::decoder::{
    SeqChunk, StageInput, StageOutput, check_batch, check_embedding_dim, check_head, names,
    pool_rows,
};
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, RawTensor};
use crate::linear::matrix_shape;
use crate::matrix::HostMatrix;
use crate::ops::RopeSpec;

/// Matrices reading one input, outputs side by side, each with its bias when the file has one.
struct GpuLinear {
    parts: Vec<(GpuMatrix, Option<GpuVec>)>,
}

struct GpuBlock {
    attn_norm: GpuVec,
    qkv: GpuLinear,
    /// Latent attention's other tensors (deepseek2): then `qkv` gives `[q_a | kv_a]`.
    mla: Option<GpuMla>,
    q_norm: Option<GpuVec>,
    k_norm: Option<GpuVec>,
    wo: GpuLinear,
    /// Attention sinks (gpt-oss): one logit per query head.
    sinks: Option<GpuVec>,
    post_attn_norm: Option<GpuVec>,
    ffn_norm: GpuVec,
    ffn: GpuFfn,
    post_ffn_norm: Option<GpuVec>,
    local: bool,
}

/// A rotary embedding and its frequency factors on the device.
struct GpuRope {
    spec: RopeSpec,
    factors: Option<GpuVec>,
}

impl GpuRope {
    fn new(gpu: &Gpu, spec: RopeSpec) -> Result<Self> {
        let factors = spec.factors.as_deref().map(|f| gpu.upload(f)).transpose()?;
        Ok(Self { spec, factors })
    }

    fn rope(&self, head_dim: usize) -> Rope<'_> {
        let spec = &self.spec;
        let yarn = spec.yarn.map(|y| {
            let corr = y.corr_dims(spec.dims, spec.theta);
            RopeYarn {
                ext_factor: y.ext_factor,
                // The cos/sin scale is the same for every pair.
                mscale: y.angle(0.0, spec.freq_scale, corr, 0).1,
                corr,
            }
        });
        Rope {
            mode: match self.spec.style {
                RopeStyle::Interleaved => RopeMode::Interleaved,
                RopeStyle::Neox => RopeMode::Neox,
            },
            head_dim,
            dims: self.spec.dims,
            theta: self.spec.theta,
            freq_scale: self.spec.freq_scale,
            factors: self.factors.as_ref(),
            yarn,
        }
    }
}

/// Layers `[start, end)` of a model on one GPU.
pub struct GpuDecoderStage {
    gpu: Arc<Gpu>,
    cfg: ModelConfig,
    range: LayerRange,
    /// The first stage's token lookup: the embedding table on the device (every format; shared
    /// with a tied head).
    lookup: Option<Arc<GpuMatrix>>,
    blocks: Vec<GpuBlock>,
    /// The final norm, on the device and (for pooling) on the host.
    output_norm: Option<(GpuVec, Vec<f32>)>,
    head: Option<Arc<GpuMatrix>>,
    rope_global: GpuRope,
    rope_local: GpuRope,
}

/// A `[rows, cols]` weight tensor uploaded to `gpu`.
fn upload(gpu: &Gpu, name: &str, raw: &RawTensor) -> Result<GpuMatrix> {
    let (rows, cols, qtype) = matrix_shape(name, raw)?;
    let m = QMatrix::new(qtype, rows, cols, &raw.data)
        .map_err(|e| ModelError::BadInput(format!("{name}: {e}")))?;
    Ok(gpu.upload_matrix(&m)?)
}

fn load_linear(g: &mut GgufFile, gpu: &Gpu, spec: &MatrixSpec) -> Result<GpuLinear> {
    let mut parts = Vec::with_capacity(spec.parts.len());
    let mut out = 0;
    for p in &spec.parts {
        let w = upload(gpu, &p.weight, &g.read_raw(&p.weight)?)?;
        let bias = match &p.bias {
            Some(b) => {
                let v = g.read_f32_vec(b)?;
                if v.len() != w.rows() {
                    return Err(ModelError::BadShape {
                        name: b.clone(),
                        got: vec![v.len()],
                        expected: vec![w.rows()],
                    });
                }
                Some(gpu.upload(&v)?)
            }
            None => None,
        };
        out += w.rows();
        if w.cols() != spec.input {
            spec.check(out, w.cols())?;
        }
        parts.push((w, bias));
    }
    spec.check(out, spec.input)?;
    Ok(GpuLinear { parts })
}

fn upload_norm(g: &mut GgufFile, gpu: &Gpu, spec: &crate::block::NormSpec) -> Result<GpuVec> {
    Ok(gpu.upload(&read_norm(g, spec)?)?)
}

fn upload_opt_norm(
    g: &mut GgufFile,
    gpu: &Gpu,
    spec: &Option<crate::block::NormSpec>,
) -> Result<Option<GpuVec>> {
    read_opt_norm(g, spec)?
        .map(|v| gpu.upload(&v).map_err(ModelError::from))
        .transpose()
}

impl GpuDecoderStage {
    /// Loads layers `range` (and the embedding / head when the range is first / last) from
    /// `gguf` onto `gpu`, reading only those tensors.
    pub fn load(gguf: &mut GgufFile, range: LayerRange, gpu: &Arc<Gpu>) -> Result<Self> {
        let cfg = ModelConfig::from_gguf(gguf)?;
        let spec = StageSpec::describe(gguf, &cfg, range)?;
        let mut blocks = Vec::with_capacity(spec.blocks.len());
        for b in &spec.blocks {
            blocks.push(GpuBlock {
                attn_norm: upload_norm(gguf, gpu, &b.attn_norm)?,
                qkv: load_linear(gguf, gpu, &b.qkv)?,
                mla: match &b.mla {
                    Some(m) => Some(GpuMla::load(gguf, gpu, m, cfg.n_heads)?),
                    None => None,
                },
                q_norm: upload_opt_norm(gguf, gpu, &b.q_norm)?,
                k_norm: upload_opt_norm(gguf, gpu, &b.k_norm)?,
                wo: load_linear(gguf, gpu, &b.wo)?,
                sinks: upload_opt_norm(gguf, gpu, &b.sinks)?,
                post_attn_norm: upload_opt_norm(gguf, gpu, &b.post_attn_norm)?,
                ffn_norm: upload_norm(gguf, gpu, &b.ffn_norm)?,
                ffn: GpuFfn::load(gguf, gpu, &b.ffn, &cfg.architecture)?,
                post_ffn_norm: upload_opt_norm(gguf, gpu, &b.post_ffn_norm)?,
                local: b.local,
            });
        }
        let mut lookup = None;
        let mut table = None;
        if spec.embedding {
            let raw = gguf.read_raw(names::TOKEN_EMBD)?;
            let t = Arc::new(upload(gpu, names::TOKEN_EMBD, &raw)?);
            check_embedding_dim(t.cols(), &cfg)?;
            if spec.first {
                lookup = Some(t.clone());
            }
            table = Some(t);
        }
        let (output_norm, head) = match &spec.last {
            Some(last) => {
                let head = match (table, last.tied) {
                    (Some(t), true) => t,
                    _ => Arc::new(upload(gpu, names::OUTPUT, &gguf.read_raw(names::OUTPUT)?)?),
                };
                check_head(head.rows(), head.cols(), &cfg)?;
                let norm = read_norm(gguf, &last.norm)?;
                (Some((gpu.upload(&norm)?, norm)), Some(head))
            }
            None => (None, None),
        };
        Ok(Self {
            rope_global: GpuRope::new(gpu, spec.rope_global)?,
            rope_local: GpuRope::new(gpu, spec.rope_local)?,
            gpu: gpu.clone(),
            cfg,
            range: spec.range,
            lookup,
            blocks,
            output_norm,
            head,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn range(&self) -> LayerRange {
        self.range
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn is_first(&self) -> bool {
        self.lookup.is_some()
    }

    pub fn is_last(&self) -> bool {
        self.head.is_some()
    }

    /// Bytes per stored key or value in this stage's KV caches (f16).
    pub fn kv_value_bytes(&self) -> usize {
        crate::kv::VALUE_BYTES
    }

    /// The shape of this stage's device KV caches (capacity 0: they grow as needed).
    /// Latent attention's: one KV head of `kv_lora + rope` values, keys only (the key is its own value).
    fn kv_shape(&self) -> KvShape {
        let (n_kv_heads, head_dim) = match self.cfg.arch.mla {
            Some(a) => (1, a.kv_lora + a.rope),
            None => (self.cfg.n_kv_heads, self.cfg.head_dim),
        };
        KvShape {
            layers: self.range.len(),
            capacity: 0,
            n_heads: self.cfg.n_heads,
            n_kv_heads,
            head_dim,
            keys_only: self.cfg.arch.mla.is_some(),
        }
    }

    /// A fresh KV cache on the device for this stage's layers.
    pub fn new_kv_cache(&self) -> GpuKv {
        GpuKv::new(self.gpu.clone(), self.kv_shape())
    }

    /// Runs the batch: hidden states `(total tokens, dim)`, or on the last stage the logits
    /// `(chunks wanting logits, vocab)` in batch order ([`GpuDecoderStage::run`]'s main output).
    pub fn forward(
        &self,
        input: StageInput<'_>,
        seqs: &mut [SeqChunk<'_, GpuKv>],
    ) -> Result<HostMatrix> {
        self.run(input, seqs).map(|out| out.main)
    }

    /// Runs the batch as [`crate::DecoderStage::run`] does, on the device.
    pub fn run(
        &self,
        input: StageInput<'_>,
        seqs: &mut [SeqChunk<'_, GpuKv>],
    ) -> Result<StageOutput> {
        self.run_inner(input, seqs, None)
    }

    /// [`GpuDecoderStage::run`] with `rows[i]` logits rows for chunk `i` — those of its last
    /// `rows[i]` tokens, in order — as [`crate::DecoderStage::run_rows`] does (speculative decoding
    /// verifies a drafted run with one row per position). `rows` has one entry per chunk.
    pub fn run_rows(
        &self,
        input: StageInput<'_>,
        seqs: &mut [SeqChunk<'_, GpuKv>],
        rows: &[usize],
    ) -> Result<StageOutput> {
        crate::decoder::check_row_counts(seqs, Some(rows))?;
        self.run_inner(input, seqs, Some(rows))
    }

    fn run_inner(
        &self,
        input: StageInput<'_>,
        seqs: &mut [SeqChunk<'_, GpuKv>],
        logit_rows: Option<&[usize]>,
    ) -> Result<StageOutput> {
        let total = check_batch(seqs.iter().map(|s| (s.kv.len(), s.len)), &self.cfg)?;
        let dim = self.cfg.dim;
        let x = self.gpu.zeros(total * dim)?;
        let mut cmd = self.gpu.commands();
        match (input, &self.lookup) {
            (StageInput::Tokens(ids), Some(_)) if ids.len() != total => {
                return Err(ModelError::BadInput(format!(
                    "{} token ids for {total} rows",
                    ids.len()
                )));
            }
            (StageInput::Tokens(ids), Some(t)) => {
                let row = self.gpu.zeros(dim)?;
                for (r, &id) in ids.iter().enumerate() {
                    cmd.embed(t, id as usize, self.cfg.arch.embed_scale, &row)?;
                    cmd.copy_rows(&row, (0, 0), &x, (r * dim, 0), 1, dim)?;
                }
            }
            (StageInput::Hidden(h), _) if h.shape() == [total, dim] => {
                self.gpu.write(&x, h.data())?;
            }
            (StageInput::Hidden(h), _) => {
                return Err(ModelError::BadInput(format!(
                    "hidden state {:?}, expected [{total}, {dim}]",
                    h.shape()
                )));
            }
            (StageInput::Tokens(_), None) => {
                return Err(ModelError::BadInput(
                    "token ids sent to a stage without the embedding".into(),
                ));
            }
        }
        for s in seqs.iter_mut() {
            s.kv.reserve(s.len)?;
        }
        let x = self.layers(&mut cmd, x, seqs, total)?;
        cmd.submit()?;
        for s in seqs.iter_mut() {
            s.kv.advance(s.len);
        }
        let (Some((norm, host_norm)), Some(head)) = (&self.output_norm, &self.head) else {
            return Ok(StageOutput {
                main: HostMatrix::new(total, dim, self.gpu.read(&x)?)?,
                pooled: HostMatrix::default(),
            });
        };
        let pooled = if seqs.iter().any(|s| s.pool != crate::Pool::None) {
            let states = self.gpu.read(&x)?;
            pool_rows(&states, seqs, host_norm, dim, self.cfg.rms_eps)?
        } else {
            HostMatrix::new(0, dim, Vec::new())?
        };
        // Each chunk's logits rows are its last `n`: one run of rows to copy per chunk.
        let mut runs = Vec::new();
        let mut end = 0;
        for (i, s) in seqs.iter().enumerate() {
            end += s.len;
            let n = logit_rows.map_or(usize::from(s.want_logits), |r| r[i]);
            if n > 0 {
                runs.push((end - n, n));
            }
        }
        let total: usize = runs.iter().map(|&(_, n)| n).sum();
        if total == 0 {
            return Ok(StageOutput {
                main: HostMatrix::new(0, head.rows(), Vec::new())?,
                pooled,
            });
        }
        let mut cmd = self.gpu.commands();
        let picked = self.gpu.zeros(total * dim)?;
        let mut at = 0;
        for (first, n) in runs {
            cmd.copy_rows(&x, (first * dim, dim), &picked, (at * dim, dim), n, dim)?;
            at += n;
        }
        let normed = self.gpu.zeros(total * dim)?;
        cmd.rms_norm(&picked, norm, self.cfg.rms_eps, &normed)?;
        let logits = self.gpu.zeros(total * head.rows())?;
        cmd.matmat(head, &normed, &logits)?;
        cmd.submit()?;
        Ok(StageOutput {
            main: HostMatrix::new(total, head.rows(), self.gpu.read(&logits)?)?,
            pooled,
        })
    }
}
