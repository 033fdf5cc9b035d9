//! A model's own multi-token-prediction layer ([`Nextn`]): the `nextn` block GLM-4.5 / 4.6 files keep
//! after their `block_count − nextn_predict_layers` layers (`blk.N.nextn.*` beside an ordinary
//! attention + feed-forward block `N`). The main pass never runs it; a last stage holding it loads it
//! (and [`nextn_bytes`] prices it there), and speculative decoding drafts with it.
//!
//! One step, for a position `i` whose main-model hidden state `h_i` is known and whose next token
//! `t_{i+1}` is known: `x = eh_proj([enorm(embed(t_{i+1})) | hnorm(h_i)])`, then block `N` (its own
//! one-layer KV cache, position `i`), then `shared_head_norm` and `shared_head_head` (the model's
//! output head when the file has none) predict `t_{i+2}`. `h_i` is the main model's final-normed
//! hidden state, as vLLM and SGLang hand it over; a chained step takes the block's own output (before
//! `shared_head_norm`) as the next `h`. The embedding of position 0 is zeroed, as vLLM's GLM-4.5 and
//! DeepSeek MTP layers do. The embedding is `nextn.embed_tokens` when the file has it, else the
//! model's token embedding (shared with the stage when it holds it).

use std::sync::Arc;

use shoal_kernels::ThreadPool;

use super::{DecoderStage, Pool, SeqChunk, StageInput, names};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::kv::KvCache;
use crate::linear::{Embedding, LinearScratch, LinearSet, Part};
use crate::matrix::HostMatrix;
use crate::ops;

/// The multi-token-prediction block of a model (its first `nextn` layer).
pub struct Nextn {
    /// Block `N` as a one-layer stage over hidden states.
    layer: DecoderStage,
    eh_proj: LinearSet,
    enorm: Vec<f32>,
    hnorm: Vec<f32>,
    head_norm: Vec<f32>,
    head: LinearSet,
    embed: Embedding,
    embed_scale: f32,
    rms_eps: f32,
    dim: usize,
    pool: Arc<ThreadPool>,
}

impl std::fmt::Debug for Nextn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nextn")
            .field("layer", &self.layer.range())
            .field("dim", &self.dim)
            .finish()
    }
}

/// What one [`Nextn::forward`] computed: the block's output rows (before `shared_head_norm`), the
/// last row after it (what a chained step feeds as its `h`, as SGLang and llama.cpp carry it: vLLM
/// moved to the normed state too after acceptance fell at chained positions), and that row's logits.
#[derive(Debug, Clone, PartialEq)]
pub struct NextnOut {
    pub hidden: Vec<f32>,
    pub carried: Vec<f32>,
    pub logits: Vec<f32>,
}

/// `{arch}.nextn_predict_layers` of the file (0 when absent).
pub fn nextn_layers(gguf: &GgufFile, cfg: &ModelConfig) -> usize {
    gguf.get_u32(&format!("{}.nextn_predict_layers", cfg.architecture))
        .map_or(0, |n| n as usize)
}

/// The name of block `i`'s multi-token-prediction tensor `part`.
fn part(i: usize, part: &str) -> String {
    names::blk(i, &format!("nextn.{part}"))
}

/// Whether the file holds a loadable nextn block (its `eh_proj`) after the model's layers.
fn present(gguf: &GgufFile, cfg: &ModelConfig) -> bool {
    nextn_layers(gguf, cfg) > 0 && gguf.has_tensor(&part(cfg.n_layers, "eh_proj"))
}

/// Bytes a last stage holds for the nextn block ([`Nextn::load`]): every tensor of block
/// `n_layers`, plus a copy of the token embedding when the block has none of its own and the head is
/// not the embedding (a last stage that is also the first shares its own: then this counts it twice).
pub fn nextn_bytes(gguf: &GgufFile, cfg: &ModelConfig) -> u64 {
    if !present(gguf, cfg) {
        return 0;
    }
    let prefix = names::blk_prefix(cfg.n_layers);
    let block: u64 = gguf
        .tensor_names()
        .filter(|n| n.starts_with(&prefix))
        .map(|n| gguf.tensor_bytes(n).unwrap_or(0))
        .sum();
    let own_embed = gguf.has_tensor(&part(cfg.n_layers, "embed_tokens"));
    let tied = !gguf.has_tensor(names::OUTPUT);
    let embed = match own_embed || tied {
        true => 0,
        false => gguf.tensor_bytes(names::TOKEN_EMBD).unwrap_or(0),
    };
    block + embed
}

