//! [`EngineHandle`]: one model instance as callers see it — its info, tokenizer, chat template and the
//! bounded queue to its engine thread — and [`RequestStream`], one request's events.
//!
//! The handle does the checks that need the model (tokenize, vocabulary range, context length), creates
//! the request's event channel and only then queues it, so nothing the engine sends can be lost. What
//! needs no model (parameter ranges, a positive token budget) is already settled by the
//! [`GenerateRequest`] type the adapter built.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime};

use shoal_model::Pooling;
use shoal_model::chat::{AddedSpecials, ChatTemplate};
use shoal_model::tokenizer::Tokenizer;
use tokio::sync::mpsc;

use crate::admission::{Admission, EmbedJob, Sibling};
use crate::error::EngineError;
use crate::request::{Event, GenerateRequest, MAX_CHOICES, Prefill, Prompt, Speculation};
use crate::stats::{Counters, EngineStats};

/// One chat message, as adapters pass them to the model's chat template.
pub use shoal_model::chat::{ChatMessage, Thinking};

/// A model the engine serves.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelInfo {
    pub id: String,
    /// Context length in tokens.
    pub context_length: usize,
    /// Unix seconds when the model was loaded.
    pub created: u64,
    pub owned_by: String,
}

/// Handle to one running model instance. Cheap to clone; all methods are safe to call from async code.
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<Instance>,
}

/// An engine referred to without keeping it alive ([`EngineHandle::downgrade`]).
#[derive(Clone)]
pub struct WeakEngine(std::sync::Weak<Instance>);

impl WeakEngine {
    /// The engine, while some handle still keeps it.
    pub fn upgrade(&self) -> Option<EngineHandle> {
        self.0.upgrade().map(|inner| EngineHandle { inner })
    }
}

/// What every clone of one [`EngineHandle`] shares.
struct Instance {
    info: ModelInfo,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    vocab_size: usize,
    /// The most KV tokens the engine can ever hold (its node budget, or its remote stages' room).
    kv_tokens: usize,
    /// How embeddings pool the model's hidden states.
    pooling: Pooling,
    /// Whether the engine has a draft model (`Speculation::Draft`).
    drafts: bool,
    /// Whether its sequences may draft with the model's multi-token-prediction block
    /// (`Speculation::Mtp`).
    mtp: bool,
    /// The seed of sampled requests that name none ([`crate::engine::EngineConfig::seed`]).
    seed: Option<u64>,
    queue: SyncSender<Admission>,
    counters: Arc<Counters>,
}

/// Where a queued request comes from.
#[derive(Debug, Clone)]
pub(crate) enum Origin {
    /// A caller's request.
    Client,
    /// The engine's own warm-up ([`crate::warmup`]): its KV is never kept as a cached prefix.
    WarmUp,
    /// A stream's continuation after a stage died ([`crate::resume`]): the last `generated` tokens of
    /// its token prompt were generated before the break; `cancel` is the broken stream's flag, so that
    /// cancelling the request (by its first id) or dropping its stream reaches the engine at once.
    Continuation {
        generated: usize,
        cancel: Arc<AtomicBool>,
    },
}

/// Cancel flags of the process's live requests by id (for `POST /v1/cancel/{id}`); weak, so a finished
/// request's entry dies with it and is pruned. A request of several choices has one flag per choice.
/// One map for every engine, as request ids are: a stream that continued on another engine after its
/// stage died is still cancelled by its first id.
static CANCELS: LazyLock<Mutex<HashMap<u64, Vec<Weak<AtomicBool>>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Cancels request `id` of this process, on whichever engine runs it (see [`EngineHandle::cancel`]).
pub(crate) fn cancel_request(id: u64) -> bool {
    let Ok(mut map) = CANCELS.lock() else {
        return false;
    };
    let flags: Vec<_> = map
        .remove(&id)
        .unwrap_or_default()
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    for flag in &flags {
        flag.store(true, Ordering::Relaxed);
    }
    !flags.is_empty()
}

