//! The Llama family (SmolLM2, Llama 2/3, Mistral) as pipeline stages.
//!
//! A [`LlamaStage`] holds layers `[start, end)`; the first stage also holds the token embedding, the last
//! the final norm and the output head (tied to the embedding when the file has no `output.weight`).
//! Checkpoint tensor names live in `names`. `forward` runs a batch of sequence chunks: rows of the
//! hidden state are the concatenation of every chunk's tokens, so all matrix multiplications are
//! batched across sequences and only attention runs per sequence, against that sequence's KV cache.
//! Hidden states come in and go out (logits on the last stage) as [`HostMatrix`]: the CPU path computes
//! in its buffer, the candle-op path (GPU devices, [`LlamaStage::with_device_ops`]) converts at its start
//! and end.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use shoal_kernels::ThreadPool;

use crate::attention::{self, Heads};
use crate::config::{LayerRange, ModelConfig};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::kv::KvCache;
use crate::linear::{Embedding, QLinear};
use crate::matrix::HostMatrix;
use crate::ops::{self, RopeTable};

/// GGUF tensor names of the Llama family.
pub(crate) mod names {
    pub const TOKEN_EMBD: &str = "token_embd.weight";
    pub const OUTPUT_NORM: &str = "output_norm.weight";
    pub const OUTPUT: &str = "output.weight";
    /// The prefix every tensor name of layer `i` starts with.
    pub fn blk_prefix(i: usize) -> String {
        format!("blk.{i}.")
    }
    pub fn blk(i: usize, part: &str) -> String {
        format!("{}{part}.weight", blk_prefix(i))
    }
}

/// Input of a stage: token ids on the first stage, hidden states `(tokens, dim)` on the others.
pub enum StageInput<'a> {
    Tokens(&'a [u32]),
    Hidden(HostMatrix),
}

/// One sequence's share of a batch: its next `len` tokens (rows of the input, in batch order) start at
/// position `kv.len()`.
pub struct SeqChunk<'a> {
    pub kv: &'a mut KvCache,
    pub len: usize,
    /// On the last stage: produce logits for this chunk's last token.
    pub want_logits: bool,
}

/// An RMS-norm weight, kept for both paths.
struct Norm {
    host: Vec<f32>,
    tensor: Tensor,
}

struct Block {
    attn_norm: Norm,
    wqkv: QLinear,
    wo: QLinear,
    ffn_norm: Norm,
    w_gate_up: QLinear,
    w_down: QLinear,
}

pub struct LlamaStage {
    cfg: ModelConfig,
    range: LayerRange,
    embed: Option<Embedding>,
    blocks: Vec<Block>,
    output_norm: Option<Norm>,
    head: Option<QLinear>,
    cos: Tensor,
    sin: Tensor,
    /// CPU-only state: attention runs on host buffers.
    host: Option<Host>,
    device: Device,
}

struct Host {
    rope: RopeTable,
    pool: Arc<ThreadPool>,
}

