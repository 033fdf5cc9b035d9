//! One pipeline stage of a decoder-only model, for every architecture of [`crate::arch`].
//!
//! A [`DecoderStage`] holds layers `[start, end)`; the first stage also holds the token embedding, the
//! last the final norm and the output head (the embedding matrix itself when the file has no
//! `output.weight`). Checkpoint tensor names live in `names`. Each layer is
//! `x += post_norm(attn(norm(x)))`, `x += post_norm(ffn(norm(x)))`, where the optional pieces (Q/K/V
//! biases, per-head Q/K norms, post norms, fused QKV or gate+up, attention sinks) are used when the file has
//! their tensors
//! and the rest (rotary style, activation, sliding windows, embedding scale) comes from
//! [`crate::config::ArchParams`]. The feed-forward is dense or a mixture of experts ([`crate::ffn`]); the
//! attention is the ordinary one ([`crate::attention`]) or latent attention ([`crate::mla`]: deepseek2).
//!
//! `forward` runs a batch of sequence chunks: rows of the hidden state are the concatenation of every
//! chunk's tokens, so all matrix multiplications are batched across sequences and only attention runs
//! per sequence, against that sequence's KV cache. Hidden states come in and go out (logits on the last
//! stage) as [`HostMatrix`].

use std::sync::Arc;

use shoal_kernels::ThreadPool;

use crate::attention::{self, AttnSpec, Heads};
use crate::block::{BlockSpec, StageSpec, read_norm, read_opt_norm};
use crate::config::{LayerRange, ModelConfig};
use crate::error::{ModelError, Result};
use crate::ffn::{Ffn, FfnScratch, load_set};
use crate::gguf::GgufFile;
use crate::kv::{KvCache, VALUE_BYTES};
use crate::linear::{Embedding, LinearScratch, LinearSet, Part, QLinear};
use crate::matrix::HostMatrix;
use crate::mla::{MlaAttn, MlaScratch};
use crate::ops::{self, RopeRows, RopeSpec};
use crate::split::{self, BlockSlice, Share};

pub mod nextn;
use nextn::Nextn;

/// GGUF tensor names (llama.cpp's `LLM_TENSOR_*`).
pub(crate) use crate::gguf::names;

/// Input of a stage: token ids on the first stage, hidden states `(tokens, dim)` on the others.
pub enum StageInput<'a> {
    Tokens(&'a [u32]),
    Hidden(HostMatrix),
}

/// One sequence's share of a batch: its next `len` tokens (rows of the input, in batch order) start at
/// position `kv.len()`.
/// `K` is the sequence's cache: [`KvCache`] on the host, [`crate::gpu::GpuKv`] on a GPU stage.
pub struct SeqChunk<'a, K = KvCache> {
    pub kv: &'a mut K,
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
    /// False on a tensor-parallel member holding none of the heads: its attention's partial sum is
    /// zero (`qkv` and `wo` are empty).
    attends: bool,
    attn_norm: Vec<f32>,
    /// Outputs `[q | k | v]` (latent attention: `[q_a | kv_a]`).
    qkv: LinearSet,
    /// Latent attention's other weights (deepseek2).
    mla: Option<MlaAttn>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    wo: LinearSet,
    /// Attention sinks, one logit per query head (gpt-oss).
    sinks: Option<Vec<f32>>,
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    /// Dense or a mixture of experts.
    ffn: Ffn,
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
    /// On a split last stage: this member's rows of the head and the head's rows in all (its logits
    /// are made whole by one more all-reduce, every member taking part, rows or none).
    split_head: Option<(std::ops::Range<usize>, usize)>,
    /// This member's slice of the layers when they are split over several ([`crate::split`]).
    share: Option<Share>,
    /// On a whole last stage of a file with one, when asked ([`DecoderStage::load_nextn`]): the
    /// multi-token-prediction block ([`nextn`]), which the stage's own passes never run.
    nextn: Option<Arc<Nextn>>,
}

/// A hidden-state partial sum of a split stage made whole: every member's added in rank order, in
/// place (`rows × dim`), twice a layer (after the attention output and the feed-forward).
pub type Reduce<'a> = dyn FnMut(&mut [f32]) -> Result<()> + 'a;

