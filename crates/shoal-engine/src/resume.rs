//! Streams that survive a stage's death (issue 30). When a stage of a pipeline dies, every sequence
//! running through it ends with [`EngineError::StageLost`]; the cluster places the instance again on the
//! nodes left (about a second on loopback) and its new engine takes the model's place in
//! [`crate::Engines`].
//! Every choice of a request submitted through [`crate::Engines::submit_n`] carries a [`Resume`]: its
//! stream, instead of ending with that error, waits (at most [`RESUME_WAIT`]) for the model's next
//! engine, submits a continuation — the prompt's tokens and every token generated so far as a token
//! prompt, the generated ones counted as such — and forwards the continuation's events as its own. The
//! client sees a pause. The KV is rebuilt by prefilling the continuation (chunked, and from the prefix
//! cache where it has the prompt), as Petals replays a sequence.
//!
//! The continuation starts where the stream stood ([`crate::sequence`]'s catch-up): the text held back
//! for a possible stop sequence or an unfinished character is held still, a constraint (a copy of the
//! request's, as submitted) takes the generated tokens again, the sampler replays their draws, the
//! token budget, the timeout and the usage are the request's as a whole. So a continuation gives the
//! tokens and the text of the lone run: exactly for a greedy request; a sampled one draws from the same
//! random state (a request without a seed gets one when submitted, [`Resume::pin_seed`]), so it also
//! matches as long as the re-placed stages compute the same logits. A continuation whose stage dies in
//! turn continues again the same way. Nothing is resumed outside a tokio runtime; when no engine comes
//! back in time, the error says so.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::error::EngineError;
use crate::handle::{Continuation, EngineHandle, RequestStream, choice_seed};
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
    /// The choice's request as submitted (its own seed, its constraint's first state).
    request: GenerateRequest,
    /// The prompt as the first engine tokenized it.
    prompt: Vec<u32>,
    /// Tokens generated so far (seen by the stream as they pass).
    generated: Vec<u32>,
    deadline: Option<Instant>,
}

impl Resume {
    /// Gives a sampled request without a seed one, so that a continuation can replay its draws (the
    /// engine would otherwise pick one of its own, which a continuation on another engine cannot know).
    pub(crate) fn pin_seed(request: &mut GenerateRequest) {
        if request.sampling.seed.is_none() && request.sampling.temperature > 0.0 {
            use std::hash::BuildHasher;
            // A random key per call (the standard library's per-process random hashing keys).
            let random = std::collections::hash_map::RandomState::new();
            request.sampling.seed = Some(random.hash_one(std::time::SystemTime::now()));
        }
    }

    /// The resume of choice `i` of `request` (a copy as submitted to `failed`, which tokenized its
    /// `prompt`): the choice's own seed, as the engine gives it ([`choice_seed`]).
    pub(crate) fn of(
        engines: Lookup,
        failed: &EngineHandle,
        mut request: GenerateRequest,
        i: usize,
        prompt: Vec<u32>,
    ) -> Box<Self> {
        if i > 0 {
            request.sampling.seed = request.sampling.seed.map(|s| choice_seed(s, i));
        }
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
        let mut inner = match self.continuation(&engine, cancel.clone()) {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Event::Error(e));
                return;
            }
        };
        tracing::info!(model = %self.request.model, generated = done, "continuing on the model's next instance");
        // Should the continuation's stage die too, it continues again, from what it has by then.
        inner.set_continuation(Box::new(Resume {
            failed: engine,
            ..*self
        }));
        // The continuation shares the stream's cancel flag: the engine sees a cancel or a dropped stream.
        loop {
            let event = tokio::select! {
                e = inner.next() => e,
                _ = tokio::time::sleep(POLL) => {
                    if tx.is_closed() {
                        return;
                    }
                    continue;
                }
            };
            let Some(event) = event else { return };
            let last = matches!(event, Event::Done { .. } | Event::Error(_));
            if tx.send(event).is_err() || last {
                return;
            }
        }
    }

    /// The continuation's request on `engine`: prompt and generated tokens as the token prompt, what is
    /// left of the timeout.
    fn continuation(
        &self,
        engine: &EngineHandle,
        cancel: Arc<AtomicBool>,
    ) -> Result<RequestStream, EngineError> {
        if self
            .request
            .max_tokens
            .is_some_and(|m| self.generated.len() >= m.get() as usize)
        {
            return Err(EngineError::Internal(
                "a stream broke after its last token".into(),
            ));
        }
        let mut request = self.request.clone();
        request.prompt =
            Prompt::Tokens(self.prompt.iter().chain(&self.generated).copied().collect());
        request.add_bos = false;
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(EngineError::Timeout {
                    after_ms: self.request.timeout.map_or(0, |t| t.as_millis() as u64),
                });
            }
            request.timeout = Some(left);
        }
        engine.enqueue_continuation(request, self.generated.len(), cancel)
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
