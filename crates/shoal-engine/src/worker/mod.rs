//! The engine thread: owns the pipeline stages and every sequence.
//!
//! [`Worker::run`] loops: take new requests from the bounded queue, free cancelled and timed-out ones,
//! admit waiting ones within the KV budget ([`admit`]), run one step ([`step`]: launch a micro-batch or
//! land one in flight, stream the sampled tokens), and publish what it holds. What KV memory it may
//! hold is the [`KvAccount`]'s business; the worker decides what to evict (cached prefixes, least
//! recently used first) and whom to preempt (the newest sequence).

mod admit;
mod speculate;
mod step;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};

use shoal_model::ModelConfig;
use shoal_model::tokenizer::Tokenizer;

use crate::admission::Admission;
use crate::config::EngineConfig;
use crate::kv_account::KvAccount;
use crate::kvpool::KvPool;
use crate::meters::Meters;
use crate::prefix::PrefixIndex;
use crate::scheduler::StepTimes;
use crate::sequence::Sequence;
use crate::stage::{ChunkSpec, KvOp, Stage, kv_all_lossy};
use crate::stats::Counters;

/// How often an engine with nothing it can run checks whether KV memory came free.
const WAIT_FOR_MEMORY: std::time::Duration = std::time::Duration::from_millis(2);
/// How often an idle engine holding cached prefixes checks whether another engine needs the memory.
const IDLE_MEMORY_CHECK: std::time::Duration = std::time::Duration::from_millis(10);

pub(crate) struct Worker {
    stages: Vec<Box<dyn Stage>>,
    prefix: PrefixIndex,
    /// The KV memory this engine holds and may hold.
    kv: KvAccount,
    /// Sequences whose KV was dropped to stay in budget; they resume first, recomputing their KV.
    preempted: VecDeque<Sequence>,
    /// Further choices of a running request (`n` > 1), waiting for its first choice's prompt KV to
    /// copy ([`Fork`]).
    forks: Vec<Fork>,
    tokenizer: Arc<Tokenizer>,
    context_length: usize,
    config: EngineConfig,
    counters: Arc<Counters>,
    /// The engine's metrics (TTFT, ITL, tokens, steps, …), registered once with the model's label.
    meters: Meters,
    running: Vec<Sequence>,
    waiting: VecDeque<Admission>,
    seed_counter: u64,
    /// Micro-batches launched into a pipeline with stages on other nodes and not yet answered, oldest
    /// first.
    flights: VecDeque<Flight>,
    /// Measured step times, which size the prefill chunk taken while streams decode.
    times: StepTimes,
    /// Whether every stage can verify drafted tokens (speculative decoding is off otherwise).
    verifies: bool,
    /// The model's multi-token-prediction block and its last stage's tap, when that stage is in this
    /// process and the model has one (`Speculation::Mtp`).
    mtp: Option<crate::mtp_draft::Mtp>,
    /// Seconds of a step of decodes alone, by how many decodes it had (`speculate::decode_bucket`),
    /// and what one drafted token adds to one (moving averages), once measured: speculative
    /// decoding's cost.
    plain_step_secs: [Option<f64>; speculate::DECODE_BUCKETS],
    draft_token_secs: Option<f64>,
    /// Steps that could draft so far (one in so many is kept plain, to measure).
    steps_since_plain: usize,
}

/// A choice waiting to start from a copy of its request's first choice (`parent`), once that one's
/// prompt is computed.
struct Fork {
    parent: u64,
    seq: Sequence,
}

/// A micro-batch in flight.
struct Flight {
    ticket: u64,
    batch: Vec<ChunkSpec>,
    /// The draft each chunk wanting logits verifies (empty: none).
    drafts: step::Drafts,
    /// When it was launched (its step time is launch → outputs).
    started: std::time::Instant,
}