/// Layer `spec` (of a model of shape `cfg`), whole or `share`'s slice of it.
fn load_block(
    g: &mut GgufFile,
    spec: &BlockSpec,
    cfg: &ModelConfig,
    share: Option<&Share>,
) -> Result<Block> {
    let (qkv, wo, ffn, sinks, mla) = match share {
        None => (
            load_set(g, &spec.qkv)?,
            load_set(g, &spec.wo)?,
            Ffn::load(g, &spec.ffn)?,
            read_opt_norm(g, &spec.sinks)?,
            match &spec.mla {
                Some(m) => Some(MlaAttn::load(g, m, cfg.n_heads)?),
                None => None,
            },
        ),
        Some(share) => {
            let at = BlockSlice::load(g, share, cfg, spec)?;
            let (qkv, wo) = match at.attention {
                Some(a) => a,
                None => (
                    LinearSet::from_raws(Vec::new())?,
                    LinearSet::from_raws(Vec::new())?,
                ),
            };
            (
                qkv,
                wo,
                at.ffn,
                read_opt_norm(g, &spec.sinks)?.map(|s| s[at.sinks].to_vec()),
                at.mla,
            )
        }
    };
    Ok(Block {
        attends: share.is_none_or(Share::attends),
        qkv,
        mla,
        wo,
        ffn,
        attn_norm: read_norm(g, &spec.attn_norm)?,
        q_norm: read_opt_norm(g, &spec.q_norm)?,
        k_norm: read_opt_norm(g, &spec.k_norm)?,
        sinks,
        post_attn_norm: read_opt_norm(g, &spec.post_attn_norm)?,
        ffn_norm: read_norm(g, &spec.ffn_norm)?,
        post_ffn_norm: read_opt_norm(g, &spec.post_ffn_norm)?,
        local: spec.local,
    })
}

/// Checks a loaded output head's width.
pub(crate) fn check_head(rows: usize, cols: usize, cfg: &ModelConfig) -> Result<()> {
    if cols != cfg.dim {
        return Err(ModelError::BadShape {
            name: names::OUTPUT.into(),
            got: vec![rows, cols],
            expected: vec![rows, cfg.dim],
        });
    }
    Ok(())
}

/// Checks a loaded embedding table's width.
pub(crate) fn check_embedding_dim(dim: usize, cfg: &ModelConfig) -> Result<()> {
    if dim != cfg.dim {
        return Err(ModelError::BadShape {
            name: names::TOKEN_EMBD.into(),
            got: vec![dim],
            expected: vec![cfg.dim],
        });
    }
    Ok(())
}

impl DecoderStage {
    /// Loads layers `range` (and the embedding / head when the range is first / last) from `gguf`,
    /// reading only those tensors.
    pub fn load(gguf: &mut GgufFile, range: LayerRange, pool: &Arc<ThreadPool>) -> Result<Self> {
        Self::load_with(gguf, range, pool, None)
    }

    /// Loads `share`'s slice of layers `range` ([`crate::split::shares`] made it): its heads' and
    /// feed-forward columns' rows and columns of each matrix, the whole norms, the embedding when the
    /// range is first and, on rank 0 only, the final norm and head when it is last. Its
    /// [`DecoderStage::run_split`] needs every member's partial sums.
    pub fn load_share(
        gguf: &mut GgufFile,
        range: LayerRange,
        share: &Share,
        pool: &Arc<ThreadPool>,
    ) -> Result<Self> {
        Self::load_with(gguf, range, pool, Some(share))
    }

