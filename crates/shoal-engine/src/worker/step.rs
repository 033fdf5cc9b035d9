//! One engine step, in phases: [`Worker::refresh_masks`] (constrained sequences learn which tokens
//! may come next) → [`Worker::ready_sequences`] → [`Worker::ensure_decode_room`] (make room,
//! preempt, or end a lone oversize sequence) → the KV grant → [`Worker::plan`] (views, the ITL-slack
//! prefill chunk, the micro-batch) → [`Worker::build_batch`] → [`Worker::launch`] (timing, counters) →
//! [`Worker::deliver`] the picks, or keep the batch in flight and land it later
//! ([`Worker::complete_oldest`]).

use std::time::Instant;

use super::{Flight, Worker};
use crate::error::EngineError;
use crate::request::FinishReason;
use crate::scheduler::{SeqView, StepBudget, plan_micro_batch};
use crate::sequence::Sequence;
use crate::stage::{
    ChunkSpec, Outputs, PipelineLaunch, Pool, SampleRef, complete_pipeline, launch_pipeline,
    pipeline_depth,
};
use crate::verify;

/// Prompts with more tokens still to prefill than this are "long": their chunks obey the ITL slack.
const LONG_PROMPT_TOKENS: usize = 256;

/// What one step computes: `(index into running, tokens to feed)`, decodes first (a decode that
/// verifies a draft feeds its drafted tokens too).
pub(super) type Plan = Vec<(usize, usize)>;

/// One entry per chunk of a batch that wants logits: the drafted tokens it verifies (empty: none).
pub(super) type Drafts = Vec<Vec<u32>>;

impl Worker {
    /// One engine step: launch a micro-batch of the sequences that are not in flight, or, when the
    /// pipeline is full (or nothing is ready), wait for the oldest batch in flight. With only local stages
    /// every batch completes at once; with stages on other nodes up to [`pipeline_depth`] micro-batches
    /// are in different stages at the same time.
    pub(super) fn step(&mut self) {
        self.refresh_masks();
        let depth = pipeline_depth(&self.stages);
        let ready = self.ready_sequences();
        if !ready.contains(&true) || self.flights.len() >= depth {
            self.complete_oldest();
            return;
        }
        if !self.ensure_decode_room(&ready) {
            return;
        }
        // Take what the pool can give for this step (up to a full batch); unused room goes back after it.
        let free = self
            .kv
            .grant_step(self.kv_in_use(), self.config.max_batch_tokens);
        let (views, mut plan) = self.plan(depth, free);
        if plan.is_empty() {
            self.complete_oldest();
            return;
        }
        self.draft(&mut plan, free);
        let (batch, tokens, drafts) = self.build_batch(&plan);
        let started = Instant::now();
        match self.launch(&plan, &views, &batch, tokens) {
            Ok(PipelineLaunch::Done(out)) => {
                self.meters.step(started.elapsed());
                self.deliver(&batch, &drafts, out)
            }
            Ok(PipelineLaunch::Pending(ticket)) => self.flights.push_back(Flight {
                ticket,
                batch,
                drafts,
                started,
            }),
            Err(e) => self.fail_batch(&batch, e),
        }
    }

    /// Asks each constrained sequence's processor for its next token's mask (once per token; it travels
    /// with the step to whichever stage samples); a sequence whose constraint fails or allows nothing
    /// ends with the error. Unconstrained sequences cost one check.
    fn refresh_masks(&mut self) {
        let mut failed = Vec::new();
        for (i, seq) in self.running.iter_mut().enumerate() {
            if seq.constrained()
                && let Err(e) = seq.refresh_mask()
            {
                failed.push((i, e));
            }
        }
        for (i, e) in failed.into_iter().rev() {
            self.fail(i, e);
        }
    }

    /// Which running sequences have tokens to compute and are not part of a batch in flight.
    fn ready_sequences(&self) -> Vec<bool> {
        self.running
            .iter()
            .map(|s| s.pending() > 0 && !self.in_flight(s.id))
            .collect()
    }

    /// Whether sequence `id` is part of a batch still in flight.
    fn in_flight(&self, id: u64) -> bool {
        self.flights
            .iter()
            .any(|f| f.batch.iter().any(|c| c.seq_id == id))
    }

    /// Every decoding sequence needs one more KV slot: makes room, or preempts until it fits; true when
    /// the step can go on. A lone sequence that outgrew the whole node budget ends as if it had hit its
    /// length limit; one that only lacks room other engines hold steps aside until they free it.
    fn ensure_decode_room(&mut self, ready: &[bool]) -> bool {
        loop {
            let decodes = self
                .running
                .iter()
                .zip(ready)
                .filter(|(s, r)| **r && s.decoding())
                .count();
            // At least one free slot, so the step always makes progress.
            if self.make_room(decodes.max(1)) {
                return true;
            }
            if !self.flights.is_empty() {
                // Batches in flight may finish sequences and free memory: let them land first.
                self.complete_oldest();
                return false;
            }
            if self.running.len() == 1 {
                if self.running[0].tokens.len() + 1 > self.kv.max_tokens() {
                    self.finish(0, FinishReason::Length);
                } else {
                    self.preempt_newest();
                }
                return false;
            }
            self.preempt_newest();
        }
    }

