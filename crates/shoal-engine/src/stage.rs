//! The stage seam: one trait for every piece of a pipeline, wherever it runs.
//!
//! The engine hands each stage the same batch description ([`ChunkSpec`]s, in batch order) and the
//! previous stage's output. A stage owns the KV caches of its layers, keyed by sequence id, so a
//! remote stage keeps its KV on its own node and only activations travel.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::Tensor;
use shoal_kernels::ThreadPool;
use shoal_model::{KvCache, LlamaStage, SeqChunk, StageInput};

use crate::error::EngineError;
use crate::sampler::{self, Sampler};

/// One sequence's part of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSpec {
    pub seq_id: u64,
    /// Tokens of this sequence in the batch (1 when decoding).
    pub len: usize,
    /// Whether the last stage must return logits for this chunk's last token.
    pub want_logits: bool,
}

/// How to sample one chunk that wants logits: the owner's sampler state and the sequence so far.
/// A stage that samples (a remote last stage) must draw exactly what `sampler` would.
#[derive(Clone, Copy)]
pub struct SampleRef<'a> {
    pub seq_id: u64,
    pub sampler: &'a Sampler,
    pub history: &'a [u32],
}

/// A token picked by the last stage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pick {
    pub id: u32,
    pub logprob: f32,
}

/// What flows between stages.
pub enum StageData {
    Tokens(Vec<u32>),
    /// `(total tokens, dim)` hidden states.
    Hidden(Tensor),
    /// `(chunks wanting logits, vocab)`.
    Logits(Tensor),
    /// Tokens already sampled, one per chunk wanting logits, in batch order (a remote last stage samples
    /// where the logits are, so only token ids travel back).
    Sampled(Vec<Pick>),
}

/// Samples one row of logits as `job` says; what a last stage that samples runs for each chunk.
pub fn sample_row(job: &SampleRef<'_>, row: &mut [f32]) -> Pick {
    let mut s = job.sampler.clone();
    let id = s.sample(row, job.history);
    Pick {
        id,
        logprob: sampler::logprob(row, id),
    }
}

/// Samples every row of `logits` (`(sampling.len(), vocab)`) as its job says, the rows split over
/// `pool`'s threads when there is one (each row's pick is independent of the others and of the split).
pub fn sample_rows(
    logits: &Tensor,
    sampling: &[SampleRef<'_>],
    pool: Option<&ThreadPool>,
) -> Result<Vec<Pick>, EngineError> {
    let (rows, vocab) = logits
        .dims2()
        .map_err(|e| EngineError::Internal(format!("logits: {e}")))?;
    if rows != sampling.len() {
        return Err(EngineError::Internal(format!(
            "{rows} rows of logits for {} sequences",
            sampling.len()
        )));
    }
    let mut values = logits
        .flatten_all()
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(|e| EngineError::Internal(format!("reading logits: {e}")))?;
    /// A row not yet sampled, then its pick.
    type Slot<'a> = Mutex<(Option<&'a mut [f32]>, Option<Pick>)>;
    let slots: Vec<Slot<'_>> = values
        .chunks_mut(vocab.max(1))
        .map(|row| Mutex::new((Some(row), None)))
        .collect();
    let next = AtomicUsize::new(0);
    let work = |_: usize, _: usize| {
        loop {
            let r = next.fetch_add(1, Ordering::Relaxed);
            let (Some(slot), Some(job)) = (slots.get(r), sampling.get(r)) else {
                break;
            };
            let Ok(mut slot) = slot.lock() else {
                continue;
            };
            if let Some(row) = slot.0.take() {
                slot.1 = Some(sample_row(job, row));
            }
        }
    };
    match pool {
        Some(p) if rows > 1 => p.run(work),
        _ => work(0, 1),
    }
    slots
        .into_iter()
        .map(|s| {
            s.into_inner()
                .ok()
                .and_then(|(_, pick)| pick)
                .ok_or_else(|| EngineError::Internal("a row was not sampled".into()))
        })
        .collect()
}

/// What [`Stage::launch`] did with a batch.
pub enum Launched {
    /// Computed already.
    Ready(StageData),
    /// On its way (to other nodes); [`Stage::complete`] with this ticket waits for the result.
    Pending(u64),
}