/// The seed of choice `i` of a request seeded with `seed`: `seed` itself for the first, then the `i`-th
/// draw of the generator seeded with it (distinct for every choice).
pub fn choice_seed(seed: u64, i: usize) -> u64 {
    let mut g = shoal_kernels::rng::SplitMix64::new(seed);
    (0..i).fold(seed, |_, _| g.next_u64())
}

/// Request ids, shared by all engines of the process.
static NEXT_REQUEST_ID: AtomicU64 = AtomicU64::new(1);

/// Registry entries kept before dead ones are pruned.
const CANCEL_PRUNE_AT: usize = 1024;

impl EngineHandle {
    /// The handle of a model whose engine thread takes requests from `queue`; `(vocab_size,
    /// kv_tokens)`: the model's vocabulary and the most KV tokens its engine can hold; `drafts`:
    /// whether its engine has a draft model; `mtp`: whether its sequences may draft with the model's
    /// multi-token-prediction block; `seed`: the seed of requests that name none.
    pub(crate) fn new(
        info: ModelInfo,
        tokenizer: Arc<Tokenizer>,
        template: Option<ChatTemplate>,
        (vocab_size, kv_tokens): (usize, usize),
        (pooling, drafts, mtp, seed): (Pooling, bool, bool, Option<u64>),
        queue: SyncSender<Admission>,
        counters: Arc<Counters>,
    ) -> Self {
        Self {
            inner: Arc::new(Instance {
                info,
                tokenizer,
                template,
                vocab_size,
                kv_tokens,
                pooling,
                drafts,
                mtp,
                seed,
                queue,
                counters,
            }),
        }
    }

    /// The model this engine serves.
    pub fn info(&self) -> &ModelInfo {
        &self.inner.info
    }

    /// The most KV tokens the engine can ever hold: a prompt and its first token need that much room
    /// (the node's KV budget, or what the pipeline's remote stages hold if less).
    pub fn kv_capacity(&self) -> usize {
        self.inner.kv_tokens
    }

