//! One pipeline stage of a decoder-only model, for every architecture of [`crate::arch`].
//!
//! A [`DecoderStage`] holds layers `[start, end)`; the first stage also holds the token embedding, the
//! last the final norm and the output head (the embedding matrix itself when the file has no
//! `output.weight`). Checkpoint tensor names live in `names`. Each layer is
//! `x += post_norm(attn(norm(x)))`, `x += post_norm(ffn(norm(x)))`, where the optional pieces (Q/K/V
//! biases, per-head Q/K norms, post norms, fused QKV or gate+up) are used when the file has their tensors
//! and the rest (rotary style, activation, sliding windows, embedding scale) comes from
//! [`crate::config::ArchParams`].
//!
//! `forward` runs a batch of sequence chunks: rows of the hidden state are the concatenation of every
//! chunk's tokens, so all matrix multiplications are batched across sequences and only attention runs
//! per sequence, against that sequence's KV cache. Hidden states come in and go out (logits on the last
//! stage) as [`HostMatrix`].

use std::sync::Arc;

use shoal_kernels::ThreadPool;

use crate::attention::{self, AttnSpec, Heads};
use crate::config::{LayerRange, ModelConfig};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::kv::{KvCache, VALUE_BYTES};
use crate::linear::{Embedding, LinearScratch, LinearSet, Part, QLinear};
use crate::matrix::HostMatrix;
use crate::ops::{self, RopeRows, RopeSpec};

/// GGUF tensor names (llama.cpp's `LLM_TENSOR_*`).
pub(crate) use crate::gguf::names;

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
    /// On the last stage: what to return of this chunk's final hidden states (embeddings).
    pub pool: Pool,
}

/// What the last stage returns of a chunk's final hidden states — after the output norm, what
/// llama.cpp's embedding mode pools — besides logits: nothing, the sum of its rows, its last row or its
/// first row (one row of [`StageOutput::pooled`] per chunk that asks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pool {
    #[default]
    None,
    Sum,
    Last,
    First,
}

/// What [`DecoderStage::run`] computed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageOutput {
    /// Hidden states `(total tokens, dim)`, or on the last stage the logits `(chunks wanting logits,
    /// vocab)` in batch order.
    pub main: HostMatrix,
    /// On the last stage, one row `(dim)` per chunk whose [`SeqChunk::pool`] asks, in batch order
    /// (`0 × dim` when none does); empty elsewhere.
    pub pooled: HostMatrix,
}

struct Block {
    attn_norm: Vec<f32>,
    /// Outputs `[q | k | v]`.
    qkv: LinearSet,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    wo: LinearSet,
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    /// Outputs `[gate | up]`.
    gate_up: LinearSet,
    down: LinearSet,
    post_ffn_norm: Option<Vec<f32>>,
    /// A sliding-window layer.
    local: bool,
}

pub struct DecoderStage {
    cfg: ModelConfig,
    range: LayerRange,
    embed: Option<Embedding>,
    blocks: Vec<Block>,
    output_norm: Option<Vec<f32>>,
    head: Option<LinearSet>,
    rope_global: RopeSpec,
    rope_local: RopeSpec,
    pool: Arc<ThreadPool>,
}

/// Reads an optional F32 vector of `len` values.
fn opt_vec(g: &mut GgufFile, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
    if !g.has_tensor(name) {
        return Ok(None);
    }
    vector(g, name, len).map(Some)
}

/// Reads an F32 vector of `len` values (norm weights).
fn vector(g: &mut GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let v = g.read_f32_vec(name)?;
    if v.len() != len {
        return Err(ModelError::BadShape {
            name: name.into(),
            got: vec![v.len()],
            expected: vec![len],
        });
    }
    Ok(v)
}

fn check_out(set: &LinearSet, name: &str, out: usize, input: usize) -> Result<()> {
    if set.out_features() != out || set.in_features() != input {
        return Err(ModelError::BadShape {
            name: name.into(),
            got: vec![set.out_features(), set.in_features()],
            expected: vec![out, input],
        });
    }
    Ok(())
}

