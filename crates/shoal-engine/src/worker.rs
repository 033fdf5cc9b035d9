//! The engine thread: owns the pipeline stages and every sequence.
//!
//! Each step it frees cancelled and timed-out requests, admits waiting ones within the KV budget
//! (evicting cached prefixes, preempting the newest sequence when decodes no longer fit), plans the step
//! ([`crate::scheduler::plan_step`]), runs the batch through the stages, samples, and streams events.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Instant;

use shoal_model::ModelConfig;
use shoal_model::tokenizer::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use crate::engine::{Admission, Counters, EngineConfig};
use crate::error::EngineError;
use crate::kvpool::KvPool;
use crate::prefix::PrefixIndex;
use crate::request::{Event, FinishReason, Usage};
use crate::sampler::Sampler;
use crate::scheduler::{SeqView, StepBudget, StepTimes, plan_micro_batch};
use crate::stage::{
    ChunkSpec, KvOp, Pick, PipelineLaunch, SampleRef, Stage, complete_pipeline, kv_all,
    kv_all_lossy, launch_pipeline, pipeline_depth,
};
use crate::stop::StopMatcher;

/// Prompts with more tokens still to prefill than this are "long": their chunks obey the ITL slack.
const LONG_PROMPT_TOKENS: usize = 256;

/// How often an engine with nothing it can run checks whether KV memory came free.
const WAIT_FOR_MEMORY: std::time::Duration = std::time::Duration::from_millis(2);
/// How often an idle engine holding cached prefixes checks whether another engine needs the memory.
const IDLE_MEMORY_CHECK: std::time::Duration = std::time::Duration::from_millis(10);

/// A sequence owned by the engine thread.
struct Sequence {
    id: u64,
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Tokens whose KV is computed on every stage.
    computed: usize,
    max_new: usize,
    sampler: Sampler,
    decoder: StreamDecoder,
    stop: StopMatcher,
    tx: UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
    ignore_eos: bool,
    deadline: Option<Instant>,
    timeout_ms: u64,
    /// Prompt tokens whose KV came from the prefix cache.
    cached: usize,
}

impl Sequence {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_len as u32,
            completion_tokens: self.generated() as u32,
            cached_tokens: self.cached as u32,
        }
    }

    fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.tx.is_closed()
    }
}

pub(crate) struct Worker {
    stages: Vec<Box<dyn Stage>>,
    prefix: PrefixIndex,
    /// The node's KV memory, shared with other engines.
    pool: Arc<KvPool>,
    /// KV bytes one token takes in the layers of this process (what the node's pool pays).
    token_bytes: usize,
    /// Tokens of KV the stages on other nodes can hold (`usize::MAX` when there are none).
    token_cap: usize,
    /// Tokens of KV this engine has reserved in the pool (≥ what it holds).
    reserved: usize,
    /// Whether this engine has asked the others for memory (and should withdraw the request once served).
    asked_others: bool,
    /// Sequences whose KV was dropped to stay in budget; they resume first, recomputing their KV.
    preempted: VecDeque<Sequence>,
    tokenizer: Arc<Tokenizer>,
    context_length: usize,
    config: EngineConfig,
    counters: Arc<Counters>,
    running: Vec<Sequence>,
    waiting: VecDeque<Admission>,
    seed_counter: u64,
    /// Micro-batches launched into a pipeline with stages on other nodes and not yet answered, oldest
    /// first.
    flights: VecDeque<Flight>,
    /// Measured step times, which size the prefill chunk taken while streams decode.
    times: StepTimes,
}

/// A micro-batch in flight.
struct Flight {
    ticket: u64,
    batch: Vec<ChunkSpec>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // The engine is gone: its KV memory is the other engines' now.
        self.pool.release(self.reserved * self.token_bytes);
    }
}

