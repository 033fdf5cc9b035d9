//! The stage seam: one trait for every piece of a pipeline, wherever it runs.
//!
//! The engine hands each stage the same batch description ([`ChunkSpec`]s, in batch order) and the
//! previous stage's output. A stage owns the KV caches of its layers, keyed by sequence id, so a
//! remote stage keeps its KV on its own node and only activations travel. A [`LocalStage`]'s caches take
//! their buffers from its [`KvSource`] once one is bound (the engine binds its node's KV pool, which
//! keeps freed sequences' buffers for the next).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use shoal_kernels::ThreadPool;
use shoal_model::{DecoderStage, HostMatrix, KvCache, KvSource, StageOutput};

pub use crate::batch::{ChunkSpec, KvOp, Outputs, Pick, Pool, StageData};

use crate::error::EngineError;
use crate::group::{GroupKv, GroupLink, Merged, merge_head};
use crate::logits::TokenMask;
use crate::mtp_draft::{Mtp, MtpTap};
use crate::sampler::Sampler;
use crate::seqkv::{SeqKvs, internal};
use crate::verify;

/// How to sample one chunk that wants logits: the owner's sampler state, the sequence so far and the
/// tokens its constraint allows (constrained decoding), if any; with a `draft` (speculative decoding),
/// the drafted tokens the chunk fed after the sequence's last one, to verify over its last
/// `1 + draft.len()` rows ([`crate::verify`]), and the masks of the positions after each drafted token.
/// A stage that samples (a remote last stage) must draw exactly what `sampler` would.
#[derive(Clone, Copy)]
pub struct SampleRef<'a> {
    pub seq_id: u64,
    pub sampler: &'a Sampler,
    pub history: &'a [u32],
    pub mask: Option<&'a TokenMask>,
    /// Drafted tokens to verify (empty: sample one token).
    pub draft: &'a [u32],
    /// What the constraint allows after each drafted token (empty when unconstrained).
    pub draft_masks: &'a [Option<TokenMask>],
}

impl SampleRef<'_> {
    /// Logits rows this chunk needs: one per drafted token and one more.
    pub fn rows(&self) -> usize {
        1 + self.draft.len()
    }
}

/// Samples one row of logits as `job` says; what a last stage that samples runs for each chunk.
///
/// Log-probabilities are those of the model's raw logits — before the mask, the penalties and the
/// temperature — as llama-server (without `post_sampling_probs`) and vLLM report them.
pub fn sample_row(job: &SampleRef<'_>, row: &mut [f32]) -> Pick {
    let mut s = job.sampler.clone();
    verify::pick_row(&mut s, row, job.mask, |s, row| s.sample(row, job.history))
}

/// Samples (or verifies) one chunk's rows as `job` says.
fn sample_chunk(job: &SampleRef<'_>, mut rows: Vec<&mut [f32]>) -> Vec<Pick> {
    if job.draft.is_empty() {
        return rows.iter_mut().map(|r| sample_row(job, r)).collect();
    }
    let masks: Vec<Option<&TokenMask>> = std::iter::once(job.mask)
        .chain(job.draft_masks.iter().map(Option::as_ref))
        .collect();
    let masks = if job.mask.is_none() && job.draft_masks.is_empty() {
        Vec::new()
    } else {
        masks
    };
    verify::verify_chunk(job.sampler, job.history, &masks, job.draft, rows)
}