fn load_block(g: &mut GgufFile, cfg: &ModelConfig, i: usize) -> Result<Block> {
    let (dim, hd) = (cfg.dim, cfg.head_dim);
    let (qd, kvd) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
    let w = |p: &str| names::blk(i, p);
    let b = |p: &str| names::blk_bias(i, p);
    let fused_qkv = g.has_tensor(&w("attn_qkv"));
    let qkv = if fused_qkv {
        let (wn, bn) = (w("attn_qkv"), b("attn_qkv"));
        LinearSet::load(
            g,
            &[Part {
                weight: &wn,
                bias: Some(&bn),
            }],
        )?
    } else {
        let names: Vec<(String, String)> = ["attn_q", "attn_k", "attn_v"]
            .iter()
            .map(|p| (w(p), b(p)))
            .collect();
        let parts: Vec<Part<'_>> = names
            .iter()
            .map(|(wn, bn)| Part {
                weight: wn,
                bias: Some(bn),
            })
            .collect();
        LinearSet::load(g, &parts)?
    };
    check_out(&qkv, &w("attn_qkv"), qd + 2 * kvd, dim)?;
    let wo = LinearSet::load(
        g,
        &[Part {
            weight: &w("attn_output"),
            bias: None,
        }],
    )?;
    check_out(&wo, &w("attn_output"), dim, qd)?;
    let gate_up = if g.has_tensor(&w("ffn_gate")) {
        let (gn, un) = (w("ffn_gate"), w("ffn_up"));
        LinearSet::load(
            g,
            &[
                Part {
                    weight: &gn,
                    bias: None,
                },
                Part {
                    weight: &un,
                    bias: None,
                },
            ],
        )?
    } else {
        // Phi-3: `ffn_up` holds gate and up stacked.
        LinearSet::load(
            g,
            &[Part {
                weight: &w("ffn_up"),
                bias: None,
            }],
        )?
    };
    check_out(&gate_up, &w("ffn_up"), 2 * cfg.ffn_dim, dim)?;
    let down = LinearSet::load(
        g,
        &[Part {
            weight: &w("ffn_down"),
            bias: None,
        }],
    )?;
    check_out(&down, &w("ffn_down"), dim, cfg.ffn_dim)?;
    Ok(Block {
        attn_norm: vector(g, &w("attn_norm"), dim)?,
        qkv,
        q_norm: opt_vec(g, &w("attn_q_norm"), hd)?,
        k_norm: opt_vec(g, &w("attn_k_norm"), hd)?,
        wo,
        post_attn_norm: opt_vec(g, &w("post_attention_norm"), dim)?,
        ffn_norm: vector(g, &w("ffn_norm"), dim)?,
        gate_up,
        down,
        post_ffn_norm: opt_vec(g, &w("post_ffw_norm"), dim)?,
        local: cfg.arch.local_layers.get(i).copied().unwrap_or(false),
    })
}