    fn load_with(
        gguf: &mut GgufFile,
        range: LayerRange,
        pool: &Arc<ThreadPool>,
        share: Option<&Share>,
    ) -> Result<Self> {
        let whole = ModelConfig::from_gguf(gguf)?;
        let spec = StageSpec::describe(gguf, &whole, range)?;
        let blocks = spec
            .blocks
            .iter()
            .map(|b| load_block(gguf, b, &whole, share))
            .collect::<Result<Vec<_>>>()?;
        let cfg = match share {
            Some(s) => s.local_config(&whole),
            None => whole,
        };
        let embed = if spec.embedding {
            let e = Embedding::from_raw(names::TOKEN_EMBD, gguf.read_raw(names::TOKEN_EMBD)?)?;
            check_embedding_dim(e.dim(), &cfg)?;
            Some(e)
        } else {
            None
        };
        let split_head = match (share, &spec.last) {
            (Some(s), Some(last)) if s.members > 1 => {
                Some((s.vocab.clone(), split::head_rows(gguf, last.tied)?))
            }
            _ => None,
        };
        let (output_norm, head) = match &spec.last {
            Some(last) => {
                let head = match (&split_head, &embed, last.tied) {
                    (Some((rows, _)), _, _) if rows.is_empty() => None,
                    (Some((rows, _)), _, tied) => {
                        Some(split::load_head_rows(gguf, tied, rows.clone())?)
                    }
                    (None, Some(e), true) => {
                        Some(LinearSet::single(QLinear::new(e.shared(), None)?))
                    }
                    _ => Some(LinearSet::load(
                        gguf,
                        &[Part {
                            weight: names::OUTPUT,
                            bias: None,
                        }],
                    )?),
                };
                if let Some(h) = &head {
                    check_head(h.out_features(), h.in_features(), &cfg)?;
                }
                (Some(read_norm(gguf, &last.norm)?), head)
            }
            None => (None, None),
        };
        Ok(Self {
            embed: embed.filter(|_| spec.first),
            cfg,
            range: spec.range,
            blocks,
            output_norm,
            head,
            rope_global: spec.rope_global,
            rope_local: spec.rope_local,
            pool: pool.clone(),
            split_head,
            share: share.cloned(),
            nextn: None,
        })
    }

    /// Loads the model's multi-token-prediction block ([`nextn`]) beside a whole last stage of a
    /// file that has one, for drafting (`Speculation::Mtp`); [`DecoderStage::load`] leaves it out, so
    /// a node that does not draft with it never holds it. Whether the stage now has the block.
    pub fn load_nextn(&mut self, gguf: &mut GgufFile) -> Result<bool> {
        if self.nextn.is_none()
            && self.share.is_none()
            && let Some(head) = &self.head
        {
            let block = Nextn::load(gguf, &self.cfg, head, self.embed.as_ref(), &self.pool)?;
            self.nextn = block.map(Arc::new);
        }
        Ok(self.nextn.is_some())
    }