    /// The model's tokenizer (constrained decoding builds its token tables from it).
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.inner.tokenizer
    }

    /// The model's chat template, if its GGUF has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.inner.template.as_ref()
    }

    /// Renders chat messages with the model's own chat template, generation prompt appended.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, EngineError> {
        self.render_chat_tools(messages, &[])
    }

    /// [`EngineHandle::render_chat`] with `tools` (OpenAI's JSON function definitions) for the
    /// template to describe ([`ChatTemplate::apply_tools`]); none renders exactly as `render_chat`.
    pub fn render_chat_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
    ) -> Result<String, EngineError> {
        self.render_chat_thinking(messages, tools, &Thinking::default())
    }

    /// Whether the model's chat template writes `<think>` blocks (its answers may start with thoughts).
    pub fn writes_thinking(&self) -> bool {
        self.inner
            .template
            .as_ref()
            .is_some_and(|t| t.writes_thinking())
    }

    /// [`EngineHandle::render_chat_tools`] with what the request asks of the model's thinking
    /// (`enable_thinking`, `reasoning_effort`: [`Thinking`]).
    pub fn render_chat_thinking(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        thinking: &Thinking,
    ) -> Result<String, EngineError> {
        if messages.is_empty() {
            return Err(EngineError::InvalidParam {
                param: "messages",
                message: "messages must not be empty".into(),
            });
        }
        let template = self
            .inner
            .template
            .as_ref()
            .ok_or_else(|| EngineError::NoChatTemplate {
                model: self.info().id.clone(),
            })?;
        // The prompt is submitted with `add_bos`: a BOS the template writes itself is cut when the
        // tokenizer adds one (Llama 3's and Gemma's templates start with `{{ bos_token }}`), so the prompt
        // starts with exactly one, as llama.cpp's chat path makes it.
        let added = AddedSpecials {
            bos: self.inner.tokenizer.add_bos(),
            eos: false,
        };
        template
            .apply_thinking_at(messages, tools, true, added, SystemTime::now(), thinking)
            .map_err(|e| EngineError::Template(e.to_string()))
    }

    /// Tokenizes and checks the request for `request.model` (this engine's model), then queues it. The
    /// event channel exists before the engine sees the request, so no token can be lost however fast
    /// the engine is.
    pub fn submit(&self, request: GenerateRequest) -> Result<RequestStream, EngineError> {
        if request.model != self.info().id {
            return Err(EngineError::ModelNotFound {
                model: request.model,
            });
        }
        self.enqueue_n(request, 1)?
            .pop()
            .ok_or_else(|| EngineError::Internal("no stream for a request".into()))
    }

    /// `n` choices of one request ([`MAX_CHOICES`] at most): `n` sequences from one prompt, which is
    /// prefilled once (the other choices start from a copy of its KV), one stream each. The streams
    /// share the request id, so cancelling it stops every choice; dropping one stream stops its choice.
    /// With a seed, choice 0 draws with it and choice `i` with a seed derived from it and `i`.
    pub fn submit_n(
        &self,
        request: GenerateRequest,
        n: usize,
    ) -> Result<Vec<RequestStream>, EngineError> {
        if request.model != self.info().id {
            return Err(EngineError::ModelNotFound {
                model: request.model,
            });
        }
        self.enqueue_n(request, n)
    }

    /// [`EngineHandle::enqueue_n`], with a copy of the prompt's tokens as this engine made them.
    pub(crate) fn enqueue_keeping_prompt(
        &self,
        request: GenerateRequest,
        n: usize,
    ) -> Result<(Vec<RequestStream>, Vec<u32>), EngineError> {
        let mut prompt = Vec::new();
        let streams = self.enqueue_choices(request, n, Some(&mut prompt))?;
        Ok((streams, prompt))
    }

    /// [`EngineHandle::submit_n`] for a request already routed to this engine by its model id.
    pub(crate) fn enqueue_n(
        &self,
        request: GenerateRequest,
        n: usize,
    ) -> Result<Vec<RequestStream>, EngineError> {
        self.enqueue_choices(request, n, None)
    }

    /// Gives `request` the engine's default seed ([`crate::engine::EngineConfig::seed`]) when it names none.
    pub(crate) fn give_default_seed(&self, request: &mut GenerateRequest) {
        request.sampling.seed = request.sampling.seed.or(self.inner.seed);
    }

    /// Checks `n`, tokenizes the prompt (copied into `keep` when given) and queues the request.
    fn enqueue_choices(
        &self,
        mut request: GenerateRequest,
        n: usize,
        keep: Option<&mut Vec<u32>>,
    ) -> Result<Vec<RequestStream>, EngineError> {
        if !(1..=MAX_CHOICES).contains(&n) {
            return Err(EngineError::InvalidParam {
                param: "n",
                message: format!("n must be between 1 and {MAX_CHOICES}, got {n}"),
            });
        }
        self.give_default_seed(&mut request);
        if matches!(request.speculative, Some(Speculation::Mtp { .. })) && !self.inner.mtp {
            return Err(EngineError::InvalidParam {
                param: "speculative",
                message: format!(
                    "model '{}' has no multi-token-prediction (nextn) block that this node runs \
                     (it needs a GLM-4.5-style file, the model's last layers in this process, and \
                     `shoal serve --speculative mtp`, which loads the block); use \"ngram\" or \
                     \"off\"",
                    self.info().id
                ),
            });
        }
        if matches!(request.speculative, Some(Speculation::Draft { .. })) && !self.inner.drafts {
            return Err(EngineError::InvalidParam {
                param: "speculative",
                message: format!(
                    "model '{}' has no draft model on this node (serve with --draft-model, a \
                     model of the same vocabulary); use \"ngram\" or \"off\"",
                    self.info().id
                ),
            });
        }
        let tokens = self.prompt_tokens(&request)?;
        if let Some(keep) = keep {
            keep.clone_from(&tokens);
        }
        let deadline = request.timeout.map(|t| Instant::now() + t);
        self.queue(tokens, request, None, (n, deadline), Origin::Client)
    }

    /// Queues the continuation of a request whose stage died ([`crate::resume`]): `request`'s token
    /// prompt is its first prompt then the `generated` tokens it had, counted as generated.
    pub(crate) fn enqueue_continuation(
        &self,
        request: GenerateRequest,
        generated: usize,
        cancel: Arc<AtomicBool>,
    ) -> Result<RequestStream, EngineError> {
        let tokens = self.prompt_tokens(&request)?;
        let deadline = request.timeout.map(|t| Instant::now() + t);
        self.queue(
            tokens,
            request,
            None,
            (1, deadline),
            Origin::Continuation { generated, cancel },
        )?
        .pop()
        .ok_or_else(|| EngineError::Internal("no stream for a continuation".into()))
    }

    /// Queues `tokens` (checked) as an embedding sequence ([`crate::embed`]).
    pub(crate) fn enqueue_embedding(
        &self,
        tokens: Vec<u32>,
        job: EmbedJob,
        timeout: Option<std::time::Duration>,
        deadline: Option<Instant>,
    ) -> Result<RequestStream, EngineError> {
        // What an embedding sequence samples: nothing; the request only carries its model and timeout.
        let request = GenerateRequest {
            model: self.info().id.clone(),
            prompt: Prompt::Tokens(Vec::new()),
            sampling: Default::default(),
            max_tokens: None,
            stop: Vec::new(),
            add_bos: false,
            ignore_eos: false,
            timeout,
            logits_processor: None,
            speculative: None,
        };
        let mut streams = self.queue(tokens, request, Some(job), (1, deadline), Origin::Client)?;
        streams
            .pop()
            .ok_or_else(|| EngineError::Internal("no stream for an embedding".into()))
    }

    /// Queues a checked request of `choices` choices for the engine thread, their event channels made
    /// first; one stream per choice.
    pub(crate) fn queue(
        &self,
        tokens: Vec<u32>,
        request: GenerateRequest,
        embed: Option<EmbedJob>,
        (choices, deadline): (usize, Option<Instant>),
        origin: Origin,
    ) -> Result<Vec<RequestStream>, EngineError> {
        // Unique across every engine of the process, so a request id names one request on this node.
        let id = NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed);
        let prompt_tokens = tokens.len();
        let mut streams = Vec::with_capacity(choices);
        let mut flags = Vec::with_capacity(choices);
        // The prompt is prefilled once for every choice: one progress, watched by each stream.
        let (prefill, prefill_rx) = tokio::sync::watch::channel(Prefill {
            done: 0,
            total: prompt_tokens as u32,
        });
        // The channels exist before the engine knows about the request: nothing it sends can be lost.
        // Unbounded on purpose: the engine must never block on a slow client, and a sequence sends at
        // most (context length + 1) events, which bounds it.
        let mut channel = |cancel: Option<Arc<AtomicBool>>| {
            let (tx, rx) = mpsc::unbounded_channel();
            let cancel = cancel.unwrap_or_default();
            flags.push(Arc::downgrade(&cancel));
            streams.push(RequestStream {
                id,
                prompt_tokens,
                rx,
                prefill: prefill_rx.clone(),
                cancel: cancel.clone(),
                resume: None,
            });
            (tx, cancel)
        };
        let (tx, cancel) = channel(match &origin {
            Origin::Continuation { cancel, .. } => Some(cancel.clone()),
            Origin::Client | Origin::WarmUp => None,
        });
        let siblings = (1..choices)
            .map(|i| {
                let (tx, cancel) = channel(None);
                Sibling {
                    // Each choice is a sequence of its own (its KV on every stage).
                    id: NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed),
                    tx,
                    cancel,
                    seed: request.sampling.seed.map(|s| choice_seed(s, i)),
                }
            })
            .collect();
        let admission = Admission {
            id,
            tokens,
            generated: match origin {
                Origin::Continuation { generated, .. } => generated,
                Origin::Client | Origin::WarmUp => 0,
            },
            request,
            embed,
            siblings,
            tx,
            prefill: Some(prefill),
            cancel,
            deadline,
            queued: Instant::now(),
            warm_up: matches!(origin, Origin::WarmUp),
            span: tracing::Span::current(),
        };
        // Counted before it is sent: the engine thread may take it (and count it out) at once, and a
        // count taken out before it went in would wrap the gauge for whoever reads it meanwhile.
        self.inner.counters.queued();
        let sent = self.inner.queue.try_send(admission);
        if sent.is_err() {
            self.inner.counters.dequeued(1);
        }
        match sent {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(EngineError::Overloaded),
            Err(TrySendError::Disconnected(_)) => return Err(EngineError::Stopped),
        }
        if let Ok(mut map) = CANCELS.lock() {
            if map.len() >= CANCEL_PRUNE_AT {
                map.retain(|_, w| w.iter().any(|w| w.strong_count() > 0));
            }
            map.insert(id, flags);
        }
        Ok(streams)
    }

    /// The prompt's tokens (BOS added when asked and the model wants it), checked against the model:
    /// not empty, every id in the vocabulary, room left in the context.
    fn prompt_tokens(&self, request: &GenerateRequest) -> Result<Vec<u32>, EngineError> {
        let tokens = self.encode(&request.prompt, request.add_bos);
        self.check_ids(&tokens, "prompt")?;
        let context_length = self.info().context_length;
        if tokens.len() >= context_length {
            return Err(EngineError::PromptTooLong {
                prompt_tokens: tokens.len(),
                context_length,
            });
        }
        Ok(tokens)
    }

    /// Errs on no tokens or an id outside the vocabulary (`param` names the field).
    fn check_ids(&self, tokens: &[u32], param: &'static str) -> Result<(), EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let vocab = self.inner.vocab_size as u32;
        if let Some(bad) = tokens.iter().find(|&&t| t >= vocab) {
            return Err(EngineError::InvalidParam {
                param,
                message: format!("token id {bad} is outside the vocabulary of {vocab}"),
            });
        }
        Ok(())
    }

    /// An embedding input's tokens: text tokenized as llama.cpp's server does (special tokens parsed,
    /// BOS and EOS as the GGUF asks), token ids as given; checked like a prompt, and cut to the context
    /// length when `truncate` says so (else longer is [`EngineError::PromptTooLong`]).
    pub(crate) fn embed_tokens(
        &self,
        input: &Prompt,
        truncate: bool,
    ) -> Result<Vec<u32>, EngineError> {
        let mut tokens = match input {
            Prompt::Text(text) => self.inner.tokenizer.encode_prompt(text),
            Prompt::Tokens(t) => t.clone(),
        };
        self.check_ids(&tokens, "input")?;
        let context_length = self.info().context_length;
        if tokens.len() > context_length {
            if !truncate {
                return Err(EngineError::PromptTooLong {
                    prompt_tokens: tokens.len(),
                    context_length,
                });
            }
            tokens.truncate(context_length);
        }
        Ok(tokens)
    }

    /// How embeddings pool this model's hidden states.
    pub(crate) fn pooling(&self) -> Pooling {
        self.inner.pooling
    }

    /// How many tokens `text` is as a prompt submitted with `add_bos`, counted as [`EngineHandle::submit`]
    /// counts them (for token-counting routes; nothing is checked against the context).
    pub fn count_tokens(&self, text: &str, add_bos: bool) -> usize {
        self.encode(&Prompt::Text(text.to_string()), add_bos).len()
    }

    /// The prompt's tokens, BOS added in front when asked and the model wants it.
    fn encode(&self, prompt: &Prompt, add_bos: bool) -> Vec<u32> {
        let tokenizer = &self.inner.tokenizer;
        let mut tokens = match prompt {
            Prompt::Text(text) => tokenizer.encode(text, true),
            Prompt::Tokens(t) => t.clone(),
        };
        if add_bos
            && tokenizer.add_bos()
            && let Some(bos) = tokenizer.bos_id()
            && tokens.first() != Some(&bos)
        {
            tokens.insert(0, bos);
        }
        tokens
    }

    /// Whether `other` is a handle to this same engine.
    pub fn same_engine(&self, other: &EngineHandle) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A reference to this engine that does not keep it running (its thread ends with the last
    /// [`EngineHandle`]).
    pub fn downgrade(&self) -> WeakEngine {
        WeakEngine(Arc::downgrade(&self.inner))
    }

    /// Current counters.
    pub fn stats(&self) -> EngineStats {
        self.inner.counters.snapshot()
    }

    /// The engine's live counters (the warm-up forgets what it counted).
    pub(crate) fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// Cancels request `id` (as returned by [`RequestStream::id`]) wherever it is: queued or running,
    /// on this engine or, ids being unique per process, any other (a stream that continued elsewhere
    /// after its stage died included). The engine frees it at its next step and its stream ends with
    /// `Done { Cancelled }`. Returns false when no such request is live.
    pub fn cancel(&self, id: u64) -> bool {
        cancel_request(id)
    }
}