impl DecoderStage {
    /// Loads layers `range` (and the embedding / head when the range is first / last) from `gguf`,
    /// reading only those tensors.
    pub fn load(gguf: &mut GgufFile, range: LayerRange, pool: &Arc<ThreadPool>) -> Result<Self> {
        let cfg = ModelConfig::from_gguf(gguf)?;
        let range = LayerRange::new(range.start, range.end, cfg.n_layers)?;
        let blocks = (range.start..range.end)
            .map(|i| load_block(gguf, &cfg, i))
            .collect::<Result<Vec<_>>>()?;
        let first = range.is_first();
        let last = range.is_last(cfg.n_layers);
        let tied = !gguf.has_tensor(names::OUTPUT);
        let embed = if first || (last && tied) {
            let e = Embedding::from_raw(names::TOKEN_EMBD, gguf.read_raw(names::TOKEN_EMBD)?)?;
            if e.dim() != cfg.dim {
                return Err(ModelError::BadShape {
                    name: names::TOKEN_EMBD.into(),
                    got: vec![e.dim()],
                    expected: vec![cfg.dim],
                });
            }
            Some(e)
        } else {
            None
        };
        let (output_norm, head) = if last {
            let head = match (&embed, tied) {
                (Some(e), true) => LinearSet::single(QLinear::new(e.shared(), None)?),
                _ => LinearSet::load(
                    gguf,
                    &[Part {
                        weight: names::OUTPUT,
                        bias: None,
                    }],
                )?,
            };
            check_out(&head, names::OUTPUT, head.out_features(), cfg.dim)?;
            (Some(vector(gguf, names::OUTPUT_NORM, cfg.dim)?), Some(head))
        } else {
            (None, None)
        };
        let factors = match () {
            _ if gguf.has_tensor(names::ROPE_FREQS) => Some(gguf.read_f32_vec(names::ROPE_FREQS)?),
            _ if gguf.has_tensor(names::ROPE_FACTORS_SHORT) => {
                Some(gguf.read_f32_vec(names::ROPE_FACTORS_SHORT)?)
            }
            _ => None,
        };
        let a = &cfg.arch;
        if let Some(f) = &factors
            && f.len() != a.rope_dims / 2
        {
            return Err(ModelError::BadShape {
                name: names::ROPE_FREQS.into(),
                got: vec![f.len()],
                expected: vec![a.rope_dims / 2],
            });
        }
        let rope_global = RopeSpec {
            style: a.rope,
            dims: a.rope_dims,
            theta: cfg.rope_theta,
            freq_scale: a.rope_freq_scale,
            factors,
        };
        let rope_local = RopeSpec {
            theta: a.local_rope_theta,
            freq_scale: 1.0,
            factors: None,
            ..rope_global.clone()
        };
        Ok(Self {
            embed: embed.filter(|_| first),
            cfg,
            range,
            blocks,
            output_norm,
            head,
            rope_global,
            rope_local,
            pool: pool.clone(),
        })
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

    /// The thread pool the stage computes on.
    pub fn pool(&self) -> &Arc<ThreadPool> {
        &self.pool
    }

    /// Bytes per stored key or value in this stage's KV caches.
    pub fn kv_value_bytes(&self) -> usize {
        VALUE_BYTES
    }

    /// A fresh KV cache for this stage's layers.
    pub fn new_kv_cache(&self) -> KvCache {
        KvCache::new(self.range.len(), self.cfg.n_kv_heads, self.cfg.head_dim)
    }

    /// Runs the batch. Returns hidden states `(total_tokens, dim)`, or on the last stage the logits
    /// `(chunks wanting logits, vocab)` in batch order ([`DecoderStage::run`] without pooled rows).
    pub fn forward(&self, input: StageInput<'_>, seqs: &mut [SeqChunk<'_>]) -> Result<HostMatrix> {
        self.run(input, seqs).map(|out| out.main)
    }

