//! [`EngineHandle::warm_up`]: what an instance runs before it reports ready, so its first real request
//! is as fast as the ones after it.
//!
//! A fresh engine pays, on its first request, for everything that happens once: the kernels' code and
//! lookup tables coming into the caches, the thread pool's workers waking for their first job, each
//! stage's scratch buffers and the sequence's KV memory being allocated and faulted in, and in a
//! pipeline the first frames over each hop.
//!
//! KV memory: a freed sequence's buffers stay in the node's KV pool for the next sequence
//! ([`crate::kvpool`]), so only a cache longer than any before it faults fresh pages. Before the engine
//! starts, [`touch_kv`] fills the pool with one cache's buffers of each of [`TOUCHED_KV_TOKENS`] tokens
//! (fewer when the budget or the context holds less): a cache growing through those sizes takes them as
//! a steady request takes its predecessors', so a first request of up to the largest one faults no KV
//! page either.
//!
//! The rest: one short internal request through every stage — a prompt of [`WARM_UP_PROMPT_TOKENS`]
//! prefilled as one chunk, then [`WARM_UP_DECODE_TOKENS`] decode steps drawing their tokens as a request
//! that samples does — run through the same queue, scheduler and stages as any request. It leaves nothing behind that a user
//! could see: its KV is never kept as a cached prefix (so no later prompt reuses it and outputs stay
//! those of a cold engine), and the engine's totals and recent averages are reset once it is done (the
//! engine is not registered before, so nobody has read them).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_model::{KvCache, ModelConfig};

use crate::error::EngineError;
use crate::handle::{EngineHandle, Origin};
use crate::kvpool::KvPool;
use crate::request::{Event, GenerateRequest, Prompt, SamplingParams};

/// Prompt tokens of the warm-up request: one prefill chunk of several rows (the batched kernels).
pub const WARM_UP_PROMPT_TOKENS: usize = 48;
/// Tokens the warm-up decodes after its prompt (one row at a time: the decode kernels).
pub const WARM_UP_DECODE_TOKENS: u32 = 4;
/// How long the warm-up may take before the instance is failed (a pipeline of slow nodes included).
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(600);
/// Ordinary text to tokenize for the warm-up prompt (repeated to its length).
pub const WARM_UP_TEXT: &str = "The river ran past the old mill, where the miller counted sacks of grain \
    and told stories of the winter the water froze solid from bank to bank.";

/// Capacities (tokens) of the caches whose buffers [`touch_kv`] leaves in the pool: each at most twice
/// the one before, so a cache growing from its first chunk takes one at every step up to 512 tokens.
pub const TOUCHED_KV_TOKENS: [usize; 3] = [128, 256, 512];

/// Allocates and touches the KV buffers of one cache of `local_layers` layers for each size of
/// [`TOUCHED_KV_TOKENS`] up to `max_tokens` (the context or what the engine may hold, if less) and hands
/// them to `pool` (which keeps what fits in its unreserved budget).
pub(crate) fn touch_kv(
    pool: &Arc<KvPool>,
    model: &ModelConfig,
    local_layers: usize,
    max_tokens: usize,
) {
    if local_layers == 0 {
        return;
    }
    let limit = max_tokens.min(model.context_length);
    let caches: Vec<KvCache> = TOUCHED_KV_TOKENS
        .iter()
        .filter(|&&t| t <= limit)
        .filter_map(|&tokens| {
            let buffers: Arc<dyn shoal_model::KvBuffers> = pool.clone();
            let mut kv = KvCache::for_model(model, local_layers, Some(buffers));
            match kv.reserve(tokens) {
                Ok(()) => Some(kv),
                Err(e) => {
                    tracing::debug!("touching {tokens} tokens of KV: {e}");
                    None
                }
            }
        })
        .collect();
    drop(caches); // their buffers go to the pool
}

/// How a warm-up went.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmedUp {
    /// Prompt tokens prefilled and tokens decoded.
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Wall time of the whole request.
    pub took: Duration,
}

impl EngineHandle {
    /// Runs the warm-up request through the engine and its stages and waits for it; an error (a stage
    /// that fails, a lost node, the timeout) is returned as the engine reported it. Meant for a fresh
    /// engine nobody submits to yet: its counters are reset afterwards.
    pub async fn warm_up(&self) -> Result<WarmedUp, EngineError> {
        let started = Instant::now();
        let tokens = self.warm_up_prompt();
        let prompt_tokens = tokens.len();
        let request = GenerateRequest {
            model: self.info().id.clone(),
            prompt: Prompt::Tokens(Vec::new()),
            // Drawn, not greedy: the draw's ranking and cuts are what requests that sample run (its
            // tokens are thrown away).
            sampling: SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                top_k: 40,
                seed: Some(0),
                ..Default::default()
            },
            max_tokens: NonZeroU32::new(WARM_UP_DECODE_TOKENS),
            stop: Vec::new(),
            add_bos: false,
            ignore_eos: true,
            timeout: Some(WARM_UP_TIMEOUT),
            logits_processor: None,
            speculative: None,
        };
        let deadline = Some(started + WARM_UP_TIMEOUT);
        let mut stream = self
            .queue(tokens, request, None, (1, deadline), Origin::WarmUp)?
            .pop()
            .ok_or_else(|| EngineError::Internal("no stream for the warm-up".into()))?;
        let mut generated_tokens = 0;
        let outcome = loop {
            match stream.next().await {
                Some(Event::Token { .. }) => generated_tokens += 1,
                Some(Event::Done { .. }) => break Ok(()),
                Some(Event::Error(e)) => break Err(e),
                None => break Err(EngineError::Stopped),
            }
        };
        self.counters().reset_totals();
        outcome.map(|()| WarmedUp {
            prompt_tokens,
            generated_tokens,
            took: started.elapsed(),
        })
    }

    /// [`WARM_UP_PROMPT_TOKENS`] tokens of ordinary text (BOS first when the model wants one), fewer
    /// when the context or the engine's KV room is smaller (a request that fits is never refused; one
    /// that outgrows the room on decode ends at the limit).
    fn warm_up_prompt(&self) -> Vec<u32> {
        let tokenizer = self.tokenizer();
        let text = tokenizer.encode(WARM_UP_TEXT, false);
        let room = self
            .info()
            .context_length
            .min(self.kv_capacity())
            .saturating_sub(WARM_UP_DECODE_TOKENS as usize + 1)
            .clamp(1, WARM_UP_PROMPT_TOKENS);
        let bos = tokenizer.bos_id().filter(|_| tokenizer.add_bos());
        // A tokenizer that makes nothing of the text still has its BOS, or token 0.
        let fill: Vec<u32> = if text.is_empty() {
            vec![bos.unwrap_or(0)]
        } else {
            text
        };
        bos.into_iter()
            .chain(fill.iter().copied().cycle())
            .take(room)
            .collect()
    }
}