impl LlamaStage {
    /// Loads layers `range` (and the embedding / head when the range is first / last) from `gguf`.
    pub fn load(
        gguf: &mut GgufFile,
        range: LayerRange,
        device: &Device,
        pool: &Arc<ThreadPool>,
    ) -> Result<Self> {
        let cfg = ModelConfig::from_gguf(gguf)?;
        let range = LayerRange::new(range.start, range.end, cfg.n_layers)?;
        let norm = |g: &mut GgufFile, name: &str| -> Result<Norm> {
            let v = g.read_f32_vec(name)?;
            if v.len() != cfg.dim {
                return Err(ModelError::BadShape {
                    name: name.into(),
                    got: vec![v.len()],
                    expected: vec![cfg.dim],
                });
            }
            Ok(Norm {
                tensor: Tensor::from_vec(v.clone(), cfg.dim, device)?,
                host: v,
            })
        };
        let mut blocks = Vec::with_capacity(range.len());
        for i in range.start..range.end {
            let qkv_name = names::blk(i, "attn_qkv");
            let qkv = QLinear::concat_rows(
                &qkv_name,
                vec![
                    gguf.read_raw(&names::blk(i, "attn_q"))?,
                    gguf.read_raw(&names::blk(i, "attn_k"))?,
                    gguf.read_raw(&names::blk(i, "attn_v"))?,
                ],
            )?;
            let gu_name = names::blk(i, "ffn_gate_up");
            let gate_up = QLinear::concat_rows(
                &gu_name,
                vec![
                    gguf.read_raw(&names::blk(i, "ffn_gate"))?,
                    gguf.read_raw(&names::blk(i, "ffn_up"))?,
                ],
            )?;
            let wo_name = names::blk(i, "attn_output");
            let down_name = names::blk(i, "ffn_down");
            blocks.push(Block {
                attn_norm: norm(gguf, &names::blk(i, "attn_norm"))?,
                wqkv: QLinear::from_raw(&qkv_name, qkv, device, pool)?,
                wo: QLinear::from_raw(&wo_name, gguf.read_raw(&wo_name)?, device, pool)?,
                ffn_norm: norm(gguf, &names::blk(i, "ffn_norm"))?,
                w_gate_up: QLinear::from_raw(&gu_name, gate_up, device, pool)?,
                w_down: QLinear::from_raw(&down_name, gguf.read_raw(&down_name)?, device, pool)?,
            });
        }
        let first = range.is_first();
        let last = range.is_last(cfg.n_layers);
        let tied = !gguf.has_tensor(names::OUTPUT);
        let embd_raw = if first || (last && tied) {
            Some(gguf.read_raw(names::TOKEN_EMBD)?)
        } else {
            None
        };
        let embed = match (&embd_raw, first) {
            (Some(raw), true) => Some(Embedding::from_raw(names::TOKEN_EMBD, raw)?),
            _ => None,
        };
        let (output_norm, head) = if last {
            let head_raw = match (tied, embd_raw) {
                (true, Some(raw)) => raw,
                _ => gguf.read_raw(names::OUTPUT)?,
            };
            (
                Some(norm(gguf, names::OUTPUT_NORM)?),
                Some(QLinear::from_raw(names::OUTPUT, head_raw, device, pool)?),
            )
        } else {
            (None, None)
        };
        let (cos, sin) = rope_tables(&cfg, device)?;
        let host = device.is_cpu().then(|| Host {
            rope: RopeTable::new(cfg.head_dim, cfg.rope_theta, cfg.context_length),
            pool: pool.clone(),
        });
        Ok(Self {
            host,
            cfg,
            range,
            embed,
            blocks,
            output_norm,
            head,
            cos,
            sin,
            device: device.clone(),
        })
    }