impl Worker {
    pub(crate) fn new(
        mut stages: Vec<Box<dyn Stage>>,
        tokenizer: Arc<Tokenizer>,
        model: &ModelConfig,
        config: EngineConfig,
        counters: Arc<Counters>,
        meters: Meters,
        seed: u64,
    ) -> Self {
        // The node's pool pays for the KV of the layers in this process; stages on other nodes are
        // budgeted there and bound how many tokens this engine may hold in all.
        let value_bytes = stages.first().map_or(2, |s| s.info().kv_value_bytes);
        let local_layers = stages
            .iter()
            .map(|s| s.info().local_kv_layers)
            .sum::<usize>();
        // A sequence drafting with the model's multi-token-prediction block or a draft model keeps
        // that source's KV beside the stages' (on this node): the budget pays for it per token as
        // for a layer, for every sequence (a bound: a sequence that does not draft holds less).
        let mtp = stages.last_mut().and_then(|s| s.mtp());
        let draft_bytes = mtp.as_ref().map_or(0, |m| m.nextn.kv_bytes_per_token())
            + config
                .draft_model
                .as_ref()
                .map_or(0, |d| d.kv_bytes_per_token());
        let token_bytes = model.kv_bytes_per_token(local_layers.max(1), value_bytes) + draft_bytes;
        let token_cap = stages
            .iter()
            .filter_map(|s| s.info().kv_token_capacity)
            .min()
            .unwrap_or(usize::MAX);
        let pool = config
            .kv_pool
            .clone()
            .unwrap_or_else(|| Arc::new(KvPool::new(config.kv_budget_bytes)));
        let verifies = stages.iter().all(|s| s.verifies());
        Self {
            kv: KvAccount::new(pool, token_bytes, token_cap),
            preempted: VecDeque::new(),
            forks: Vec::new(),
            prefix: PrefixIndex::new(config.prefix_cache_tokens),
            stages,
            tokenizer,
            context_length: model.context_length,
            config,
            counters,
            meters,
            running: Vec::new(),
            waiting: VecDeque::new(),
            seed_counter: seed,
            flights: VecDeque::new(),
            times: StepTimes::default(),
            verifies,
            mtp,
            plain_step_secs: [None; speculate::DECODE_BUCKETS],
            draft_token_secs: None,
            steps_since_plain: 0,
        }
    }

    /// The most KV tokens this engine can ever hold.
    pub(crate) fn kv_max_tokens(&self) -> usize {
        self.kv.max_tokens()
    }

    /// Whether its sequences may draft with the model's multi-token-prediction block
    /// (`Speculation::Mtp`).
    pub(crate) fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    pub(crate) fn run(&mut self, rx: Receiver<Admission>) {
        loop {
            if self.running.is_empty()
                && self.waiting.is_empty()
                && self.preempted.is_empty()
                && self.forks.is_empty()
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
            } else if !(self.waiting.is_empty()
                && self.preempted.is_empty()
                && self.forks.is_empty())
            {
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

    /// Frees cached prefixes other engines wait for, gives back what is not held, and publishes it.
    fn publish_memory(&mut self) {
        self.yield_memory();
        self.kv.trim(self.kv_in_use());
        let held = self.stages.iter().map(|s| s.held_sequences()).sum();
        self.counters.holding(self.kv_in_use(), held);
        self.counters.preempted_waiting(self.preempted.len());
    }

    /// KV tokens held: running sequences plus cached prefixes.
    fn kv_in_use(&self) -> usize {
        self.running
            .iter()
            .map(|s| s.computed + s.spec_held)
            .sum::<usize>()
            + self.prefix.used_tokens()
    }

    /// Evicts cached prefixes (least recently used first) while another engine on the node waits for
    /// memory; [`KvAccount::trim`] then hands the bytes back to the pool.
    fn yield_memory(&mut self) {
        let want = self.kv.wanted_by_others();
        let mut freed = 0;
        while freed < want {
            let before = self.prefix.used_tokens();
            let Some(id) = self.prefix.pop_lru() else {
                break;
            };
            self.meters.evicted(1);
            kv_all_lossy(&mut self.stages, KvOp::DropPrefix { prefix_id: id });
            freed += before - self.prefix.used_tokens();
        }
    }

    /// Makes `need` KV tokens free if possible, evicting cached prefixes first (this engine's, then
    /// asking the others for theirs); true when they are.
    fn make_room(&mut self, need: usize) -> bool {
        loop {
            if self.kv.hold(self.kv_in_use() + need) {
                return true;
            }
            let Some(id) = self.prefix.pop_lru() else {
                self.kv.ask_others(self.kv_in_use() + need);
                return false;
            };
            self.meters.evicted(1);
            kv_all_lossy(&mut self.stages, KvOp::DropPrefix { prefix_id: id });
            // The prefix's tokens are no longer held; what was reserved for them stays reserved here.
        }
    }
}