/// A pipeline stage: layers in this process, or the stages on other nodes behind the same trait.
pub trait Stage: Send {
    /// Runs `batch` on `input`; the first stage takes tokens, the last returns logits (or, when it
    /// samples itself, [`StageData::Sampled`] following `sampling`: one entry per chunk that wants
    /// logits, in batch order).
    fn forward(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<StageData, EngineError>;
    /// Frees everything held for `seq_id` (its KV cache). Unknown ids are ignored.
    fn release(&mut self, seq_id: u64);
    /// Tokens held in this stage's KV cache for `seq_id`.
    fn cached_len(&self, seq_id: u64) -> usize;
    /// Keeps the first `len` tokens of `seq_id`'s KV as prefix `prefix_id` and frees the sequence.
    fn retain_prefix(&mut self, seq_id: u64, prefix_id: u64, len: usize)
    -> Result<(), EngineError>;
    /// Starts `seq_id` with a copy of the first `len` tokens of prefix `prefix_id`.
    fn start_from_prefix(
        &mut self,
        prefix_id: u64,
        seq_id: u64,
        len: usize,
    ) -> Result<(), EngineError>;
    /// Frees prefix `prefix_id`. Unknown ids are ignored.
    fn drop_prefix(&mut self, prefix_id: u64);
    /// Sequences whose KV this stage holds now.
    fn held_sequences(&self) -> usize;
    /// Starts `batch` without waiting for its result when the stage can (stages on other nodes), so the
    /// engine can compute another micro-batch meanwhile. Computes it right away otherwise.
    fn launch(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<Launched, EngineError> {
        self.forward(batch, input, sampling).map(Launched::Ready)
    }
    /// The result of a batch [`Stage::launch`] left pending, oldest first.
    fn complete(&mut self, ticket: u64) -> Result<StageData, EngineError> {
        Err(EngineError::Internal(format!(
            "batch {ticket} was never left pending by this stage"
        )))
    }
    /// Pipeline stages behind this one that compute concurrently with this process (0 for local
    /// layers): how many micro-batches may be in flight at once beyond the first.
    fn concurrent_stages(&self) -> usize {
        0
    }
    /// Bytes per stored key or value in this stage's KV caches (f16 on CPU hosts, the default).
    fn kv_value_bytes(&self) -> usize {
        shoal_model::kv::value_bytes(true)
    }
    /// Layers whose KV cache this stage keeps in this process, paid from the engine's node budget
    /// (0 for stages on other nodes: their node budgets them).
    fn local_kv_layers(&self) -> usize {
        0
    }
    /// Tokens of KV per sequence set this stage can hold when its node budgets it (stages on other
    /// nodes); the engine never holds more. `None`: budgeted by the engine's own pool.
    fn kv_token_capacity(&self) -> Option<usize> {
        None
    }
}

/// Layers running in this process.
pub struct LocalStage {
    model: LlamaStage,
    caches: HashMap<u64, KvCache>,
    prefixes: HashMap<u64, KvCache>,
}

impl LocalStage {
    pub fn new(model: LlamaStage) -> Self {
        Self {
            model,
            caches: HashMap::new(),
            prefixes: HashMap::new(),
        }
    }

    pub fn model(&self) -> &LlamaStage {
        &self.model
    }

    /// Frees every sequence and prefix (the pipeline that fed this stage is gone).
    pub fn clear(&mut self) {
        self.caches.clear();
        self.prefixes.clear();
    }

    /// Tokens of KV held: every sequence's and every kept prefix's.
    pub fn held_tokens(&self) -> usize {
        self.caches
            .values()
            .chain(self.prefixes.values())
            .map(KvCache::len)
            .sum()
    }

    /// Bytes one token of KV takes in this stage's layers.
    pub fn kv_bytes_per_token(&self) -> usize {
        let m = &self.model;
        m.config()
            .kv_bytes_per_token(m.range().len(), m.kv_value_bytes())
    }

    /// Bytes of KV cache allocated across all sequences and kept prefixes.
    pub fn kv_bytes(&self) -> usize {
        self.caches
            .values()
            .chain(self.prefixes.values())
            .map(KvCache::allocated_bytes)
            .sum()
    }
}

fn internal(e: impl std::fmt::Display) -> EngineError {
    EngineError::Internal(e.to_string())
}

impl Stage for LocalStage {
    fn kv_value_bytes(&self) -> usize {
        self.model.kv_value_bytes()
    }

    fn local_kv_layers(&self) -> usize {
        self.model.range().len()
    }

    fn forward(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<StageData, EngineError> {
        // Take each sequence's cache out of the map so the model can borrow them all mutably.
        let mut taken: Vec<KvCache> = batch
            .iter()
            .map(|c| {
                self.caches
                    .remove(&c.seq_id)
                    .unwrap_or_else(|| self.model.new_kv_cache())
            })
            .collect();
        let result = {
            let mut chunks: Vec<SeqChunk<'_>> = taken
                .iter_mut()
                .zip(batch)
                .map(|(kv, c)| SeqChunk {
                    kv,
                    len: c.len,
                    want_logits: c.want_logits,
                })
                .collect();

            match input {
                StageData::Tokens(ids) => self.model.forward(StageInput::Tokens(&ids), &mut chunks),
                StageData::Hidden(h) => self.model.forward(StageInput::Hidden(h), &mut chunks),
                StageData::Logits(_) | StageData::Sampled(_) => {
                    return Err(EngineError::Internal("logits sent into a stage".into()));
                }
            }
        };
        for (kv, c) in taken.into_iter().zip(batch) {
            self.caches.insert(c.seq_id, kv);
        }
        let out = result.map_err(internal)?;
        Ok(match (self.model.is_last(), sampling.is_empty()) {
            // Sampled here, on this stage's threads.
            (true, false) => StageData::Sampled(sample_rows(
                &out,
                sampling,
                self.model.pool().map(|p| &**p),
            )?),
            (true, true) => StageData::Logits(out),
            (false, _) => StageData::Hidden(out),
        })
    }

    fn release(&mut self, seq_id: u64) {
        self.caches.remove(&seq_id);
    }

    fn cached_len(&self, seq_id: u64) -> usize {
        self.caches.get(&seq_id).map_or(0, KvCache::len)
    }

    fn retain_prefix(
        &mut self,
        seq_id: u64,
        prefix_id: u64,
        len: usize,
    ) -> Result<(), EngineError> {
        let kv = self
            .caches
            .remove(&seq_id)
            .ok_or_else(|| EngineError::Internal(format!("no KV for sequence {seq_id}")))?;
        // A compact copy: the running cache grows ahead of its length.
        self.prefixes
            .insert(prefix_id, kv.copy_prefix(len).map_err(internal)?);
        Ok(())
    }

    fn start_from_prefix(
        &mut self,
        prefix_id: u64,
        seq_id: u64,
        len: usize,
    ) -> Result<(), EngineError> {
        let prefix = self
            .prefixes
            .get(&prefix_id)
            .ok_or_else(|| EngineError::Internal(format!("no prefix {prefix_id}")))?;
        let kv = prefix.copy_prefix(len).map_err(internal)?;
        self.caches.insert(seq_id, kv);
        Ok(())
    }

    fn drop_prefix(&mut self, prefix_id: u64) {
        self.prefixes.remove(&prefix_id);
    }

    fn held_sequences(&self) -> usize {
        self.caches.len()
    }
}

/// The result of [`launch_pipeline`].
pub enum PipelineLaunch {
    Done(Vec<Pick>),
    /// Pass to [`complete_pipeline`].
    Pending(u64),
}

/// Runs a batch through every stage in order and returns one pick per chunk wanting logits (sampling
/// here when the last stage returned logits), or leaves it in flight when the last stage is on other
/// nodes.
pub fn launch_pipeline(
    stages: &mut [Box<dyn Stage>],
    batch: &[ChunkSpec],
    tokens: Vec<u32>,
    sampling: &[SampleRef<'_>],
) -> Result<PipelineLaunch, EngineError> {
    let Some((last, head)) = stages.split_last_mut() else {
        return Err(EngineError::Internal("a pipeline without stages".into()));
    };
    let mut data = StageData::Tokens(tokens);
    for stage in head.iter_mut() {
        data = stage.forward(batch, data, sampling)?;
    }
    match last.launch(batch, data, sampling)? {
        Launched::Ready(data) => into_picks(data, sampling).map(PipelineLaunch::Done),
        Launched::Pending(ticket) => Ok(PipelineLaunch::Pending(ticket)),
    }
}

/// Waits for a batch [`launch_pipeline`] left pending; `wanted` = chunks of it that want logits.
pub fn complete_pipeline(
    stages: &mut [Box<dyn Stage>],
    ticket: u64,
    wanted: usize,
) -> Result<Vec<Pick>, EngineError> {
    let last = stages
        .last_mut()
        .ok_or_else(|| EngineError::Internal("a pipeline without stages".into()))?;
    match last.complete(ticket)? {
        StageData::Sampled(picks) if picks.len() == wanted => Ok(picks),
        StageData::Sampled(picks) => Err(EngineError::Internal(format!(
            "the pipeline returned {} tokens for {wanted} sequences",
            picks.len()
        ))),
        _ => Err(EngineError::Internal(
            "a pending batch must come back sampled".into(),
        )),
    }
}

/// Micro-batches that may be in flight at once in this pipeline.
pub fn pipeline_depth(stages: &[Box<dyn Stage>]) -> usize {
    1 + stages.iter().map(|s| s.concurrent_stages()).sum::<usize>()
}

fn into_picks(data: StageData, sampling: &[SampleRef<'_>]) -> Result<Vec<Pick>, EngineError> {
    let picks = match data {
        StageData::Logits(l) => sample_rows(&l, sampling, None)?,
        StageData::Sampled(picks) => picks,
        _ => {
            return Err(EngineError::Internal(
                "the pipeline's last stage returned no logits".into(),
            ));
        }
    };
    if picks.len() != sampling.len() {
        return Err(EngineError::Internal(format!(
            "the pipeline returned {} tokens for {} sequences",
            picks.len(),
            sampling.len()
        )));
    }
    Ok(picks)
}