    /// Runs the candle-op path (the one GPU devices use) even on CPU: for tests that keep that path
    /// honest without a GPU.
    pub fn with_device_ops(mut self) -> Self {
        self.host = None;
        self
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn range(&self) -> LayerRange {
        self.range
    }

    pub fn is_first(&self) -> bool {
        self.embed.is_some()
    }

    pub fn is_last(&self) -> bool {
        self.head.is_some()
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The thread pool of the CPU path (`None` on other devices).
    pub fn pool(&self) -> Option<&Arc<ThreadPool>> {
        self.host.as_ref().map(|h| &h.pool)
    }

    /// Bytes per stored key or value in this stage's KV caches.
    pub fn kv_value_bytes(&self) -> usize {
        crate::kv::value_bytes(self.host.is_some())
    }

    /// A fresh KV cache for this stage's layers.
    pub fn new_kv_cache(&self) -> KvCache {
        KvCache::new(
            self.range.len(),
            self.cfg.n_kv_heads,
            self.cfg.head_dim,
            &self.device,
            self.host.is_some(),
        )
    }

    /// Runs the batch. Returns hidden states `(total_tokens, dim)`, or on the last stage the logits
    /// `(chunks wanting logits, vocab)` in batch order.
    pub fn forward(&self, input: StageInput<'_>, seqs: &mut [SeqChunk<'_>]) -> Result<HostMatrix> {
        let total: usize = seqs.iter().map(|s| s.len).sum();
        if seqs.iter().any(|s| s.len == 0) {
            return Err(ModelError::BadInput("empty sequence chunk".into()));
        }
        for s in seqs.iter() {
            let needed = s.kv.len() + s.len;
            if needed > self.cfg.context_length {
                return Err(ModelError::ContextFull {
                    needed,
                    context_length: self.cfg.context_length,
                });
            }
        }
        match &input {
            StageInput::Tokens(ids) if ids.len() != total => {
                return Err(ModelError::BadInput(format!(
                    "{} token ids for {total} rows",
                    ids.len()
                )));
            }
            StageInput::Hidden(h) if h.shape() != [total, self.cfg.dim] => {
                return Err(ModelError::BadInput(format!(
                    "hidden state {:?}, expected [{total}, {}]",
                    h.shape(),
                    self.cfg.dim
                )));
            }
            _ => {}
        }
        match &self.host {
            Some(host) => self.forward_host(host, input, seqs, total),
            // Candle ops on the device, between host matrices.
            None => host_matrix(&self.forward_device(input, seqs, total)?),
        }
    }

    /// The candle-op path (what GPU devices would run): hidden states `(total_tokens, dim)` or logits.
    fn forward_device(
        &self,
        input: StageInput<'_>,
        seqs: &mut [SeqChunk<'_>],
        total: usize,
    ) -> Result<Tensor> {
        let mut x = match (input, &self.embed) {
            (StageInput::Tokens(ids), Some(embed)) => embed.forward(ids, &self.device)?,
            (StageInput::Hidden(h), _) => {
                let shape = (h.rows(), h.cols());
                Tensor::from_vec(h.into_data(), shape, &self.device)?
            }
            (StageInput::Tokens(_), None) => return Err(no_embedding()),
        };
        for s in seqs.iter_mut() {
            s.kv.reserve(s.len)?;
        }
        for (li, blk) in self.blocks.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &blk.attn_norm.tensor, self.cfg.rms_eps)?;
            let qkv = blk.wqkv.forward(&h)?;
            let mut outs = Vec::with_capacity(seqs.len());
            let mut row = 0;
            for s in seqs.iter_mut() {
                outs.push(self.attention(li, &qkv.narrow(0, row, s.len)?, s.kv)?);
                row += s.len;
            }
            let attn = match outs.len() {
                1 => outs.swap_remove(0),
                _ => Tensor::cat(&outs, 0)?,
            };
            x = (x + blk.wo.forward(&attn)?)?;
            let h = candle_nn::ops::rms_norm(&x, &blk.ffn_norm.tensor, self.cfg.rms_eps)?;
            let gu = blk.w_gate_up.forward(&h)?;
            let ffn = self.cfg.ffn_dim;
            let y = (candle_nn::ops::silu(&gu.narrow(1, 0, ffn)?)? * gu.narrow(1, ffn, ffn)?)?;
            x = (x + blk.w_down.forward(&y)?)?;
        }
        for s in seqs.iter_mut() {
            s.kv.advance(s.len);
        }
        let (Some(norm), Some(head)) = (&self.output_norm, &self.head) else {
            return Ok(x);
        };
        let mut rows = Vec::new();
        let mut end = 0;
        for s in seqs.iter() {
            end += s.len;
            if s.want_logits {
                rows.push(end as u32 - 1);
            }
        }
        let picked = if rows.len() == total {
            x
        } else {
            let idx = Tensor::from_vec(rows.clone(), rows.len(), &self.device)?;
            x.index_select(&idx, 0)?
        };
        let h = candle_nn::ops::rms_norm(&picked, &norm.tensor, self.cfg.rms_eps)?;
        head.forward(&h)
    }