/// Samples every row of `logits` (`Σ rows, vocab`: [`SampleRef::rows`] per job, in order) in place (the
/// penalties change it) as its job says, the jobs split over `pool`'s threads when there is one (each
/// job's picks are independent of the others and of the split); the picks of every job in order.
pub fn sample_rows(
    logits: &mut HostMatrix,
    sampling: &[SampleRef<'_>],
    pool: Option<&ThreadPool>,
) -> Result<Vec<Pick>, EngineError> {
    let rows = logits.rows();
    let want: usize = sampling.iter().map(SampleRef::rows).sum();
    if rows != want {
        return Err(EngineError::Internal(format!(
            "{rows} rows of logits for {} sequences needing {want}",
            sampling.len()
        )));
    }
    /// A job's rows not yet sampled, then its picks.
    type Slot<'a> = Mutex<(Option<Vec<&'a mut [f32]>>, Option<Vec<Pick>>)>;
    let mut all = logits.rows_mut();
    let slots: Vec<Slot<'_>> = sampling
        .iter()
        .map(|job| Mutex::new((Some(all.by_ref().take(job.rows()).collect()), None)))
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
            if let Some(rows) = slot.0.take() {
                slot.1 = Some(sample_chunk(job, rows));
            }
        }
    };
    match pool {
        Some(p) if sampling.len() > 1 => p.run(work),
        _ => work(0, 1),
    }
    let mut picks = Vec::with_capacity(sampling.len());
    for s in slots {
        let chunk = s
            .into_inner()
            .ok()
            .and_then(|(_, p)| p)
            .ok_or_else(|| EngineError::Internal("a row was not sampled".into()))?;
        picks.extend(chunk);
    }
    Ok(picks)
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
    /// Whether this stage can verify drafted tokens (speculative decoding): on the last stage,
    /// return a logits row for each of a chunk's last [`SampleRef::rows`] positions. Every stage
    /// shoal runs can — CPU or GPU layers, a tensor-parallel group's rank 0, stages on other nodes;
    /// a stage that cannot says so, and then the engine drafts nothing.
    fn verifies(&self) -> bool {
        true
    }
    /// Makes this stage — one member's share of a tensor-parallel group's layers — compute with the
    /// rest of its group through `link`. Only CPU layers loaded as a share can.
    fn join_group(&mut self, link: Box<dyn GroupLink>) -> Result<(), EngineError> {
        drop(link);
        Err(EngineError::Internal(
            "only a CPU stage loaded as a share joins a tensor-parallel group".into(),
        ))
    }
    /// On a last stage in this process whose model has a multi-token-prediction block: the block,
    /// and the tap this stage fills from now on with the hidden rows of the sequences registered
    /// there ([`crate::mtp_draft`]). `None` elsewhere.
    fn mtp(&mut self) -> Option<Mtp> {
        None
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
    /// Where the hidden rows of sequences drafting with the model's multi-token-prediction block go,
    /// once [`Stage::mtp`] was asked.
    mtp_tap: Option<Arc<MtpTap>>,
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
            mtp_tap: None,
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

/// Logits rows per chunk of `batch` when some chunk verifies a draft (its job's
/// [`SampleRef::rows`], 0 for chunks wanting none); `None` when every chunk wants one row at most.
pub fn logit_rows(batch: &[ChunkSpec], sampling: &[SampleRef<'_>]) -> Option<Vec<usize>> {
    if sampling.iter().all(|s| s.draft.is_empty()) {
        return None;
    }
    let mut jobs = sampling.iter();
    Some(
        batch
            .iter()
            .map(|c| match c.want_logits {
                true => jobs.next().map_or(1, SampleRef::rows),
                false => 0,
            })
            .collect(),
    )
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

/// Whether rank 0 can pick every row of the batch from the members' best entries alone: greedy,
/// nothing changing the logits (no mask, on a drafted token's position either), no alternatives to
/// report, and ids exact as f32. A chunk verifying a draft then keeps its rows' picks up to the first
/// that is not the draft's ([`verified_greedy`]).
fn picks_from_summaries(sampling: &[SampleRef<'_>], vocab: usize) -> bool {
    !sampling.is_empty()
        && vocab <= 1 << 24
        && sampling.iter().all(|j| {
            j.mask.is_none()
                && j.draft_masks.iter().all(Option::is_none)
                && j.sampler.is_greedy()
                && !j.sampler.has_penalties()
                && j.sampler.top_logprobs() == 0
        })
}

/// Greedy verification from one greedy pick per logits row (`rows`, [`SampleRef::rows`] a job, in
/// job order): each job's picks up to and including the first that is not its draft's, as
/// [`crate::verify::verify_chunk`] returns them for a greedy sampler.
fn verified_greedy(rows: Vec<Pick>, sampling: &[SampleRef<'_>]) -> Vec<Pick> {
    let mut rows = rows.into_iter();
    let mut picks = Vec::with_capacity(sampling.len());
    for job in sampling {
        let mine: Vec<Pick> = rows.by_ref().take(job.rows()).collect();
        let keep = crate::verify::chunk_picks(job.draft, &mine);
        picks.extend(mine.into_iter().take(keep));
    }
    picks
}

impl LocalStage {
    /// Runs `batch` on these layers now.
    pub fn forward(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<StageData, EngineError> {
        let rows = logit_rows(batch, sampling);
        self.forward_rows(batch, input, sampling, rows.as_deref())
    }

    /// A tensor-parallel member's batch as rank 0 sent it: `rows` each chunk's logits rows when it
    /// verifies drafted tokens (the members compute their share of the head for the same rows).
    pub fn forward_member(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        rows: Option<&[usize]>,
    ) -> Result<StageData, EngineError> {
        self.forward_rows(batch, input, &[], rows)
    }

    fn forward_rows(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
        rows: Option<&[usize]>,
    ) -> Result<StageData, EngineError> {
        let (model, source) = (&self.model, &self.kv_source);
        let new_cache = || Self::new_cache(model, source);
        let tap = self
            .mtp_tap
            .as_ref()
            .filter(|t| batch.iter().any(|c| t.wants(c.seq_id)));
        let out = match &mut self.group {
            None if tap.is_some() => {
                let starts: Vec<usize> = batch
                    .iter()
                    .map(|c| self.kvs.cached_len(c.seq_id))
                    .collect();
                let mut hidden = Vec::new();
                let out = self
                    .kvs
                    .run_batch(batch, input, new_cache, |input, chunks| {
                        model.run_keeping_hidden(input, chunks, rows, &mut hidden)
                    })
                    .map_err(internal)?;
                if let Some(tap) = tap {
                    deposit(tap, batch, &starts, &hidden, model.config().dim);
                }
                out
            }
            None => self
                .kvs
                .run_batch(batch, input, new_cache, |input, chunks| match rows {
                    Some(rows) => model.run_rows(input, chunks, rows),
                    None => model.run(input, chunks),
                })
                .map_err(internal)?,
            Some(link) => {
                let starts: Vec<usize> = batch
                    .iter()
                    .map(|c| self.kvs.cached_len(c.seq_id))
                    .collect();
                link.send_batch(batch, &starts, rows, &input)?;
                let split_head = model.split_head();
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
                    .run_batch(batch, input, new_cache, |input, chunks| match split_head {
                        Some(_) => model.run_split_shard(input, chunks, &mut reduce, rows),
                        None => model.run_split(input, chunks, &mut reduce, rows),
                    });
                let out = match result {
                    Ok(out) => out,
                    Err(e) => return Err(failed.take().unwrap_or_else(|| internal(e))),
                };
                match split_head {
                    None => out,
                    Some((mine, vocab)) => {
                        let whole = !picks_from_summaries(sampling, vocab);
                        match merge_head(&mut **link, out, mine, vocab, whole)? {
                            Merged::Logits(out) => out,
                            Merged::Picks(mut outputs) => {
                                outputs.picks = verified_greedy(outputs.picks, sampling);
                                return Ok(StageData::Sampled(outputs));
                            }
                        }
                    }
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
            kv_token_capacity: self.group.as_ref().and_then(|l| l.kv_token_capacity()),
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

    fn mtp(&mut self) -> Option<Mtp> {
        if self.group.is_some() {
            return None;
        }
        let nextn = self.model.nextn()?.clone();
        let dim = self.model.config().dim;
        let tap = self
            .mtp_tap
            .get_or_insert_with(|| Arc::new(MtpTap::new(dim)))
            .clone();
        Some(Mtp { nextn, tap })
    }
}

/// Hands `tap` the hidden rows (`hidden`: every token of `batch`, `dim` values each) of the chunks
/// whose sequence it wants; chunk `i` started at position `starts[i]`.
fn deposit(tap: &MtpTap, batch: &[ChunkSpec], starts: &[usize], hidden: &[f32], dim: usize) {
    let mut row = 0;
    for (c, &start) in batch.iter().zip(starts) {
        if tap.wants(c.seq_id)
            && let Some(rows) = hidden.get(row * dim..(row + c.len) * dim)
        {
            tap.deposit(c.seq_id, start, rows);
        }
        row += c.len;
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

/// Waits for a batch [`launch_pipeline`] left pending; `wanted` = picks its chunks that want logits
/// may return (one each, up to [`SampleRef::rows`] for one verifying a draft), `pooling` = chunks that
/// pool.
pub fn complete_pipeline(
    stages: &mut [Box<dyn Stage>],
    ticket: u64,
    wanted: std::ops::RangeInclusive<usize>,
    pooling: usize,
) -> Result<Outputs, EngineError> {
    let last = stages
        .last_mut()
        .ok_or_else(|| EngineError::Internal("a pipeline without stages".into()))?;
    match last.complete(ticket)? {
        StageData::Sampled(out)
            if wanted.contains(&out.picks.len()) && out.pooled.rows() == pooling =>
        {
            Ok(out)
        }
        StageData::Sampled(out) => Err(EngineError::Internal(format!(
            "the pipeline returned {} tokens and {} pooled rows for {wanted:?} and {pooling}",
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
    let most: usize = sampling.iter().map(SampleRef::rows).sum();
    if !(sampling.len()..=most).contains(&out.picks.len()) {
        return Err(EngineError::Internal(format!(
            "the pipeline returned {} tokens for {} sequences",
            out.picks.len(),
            sampling.len()
        )));
    }
    Ok(out)
}
