//! [`EngineConfig`]: how one engine batches, queues, caches prefixes and budgets KV memory.

use std::sync::Arc;

use shoal_model::LayerRange;

use crate::draft_model::DraftModel;
use crate::gpu_stage::Device;
use crate::kvpool::KvPool;
use crate::request::Speculation;

/// Engine tuning.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Compute threads for the CPU kernels.
    pub threads: usize,
    /// Tokens per step across all sequences (decodes + prefill chunks).
    pub max_batch_tokens: usize,
    /// Prefill tokens per step while other sequences decode, at most (see
    /// [`crate::scheduler::StepBudget`]).
    pub max_prefill_while_decoding: usize,
    /// While streams decode and a long prompt (over 256 tokens left) is prefilled, take only as many of
    /// its tokens per step as keep the step within this many times a decode-only step (measured), so it
    /// raises running streams' inter-token latency by at most this factor; `None` = always
    /// `max_prefill_while_decoding`.
    pub itl_slack: Option<f64>,
    /// Sequences holding KV at once; more wait in the queue.
    pub max_running: usize,
    /// Requests queued between handles and the engine thread before `Overloaded` (HTTP 503). Bounded so a
    /// flood of requests cannot grow memory without limit.
    pub queue_depth: usize,
    /// Layer ranges to load as separate local stages (a pipeline inside one process); `None` = one stage.
    pub stages: Option<Vec<LayerRange>>,
    /// Tokens of finished sequences whose KV is kept for reuse by later prompts that share a prefix
    /// (multi-turn chats, shared system prompts); 0 disables the prefix cache.
    pub prefix_cache_tokens: usize,
    /// KV-cache memory this engine may use, all sequences and cached prefixes together. Requests wait
    /// for room (and newer sequences are preempted and later recomputed) rather than exceeding it.
    /// Ignored when `kv_pool` is set.
    pub kv_budget_bytes: usize,
    /// The node's KV memory shared with the other engines on it; `None` = a pool of `kv_budget_bytes`
    /// for this engine alone.
    pub kv_pool: Option<Arc<KvPool>>,
    /// Where the local stages run (every one of them: a whole model or each `stages` range).
    pub device: Device,
    /// Device memory a GPU stage's KV may take, all its sequences and prefixes together (not
    /// paid from `kv_budget_bytes`).
    pub device_kv_budget_bytes: usize,
    /// Speculative decoding for requests that do not say (`GenerateRequest::speculative`).
    pub speculative: Speculation,
    /// The draft model of [`Speculation::Draft`], loaded for this engine's model (the same token
    /// list); `None`: a request asking for it is refused.
    pub draft_model: Option<Arc<DraftModel>>,
    /// The seed of every sampled request that names none (llama-server's `--seed`): such a request
    /// draws as if it had named it, so the same request gives the same answer. `None`: a random seed
    /// per request.
    pub seed: Option<u64>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            threads: default_threads(),
            max_batch_tokens: 256,
            max_prefill_while_decoding: 16,
            itl_slack: Some(2.0),
            max_running: 64,
            queue_depth: 256,
            stages: None,
            prefix_cache_tokens: 8192,
            kv_budget_bytes: 2 << 30,
            kv_pool: None,
            device: Device::Cpu,
            device_kv_budget_bytes: 1 << 30,
            speculative: Speculation::Off,
            draft_model: None,
            seed: None,
        }
    }
}

/// Physical cores are what matters for memory-bound kernels; fall back to 1.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
