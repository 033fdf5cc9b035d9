//! A draft model for speculative decoding: a small model with the target's vocabulary (e.g.
//! SmolLM2-135M drafting for SmolLM2-1.7B) run whole on the driver node, each sequence with its own
//! KV cache of the draft model ([`ModelDraft`]), proposing its greedy continuation for the target to
//! verify ([`crate::verify`]). Greedy drafts are a deterministic proposal, so the rejection rule keeps
//! a sampled request's distribution the target's exactly, as with n-gram drafts.
//!
//! [`DraftModel::load`] reads the file whole onto the CPU; [`DraftModel::fits`] says whether it drafts
//! for a target (the same token list, entry by entry, fingerprinted from `tokenizer.ggml.tokens`). A
//! sequence's draft cache follows what the draft model has seen: each proposal keeps the longest
//! common prefix of its cache and the sequence, feeds the rest, then decodes `max` tokens. Its KV
//! lives in host memory outside the node's KV budget; it is one small model's worth a sequence.

use std::path::Path;
use std::sync::Arc;

use shoal_kernels::ThreadPool;
use shoal_model::gguf::GgufFile;
use shoal_model::{DecoderStage, KvCache, LayerRange, ModelConfig, Pool, SeqChunk, StageInput};

use crate::draft::DraftSource;
use crate::error::EngineError;
use crate::sampler::argmax;

/// Tokens fed to the draft model in one batch when it catches up with a sequence (a prompt).
const CATCH_UP_CHUNK: usize = 256;

/// A small model loaded whole to draft for targets of the same vocabulary.
pub struct DraftModel {
    name: String,
    stage: DecoderStage,
    config: ModelConfig,
    /// A hash of the file's token list (`tokenizer.ggml.tokens`).
    vocab: u64,
}

impl std::fmt::Debug for DraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftModel")
            .field("name", &self.name)
            .field("n_layers", &self.config.n_layers)
            .field("vocab_size", &self.config.vocab_size)
            .finish()
    }
}

impl DraftModel {
    /// Loads the model at `path` whole, on the CPU threads of `pool`.
    pub fn load(path: &Path, pool: &Arc<ThreadPool>) -> Result<Self, EngineError> {
        let err = |e: &dyn std::fmt::Display| {
            EngineError::Internal(format!("loading the draft model {}: {e}", path.display()))
        };
        let mut gguf = GgufFile::open(path).map_err(|e| err(&e))?;
        let config = ModelConfig::from_gguf(&gguf).map_err(|e| err(&e))?;
        let vocab = gguf
            .token_list_fingerprint()
            .ok_or_else(|| err(&"it has no token list"))?;
        let range = LayerRange::full(config.n_layers);
        let stage = DecoderStage::load(&mut gguf, range, pool).map_err(|e| err(&e))?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        Ok(Self {
            name,
            stage,
            config,
            vocab,
        })
    }

    /// Bytes one token of a drafting sequence's KV takes in this model (every layer), what the
    /// engine's KV budget pays for it beside the target's.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.config
            .kv_bytes_per_token(self.config.n_layers, self.stage.kv_value_bytes())
    }

    /// The file's name, for logs.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this model drafts for a target whose file has token list fingerprint `target_vocab`
    /// ([`GgufFile::token_list_fingerprint`]).
    pub fn fits(&self, target_vocab: Option<u64>) -> bool {
        target_vocab == Some(self.vocab)
    }

    /// The logits of the last of `tokens` fed to `kv` after what it holds.
    fn feed(&self, kv: &mut KvCache, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut last = Vec::new();
        for (i, part) in tokens.chunks(CATCH_UP_CHUNK).enumerate() {
            let want = (i + 1) * CATCH_UP_CHUNK >= tokens.len();
            let mut chunk = [SeqChunk {
                kv: &mut *kv,
                len: part.len(),
                want_logits: want,
                pool: Pool::None,
            }];
            let out = self
                .stage
                .run(StageInput::Tokens(part), &mut chunk)
                .map_err(|e| EngineError::Internal(format!("draft model {}: {e}", self.name)))?;
            if want {
                last = out.main.into_data();
            }
        }
        Ok(last)
    }
}

/// One sequence's drafts from a [`DraftModel`]: its greedy continuation.
pub struct ModelDraft {
    model: Arc<DraftModel>,
    kv: KvCache,
    /// The tokens `kv` holds, in order.
    seen: Vec<u32>,
}

impl std::fmt::Debug for ModelDraft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelDraft")
            .field("model", &self.model.name)
            .field("seen", &self.seen.len())
            .finish()
    }
}

impl ModelDraft {
    pub fn new(model: Arc<DraftModel>) -> Self {
        let c = &model.config;
        let kv = KvCache::for_model(c, c.n_layers, None);
        Self {
            model,
            kv,
            seen: Vec::new(),
        }
    }

    /// Up to `max` greedy tokens after `tokens`; an error leaves the cache empty (the next proposal
    /// starts over).
    fn try_propose(&mut self, tokens: &[u32], max: usize) -> Result<Vec<u32>, EngineError> {
        // Keep what both agree on, but feed at least the last token: its logits give the first draft.
        let common = self
            .seen
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len() - 1);
        self.kv.truncate(common);
        self.seen.truncate(common);
        let mut logits = self.model.feed(&mut self.kv, &tokens[common..])?;
        self.seen.extend_from_slice(&tokens[common..]);
        let mut out = Vec::with_capacity(max);
        while out.len() < max {
            let next = argmax(&logits);
            out.push(next);
            if out.len() == max {
                break;
            }
            logits = self.model.feed(&mut self.kv, &[next])?;
            self.seen.push(next);
        }
        Ok(out)
    }
}

impl DraftSource for ModelDraft {
    fn propose(&mut self, tokens: &[u32], max: usize) -> Vec<u32> {
        if max == 0 || tokens.is_empty() {
            return Vec::new();
        }
        let draft = self.try_propose(tokens, max);
        or_none(draft, || {
            self.kv.truncate(0);
            self.seen.clear();
        })
    }
}

/// A model-run draft, or none this pass when computing it failed (logged): `reset` then empties the
/// source's cache, so its next proposal starts over.
pub(crate) fn or_none(draft: Result<Vec<u32>, EngineError>, reset: impl FnOnce()) -> Vec<u32> {
    draft.unwrap_or_else(|e| {
        tracing::warn!("{e}: no draft this pass");
        reset();
        Vec::new()
    })
}