impl Worker {
    pub(crate) fn new(
        stages: Vec<Box<dyn Stage>>,
        tokenizer: Arc<Tokenizer>,
        model: &ModelConfig,
        config: EngineConfig,
        counters: Arc<Counters>,
        seed: u64,
    ) -> Self {
        // The node's pool pays for the KV of the layers in this process; stages on other nodes are
        // budgeted there and bound how many tokens this engine may hold in all.
        let value_bytes = stages.first().map_or(2, |s| s.info().kv_value_bytes);
        let local_layers = stages
            .iter()
            .map(|s| s.info().local_kv_layers)
            .sum::<usize>();
        let token_bytes = model
            .kv_bytes_per_token(local_layers.max(1), value_bytes)
            .max(1);
        let token_cap = stages
            .iter()
            .filter_map(|s| s.info().kv_token_capacity)
            .min()
            .unwrap_or(usize::MAX);
        let pool = config
            .kv_pool
            .clone()
            .unwrap_or_else(|| Arc::new(KvPool::new(config.kv_budget_bytes)));
        Self {
            pool,
            token_bytes,
            token_cap,
            reserved: 0,
            asked_others: false,
            preempted: VecDeque::new(),
            prefix: PrefixIndex::new(config.prefix_cache_tokens),
            stages,
            tokenizer,
            context_length: model.context_length,
            config,
            counters,
            running: Vec::new(),
            waiting: VecDeque::new(),
            seed_counter: seed,
            flights: VecDeque::new(),
            times: StepTimes::default(),
        }
    }