    /// Runs the batch: [`DecoderStage::forward`]'s output and, on the last stage, the pooled final
    /// hidden states of the chunks that ask ([`SeqChunk::pool`]).
    pub fn run(&self, input: StageInput<'_>, seqs: &mut [SeqChunk<'_>]) -> Result<StageOutput> {
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
        let mut x = match (input, &self.embed) {
            (StageInput::Tokens(ids), Some(embed)) if ids.len() == total => {
                embed.lookup(ids, self.cfg.arch.embed_scale)?
            }
            (StageInput::Tokens(ids), Some(_)) => {
                return Err(ModelError::BadInput(format!(
                    "{} token ids for {total} rows",
                    ids.len()
                )));
            }
            (StageInput::Hidden(h), _) if h.shape() == [total, self.cfg.dim] => h.into_data(),
            (StageInput::Hidden(h), _) => {
                return Err(ModelError::BadInput(format!(
                    "hidden state {:?}, expected [{total}, {}]",
                    h.shape(),
                    self.cfg.dim
                )));
            }
            (StageInput::Tokens(_), None) => {
                return Err(ModelError::BadInput(
                    "token ids sent to a stage without the embedding".into(),
                ));
            }
        };
        for s in seqs.iter_mut() {
            s.kv.reserve(s.len)?;
        }
        self.layers(&mut x, seqs, total)?;
        for s in seqs.iter_mut() {
            s.kv.advance(s.len);
        }
        let (Some(norm), Some(head)) = (&self.output_norm, &self.head) else {
            return Ok(StageOutput {
                main: HostMatrix::new(total, self.cfg.dim, x)?,
                pooled: HostMatrix::default(),
            });
        };
        let dim = self.cfg.dim;
        let pooled = self.pool_rows(&x, seqs, norm)?;
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
        ops::rms_norm(&picked, norm, self.cfg.rms_eps, &mut normed);
        let mut logits = Vec::new();
        head.forward(
            &normed,
            rows,
            &mut logits,
            &mut LinearScratch::default(),
            &self.pool,
        )?;
        Ok(StageOutput {
            main: HostMatrix::new(rows, head.out_features(), logits)?,
            pooled,
        })
    }

    /// The last stage's pooled rows: for each chunk that asks, the final-normed rows of its tokens in
    /// `x` summed, or its last or first one (`0 × dim` when no chunk asks).
    fn pool_rows(&self, x: &[f32], seqs: &[SeqChunk<'_>], norm: &[f32]) -> Result<HostMatrix> {
        let dim = self.cfg.dim;
        let mut out = Vec::new();
        let mut normed = vec![0f32; dim];
        let mut start = 0;
        for s in seqs {
            let rows = start..start + s.len;
            start += s.len;
            let pick = match s.pool {
                Pool::None => continue,
                Pool::Sum => rows,
                Pool::Last => rows.end - 1..rows.end,
                Pool::First => rows.start..rows.start + 1,
            };
            let mut acc = vec![0f32; dim];
            for r in pick {
                ops::rms_norm(
                    &x[r * dim..(r + 1) * dim],
                    norm,
                    self.cfg.rms_eps,
                    &mut normed,
                );
                ops::add_assign(&mut acc, &normed);
            }
            out.extend_from_slice(&acc);
        }
        HostMatrix::new(out.len() / dim.max(1), dim, out)
    }

    /// Every layer of the stage over the batch's hidden states `x` (`total × dim`), in place.
    fn layers(&self, x: &mut [f32], seqs: &mut [SeqChunk<'_>], total: usize) -> Result<()> {
        let c = &self.cfg;
        let (dim, hd) = (c.dim, c.head_dim);
        let (qd, kvd) = (c.n_heads * hd, c.n_kv_heads * hd);
        let positions = || seqs.iter().flat_map(|s| s.kv.len()..s.kv.len() + s.len);
        let rope_global = RopeRows::new(&self.rope_global, positions());
        let any_local = self.blocks.iter().any(|b| b.local);
        let rope_local = any_local.then(|| RopeRows::new(&self.rope_local, positions()));
        let mut h = vec![0f32; total * dim];
        let mut attn = vec![0f32; total * qd];
        let mut act = vec![0f32; total * c.ffn_dim];
        // Matmul outputs and quantized inputs, reused by every layer.
        let (mut qkv, mut o, mut gu, mut down) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut scratch = LinearScratch::default();
        let pool = &*self.pool;
        for (li, blk) in self.blocks.iter().enumerate() {
            ops::rms_norm(x, &blk.attn_norm, c.rms_eps, &mut h);
            blk.qkv.forward(&h, total, &mut qkv, &mut scratch, pool)?;
            for row in qkv.chunks_exact_mut(qd + 2 * kvd) {
                if let Some(w) = &blk.q_norm {
                    ops::rms_norm_in_place(&mut row[..qd], w, c.rms_eps);
                }
                if let Some(w) = &blk.k_norm {
                    ops::rms_norm_in_place(&mut row[qd..qd + kvd], w, c.rms_eps);
                }
            }
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
            let spec = AttnSpec {
                heads: Heads {
                    n_heads: c.n_heads,
                    n_kv_heads: c.n_kv_heads,
                    head_dim: hd,
                },
                window: if blk.local { c.arch.sliding_window } else { 0 },
                query_scale: c.arch.query_scale,
            };
            let rope = match (&rope_local, blk.local) {
                (Some(r), true) => r,
                _ => &rope_global,
            };
            attention::attend(&mut qkv, &mut chunks, spec, rope, &mut attn, pool);
            blk.wo.forward(&attn, total, &mut o, &mut scratch, pool)?;
            residual(x, &mut o, blk.post_attn_norm.as_deref(), c.rms_eps, &mut h);
            ops::rms_norm(x, &blk.ffn_norm, c.rms_eps, &mut h);
            blk.gate_up
                .forward(&h, total, &mut gu, &mut scratch, pool)?;
            ops::gated_par(c.arch.activation, &gu, c.ffn_dim, &mut act, pool);
            blk.down
                .forward(&act, total, &mut down, &mut scratch, pool)?;
            residual(
                x,
                &mut down,
                blk.post_ffn_norm.as_deref(),
                c.rms_eps,
                &mut h,
            );
        }
        Ok(())
    }
}

/// `x += y`, or `x += rms_norm(y)` with a post norm (`tmp` is room for the normed rows).
fn residual(x: &mut [f32], y: &mut [f32], post_norm: Option<&[f32]>, eps: f32, tmp: &mut [f32]) {
    match post_norm {
        Some(w) => {
            ops::rms_norm(y, w, eps, tmp);
            ops::add_assign(x, tmp);
        }
        None => ops::add_assign(x, y),
    }
}
