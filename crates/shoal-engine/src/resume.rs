//! Streams that survive a stage's death (issue 30). When a stage of a pipeline dies, every sequence
//! running through it ends with [`EngineError::StageLost`]; the cluster places the instance again on the
//! nodes left (about a second on loopback) and its new engine takes the model's place in
//! [`crate::Engines`].
//! A request submitted through [`crate::Engines::submit_n`] carries a [`Resume`]: its stream, instead of ending
//! with that error, waits (at most [`RESUME_WAIT`]) for the model's next engine, submits a continuation —
//! the prompt's tokens and every token generated so far as a token prompt, the token budget and timeout
//! what is left of them, the same sampling — and forwards the continuation's events as its own. The
//! client sees a pause. The KV is rebuilt by prefilling the continuation (chunked, and from the prefix
//! cache where it has the prompt), as Petals replays a sequence.
//!
//! Greedy requests continue with exactly their lone run's tokens; a sampled one keeps its tokens so far
//! and draws the rest from its seed again. Not resumed (the error ends the stream as before): requests
//! with several choices, constrained decoding (the guide's state is the processor's), stop sequences
//! (text held back for a possible stop would be lost at the break), a second break, and engines outside
//! a tokio runtime. When no engine comes back in time, the error says so.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::error::EngineError;
use crate::handle::{Continuation, EngineHandle, RequestStream};
use crate::request::{Event, GenerateRequest, Prompt};

/// How long a broken stream waits for its model's next engine.
pub const RESUME_WAIT: Duration = Duration::from_secs(10);
/// How often it looks, and how often a continuation checks that the client still wants it.
const POLL: Duration = Duration::from_millis(100);

/// The engine serving a model now (the registry's lookup).
pub(crate) type Lookup = Arc<dyn Fn(&str) -> Option<EngineHandle> + Send + Sync>;

/// What a stream needs to continue on another engine.
pub(crate) struct Resume {
    engines: Lookup,
    /// The engine whose stage died (its successor is any other engine of the model).
    failed: EngineHandle,
    request: GenerateRequest,
    /// The prompt as the engine tokenized it.
    prompt: Vec<u32>,
    /// Tokens generated so far (seen by the stream as they pass).
    generated: Vec<u32>,
    deadline: Option<Instant>,
}

impl Resume {
    /// A resume for `request` on `failed` when it can be resumed (see the module doc).
    /// Whether `request` with `n` choices can be resumed at all.
    pub(crate) fn applies(request: &GenerateRequest, n: usize) -> bool {
        n == 1 && request.logits_processor.is_none() && request.stop.is_empty()
    }

    /// The resume of `request` (one that [`Resume::applies`] to), whose `prompt` `failed` tokenized.
    pub(crate) fn of(
        engines: Lookup,
        failed: &EngineHandle,
        request: GenerateRequest,
        prompt: Vec<u32>,
    ) -> Box<Self> {
        Box::new(Resume {
            engines,
            failed: failed.clone(),
            deadline: request.timeout.map(|t| Instant::now() + t),
            request,
            prompt,
            generated: Vec::new(),
        })
    }

    async fn run(
        self: Box<Self>,
        why: String,
        tx: mpsc::UnboundedSender<Event>,
        cancel: Arc<AtomicBool>,
    ) {
        let give_up = Instant::now() + RESUME_WAIT;
        let engine = loop {
            if tx.is_closed() || cancel.load(Ordering::Relaxed) {
                return;
            }
            match (self.engines)(&self.request.model) {
                Some(e) if !e.same_engine(&self.failed) => break e,
                _ if Instant::now() >= give_up => {
                    let _ = tx.send(Event::Error(EngineError::StageLost(format!(
                        "{why}; no instance of the model driven by this node was ready again within {} s",
                        RESUME_WAIT.as_secs()
                    ))));
                    return;
                }
                _ => tokio::time::sleep(POLL).await,
            }
        };
        let done = self.generated.len();
        let mut inner = match self.continuation(&engine) {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Event::Error(e));
                return;
            }
        };
        tracing::info!(model = %self.request.model, generated = done, "continuing on the model's next instance");
        loop {
            let event = tokio::select! {
                e = inner.next() => e,
                _ = tokio::time::sleep(POLL) => {
                    if cancel.load(Ordering::Relaxed) {
                        inner.cancel();
                    }
                    if tx.is_closed() {
                        return;
                    }
                    continue;
                }
            };
            let event = match event {
                Some(Event::Done {
                    finish_reason,
                    mut usage,
                    stop_sequence,
                }) => {
                    // As one request: the client's prompt, every token generated across the break.
                    usage.prompt_tokens = usage.prompt_tokens.saturating_sub(done as u32);
                    usage.completion_tokens += done as u32;
                    Event::Done {
                        finish_reason,
                        usage,
                        stop_sequence,
                    }
                }
                Some(e) => e,
                None => return,
            };
            let last = matches!(event, Event::Done { .. } | Event::Error(_));
            if tx.send(event).is_err() || last {
                return;
            }
        }
    }

    /// The continuation's request on `engine`: prompt and generated tokens as the prompt, what is left
    /// of the budget and the timeout.
    fn continuation(&self, engine: &EngineHandle) -> Result<RequestStream, EngineError> {
        let done = self.generated.len() as u32;
        let mut request = self.request.clone();
        request.prompt =
            Prompt::Tokens(self.prompt.iter().chain(&self.generated).copied().collect());
        request.add_bos = false;
        request.max_tokens =
            match request.max_tokens {
                Some(m) => Some(NonZeroU32::new(m.get().saturating_sub(done)).ok_or_else(
                    || EngineError::Internal("a stream broke after its last token".into()),
                )?),
                None => None,
            };
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(EngineError::Timeout {
                    after_ms: self.request.timeout.map_or(0, |t| t.as_millis() as u64),
                });
            }
            request.timeout = Some(left);
        }
        engine
            .enqueue_n(request, 1)?
            .pop()
            .ok_or_else(|| EngineError::Internal("no stream for a continuation".into()))
    }
}

impl Continuation for Resume {
    fn token(&mut self, id: u32) {
        self.generated.push(id);
    }

    /// Continues the stream after `why` broke it: a task that waits for the model's next engine and
    /// forwards the continuation's events; the returned channel replaces the stream's. `None` outside a
    /// tokio runtime.
    fn start(
        self: Box<Self>,
        why: String,
        cancel: Arc<AtomicBool>,
    ) -> Option<mpsc::UnboundedReceiver<Event>> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (tx, rx) = mpsc::unbounded_channel();
        tracing::warn!(model = %self.request.model, generated = self.generated.len(), "{why}: waiting for the model's next instance to continue");
        runtime.spawn(self.run(why, tx, cancel));
        Some(rx)
    }
}
