//! The KV bookkeeping every stage in this process shares, whatever holds the caches: [`SeqKvs`]
//! keeps one cache per sequence and per kept prefix, and the placeholders
//! ([`SeqKvs::rewind`] of a sequence gone), and applies [`KvOp`]s to them. [`StageKv`] is what a
//! cache must do: a host [`KvCache`] ([`crate::stage::LocalStage`]) or a device
//! [`shoal_model::gpu::GpuKv`] ([`crate::gpu_stage::GpuStage`]).

use std::collections::{HashMap, HashSet};

use shoal_model::gpu::GpuKv;
use shoal_model::{KvCache, ModelError, SeqChunk, StageInput, StageOutput};

use crate::batch::{ChunkSpec, KvOp, StageData};
use crate::error::EngineError;

/// One sequence's KV cache, on the host or a device.
pub trait StageKv: Sized {
    /// Tokens held.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Keeps the first `len` tokens.
    fn truncate(&mut self, len: usize);
    /// Holds `t` more blank tokens.
    fn extend_blank(&mut self, t: usize) -> Result<(), ModelError>;
    /// A compact copy of the first `len` tokens.
    fn copy_prefix(&self, len: usize) -> Result<Self, ModelError>;
    /// Bytes allocated.
    fn allocated_bytes(&self) -> usize;
}

macro_rules! stage_kv {
    ($t:ty) => {
        impl StageKv for $t {
            fn len(&self) -> usize {
                <$t>::len(self)
            }
            fn truncate(&mut self, len: usize) {
                <$t>::truncate(self, len)
            }
            fn extend_blank(&mut self, t: usize) -> Result<(), ModelError> {
                <$t>::extend_blank(self, t)
            }
            fn copy_prefix(&self, len: usize) -> Result<Self, ModelError> {
                <$t>::copy_prefix(self, len)
            }
            fn allocated_bytes(&self) -> usize {
                <$t>::allocated_bytes(self)
            }
        }
    };
}

stage_kv!(KvCache);
stage_kv!(GpuKv);

pub(crate) fn internal(e: impl std::fmt::Display) -> EngineError {
    EngineError::Internal(e.to_string())
}

/// Every sequence's and kept prefix's cache of one stage.
pub struct SeqKvs<C> {
    caches: HashMap<u64, C>,
    prefixes: HashMap<u64, C>,
    /// Sequences whose cache is a placeholder ([`SeqKvs::rewind`] of a sequence gone): computed
    /// like any other, never copied into a prefix or another sequence.
    placeholders: HashSet<u64>,
}

impl<C> Default for SeqKvs<C> {
    fn default() -> Self {
        Self {
            caches: HashMap::new(),
            prefixes: HashMap::new(),
            placeholders: HashSet::new(),
        }
    }
}

impl<C: StageKv> SeqKvs<C> {
    /// Frees every sequence and prefix.
    pub fn clear(&mut self) {
        self.caches.clear();
        self.prefixes.clear();
        self.placeholders.clear();
    }

    /// Tokens of KV held: every sequence's and every kept prefix's.
    pub fn held_tokens(&self) -> usize {
        self.caches
            .values()
            .chain(self.prefixes.values())
            .map(C::len)
            .sum()
    }

    /// Bytes of KV allocated across all sequences and kept prefixes.
    pub fn kv_bytes(&self) -> usize {
        self.caches
            .values()
            .chain(self.prefixes.values())
            .map(C::allocated_bytes)
            .sum()
    }

    /// Each chunk's cache, taken out (a new one from `new` for a sequence not seen yet) so the
    /// model can borrow them all mutably; give them back with [`SeqKvs::put_back`].
    fn take(&mut self, batch: &[ChunkSpec], new: impl Fn() -> C) -> Vec<C> {
        batch
            .iter()
            .map(|c| self.caches.remove(&c.seq_id).unwrap_or_else(&new))
            .collect()
    }

    fn put_back(&mut self, taken: Vec<C>, batch: &[ChunkSpec]) {
        for (kv, c) in taken.into_iter().zip(batch) {
            self.caches.insert(c.seq_id, kv);
        }
    }

