//! Engine configuration, model loading, and the shared state behind [`EngineHandle`].
//!
//! One engine thread per model instance ([`crate::worker`]) owns its pipeline stages and every sequence.
//! Handles validate and tokenize requests here, then talk to the thread through a bounded queue; results
//! flow back through each request's own channel.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use shoal_kernels::ThreadPool;
use shoal_model::chat::ChatTemplate;
use shoal_model::gguf::GgufFile;
use shoal_model::tokenizer::Tokenizer;
use shoal_model::{LayerRange, LlamaStage, ModelConfig};
use tokio::sync::mpsc::{self, UnboundedSender};

use crate::error::EngineError;
use crate::handle::{ChatMessage, EngineHandle, EngineStats, ModelInfo, RequestStream};
use crate::kvpool::KvPool;
use crate::request::{Event, GenerateRequest, Prompt};
use crate::stage::{LocalStage, Stage};
use crate::worker::Worker;

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
        }
    }
}

/// Physical cores are what matters for memory-bound kernels; fall back to 1.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Counters shared between the engine thread and handles.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) active: AtomicUsize,
    pub(crate) waiting: AtomicUsize,
    pub(crate) steps: AtomicU64,
    pub(crate) generated: AtomicU64,
    pub(crate) prefilled: AtomicU64,
    pub(crate) kv_tokens: AtomicUsize,
    pub(crate) stage_sequences: AtomicUsize,
}

/// A request accepted by a handle, on its way to the engine thread.
pub(crate) struct Admission {
    pub(crate) id: u64,
    pub(crate) tokens: Vec<u32>,
    pub(crate) request: GenerateRequest,
    pub(crate) tx: UnboundedSender<Event>,
    pub(crate) cancel: Arc<AtomicBool>,
    pub(crate) deadline: Option<Instant>,
}

struct ModelSlot {
    info: ModelInfo,
    config: ModelConfig,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    queue: SyncSender<Admission>,
}

/// State behind every [`EngineHandle`] clone.
pub struct Shared {
    slot: ModelSlot,
    counters: Arc<Counters>,
    /// Cancel flags of live requests by id (for `POST /v1/cancel/{id}`); weak, so a finished request's
    /// entry dies with it and is pruned.
    cancels: Mutex<HashMap<u64, Weak<AtomicBool>>>,
}

/// Request ids, shared by all engines of the process.
static NEXT_REQUEST_ID: AtomicU64 = AtomicU64::new(1);

/// Registry entries kept before dead ones are pruned.
const CANCEL_PRUNE_AT: usize = 1024;

impl Shared {
    fn slot(&self, model: &str) -> Result<&ModelSlot, EngineError> {
        if model == self.slot.info.id {
            Ok(&self.slot)
        } else {
            Err(EngineError::ModelNotFound {
                model: model.to_string(),
            })
        }
    }

    pub(crate) fn models(&self) -> Vec<ModelInfo> {
        vec![self.slot.info.clone()]
    }

    pub(crate) fn render_chat(
        &self,
        model: &str,
        messages: &[ChatMessage],
    ) -> Result<String, EngineError> {
        let slot = self.slot(model)?;
        if messages.is_empty() {
            return Err(EngineError::InvalidParam {
                param: "messages",
                message: "messages must not be empty".into(),
            });
        }
        let template = slot.template.as_ref().ok_or_else(|| {
            EngineError::Template(format!("model '{model}' has no chat template"))
        })?;
        template
            .render(messages, true)
            .map_err(|e| EngineError::Template(e.to_string()))
    }