    /// What the planner sees of each running sequence, and the micro-batch to launch with `free` KV
    /// tokens: the running sequences split evenly over the micro-batches a pipeline `depth` deep holds.
    fn plan(&self, depth: usize, free: usize) -> (Vec<SeqView>, Plan) {
        let views: Vec<SeqView> = self
            .running
            .iter()
            .map(|s| SeqView {
                pending: if self.in_flight(s.id) { 0 } else { s.pending() },
                decoding: s.decoding(),
            })
            .collect();
        let per_batch = self.running.len().div_ceil(depth);
        // A long prompt is prefilled in chunks sized so running streams' steps stay within the ITL slack;
        // short prompts (a burst of chat turns) take the full chunk, or their TTFT would suffer for little.
        let long_prompt = views
            .iter()
            .any(|v| !v.decoding && v.pending > LONG_PROMPT_TOKENS);
        let chunk = if long_prompt {
            self.times.prefill_chunk(
                self.config.itl_slack,
                self.config.max_prefill_while_decoding,
            )
        } else {
            self.config.max_prefill_while_decoding
        };
        let plan = plan_micro_batch(
            &views,
            StepBudget {
                max_tokens: self.config.max_batch_tokens.min(free),
                max_prefill_while_decoding: chunk,
            },
            per_batch,
        );
        (views, plan)
    }

    /// The batch description every stage gets, the tokens the first stage takes (a sequence's
    /// drafted tokens after its own), and the draft each chunk wanting logits verifies.
    fn build_batch(&self, plan: &Plan) -> (Vec<ChunkSpec>, Vec<u32>, Drafts) {
        let mut batch = Vec::with_capacity(plan.len());
        let mut tokens = Vec::new();
        let mut drafts = Vec::new();
        for &(i, n) in plan {
            let s = &self.running[i];
            let own = n - s.draft.len();
            tokens.extend_from_slice(&s.tokens[s.computed..s.computed + own]);
            tokens.extend_from_slice(&s.draft);
            let want_logits = !s.is_embedding() && s.computed + own == s.tokens.len();
            if want_logits {
                drafts.push(s.draft.clone());
            }
            batch.push(ChunkSpec {
                seq_id: s.id,
                len: n,
                want_logits,
                pool: s.chunk_pool(n),
            });
        }
        (batch, tokens, drafts)
    }

    /// Runs `batch` into the pipeline, records how long a batch computed here took, and counts the
    /// step; the stages hold (or are computing) its KV from now on.
    fn launch(
        &mut self,
        plan: &Plan,
        views: &[SeqView],
        batch: &[ChunkSpec],
        tokens: Vec<u32>,
    ) -> Result<PipelineLaunch, EngineError> {
        let sampling = sample_refs(&self.running, plan, batch);
        let started = Instant::now();
        let launched = launch_pipeline(&mut self.stages, batch, tokens, &sampling);
        drop(sampling);
        if let Ok(PipelineLaunch::Done(_)) = &launched {
            // Only a batch computed here says how long this engine's steps take.
            let decodes = plan.iter().filter(|&&(i, _)| views[i].decoding).count();
            let prefill: usize = plan
                .iter()
                .filter(|&&(i, _)| !views[i].decoding)
                .map(|&(_, n)| n)
                .sum();
            let drafted = plan.iter().map(|&(i, _)| self.running[i].draft.len()).sum();
            self.record_step(decodes, prefill, drafted, started.elapsed().as_secs_f64());
        }
        self.counters.stepped();
        for &(i, n) in plan {
            let seq = &mut self.running[i];
            if seq.computed < seq.prompt_len {
                self.counters.prefilled(n - seq.draft.len());
            }
            // The drafted tokens' KV is held apart until their pass is verified.
            seq.spec_held = seq.draft.len();
            seq.computed += n - seq.draft.len();
        }
        launched
    }

    /// Waits for the oldest batch in flight and delivers its tokens.
    pub(super) fn complete_oldest(&mut self) {
        let Some(flight) = self.flights.pop_front() else {
            return;
        };
        let wanted = flight.batch.iter().filter(|c| c.want_logits).count();
        let drafted: usize = flight.drafts.iter().map(Vec::len).sum();
        let pooling = flight.batch.iter().filter(|c| c.pool != Pool::None).count();
        let picks = wanted..=wanted + drafted;
        match complete_pipeline(&mut self.stages, flight.ticket, picks, pooling) {
            Ok(out) => {
                let took = flight.started.elapsed();
                self.meters.step(took);
                self.record_flight(&flight.batch, &flight.drafts, took.as_secs_f64());
                self.deliver(&flight.batch, &flight.drafts, out)
            }
            Err(e) => self.fail_batch(&flight.batch, e),
        }
    }

