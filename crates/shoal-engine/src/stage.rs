//! The stage seam: one trait for every piece of a pipeline, wherever it runs.
//!
//! The engine hands each stage the same batch description ([`ChunkSpec`]s, in batch order) and the
//! previous stage's output. A stage owns the KV caches of its layers, keyed by sequence id, so a
//! remote stage keeps its KV on its own node and only activations travel. A [`LocalStage`]'s caches take
//! their buffers from its [`KvSource`] once one is bound (the engine binds its node's KV pool, which
//! keeps freed sequences' buffers for the next).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use shoal_kernels::ThreadPool;
use shoal_model::{DecoderStage, HostMatrix, KvCache, KvSource, StageOutput};

pub use crate::batch::{ChunkSpec, KvOp, Outputs, Pick, Pool, StageData};

use crate::error::EngineError;
use crate::group::{GroupKv, GroupLink};
use crate::logits::TokenMask;
use crate::sampler::{self, Sampler};
use crate::seqkv::{SeqKvs, internal};

/// How to sample one chunk that wants logits: the owner's sampler state, the sequence so far and the
/// tokens its constraint allows (constrained decoding), if any. A stage that samples (a remote last
/// stage) must draw exactly what `sampler` would.
#[derive(Clone, Copy)]
pub struct SampleRef<'a> {
    pub seq_id: u64,
    pub sampler: &'a Sampler,
    pub history: &'a [u32],
    pub mask: Option<&'a TokenMask>,
}