    pub(crate) fn submit(&self, request: GenerateRequest) -> Result<RequestStream, EngineError> {
        let slot = self.slot(&request.model)?;
        let mut tokens = match &request.prompt {
            Prompt::Text(text) => slot.tokenizer.encode(text, true),
            Prompt::Tokens(t) => t.clone(),
        };
        if request.add_bos
            && slot.tokenizer.add_bos()
            && let Some(bos) = slot.tokenizer.bos_id()
            && tokens.first() != Some(&bos)
        {
            tokens.insert(0, bos);
        }
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let vocab = slot.config.vocab_size as u32;
        if let Some(bad) = tokens.iter().find(|&&t| t >= vocab) {
            return Err(EngineError::InvalidParam {
                param: "prompt",
                message: format!("token id {bad} is outside the vocabulary of {vocab}"),
            });
        }
        let context_length = slot.config.context_length;
        if tokens.len() >= context_length {
            return Err(EngineError::PromptTooLong {
                prompt_tokens: tokens.len(),
                context_length,
            });
        }
        if request.max_tokens == Some(0) {
            return Err(EngineError::InvalidParam {
                param: "max_tokens",
                message: "max_tokens must be at least 1".into(),
            });
        }
        // Unique across every engine of the process, so a request id names one request on this node.
        let id = NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed);
        // The channel exists before the engine knows about the request: nothing it sends can be lost.
        // Unbounded on purpose: the engine must never block on a slow client, and a sequence sends at
        // most (context length + 1) events, which bounds it.
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let deadline = request.timeout.map(|t| Instant::now() + t);
        let prompt_tokens = tokens.len();
        let admission = Admission {
            id,
            tokens,
            request,
            tx,
            cancel: cancel.clone(),
            deadline,
        };
        match slot.queue.try_send(admission) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(EngineError::Overloaded),
            Err(TrySendError::Disconnected(_)) => return Err(EngineError::Stopped),
        }
        self.counters.waiting.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut map) = self.cancels.lock() {
            if map.len() >= CANCEL_PRUNE_AT {
                map.retain(|_, w| w.strong_count() > 0);
            }
            map.insert(id, Arc::downgrade(&cancel));
        }
        Ok(RequestStream {
            id,
            prompt_tokens,
            rx,
            cancel,
        })
    }

    /// Flags request `id` for cancellation; false when no such request is live.
    pub(crate) fn cancel(&self, id: u64) -> bool {
        let Ok(mut map) = self.cancels.lock() else {
            return false;
        };
        match map.remove(&id).and_then(|w| w.upgrade()) {
            Some(flag) => {
                flag.store(true, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    pub(crate) fn stats(&self) -> EngineStats {
        let c = &self.counters;
        EngineStats {
            active_sequences: c.active.load(Ordering::Relaxed),
            waiting: c.waiting.load(Ordering::Relaxed),
            steps: c.steps.load(Ordering::Relaxed),
            generated_tokens: c.generated.load(Ordering::Relaxed),
            prefilled_tokens: c.prefilled.load(Ordering::Relaxed),
            kv_tokens: c.kv_tokens.load(Ordering::Relaxed),
            stage_sequences: c.stage_sequences.load(Ordering::Relaxed),
        }
    }
}

/// A model loaded and ready to be driven by an engine thread.
pub struct LoadedModel {
    pub id: String,
    pub config: ModelConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub stages: Vec<Box<dyn Stage>>,
}

impl LoadedModel {
    /// Loads a GGUF model as one local stage per range in `ranges` (all layers when `None`).
    pub fn from_gguf(
        path: &Path,
        id: &str,
        ranges: Option<&[LayerRange]>,
        pool: &Arc<ThreadPool>,
    ) -> Result<Self, EngineError> {
        let err = |e: &dyn std::fmt::Display| {
            EngineError::Internal(format!("loading {}: {e}", path.display()))
        };
        let mut gguf = GgufFile::open(path).map_err(|e| err(&e))?;
        let config = ModelConfig::from_gguf(&gguf).map_err(|e| err(&e))?;
        let tokenizer = Tokenizer::from_gguf(gguf.content()).map_err(|e| err(&e))?;
        let template = match ChatTemplate::from_gguf(gguf.content()) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!("{}: no usable chat template: {e}", path.display());
                None
            }
        };
        let full = [LayerRange::full(config.n_layers)];
        let ranges = ranges.unwrap_or(&full);
        let device = candle_core::Device::Cpu;
        let mut stages: Vec<Box<dyn Stage>> = Vec::with_capacity(ranges.len());
        for r in ranges {
            let stage = LlamaStage::load(&mut gguf, *r, &device, pool).map_err(|e| err(&e))?;
            stages.push(Box::new(LocalStage::new(stage)));
        }
        Ok(Self {
            id: id.to_string(),
            config,
            tokenizer: Arc::new(tokenizer),
            template,
            stages,
        })
    }
}

/// Loads layers `range` of a GGUF model as a stage (what a node hosting one stage of a pipeline runs).
pub fn load_local_stage(
    path: &Path,
    range: LayerRange,
    pool: &Arc<ThreadPool>,
) -> Result<LocalStage, EngineError> {
    let err = |e: &dyn std::fmt::Display| {
        EngineError::Internal(format!("loading {}: {e}", path.display()))
    };
    let mut gguf = GgufFile::open(path).map_err(|e| err(&e))?;
    let stage =
        LlamaStage::load(&mut gguf, range, &candle_core::Device::Cpu, pool).map_err(|e| err(&e))?;
    Ok(LocalStage::new(stage))
}

/// Loads `path` and starts its engine thread.
pub fn spawn_from_gguf(
    path: &Path,
    id: &str,
    config: EngineConfig,
) -> Result<EngineHandle, EngineError> {
    let pool = Arc::new(ThreadPool::new(config.threads.max(1)));
    let model = LoadedModel::from_gguf(path, id, config.stages.as_deref(), &pool)?;
    spawn(model, config)
}

/// Starts the engine thread for a loaded model.
pub fn spawn(model: LoadedModel, config: EngineConfig) -> Result<EngineHandle, EngineError> {
    let (queue, rx) = std::sync::mpsc::sync_channel(config.queue_depth.max(1));
    let counters = Arc::new(Counters::default());
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let info = ModelInfo {
        id: model.id.clone(),
        context_length: model.config.context_length,
        created,
        owned_by: "shoal".into(),
    };
    let slot = ModelSlot {
        info,
        config: model.config.clone(),
        tokenizer: model.tokenizer.clone(),
        template: model.template,
        queue,
    };
    let mut worker = Worker::new(
        model.stages,
        model.tokenizer,
        &model.config,
        config,
        counters.clone(),
        created,
    );
    std::thread::Builder::new()
        .name(format!("engine-{}", model.id))
        .spawn(move || worker.run(rx))
        .map_err(|e| EngineError::Internal(format!("cannot start engine thread: {e}")))?;
    Ok(EngineHandle {
        inner: Arc::new(Shared {
            slot,
            counters,
            cancels: Mutex::new(HashMap::new()),
        }),
    })
}