    /// Block `index` of the model `cfg` alone, as a stage over hidden states without the embedding,
    /// the final norm or the head (a nextn block, which lies past `cfg.n_layers`).
    pub(crate) fn load_layer_alone(
        gguf: &mut GgufFile,
        cfg: &ModelConfig,
        index: usize,
        pool: &Arc<ThreadPool>,
    ) -> Result<Self> {
        let mut past = cfg.clone();
        past.n_layers = index + 1;
        let range = LayerRange::new(index, index + 1, index + 1)?;
        let spec = StageSpec::describe(gguf, &past, range)?;
        let blocks = spec
            .blocks
            .iter()
            .map(|b| load_block(gguf, b, cfg, None))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            cfg: cfg.clone(),
            range: spec.range,
            embed: None,
            blocks,
            output_norm: None,
            head: None,
            rope_global: spec.rope_global,
            rope_local: spec.rope_local,
            pool: pool.clone(),
            split_head: None,
            share: None,
            nextn: None,
        })
    }

    /// The model's multi-token-prediction block, on a whole last stage of a file that has one.
    pub fn nextn(&self) -> Option<&Arc<Nextn>> {
        self.nextn.as_ref()
    }

    /// This member's slice when the stage's layers are split over several.
    pub fn share(&self) -> Option<&Share> {
        self.share.as_ref()
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
        self.output_norm.is_some()
    }

    /// On a member of a split last stage: its rows of the output head and the head's rows in all
    /// (what [`DecoderStage::run_split_shard`] returns logits for).
    pub fn split_head(&self) -> Option<(std::ops::Range<usize>, usize)> {
        self.split_head.clone()
    }

    /// The thread pool the stage computes on.
    pub fn pool(&self) -> &Arc<ThreadPool> {
        &self.pool
    }

    /// Bytes per stored key or value in this stage's KV caches.
    pub fn kv_value_bytes(&self) -> usize {
        VALUE_BYTES
    }

    /// A fresh KV cache for this stage's layers (keys only under latent attention).
    pub fn new_kv_cache(&self) -> KvCache {
        KvCache::for_model(&self.cfg, self.range.len(), None)
    }

    /// Runs the batch. Returns hidden states `(total_tokens, dim)`, or on the last stage the logits
    /// `(chunks wanting logits, vocab)` in batch order ([`DecoderStage::run`] without pooled rows).
    pub fn forward(&self, input: StageInput<'_>, seqs: &mut [SeqChunk<'_>]) -> Result<HostMatrix> {
        self.run(input, seqs).map(|out| out.main)
    }

    /// Runs the batch: [`DecoderStage::forward`]'s output and, on the last stage, the pooled final
    /// hidden states of the chunks that ask ([`SeqChunk::pool`]).
    pub fn run(&self, input: StageInput<'_>, seqs: &mut [SeqChunk<'_>]) -> Result<StageOutput> {
        self.check_rows(seqs, None)?;
        self.run_inner(input, seqs, None, false, None, None)
    }

    /// [`DecoderStage::run`] with `rows[i]` logits rows for chunk `i` — those of its last `rows[i]`
    /// tokens, in order — instead of one per chunk wanting logits (speculative decoding verifies a
    /// drafted run of tokens with one row per position). `rows` has one entry per chunk.
    pub fn run_rows(
        &self,
        input: StageInput<'_>,
        seqs: &mut [SeqChunk<'_>],
        rows: &[usize],
    ) -> Result<StageOutput> {
        self.check_rows(seqs, Some(rows))?;
        self.run_inner(input, seqs, None, false, Some(rows), None)
    }

    /// [`DecoderStage::run`] (with [`DecoderStage::run_rows`]'s `rows` when given) that also writes
    /// into `hidden` the final-normed hidden state of every token of the batch (`total × dim`, batch
    /// order; left empty on a stage that is not last): what a multi-token-prediction block drafts
    /// from ([`nextn`]).
    pub fn run_keeping_hidden(
        &self,
        input: StageInput<'_>,
        seqs: &mut [SeqChunk<'_>],
        rows: Option<&[usize]>,
        hidden: &mut Vec<f32>,
    ) -> Result<StageOutput> {
        self.check_rows(seqs, rows)?;
        self.run_inner(input, seqs, None, false, rows, Some(hidden))
    }

    /// Refuses a split stage (it runs with its members' partial sums) and `rows` that are not one
    /// count per chunk within its length.
    fn check_rows(&self, seqs: &[SeqChunk<'_>], rows: Option<&[usize]>) -> Result<()> {
        if self.share.is_some() {
            return Err(ModelError::BadInput(
                "a split stage runs with its members' partial sums (run_split)".into(),
            ));
        }
        check_row_counts(seqs, rows)
    }

    /// [`DecoderStage::run`] of a member of a split stage ([`DecoderStage::load_share`]): `reduce`
    /// makes each partial sum whole, the same on every member. Members other than rank 0 return the
    /// hidden states. `rows`: as [`DecoderStage::run_rows`]'s (the same on every member).
    pub fn run_split(
        &self,
        input: StageInput<'_>,
        seqs: &mut [SeqChunk<'_>],
        reduce: &mut Reduce<'_>,
        rows: Option<&[usize]>,
    ) -> Result<StageOutput> {
        check_row_counts(seqs, rows)?;
        self.run_inner(input, seqs, Some(reduce), false, rows, None)
    }

    /// [`DecoderStage::run_split`] without the logits' all-reduce: on a last stage whose head is
    /// split by vocabulary each member returns its own rows' logits (`rows × Share::vocab`, rows in
    /// batch order as always), for a caller that merges the shards itself (greedy: the largest of
    /// the members' maxima) instead of exchanging whole logit rows.
    pub fn run_split_shard(
        &self,
        input: StageInput<'_>,
        seqs: &mut [SeqChunk<'_>],
        reduce: &mut Reduce<'_>,
        rows: Option<&[usize]>,
    ) -> Result<StageOutput> {
        check_row_counts(seqs, rows)?;
        self.run_inner(input, seqs, Some(reduce), true, rows, None)
    }

    fn run_inner(
        &self,
        input: StageInput<'_>,
        seqs: &mut [SeqChunk<'_>],
        mut reduce: Option<&mut Reduce<'_>>,
        shard: bool,
        logit_rows: Option<&[usize]>,
        keep_hidden: Option<&mut Vec<f32>>,
    ) -> Result<StageOutput> {
        let total = check_batch(seqs.iter().map(|s| (s.kv.len(), s.len)), &self.cfg)?;
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
        self.layers(&mut x, seqs, total, reduce.as_deref_mut())?;
        for s in seqs.iter_mut() {
            s.kv.advance(s.len);
        }
        let Some(norm) = &self.output_norm else {
            return Ok(StageOutput {
                main: HostMatrix::new(total, self.cfg.dim, x)?,
                pooled: HostMatrix::default(),
            });
        };
        let dim = self.cfg.dim;
        let pooled = pool_rows(&x, seqs, norm, dim, self.cfg.rms_eps)?;
        if let Some(all) = keep_hidden {
            all.clear();
            all.resize(x.len(), 0.0);
            ops::rms_norm(&x, norm, self.cfg.rms_eps, all);
        }
        let mut picked = Vec::new();
        let mut end = 0;
        for (i, s) in seqs.iter().enumerate() {
            end += s.len;
            let n = logit_rows.map_or(usize::from(s.want_logits), |r| r[i]);
            picked.extend_from_slice(&x[(end - n) * dim..end * dim]);
        }
        let rows = picked.len() / dim;
        let mut normed = vec![0f32; picked.len()];
        ops::rms_norm(&picked, norm, self.cfg.rms_eps, &mut normed);
        let mut logits = Vec::new();
        if let Some(head) = &self.head {
            let scratch = &mut LinearScratch::default();
            head.forward(&normed, rows, &mut logits, scratch, &self.pool)?;
        }
        let width = match (&self.split_head, reduce) {
            (None, _) => self.head.as_ref().map_or(0, LinearSet::out_features),
            (Some((mine, _)), Some(_)) if shard => mine.len(),
            (Some((mine, all)), Some(r)) => {
                // This member's rows in place, zeros elsewhere: the all-reduce adds the others'.
                let mut whole = vec![0f32; rows * all];
                if !mine.is_empty() {
                    for (dst, src) in whole
                        .chunks_exact_mut(*all)
                        .zip(logits.chunks_exact(mine.len()))
                    {
                        dst[mine.clone()].copy_from_slice(src);
                    }
                }
                if rows > 0 {
                    r(&mut whole)?;
                }
                logits = whole;
                *all
            }
            (Some(_), None) => {
                return Err(ModelError::BadInput(
                    "a member's share of the head computes with its group only (run_split)".into(),
                ));
            }
        };
        Ok(StageOutput {
            main: HostMatrix::new(rows, width, logits)?,
            pooled,
        })
    }

    /// Every layer of the stage over the batch's hidden states `x` (`total × dim`), in place.
    fn layers(
        &self,
        x: &mut [f32],
        seqs: &mut [SeqChunk<'_>],
        total: usize,
        mut reduce: Option<&mut Reduce<'_>>,
    ) -> Result<()> {
        let c = &self.cfg;
        let (dim, hd) = (c.dim, c.head_dim);
        let (qd, kvd) = (c.n_heads * hd, c.n_kv_heads * hd);
        let positions = || seqs.iter().flat_map(|s| s.kv.len()..s.kv.len() + s.len);
        let rope_global = RopeRows::new(&self.rope_global, positions());
        let any_local = self.blocks.iter().any(|b| b.local);
        let rope_local = any_local.then(|| RopeRows::new(&self.rope_local, positions()));
        let mut h = vec![0f32; total * dim];
        let mut attn = vec![0f32; total * qd];
        let mut mla_scratch = MlaScratch::default();
        // Matmul outputs and quantized inputs, reused by every layer.
        let (mut qkv, mut o, mut down) = (Vec::new(), Vec::new(), Vec::new());
        let mut scratch = LinearScratch::default();
        let mut ffn_scratch = FfnScratch::default();
        let pool = &*self.pool;
        for (li, blk) in self.blocks.iter().enumerate() {
            if blk.attends {
                ops::rms_norm(x, &blk.attn_norm, c.rms_eps, &mut h);
                blk.qkv.forward(&h, total, &mut qkv, &mut scratch, pool)?;
                let mut chunks = host_chunks(seqs, li)?;
                if let Some(mla) = &blk.mla {
                    let (rope, eps) = (&rope_global, c.rms_eps);
                    let s = &mut mla_scratch;
                    mla.attend(&qkv, &mut chunks, rope, eps, &mut attn, s, pool)?;
                } else {
                    for row in qkv.chunks_exact_mut(qd + 2 * kvd) {
                        if let Some(w) = &blk.q_norm {
                            ops::rms_norm_in_place(&mut row[..qd], w, c.rms_eps);
                        }
                        if let Some(w) = &blk.k_norm {
                            ops::rms_norm_in_place(&mut row[qd..qd + kvd], w, c.rms_eps);
                        }
                    }
                    let spec = AttnSpec {
                        heads: Heads {
                            n_heads: c.n_heads,
                            n_kv_heads: c.n_kv_heads,
                            head_dim: hd,
                        },
                        window: if blk.local { c.arch.sliding_window } else { 0 },
                        query_scale: c.arch.query_scale,
                        sinks: blk.sinks.as_deref(),
                    };
                    let rope = match (&rope_local, blk.local) {
                        (Some(r), true) => r,
                        _ => &rope_global,
                    };
                    attention::attend(&mut qkv, &mut chunks, spec, rope, &mut attn, pool);
                }
                blk.wo.forward(&attn, total, &mut o, &mut scratch, pool)?;
            } else {
                o.clear();
                o.resize(total * dim, 0.0);
            }
            if let Some(r) = reduce.as_deref_mut() {
                r(&mut o[..total * dim])?;
            }
            residual(x, &mut o, blk.post_attn_norm.as_deref(), c.rms_eps, &mut h);
            let r = reduce.as_deref_mut();
            self.ffn(blk, x, total, &mut h, &mut down, &mut ffn_scratch, r)?;
        }
        Ok(())
    }

    /// A layer's `x += post_norm(ffn(norm(x)))` (`h` and `down` are room for the rows; a split
    /// stage's partial sum made whole by `reduce` first).
    #[allow(clippy::too_many_arguments)]
    fn ffn(
        &self,
        blk: &Block,
        x: &mut [f32],
        total: usize,
        h: &mut [f32],
        down: &mut Vec<f32>,
        s: &mut FfnScratch,
        reduce: Option<&mut Reduce<'_>>,
    ) -> Result<()> {
        let c = &self.cfg;
        ops::rms_norm(x, &blk.ffn_norm, c.rms_eps, h);
        blk.ffn
            .forward(h, total, c.arch.activation, down, s, &self.pool)?;
        if let Some(r) = reduce {
            r(&mut down[..total * c.dim])?;
        }
        residual(x, down, blk.post_ffn_norm.as_deref(), c.rms_eps, h);
        Ok(())
    }
}

/// Refuses `rows` that are not one count per chunk within its length.
pub(crate) fn check_row_counts<K>(seqs: &[SeqChunk<'_, K>], rows: Option<&[usize]>) -> Result<()> {
    if let Some(rows) = rows
        && (rows.len() != seqs.len() || rows.iter().zip(seqs).any(|(&r, s)| r > s.len))
    {
        return Err(ModelError::BadInput(format!(
            "logits rows {rows:?} for chunks of {:?} tokens",
            seqs.iter().map(|s| s.len).collect::<Vec<_>>()
        )));
    }
    Ok(())
}

/// Every sequence's chunk of the batch with its cache's layer `li`.
fn host_chunks<'a>(
    seqs: &'a mut [SeqChunk<'_>],
    li: usize,
) -> Result<Vec<attention::SeqChunk<'a>>> {
    seqs.iter_mut()
        .map(|s| {
            let (t, pos) = (s.len, s.kv.len());
            Ok(attention::SeqChunk {
                t,
                pos,
                kv: s.kv.host_layer(li)?,
            })
        })
        .collect()
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

/// The last stage's pooled rows: for each chunk that asks, the final-normed rows of its tokens in
/// `x` (`rows × dim`, before the final norm) summed, or its last or first one (`0 × dim` when no
/// chunk asks).
pub(crate) fn pool_rows<K>(
    x: &[f32],
    seqs: &[SeqChunk<'_, K>],
    norm: &[f32],
    dim: usize,
    eps: f32,
) -> Result<HostMatrix> {
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
            ops::rms_norm(&x[r * dim..(r + 1) * dim], norm, eps, &mut normed);
            ops::add_assign(&mut acc, &normed);
        }
        out.extend_from_slice(&acc);
    }
    HostMatrix::new(out.len() / dim.max(1), dim, out)
}

/// Checks a batch's chunks (`(tokens held, new tokens)` each): none empty, none past the context.
/// Returns the batch's rows.
pub(crate) fn check_batch(
    chunks: impl Iterator<Item = (usize, usize)>,
    cfg: &ModelConfig,
) -> Result<usize> {
    let mut total = 0;
    for (held, len) in chunks {
        if len == 0 {
            return Err(ModelError::BadInput("empty sequence chunk".into()));
        }
        let needed = held + len;
        if needed > cfg.context_length {
            return Err(ModelError::ContextFull {
                needed,
                context_length: cfg.context_length,
            });
        }
        total += len;
    }
    Ok(total)
}