/// Samples one row of logits as `job` says; what a last stage that samples runs for each chunk.
///
/// Log-probabilities are those of the model's raw logits — before the mask, the penalties and the
/// temperature — as llama-server (without `post_sampling_probs`) and vLLM report them.
pub fn sample_row(job: &SampleRef<'_>, row: &mut [f32]) -> Pick {
    let normalizer = sampler::log_normalizer(row);
    let top = sampler::top_logprobs(row, job.sampler.top_logprobs(), normalizer);
    // The penalties change the row in place (the mask never touches the token it lets through).
    let raw = job.sampler.has_penalties().then(|| row.to_vec());
    if let Some(mask) = job.mask {
        mask.apply(row);
    }
    let mut s = job.sampler.clone();
    let id = s.sample(row, job.history);
    let logit = raw
        .as_deref()
        .unwrap_or(row)
        .get(id as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    Pick {
        id,
        logprob: logit - normalizer,
        top,
    }
}

/// Samples every row of `logits` (`(sampling.len(), vocab)`) in place (the penalties change it) as its
/// job says, the rows split over `pool`'s threads when there is one (each row's pick is independent of
/// the others and of the split).
pub fn sample_rows(
    logits: &mut HostMatrix,
    sampling: &[SampleRef<'_>],
    pool: Option<&ThreadPool>,
) -> Result<Vec<Pick>, EngineError> {
    let rows = logits.rows();
    if rows != sampling.len() {
        return Err(EngineError::Internal(format!(
            "{rows} rows of logits for {} sequences",
            sampling.len()
        )));
    }
    /// A row not yet sampled, then its pick.
    type Slot<'a> = Mutex<(Option<&'a mut [f32]>, Option<Pick>)>;
    let slots: Vec<Slot<'_>> = logits
        .rows_mut()
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

/// What a stage is, fixed when it is built: what the engine needs to budget and pipeline it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageInfo {
    /// Pipeline stages behind this one that compute concurrently with this process (0 for local
    /// layers): how many micro-batches may be in flight at once beyond the first.
    pub concurrent_stages: usize,
    /// Bytes per stored key or value in this stage's KV caches.
    pub kv_value_bytes: usize,
    /// Layers whose KV cache this stage keeps in this process, paid from the engine's node budget
    /// (0 for stages on other nodes: their node budgets them).
    pub local_kv_layers: usize,
    /// Tokens of KV per sequence set this stage can hold when its node budgets it (stages on other
    /// nodes); the engine never holds more. `None`: budgeted by the engine's own pool.
    pub kv_token_capacity: Option<usize>,
}

/// A pipeline stage: layers in this process, or the stages on other nodes behind the same trait.
pub trait Stage: Send {
    /// What this stage is (constant over its life).
    fn info(&self) -> StageInfo;
    /// Starts `batch` on `input`: the first stage takes tokens, the last returns logits and pooled rows
    /// (or, when it samples itself, [`StageData::Sampled`] following `sampling`: one entry per chunk
    /// that wants logits, in batch order). Stages on other nodes leave it [`Launched::Pending`] so the engine can
    /// compute another micro-batch meanwhile; local layers compute it at once.
    fn launch(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<Launched, EngineError>;
    /// The result of a batch [`Stage::launch`] left pending, oldest first.
    fn complete(&mut self, ticket: u64) -> Result<StageData, EngineError>;
    /// Applies `op` to the KV this stage keeps.
    fn kv(&mut self, op: KvOp) -> Result<(), EngineError>;
    /// Sequences whose KV this stage holds now.
    fn held_sequences(&self) -> usize;
    /// Makes this stage — one member's share of a tensor-parallel group's layers — compute with the
    /// rest of its group through `link`. Only CPU layers loaded as a share can.
    fn join_group(&mut self, link: Box<dyn GroupLink>) -> Result<(), EngineError> {
        drop(link);
        Err(EngineError::Internal(
            "only a CPU stage loaded as a share joins a tensor-parallel group".into(),
        ))
    }
}

/// Runs `batch` through `stage` and waits for its result.
pub fn forward(
    stage: &mut dyn Stage,
    batch: &[ChunkSpec],
    input: StageData,
    sampling: &[SampleRef<'_>],
) -> Result<StageData, EngineError> {
    match stage.launch(batch, input, sampling)? {
        Launched::Ready(data) => Ok(data),
        Launched::Pending(ticket) => stage.complete(ticket),
    }
}

/// Applies `op` on every stage of a pipeline, stopping at the first error.
pub fn kv_all(stages: &mut [Box<dyn Stage>], op: KvOp) -> Result<(), EngineError> {
    stages.iter_mut().try_for_each(|s| s.kv(op))
}

/// Applies `op` on every stage of a pipeline whatever happens (freeing: a stage that cannot is gone
/// and holds nothing any more).
pub fn kv_all_lossy(stages: &mut [Box<dyn Stage>], op: KvOp) {
    for s in stages.iter_mut() {
        if let Err(e) = s.kv(op) {
            tracing::debug!("{op:?} on a stage: {e}");
        }
    }
}

/// Layers running in this process.
pub struct LocalStage {
    model: DecoderStage,
    kvs: SeqKvs<KvCache>,
    /// Where new caches take their buffers (each allocates its own until one is bound).
    kv_source: KvSource,
    /// When the layers are one member's share of a tensor-parallel group: its link to the others.
    group: Option<Box<dyn GroupLink>>,
}

impl LocalStage {
    /// A stage whose caches allocate their own buffers.
    pub fn new(model: DecoderStage) -> Self {
        Self::with_kv_source(model, KvSource::default())
    }

    /// A stage whose caches take their buffers from `kv_source` once it is bound.
    pub fn with_kv_source(model: DecoderStage, kv_source: KvSource) -> Self {
        Self {
            model,
            kvs: SeqKvs::default(),
            kv_source,
            group: None,
        }
    }

    /// Leaves its group (which went): the share waits for a new one.
    pub fn leave(&mut self) {
        self.group = None;
    }

    /// Makes these layers (a member's share, `DecoderStage::load_share`) compute with the rest of
    /// their group through `link`.
    pub fn join(&mut self, link: Box<dyn GroupLink>) -> Result<(), EngineError> {
        match self.model.share() {
            Some(share) if share.rank == link.rank() => {
                self.group = Some(link);
                Ok(())
            }
            Some(share) => Err(EngineError::Internal(format!(
                "rank {}'s share joined its group as rank {}",
                share.rank,
                link.rank()
            ))),
            None => Err(EngineError::Internal(
                "whole layers cannot join a tensor-parallel group (load a share)".into(),
            )),
        }
    }

    /// An empty KV cache for a new sequence.
    fn new_cache(model: &DecoderStage, source: &KvSource) -> KvCache {
        KvCache::for_model(model.config(), model.range().len(), source.get())
    }

    pub fn model(&self) -> &DecoderStage {
        &self.model
    }

    /// Frees every sequence and prefix (the pipeline that fed this stage is gone), on every member of
    /// its group too (one that cannot be told has lost its group: the next batch finds out).
    pub fn clear(&mut self) {
        self.kvs.clear();
        if let Some(link) = &mut self.group
            && let Err(e) = link.send_kv(GroupKv::Clear)
        {
            tracing::warn!("a cleared stage could not tell its group: {e}");
        }
    }

    /// Tokens of KV held: every sequence's and every kept prefix's.
    pub fn held_tokens(&self) -> usize {
        self.kvs.held_tokens()
    }

    /// Bytes one token of KV takes in this stage's layers.
    pub fn kv_bytes_per_token(&self) -> usize {
        let m = &self.model;
        m.config()
            .kv_bytes_per_token(m.range().len(), m.kv_value_bytes())
    }

    /// Bytes of KV cache allocated across all sequences and kept prefixes.
    pub fn kv_bytes(&self) -> usize {
        self.kvs.kv_bytes()
    }
}

/// What a local stage returns for its model's output: hidden states, or on the last stage the
/// logits (sampled here when `sampling` asks, on `pool`'s threads) and pooled rows.
pub(crate) fn stage_data(
    is_last: bool,
    out: StageOutput,
    sampling: &[SampleRef<'_>],
    pool: Option<&ThreadPool>,
) -> Result<StageData, EngineError> {
    let (mut logits, pooled) = (out.main, out.pooled);
    Ok(match (is_last, sampling.is_empty()) {
        (true, false) => StageData::Sampled(Outputs {
            picks: sample_rows(&mut logits, sampling, pool)?,
            pooled,
        }),
        (true, true) => StageData::Logits { logits, pooled },
        (false, _) => StageData::Hidden(logits),
    })
}

impl LocalStage {
    /// Runs `batch` on these layers now.
    pub fn forward(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<StageData, EngineError> {
        let (model, source) = (&self.model, &self.kv_source);
        let new_cache = || Self::new_cache(model, source);
        let out = match &mut self.group {
            None => self
                .kvs
                .run_batch(batch, input, new_cache, |input, chunks| {
                    model.run(input, chunks)
                })
                .map_err(internal)?,
            Some(link) => {
                let starts: Vec<usize> = batch
                    .iter()
                    .map(|c| self.kvs.cached_len(c.seq_id))
                    .collect();
                link.send_batch(batch, &starts, &input)?;
                // The link's own error, not the model's rewording of it.
                let mut failed = None;
                let mut reduce = |partial: &mut [f32]| {
                    link.reduce(partial).map_err(|e| {
                        let why = e.to_string();
                        failed = Some(e);
                        shoal_model::ModelError::Unsupported(why)
                    })
                };
                let result = self
                    .kvs
                    .run_batch(batch, input, new_cache, |input, chunks| {
                        model.run_split(input, chunks, &mut reduce)
                    });
                match result {
                    Ok(out) => out,
                    Err(e) => return Err(failed.take().unwrap_or_else(|| internal(e))),
                }
            }
        };
        stage_data(
            self.model.is_last(),
            out,
            sampling,
            Some(&**self.model.pool()),
        )
    }

    /// Tokens held in this stage's KV cache for `seq_id`.
    pub fn cached_len(&self, seq_id: u64) -> usize {
        self.kvs.cached_len(seq_id)
    }

    /// Whether this stage keeps the prefix `prefix_id`.
    pub fn has_prefix(&self, prefix_id: u64) -> bool {
        self.kvs.has_prefix(prefix_id)
    }

    /// Whether `seq_id`'s cache is a placeholder (see [`LocalStage::rewind`]).
    pub fn is_placeholder(&self, seq_id: u64) -> bool {
        self.kvs.is_placeholder(seq_id)
    }

    /// Leaves `seq_id` with exactly its first `len` tokens: cut back when it holds more. When the
    /// sequence is gone, a placeholder of `len` blank tokens takes its place — for a batch sent again
    /// after a cut path whose sequence was released after it: the batch computes again, the
    /// placeholder's outputs mean nothing (their request is over), and its KV is never kept (a
    /// retain of it frees it, a fork of it copies nothing).
    pub fn rewind(&mut self, seq_id: u64, len: usize) -> Result<(), EngineError> {
        let (model, source) = (&self.model, &self.kv_source);
        self.kvs
            .rewind(seq_id, len, || Self::new_cache(model, source))?;
        match &mut self.group {
            Some(link) => link.send_kv(GroupKv::Rewind { seq_id, len }),
            None => Ok(()),
        }
    }
}

impl Stage for LocalStage {
    fn info(&self) -> StageInfo {
        StageInfo {
            concurrent_stages: 0,
            kv_value_bytes: self.model.kv_value_bytes(),
            local_kv_layers: self.model.range().len(),
            kv_token_capacity: None,
        }
    }

    fn launch(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<Launched, EngineError> {
        self.forward(batch, input, sampling).map(Launched::Ready)
    }

    fn complete(&mut self, ticket: u64) -> Result<StageData, EngineError> {
        never_pending(ticket)
    }

    fn kv(&mut self, op: KvOp) -> Result<(), EngineError> {
        self.kvs.apply(op)?;
        match &mut self.group {
            Some(link) => link.send_kv(GroupKv::Op(op)),
            None => Ok(()),
        }
    }

    fn held_sequences(&self) -> usize {
        self.kvs.sequences()
    }

    fn join_group(&mut self, link: Box<dyn GroupLink>) -> Result<(), EngineError> {
        self.join(link)
    }
}

/// What [`Stage::complete`] answers on layers in this process (CPU or GPU): they compute a batch at
/// once and never leave one pending.
pub(crate) fn never_pending(ticket: u64) -> Result<StageData, EngineError> {
    Err(EngineError::Internal(format!(
        "batch {ticket}: local layers never leave a batch pending"
    )))
}

/// The result of [`launch_pipeline`].
pub enum PipelineLaunch {
    Done(Outputs),
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
        data = forward(stage.as_mut(), batch, data, sampling)?;
    }
    match last.launch(batch, data, sampling)? {
        Launched::Ready(data) => into_outputs(data, sampling).map(PipelineLaunch::Done),
        Launched::Pending(ticket) => Ok(PipelineLaunch::Pending(ticket)),
    }
}

/// Waits for a batch [`launch_pipeline`] left pending; `wanted` = chunks of it that want logits,
/// `pooling` = chunks that pool.
pub fn complete_pipeline(
    stages: &mut [Box<dyn Stage>],
    ticket: u64,
    wanted: usize,
    pooling: usize,
) -> Result<Outputs, EngineError> {
    let last = stages
        .last_mut()
        .ok_or_else(|| EngineError::Internal("a pipeline without stages".into()))?;
    match last.complete(ticket)? {
        StageData::Sampled(out) if out.picks.len() == wanted && out.pooled.rows() == pooling => {
            Ok(out)
        }
        StageData::Sampled(out) => Err(EngineError::Internal(format!(
            "the pipeline returned {} tokens and {} pooled rows for {wanted} and {pooling}",
            out.picks.len(),
            out.pooled.rows()
        ))),
        _ => Err(EngineError::Internal(
            "a pending batch must come back sampled".into(),
        )),
    }
}

/// Micro-batches that may be in flight at once in this pipeline.
pub fn pipeline_depth(stages: &[Box<dyn Stage>]) -> usize {
    1 + stages
        .iter()
        .map(|s| s.info().concurrent_stages)
        .sum::<usize>()
}

fn into_outputs(data: StageData, sampling: &[SampleRef<'_>]) -> Result<Outputs, EngineError> {
    let out = match data {
        StageData::Logits { mut logits, pooled } => Outputs {
            picks: sample_rows(&mut logits, sampling, None)?,
            pooled,
        },
        StageData::Sampled(out) => out,
        _ => {
            return Err(EngineError::Internal(
                "the pipeline's last stage returned no logits".into(),
            ));
        }
    };
    if out.picks.len() != sampling.len() {
        return Err(EngineError::Internal(format!(
            "the pipeline returned {} tokens for {} sequences",
            out.picks.len(),
            sampling.len()
        )));
    }
    Ok(out)
}