    /// Fails every still-running sequence of `batch`.
    fn fail_batch(&mut self, batch: &[ChunkSpec], e: EngineError) {
        tracing::error!("engine step failed: {e}");
        let mut ids: Vec<usize> = self
            .running
            .iter()
            .enumerate()
            .filter(|(_, s)| batch.iter().any(|c| c.seq_id == s.id))
            .map(|(i, _)| i)
            .collect();
        ids.sort_unstable_by(|a, b| b.cmp(a));
        for i in ids {
            self.fail(i, e.clone());
        }
    }

    /// Streams the tokens picked for `batch` (one per chunk wanting logits, in order — or, for a
    /// chunk verifying a draft in `drafts`, its accepted drafted tokens and one more), hands
    /// embeddings their pooled rows (one per chunk pooling) and ends the sequences that are done.
    /// Sequences that ended while the batch was in flight are skipped.
    fn deliver(&mut self, batch: &[ChunkSpec], drafts: &Drafts, out: Outputs) {
        self.deliver_pooled(batch, &out.pooled);
        // Prompt chunks (a decode chunk is one token that wants logits) tell their progress.
        for spec in batch.iter().filter(|c| c.len > 1 || !c.want_logits) {
            if let Some(seq) = self.running.iter().find(|s| s.id == spec.seq_id) {
                seq.report_prefill();
            }
        }
        let picks = out.picks;
        let mut at = 0;
        let mut done = Vec::new();
        // One clock reading per step: every token of the batch arrived now.
        let now = Instant::now();
        for (j, spec) in batch.iter().filter(|c| c.want_logits).enumerate() {
            let draft = drafts.get(j).map_or(&[][..], Vec::as_slice);
            let rest = picks.get(at..).unwrap_or_default();
            if rest.is_empty() {
                break;
            }
            let n = verify::chunk_picks(draft, rest);
            at += n;
            let Some(i) = self.running.iter().position(|s| s.id == spec.seq_id) else {
                continue;
            };
            let mut pushed = 0;
            for pick in &rest[..n] {
                self.counters.generated();
                let seq = &mut self.running[i];
                if !seq.warm_up {
                    self.meters.token(seq.queued, seq.last_token, now);
                }
                seq.last_token = Some(now);
                pushed += 1;
                let verified = !draft.is_empty();
                match seq.push(pick.clone(), verified, &self.tokenizer, self.context_length) {
                    Ok(Some(reason)) => {
                        done.push((i, Ok(reason)));
                        break;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        done.push((i, Err(e)));
                        break;
                    }
                }
            }
            if !draft.is_empty()
                && let Err(e) = self.settle_draft(i, draft, &rest[..n], pushed)
                && !done.iter().any(|d| d.0 == i)
            {
                done.push((i, Err(e)));
            }
        }
        done.sort_unstable_by_key(|d| std::cmp::Reverse(d.0));
        for (i, end) in done {
            match end {
                Ok(reason) => self.finish(i, reason),
                Err(e) => self.fail(i, e),
            }
        }
    }
}

impl Worker {
    /// Gives each embedding of `batch` its pooled rows and sends those whose last chunk this was.
    fn deliver_pooled(&mut self, batch: &[ChunkSpec], pooled: &shoal_model::HostMatrix) {
        let pooling = batch.iter().filter(|c| c.pool != Pool::None);
        for (r, spec) in pooling.enumerate() {
            let (Some(row), Some(seq)) = (
                pooled.row(r),
                self.running.iter_mut().find(|s| s.id == spec.seq_id),
            ) else {
                continue;
            };
            seq.add_pooled(row);
        }
        // A batch holds a sequence's newest chunk: an embedding computed to its end is done.
        let mut ended: Vec<usize> = self
            .running
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.is_embedding()
                    && s.computed == s.tokens.len()
                    && batch.iter().any(|c| c.seq_id == s.id)
            })
            .map(|(i, _)| i)
            .collect();
        ended.sort_unstable_by(|a, b| b.cmp(a));
        for i in ended {
            self.finish_embedding(i);
        }
    }
}

/// How to sample each chunk of `batch` that wants logits: its sequence's sampler and tokens so far.
fn sample_refs<'a>(
    running: &'a [Sequence],
    plan: &Plan,
    batch: &[ChunkSpec],
) -> Vec<SampleRef<'a>> {
    plan.iter()
        .zip(batch)
        .filter(|(_, spec)| spec.want_logits)
        .map(|(&(i, _), spec)| SampleRef {
            seq_id: spec.seq_id,
            sampler: &running[i].sampler,
            history: &running[i].tokens,
            mask: running[i].mask(),
            draft: &running[i].draft,
            draft_masks: &running[i].draft_masks,
        })
        .collect()
}