/// The stream of one request's events. Dropping it cancels the request: the engine frees the sequence
/// at its next step.
pub struct RequestStream {
    id: u64,
    prompt_tokens: usize,
    rx: mpsc::UnboundedReceiver<Event>,
    prefill: tokio::sync::watch::Receiver<Prefill>,
    cancel: Arc<AtomicBool>,
    /// How the stream continues when a stage dies ([`crate::resume`]); `None`: it ends with the error.
    resume: Option<Box<dyn Continuation>>,
}

/// What lets a stream continue after a stage's death ([`crate::resume::Resume`]): it sees each token
/// pass, and on the break starts the continuation, whose events replace the stream's.
pub(crate) trait Continuation: Send {
    fn token(&mut self, id: u32);
    fn start(
        self: Box<Self>,
        why: String,
        cancel: Arc<AtomicBool>,
    ) -> Option<mpsc::UnboundedReceiver<Event>>;
}

impl RequestStream {
    /// Lets this stream continue on another engine when a stage dies.
    pub(crate) fn set_continuation(&mut self, resume: Box<dyn Continuation>) {
        self.resume = Some(resume);
    }

    /// Engine-wide unique request id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Number of prompt tokens after tokenization.
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// Next event; `None` after `Done`/`Error` has been received.
    pub async fn next(&mut self) -> Option<Event> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        loop {
            let event = std::task::ready!(self.rx.poll_recv(cx));
            match (&event, &mut self.resume) {
                (Some(Event::Token { id, .. }), Some(resume)) => resume.token(*id),
                (Some(Event::Error(EngineError::StageLost(why))), Some(_))
                    if !self.cancel.load(Ordering::Relaxed) =>
                {
                    let why = why.clone();
                    if let Some(rx) = self
                        .resume
                        .take()
                        .and_then(|r| r.start(why, self.cancel.clone()))
                    {
                        self.rx = rx;
                        continue;
                    }
                }
                _ => {}
            }
            return Poll::Ready(event);
        }
    }

    /// How far the prompt has been processed: updated by the engine as each prefill chunk completes
    /// (on every stage of a pipeline); `changed()` on it wakes a consumer that shows progress. Outside
    /// the stream of events, so consumers that do not ask never see it.
    pub fn prefill(&self) -> tokio::sync::watch::Receiver<Prefill> {
        self.prefill.clone()
    }

    /// Ask the engine to stop this request at its next step (a `Done` with `Cancelled` follows).
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}