    /// Runs `batch` through `model` (a stage's `run`) with each chunk's cache (a new one from
    /// `new` for a sequence not seen yet), the caches kept whatever happens.
    pub fn run_batch(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        new: impl Fn() -> C,
        model: impl FnOnce(StageInput<'_>, &mut [SeqChunk<'_, C>]) -> Result<StageOutput, ModelError>,
    ) -> Result<StageOutput, ModelError> {
        let mut taken = self.take(batch, new);
        let result = {
            let mut chunks: Vec<SeqChunk<'_, C>> = taken
                .iter_mut()
                .zip(batch)
                .map(|(kv, c)| SeqChunk {
                    kv,
                    len: c.len,
                    want_logits: c.want_logits,
                    pool: c.pool,
                })
                .collect();
            match input {
                StageData::Tokens(ids) => model(StageInput::Tokens(&ids), &mut chunks),
                StageData::Hidden(h) => model(StageInput::Hidden(h), &mut chunks),
                StageData::Logits { .. } | StageData::Sampled(_) => {
                    Err(ModelError::BadInput("logits sent into a stage".into()))
                }
            }
        };
        self.put_back(taken, batch);
        result
    }

    /// Tokens held for `seq_id`.
    pub fn cached_len(&self, seq_id: u64) -> usize {
        self.caches.get(&seq_id).map_or(0, C::len)
    }

    pub fn has_prefix(&self, prefix_id: u64) -> bool {
        self.prefixes.contains_key(&prefix_id)
    }

    pub fn is_placeholder(&self, seq_id: u64) -> bool {
        self.placeholders.contains(&seq_id)
    }

    /// Sequences held.
    pub fn sequences(&self) -> usize {
        self.caches.len()
    }

    /// Leaves `seq_id` with exactly its first `len` tokens, or a placeholder of `len` blank
    /// tokens (from `new`) when the sequence is gone (see [`crate::stage::LocalStage::rewind`]).
    pub fn rewind(
        &mut self,
        seq_id: u64,
        len: usize,
        new: impl Fn() -> C,
    ) -> Result<(), EngineError> {
        match self.caches.get_mut(&seq_id) {
            Some(kv) if kv.len() >= len => kv.truncate(len),
            Some(kv) => {
                return Err(EngineError::Internal(format!(
                    "sequence {seq_id} holds {} tokens of KV, fewer than the {len} to rewind to",
                    kv.len()
                )));
            }
            None => {
                let mut kv = new();
                kv.extend_blank(len).map_err(internal)?;
                self.caches.insert(seq_id, kv);
                self.placeholders.insert(seq_id);
            }
        }
        Ok(())
    }

    /// Applies `op`.
    pub fn apply(&mut self, op: KvOp) -> Result<(), EngineError> {
        match op {
            KvOp::Release { seq_id } => {
                self.caches.remove(&seq_id);
                self.placeholders.remove(&seq_id);
            }
            // A placeholder's KV means nothing: freed, never kept.
            KvOp::Retain { seq_id, .. } if self.placeholders.remove(&seq_id) => {
                self.caches.remove(&seq_id);
            }
            KvOp::Fork { seq_id, .. } if self.placeholders.contains(&seq_id) => {}
            KvOp::Retain {
                seq_id,
                prefix_id,
                len,
            } => {
                let kv = self
                    .caches
                    .remove(&seq_id)
                    .ok_or_else(|| EngineError::Internal(format!("no KV for sequence {seq_id}")))?;
                // A compact copy: the running cache grows ahead of its length.
                self.prefixes
                    .insert(prefix_id, kv.copy_prefix(len).map_err(internal)?);
            }
            KvOp::Start {
                prefix_id,
                seq_id,
                len,
            } => {
                let prefix = self
                    .prefixes
                    .get(&prefix_id)
                    .ok_or_else(|| EngineError::Internal(format!("no prefix {prefix_id}")))?;
                let kv = prefix.copy_prefix(len).map_err(internal)?;
                self.caches.insert(seq_id, kv);
            }
            KvOp::DropPrefix { prefix_id } => {
                self.prefixes.remove(&prefix_id);
            }
            KvOp::Rewind { seq_id, len } => {
                if let Some(kv) = self.caches.get_mut(&seq_id)
                    && kv.len() > len
                {
                    kv.truncate(len);
                }
            }
            KvOp::Fork { seq_id, into, len } => {
                let kv = self
                    .caches
                    .get(&seq_id)
                    .ok_or_else(|| EngineError::Internal(format!("no KV for sequence {seq_id}")))?
                    .copy_prefix(len)
                    .map_err(internal)?;
                self.caches.insert(into, kv);
            }
        }
        Ok(())
    }
}