    pub(crate) fn run(&mut self, rx: Receiver<Admission>) {
        loop {
            if self.running.is_empty()
                && self.waiting.is_empty()
                && self.preempted.is_empty()
                && self.flights.is_empty()
            {
                if self.prefix.used_tokens() == 0 {
                    match rx.recv() {
                        Ok(a) => self.waiting.push_back(a),
                        Err(_) => return, // every handle is gone
                    }
                } else {
                    // Idle but holding cached prefixes: wake up now and then in case another engine
                    // on the node needs the memory.
                    match rx.recv_timeout(IDLE_MEMORY_CHECK) {
                        Ok(a) => self.waiting.push_back(a),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            }
            // Pull only while the wait list has room: beyond that requests stay in the bounded channel,
            // which then answers `Overloaded` to new submissions instead of growing without limit.
            while self.waiting.len() < self.config.queue_depth {
                let Ok(a) = rx.try_recv() else { break };
                self.waiting.push_back(a);
            }
            self.drop_cancelled();
            self.admit();
            if !self.running.is_empty() || !self.flights.is_empty() {
                // (Batches of sequences that ended meanwhile still land, in order.)
                self.step();
            } else if !(self.waiting.is_empty() && self.preempted.is_empty()) {
                // Work waits for KV memory that other engines on the node hold: poll for it (and for new
                // requests) instead of spinning.
                match rx.recv_timeout(WAIT_FOR_MEMORY) {
                    Ok(a) => self.waiting.push_back(a),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            self.publish_memory();
        }
    }

    /// Frees cancelled requests and fails those past their deadline.
    fn drop_cancelled(&mut self) {
        let now = Instant::now();
        let before = self.waiting.len();
        self.waiting.retain(|a| {
            if a.tx.is_closed() {
                return false;
            }
            if a.cancel.load(Ordering::Relaxed) {
                let usage = Usage {
                    prompt_tokens: a.tokens.len() as u32,
                    ..Usage::default()
                };
                let _ = a.tx.send(Event::Done {
                    finish_reason: FinishReason::Cancelled,
                    usage,
                });
                return false;
            }
            if a.deadline.is_some_and(|d| now >= d) {
                let after_ms = a.request.timeout.map_or(0, |t| t.as_millis() as u64);
                let _ = a.tx.send(Event::Error(EngineError::Timeout { after_ms }));
                return false;
            }
            true
        });
        self.counters
            .waiting
            .fetch_sub(before - self.waiting.len(), Ordering::Relaxed);
        let before = self.preempted.len();
        self.preempted.retain(|s| {
            let timed_out = s.deadline.is_some_and(|d| now >= d);
            if timed_out {
                let _ = s.tx.send(Event::Error(EngineError::Timeout {
                    after_ms: s.timeout_ms,
                }));
            } else if s.is_cancelled() {
                let _ = s.tx.send(Event::Done {
                    finish_reason: FinishReason::Cancelled,
                    usage: s.usage(),
                });
            }
            !(timed_out || s.is_cancelled())
        });
        self.counters
            .active
            .fetch_sub(before - self.preempted.len(), Ordering::Relaxed);
        let mut i = 0;
        while i < self.running.len() {
            let seq = &self.running[i];
            if seq.is_cancelled() {
                self.finish(i, FinishReason::Cancelled);
            } else if seq.deadline.is_some_and(|d| now >= d) {
                let after_ms = seq.timeout_ms;
                self.fail(i, EngineError::Timeout { after_ms });
            } else {
                i += 1;
            }
        }
    }

    fn publish_memory(&mut self) {
        self.yield_memory();
        self.trim_reservation();
        let c = &self.counters;
        c.kv_tokens.store(self.kv_in_use(), Ordering::Relaxed);
        let held = self.stages.iter().map(|s| s.held_sequences()).sum();
        c.stage_sequences.store(held, Ordering::Relaxed);
    }

    /// KV tokens held: running sequences plus cached prefixes.
    fn kv_in_use(&self) -> usize {
        self.running.iter().map(|s| s.computed).sum::<usize>() + self.prefix.used_tokens()
    }

    /// Tokens of KV the whole node budget holds, or the remote stages can hold if fewer (the most this
    /// engine could ever get).
    fn max_kv_tokens(&self) -> usize {
        (self.pool.budget() / self.token_bytes)
            .min(self.token_cap)
            .max(1)
    }

    /// Grows this engine's reservation to `tokens` if the pool and the remote stages have room; true
    /// when it holds that much.
    fn reserve(&mut self, tokens: usize) -> bool {
        if tokens <= self.reserved {
            return true;
        }
        if tokens > self.token_cap {
            return false;
        }
        if self
            .pool
            .try_reserve((tokens - self.reserved) * self.token_bytes)
        {
            self.reserved = tokens;
            true
        } else {
            false
        }
    }

    /// Gives back reserved KV this engine no longer holds.
    fn trim_reservation(&mut self) {
        let held = self.kv_in_use();
        if self.reserved > held {
            self.pool.release((self.reserved - held) * self.token_bytes);
            self.reserved = held;
        }
    }

    /// Evicts cached prefixes (least recently used first) while another engine on the node waits for
    /// memory; [`Worker::trim_reservation`] then hands the bytes back to the pool.
    fn yield_memory(&mut self) {
        let want = self.pool.wanted();
        let mut freed = 0;
        while freed < want {
            let before = self.prefix.used_tokens();
            let Some(id) = self.prefix.pop_lru() else {
                break;
            };
            kv_all_lossy(&mut self.stages, KvOp::DropPrefix { prefix_id: id });
            freed += (before - self.prefix.used_tokens()) * self.token_bytes;
        }
    }

    /// Makes `need` KV tokens free if possible, evicting cached prefixes first (this engine's, then
    /// asking the others for theirs); true when they are.
    fn make_room(&mut self, need: usize) -> bool {
        loop {
            if self.reserve(self.kv_in_use() + need) {
                if std::mem::take(&mut self.asked_others) {
                    self.pool.clear_request();
                }
                return true;
            }
            let Some(id) = self.prefix.pop_lru() else {
                if self.kv_in_use() + need > self.token_cap {
                    // Short on the remote stages' memory: other engines here cannot help.
                    return false;
                }
                self.asked_others = true;
                let short = (self.kv_in_use() + need).saturating_sub(self.reserved);
                let free = self.pool.budget().saturating_sub(self.pool.reserved());
                self.pool
                    .request((short * self.token_bytes).saturating_sub(free));
                return false;
            };
            kv_all_lossy(&mut self.stages, KvOp::DropPrefix { prefix_id: id });
            // The prefix's tokens are no longer held; what was reserved for them stays reserved here.
        }
    }

    fn admit(&mut self) {
        // Preempted sequences first, in order; each recomputes all its tokens.
        while self.running.len() < self.config.max_running {
            let Some(need) = self.preempted.front().map(|s| s.tokens.len()) else {
                break;
            };
            if !self.make_room(need) {
                return;
            }
            if let Some(seq) = self.preempted.pop_front() {
                self.running.push(seq);
            }
        }
        while self.running.len() < self.config.max_running {
            let Some(need) = self.waiting.front().map(|a| a.tokens.len() + 1) else {
                break;
            };
            if need > self.max_kv_tokens() {
                if let Some(a) = self.waiting.pop_front() {
                    self.counters.waiting.fetch_sub(1, Ordering::Relaxed);
                    let err = EngineError::PromptTooLong {
                        prompt_tokens: a.tokens.len(),
                        context_length: self.max_kv_tokens() - 1,
                    };
                    let _ = a.tx.send(Event::Error(err));
                }
                continue;
            }
            // First come, first served: a request that does not fit yet waits, and so do those behind it.
            if !self.make_room(need) {
                break;
            }
            let Some(a) = self.waiting.pop_front() else {
                break;
            };
            self.counters.waiting.fetch_sub(1, Ordering::Relaxed);
            self.seed_counter = self.seed_counter.wrapping_add(0x9E37_79B9);
            let room = self.context_length - a.tokens.len();
            let max_new = a
                .request
                .max_tokens
                .map_or(room, |m| (m as usize).min(room));
            self.running.push(Sequence {
                id: a.id,
                prompt_len: a.tokens.len(),
                tokens: a.tokens,
                computed: 0,
                max_new,
                sampler: Sampler::new(a.request.sampling.clone(), self.seed_counter),
                decoder: StreamDecoder::new(),
                stop: StopMatcher::new(a.request.stop.clone()),
                tx: a.tx,
                cancel: a.cancel,
                ignore_eos: a.request.ignore_eos,
                deadline: a.deadline,
                timeout_ms: a.request.timeout.map_or(0, |t| t.as_millis() as u64),
                cached: 0,
            });
            self.reuse_prefix();
            self.counters.active.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Removes sequence `i`, frees its KV everywhere and sends its final event.
    /// Starts the newest running sequence from the longest cached prefix of its prompt, if any.
    fn reuse_prefix(&mut self) {
        let Some(seq) = self.running.last_mut() else {
            return;
        };
        let Some((prefix_id, n)) = self.prefix.lookup(&seq.tokens[..seq.prompt_len]) else {
            return;
        };
        let id = seq.id;
        let loaded = kv_all(
            &mut self.stages,
            KvOp::Start {
                prefix_id,
                seq_id: id,
                len: n,
            },
        );
        match loaded {
            Ok(()) => {
                seq.computed = n;
                seq.cached = n;
            }
            Err(e) => {
                // Not fatal: compute the prompt from scratch.
                tracing::warn!("prefix reuse failed, prefilling in full: {e}");
                kv_all_lossy(&mut self.stages, KvOp::Release { seq_id: id });
            }
        }
    }

    /// Removes sequence `i`, keeps its KV in the prefix cache when worth it (else frees it everywhere)
    /// and sends its final event.
    fn finish(&mut self, i: usize, reason: FinishReason) {
        let seq = self.running.swap_remove(i);
        let offer = match reason {
            FinishReason::Cancelled => Default::default(),
            _ => self.prefix.insert(&seq.tokens[..seq.computed]),
        };
        for id in offer.evict {
            kv_all_lossy(&mut self.stages, KvOp::DropPrefix { prefix_id: id });
        }
        let kept = offer.store.is_some_and(|pid| {
            let r = kv_all(
                &mut self.stages,
                KvOp::Retain {
                    seq_id: seq.id,
                    prefix_id: pid,
                    len: seq.computed,
                },
            );
            if let Err(e) = &r {
                tracing::warn!("cannot keep the prefix of sequence {}: {e}", seq.id);
                kv_all_lossy(&mut self.stages, KvOp::DropPrefix { prefix_id: pid });
            }
            r.is_ok()
        });
        if !kept {
            kv_all_lossy(&mut self.stages, KvOp::Release { seq_id: seq.id });
        }
        self.counters.active.fetch_sub(1, Ordering::Relaxed);
        let _ = seq.tx.send(Event::Done {
            finish_reason: reason,
            usage: seq.usage(),
        });
    }

    fn fail(&mut self, i: usize, error: EngineError) {
        let seq = self.running.swap_remove(i);
        kv_all_lossy(&mut self.stages, KvOp::Release { seq_id: seq.id });
        self.counters.active.fetch_sub(1, Ordering::Relaxed);
        let _ = seq.tx.send(Event::Error(error));
    }

    /// Drops the KV of the newest running sequence so older ones can go on; it resumes (recomputing
    /// its KV, which gives the same values) when there is room again.
    fn preempt_newest(&mut self) {
        let Some(mut seq) = self.running.pop() else {
            return;
        };
        kv_all_lossy(&mut self.stages, KvOp::Release { seq_id: seq.id });
        seq.computed = 0;
        seq.cached = 0;
        self.preempted.push_front(seq);
    }

    /// Whether sequence `id` is part of a batch still in flight.
    fn in_flight(&self, id: u64) -> bool {
        self.flights
            .iter()
            .any(|f| f.batch.iter().any(|c| c.seq_id == id))
    }

    /// One engine step: launch a micro-batch of the sequences that are not in flight, or, when the
    /// pipeline is full (or nothing is ready), wait for the oldest batch in flight. With only local stages
    /// every batch completes at once; with stages on other nodes up to [`pipeline_depth`] micro-batches
    /// are in different stages at the same time.
    fn step(&mut self) {
        let depth = pipeline_depth(&self.stages);
        let ready: Vec<bool> = self
            .running
            .iter()
            .map(|s| s.tokens.len() > s.computed && !self.in_flight(s.id))
            .collect();
        if !ready.contains(&true) || self.flights.len() >= depth {
            self.complete_oldest();
            return;
        }
        // Every decoding sequence needs one more KV slot; make room or preempt until it fits. A lone
        // sequence that outgrew the whole node budget ends as if it had hit its length limit; one that
        // only lacks room other engines hold steps aside until they free it.
        loop {
            let decodes = self
                .running
                .iter()
                .zip(&ready)
                .filter(|(s, r)| **r && s.tokens.len() - s.computed <= 1)
                .count();
            // At least one free slot, so the step always makes progress.
            if self.make_room(decodes.max(1)) {
                break;
            }
            if !self.flights.is_empty() {
                // Batches in flight may finish sequences and free memory: let them land first.
                self.complete_oldest();
                return;
            }
            if self.running.len() == 1 {
                if self.running[0].tokens.len() + 1 > self.max_kv_tokens() {
                    self.finish(0, FinishReason::Length);
                } else {
                    self.preempt_newest();
                }
                return;
            }
            self.preempt_newest();
        }
        // Take what the pool can give for this step (up to a full batch); unused room goes back after it.
        let want = self.config.max_batch_tokens * self.token_bytes;
        let extra = (self.kv_in_use() + self.config.max_batch_tokens)
            .min(self.token_cap)
            .saturating_sub(self.reserved);
        let granted = self
            .pool
            .reserve_up_to((extra * self.token_bytes).min(want));
        self.reserved += granted / self.token_bytes;
        self.pool.release(granted % self.token_bytes);
        let free = self.reserved.saturating_sub(self.kv_in_use());
        let views: Vec<SeqView> = self
            .running
            .iter()
            .map(|s| {
                let busy = self.in_flight(s.id);
                SeqView {
                    pending: if busy { 0 } else { s.tokens.len() - s.computed },
                    decoding: s.tokens.len() - s.computed <= 1,
                }
            })
            .collect();
        // Split the running sequences evenly over the micro-batches the pipeline can hold.
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
        if plan.is_empty() {
            self.complete_oldest();
            return;
        }

        let mut batch = Vec::with_capacity(plan.len());
        let mut tokens = Vec::new();
        for &(i, n) in &plan {
            let s = &self.running[i];
            tokens.extend_from_slice(&s.tokens[s.computed..s.computed + n]);
            batch.push(ChunkSpec {
                seq_id: s.id,
                len: n,
                want_logits: s.computed + n == s.tokens.len(),
            });
        }
        let sampling: Vec<SampleRef<'_>> = plan
            .iter()
            .zip(&batch)
            .filter(|(_, spec)| spec.want_logits)
            .map(|(&(i, _), spec)| SampleRef {
                seq_id: spec.seq_id,
                sampler: &self.running[i].sampler,
                history: &self.running[i].tokens,
            })
            .collect();
        let decodes = plan.iter().filter(|&&(i, _)| views[i].decoding).count();
        let prefill: usize = plan
            .iter()
            .filter(|&&(i, _)| !views[i].decoding)
            .map(|&(_, n)| n)
            .sum();
        let started = Instant::now();
        let launched = launch_pipeline(&mut self.stages, &batch, tokens, &sampling);
        drop(sampling);
        if let Ok(PipelineLaunch::Done(_)) = &launched {
            // Only a batch computed here says how long this engine's steps take.
            self.times
                .record(decodes, prefill, started.elapsed().as_secs_f64());
        }
        self.counters.steps.fetch_add(1, Ordering::Relaxed);
        // The stages hold (or are computing) this KV now.
        for &(i, n) in &plan {
            let seq = &mut self.running[i];
            if seq.computed < seq.prompt_len {
                self.counters
                    .prefilled
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
            seq.computed += n;
        }
        match launched {
            Ok(PipelineLaunch::Done(picks)) => self.apply(&batch, picks),
            Ok(PipelineLaunch::Pending(ticket)) => self.flights.push_back(Flight { ticket, batch }),
            Err(e) => self.fail_batch(&batch, e),
        }
    }

    /// Waits for the oldest batch in flight and delivers its tokens.
    fn complete_oldest(&mut self) {
        let Some(flight) = self.flights.pop_front() else {
            return;
        };
        let wanted = flight.batch.iter().filter(|c| c.want_logits).count();
        match complete_pipeline(&mut self.stages, flight.ticket, wanted) {
            Ok(picks) => self.apply(&flight.batch, picks),
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

    /// Streams the tokens picked for `batch` (one per chunk wanting logits, in order) and ends the
    /// sequences that are done. Sequences that ended while the batch was in flight are skipped.
    fn apply(&mut self, batch: &[ChunkSpec], picks: Vec<Pick>) {
        let mut picks = picks.into_iter();
        let mut done = Vec::new();
        for spec in batch.iter().filter(|c| c.want_logits) {
            let Some(pick) = picks.next() else { break };
            let Some(i) = self.running.iter().position(|s| s.id == spec.seq_id) else {
                continue;
            };
            let seq = &mut self.running[i];
            let (id, logprob) = (pick.id, pick.logprob);
            // Sampling happened on a copy of this state (possibly on another node): catch up.
            seq.sampler.replay(id);
            seq.tokens.push(id);
            self.counters.generated.fetch_add(1, Ordering::Relaxed);
            let eog = !seq.ignore_eos && self.tokenizer.is_eog(id);
            // The end-of-generation token's own text is never shown.
            let text = if eog {
                String::new()
            } else {
                seq.decoder.push(&self.tokenizer, id)
            };
            let fed = seq.stop.feed(&text);
            let reason = if fed.stopped || eog {
                Some(FinishReason::Stop)
            } else if seq.generated() >= seq.max_new || seq.tokens.len() >= self.context_length {
                Some(FinishReason::Length)
            } else {
                None
            };
            let mut emit = fed.emit;
            if reason.is_some() && !fed.stopped {
                // Ending for another reason than a stop sequence: held-back text is real output.
                emit.push_str(&seq.stop.flush());
                emit.push_str(&seq.decoder.finish());
            }
            let _ = seq.tx.send(Event::Token {
                id,
                text: emit,
                logprob,
            });
            if let Some(reason) = reason {
                done.push((i, reason));
            }
        }
        done.sort_unstable_by_key(|d| std::cmp::Reverse(d.0));
        for (i, reason) in done {
            self.finish(i, reason);
        }
    }
}