    /// The CPU path: every operation on host buffers (see [`crate::ops`] and [`crate::attention`]).
    fn forward_host(
        &self,
        host: &Host,
        input: StageInput<'_>,
        seqs: &mut [SeqChunk<'_>],
        total: usize,
    ) -> Result<HostMatrix> {
        let c = &self.cfg;
        let dim = c.dim;
        let mut x = match (input, &self.embed) {
            (StageInput::Tokens(ids), Some(embed)) => embed.lookup(ids)?,
            (StageInput::Hidden(h), _) => h.into_data(),
            (StageInput::Tokens(_), None) => return Err(no_embedding()),
        };
        for s in seqs.iter_mut() {
            s.kv.reserve(s.len)?;
        }
        let heads = Heads {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        };
        let qd = c.n_heads * c.head_dim;
        let mut h = vec![0f32; total * dim];
        let mut attn = vec![0f32; total * qd];
        let mut act = vec![0f32; total * c.ffn_dim];
        // Matmul outputs and quantized inputs, reused by every layer.
        let (mut qkv, mut o, mut gu, mut down) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut acts = shoal_kernels::Activations::default();
        for (li, blk) in self.blocks.iter().enumerate() {
            ops::rms_norm(&x, &blk.attn_norm.host, c.rms_eps, &mut h);
            blk.wqkv.forward_host_into(&h, total, &mut qkv, &mut acts)?;
            let mut chunks = seqs
                .iter_mut()
                .map(|s| {
                    let (t, pos) = (s.len, s.kv.len());
                    Ok(attention::SeqChunk {
                        t,
                        pos,
                        kv: s.kv.host_layer(li)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            attention::attend(
                &mut qkv,
                &mut chunks,
                heads,
                &host.rope,
                &mut attn,
                &host.pool,
            );
            blk.wo.forward_host_into(&attn, total, &mut o, &mut acts)?;
            ops::add_assign(&mut x, &o);
            ops::rms_norm(&x, &blk.ffn_norm.host, c.rms_eps, &mut h);
            blk.w_gate_up
                .forward_host_into(&h, total, &mut gu, &mut acts)?;
            ops::swiglu_par(&gu, c.ffn_dim, &mut act, &host.pool);
            blk.w_down
                .forward_host_into(&act, total, &mut down, &mut acts)?;
            ops::add_assign(&mut x, &down);
        }
        for s in seqs.iter_mut() {
            s.kv.advance(s.len);
        }
        let (Some(norm), Some(head)) = (&self.output_norm, &self.head) else {
            return HostMatrix::new(total, dim, x);
        };
        let mut picked = Vec::new();
        let mut end = 0;
        for s in seqs.iter() {
            end += s.len;
            if s.want_logits {
                picked.extend_from_slice(&x[(end - 1) * dim..end * dim]);
            }
        }
        let rows = picked.len() / dim;
        let mut normed = vec![0f32; picked.len()];
        ops::rms_norm(&picked, &norm.host, c.rms_eps, &mut normed);
        let logits = head.forward_host(&normed, rows)?;
        HostMatrix::new(rows, head.out_features(), logits)
    }

    /// Self-attention of one sequence chunk; `qkv` is `(t, q_dim + 2 kv_dim)`, returns `(t, q_dim)`.
    fn attention(&self, layer: usize, qkv: &Tensor, kv: &mut KvCache) -> Result<Tensor> {
        let c = &self.cfg;
        let (t, hd, nh, nkv) = (qkv.dim(0)?, c.head_dim, c.n_heads, c.n_kv_heads);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let heads = |off: usize, n: usize| -> Result<Tensor> {
            Ok(qkv
                .narrow(1, off, n * hd)?
                .reshape((1, t, n, hd))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let pos = kv.len();
        let cos = self.cos.narrow(0, pos, t)?;
        let sin = self.sin.narrow(0, pos, t)?;
        let q = candle_nn::rotary_emb::rope_i(&heads(0, nh)?, &cos, &sin)?;
        let k = candle_nn::rotary_emb::rope_i(&heads(qd, nkv)?, &cos, &sin)?;
        let v = heads(qd + kvd, nkv)?;
        let (k_all, v_all) = kv.append(layer, &k.squeeze(0)?, &v.squeeze(0)?)?;
        let total = pos + t;
        let group = nh / nkv;
        // Query heads sharing a KV head are adjacent, so grouping them is a reshape.
        let qg = q.reshape((nkv, group * t, hd))?;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut att = (qg.matmul(&k_all.t()?)? * scale)?;
        if t > 1 {
            let mask: Vec<f32> = (0..t)
                .flat_map(|i| {
                    (0..total).map(move |j| if j > pos + i { f32::NEG_INFINITY } else { 0.0 })
                })
                .collect();
            let mask = Tensor::from_vec(mask, (t, total), &self.device)?;
            att = att
                .reshape((nkv, group, t, total))?
                .broadcast_add(&mask)?
                .reshape((nkv, group * t, total))?;
        }
        let att = candle_nn::ops::softmax_last_dim(&att)?;
        let o = att.matmul(&v_all)?;
        Ok(o.reshape((nh, t, hd))?.transpose(0, 1)?.reshape((t, qd))?)
    }
}

/// A `(rows, cols)` tensor copied into host memory.
fn host_matrix(t: &Tensor) -> Result<HostMatrix> {
    let (rows, cols) = t.dims2()?;
    HostMatrix::new(rows, cols, t.flatten_all()?.to_vec1::<f32>()?)
}

fn no_embedding() -> ModelError {
    ModelError::BadInput("token ids sent to a stage without the embedding".into())
}

fn rope_tables(cfg: &ModelConfig, device: &Device) -> Result<(Tensor, Tensor)> {
    let half = cfg.head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| 1.0 / cfg.rope_theta.powf(2.0 * i as f32 / cfg.head_dim as f32))
        .collect();
    let inv = Tensor::from_vec(inv, (1, half), device)?;
    let pos = Tensor::arange(0u32, cfg.context_length as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((cfg.context_length, 1))?;
    let freqs = pos.broadcast_mul(&inv)?;
    Ok((freqs.cos()?, freqs.sin()?))
}