fn read_vec(g: &mut GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
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

impl Nextn {
    /// Loads the first nextn block of the model `cfg` in `g`, when the file has one: `main_head` is
    /// the stage's output head (used when the block has no `shared_head_head`), `embed` the stage's
    /// token embedding when it holds one.
    pub(crate) fn load(
        g: &mut GgufFile,
        cfg: &ModelConfig,
        main_head: &LinearSet,
        embed: Option<&Embedding>,
        pool: &Arc<ThreadPool>,
    ) -> Result<Option<Self>> {
        if !present(g, cfg) {
            return Ok(None);
        }
        let (i, dim) = (cfg.n_layers, cfg.dim);
        let single = |g: &mut GgufFile, name: &str| {
            LinearSet::load(
                g,
                &[Part {
                    weight: name,
                    bias: None,
                }],
            )
        };
        let eh_name = part(i, "eh_proj");
        let eh_proj = single(g, &eh_name)?;
        if eh_proj.in_features() != 2 * dim || eh_proj.out_features() != dim {
            return Err(ModelError::BadShape {
                name: eh_name,
                got: vec![eh_proj.out_features(), eh_proj.in_features()],
                expected: vec![dim, 2 * dim],
            });
        }
        let own_head = part(i, "shared_head_head");
        let head = match g.has_tensor(&own_head) {
            true => single(g, &own_head)?,
            false => main_head.clone(),
        };
        super::check_head(head.out_features(), head.in_features(), cfg)?;
        let own_embed = part(i, "embed_tokens");
        let embed = match (g.has_tensor(&own_embed), embed) {
            (true, _) => Embedding::from_raw(&own_embed, g.read_raw(&own_embed)?)?,
            (false, Some(e)) => e.clone(),
            (false, None) => {
                Embedding::from_raw(names::TOKEN_EMBD, g.read_raw(names::TOKEN_EMBD)?)?
            }
        };
        super::check_embedding_dim(embed.dim(), cfg)?;
        Ok(Some(Self {
            layer: DecoderStage::load_layer_alone(g, cfg, i, pool)?,
            eh_proj,
            enorm: read_vec(g, &part(i, "enorm"), dim)?,
            hnorm: read_vec(g, &part(i, "hnorm"), dim)?,
            head_norm: read_vec(g, &part(i, "shared_head_norm"), dim)?,
            head,
            embed,
            embed_scale: cfg.arch.embed_scale,
            rms_eps: cfg.rms_eps,
            dim,
            pool: pool.clone(),
        }))
    }

    /// The model's hidden size.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The block's layer index in the file.
    pub fn layer(&self) -> usize {
        self.layer.range().start
    }

    /// A fresh one-layer KV cache for the block.
    pub fn new_kv_cache(&self) -> KvCache {
        self.layer.new_kv_cache()
    }

    /// Bytes one token of the block's KV cache takes.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.layer
            .config()
            .kv_bytes_per_token(1, self.layer.kv_value_bytes())
    }

    /// Runs the block over `tokens.len()` positions after what `kv` holds: row `r` combines
    /// `tokens[r]` (the token after that position) with `hidden` row `r` (the hidden state at that
    /// position, `dim` values a row). Returns the block's output rows and the last row's logits.
    pub fn forward(&self, kv: &mut KvCache, tokens: &[u32], hidden: &[f32]) -> Result<NextnOut> {
        let (rows, dim, eps) = (tokens.len(), self.dim, self.rms_eps);
        if rows == 0 || hidden.len() != rows * dim {
            return Err(ModelError::BadInput(format!(
                "nextn: {rows} tokens with {} hidden values (dim {dim})",
                hidden.len()
            )));
        }
        let mut emb = self.embed.lookup(tokens, self.embed_scale)?;
        if kv.is_empty() {
            emb[..dim].fill(0.0);
        }
        let mut cat = vec![0f32; rows * 2 * dim];
        for ((row, e), h) in cat
            .chunks_exact_mut(2 * dim)
            .zip(emb.chunks_exact(dim))
            .zip(hidden.chunks_exact(dim))
        {
            let (left, right) = row.split_at_mut(dim);
            ops::rms_norm(e, &self.enorm, eps, left);
            ops::rms_norm(h, &self.hnorm, eps, right);
        }
        let scratch = &mut LinearScratch::default();
        let mut x = Vec::new();
        self.eh_proj
            .forward(&cat, rows, &mut x, scratch, &*self.pool)?;
        let mut chunk = [SeqChunk {
            kv,
            len: rows,
            want_logits: false,
            pool: Pool::None,
        }];
        let input = StageInput::Hidden(HostMatrix::new(rows, dim, x)?);
        let hidden = self.layer.run(input, &mut chunk)?.main.into_data();
        let mut normed = vec![0f32; dim];
        ops::rms_norm(
            &hidden[(rows - 1) * dim..],
            &self.head_norm,
            eps,
            &mut normed,
        );
        let mut logits = Vec::new();
        self.head
            .forward(&normed, 1, &mut logits, scratch, &*self.pool)?;
        Ok(NextnOut {
            hidden,
            carried: normed,
            logits,
        })
    }
}
