//! [`Admission`]: a request a handle accepted (tokenized, checked against the model, its event channel
//! created), on its way to the engine thread — a generation (with the [`Sibling`]s of its other
//! choices when it asked for several), or an embedding with its [`EmbedJob`] — and what the engine sends
//! a request that never ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use crate::error::EngineError;
use crate::request::{Event, FinishReason, GenerateRequest, Prefill, Usage};

/// An embedding sequence's instructions, on its admission ([`crate::embed`]).
pub(crate) struct EmbedJob {
    pub(crate) pooling: shoal_model::Pooling,
    /// Where the vector goes.
    pub(crate) reply: tokio::sync::oneshot::Sender<Vec<f32>>,
}

/// Another choice of a request (`n` > 1): its own sequence id, event channel, cancel flag and seed; it
/// starts from a copy of the first choice's prompt KV.
pub(crate) struct Sibling {
    pub(crate) id: u64,
    pub(crate) tx: UnboundedSender<Event>,
    pub(crate) cancel: Arc<AtomicBool>,
    pub(crate) seed: Option<u64>,
}

/// A request accepted by a handle, on its way to the engine thread.
pub(crate) struct Admission {
    pub(crate) id: u64,
    pub(crate) tokens: Vec<u32>,
    /// How many of the last `tokens` an earlier run of the request generated: a continuation after a
    /// stage's death ([`crate::resume`]) counts them as generated, not as prompt.
    pub(crate) generated: usize,
    pub(crate) request: GenerateRequest,
    /// Set for an embedding: pool the hidden states instead of generating.
    pub(crate) embed: Option<EmbedJob>,
    /// The request's other choices (`n` > 1).
    pub(crate) siblings: Vec<Sibling>,
    pub(crate) tx: UnboundedSender<Event>,
    /// Where the prompt's progress goes (the choice that prefills it; `None` for the others).
    pub(crate) prefill: Option<tokio::sync::watch::Sender<Prefill>>,
    pub(crate) cancel: Arc<AtomicBool>,
    pub(crate) deadline: Option<Instant>,
    /// When the handle queued it (its time to first token counts from here).
    pub(crate) queued: Instant,
    /// The engine's own warm-up ([`crate::EngineHandle::warm_up`]): its KV is never kept as a cached
    /// prefix.
    pub(crate) warm_up: bool,
    /// The span of the request it came from (the API's `request{id=…}`), for the engine thread's log
    /// lines about it; entered only when such a line is written, never per token.
    pub(crate) span: tracing::Span,
}

impl Admission {
    /// Ends the request if, while it waited, its client went away, it was cancelled (a `Done` with
    /// `Cancelled` follows) or its deadline passed (an `Error`); true when it is still wanted. Its choices
    /// wait as one: the first choice's fate is every choice's.
    pub(crate) fn still_wanted(&self, now: Instant) -> bool {
        if self.tx.is_closed() || self.cancel.load(Ordering::Relaxed) {
            self.send_all(|| Event::Done {
                finish_reason: FinishReason::Cancelled,
                usage: self.waited_usage(),
                stop_sequence: None,
            });
            return false;
        }
        if self.deadline.is_some_and(|d| now >= d) {
            let after_ms = self.timeout_ms();
            self.send_all(|| Event::Error(EngineError::Timeout { after_ms }));
            return false;
        }
        true
    }

    /// What a request that never ran used: its prompt, nothing computed.
    fn waited_usage(&self) -> Usage {
        Usage {
            prompt_tokens: (self.tokens.len() - self.generated) as u32,
            completion_tokens: self.generated as u32,
            ..Usage::default()
        }
    }

    /// Sends `event` to every choice of the request.
    fn send_all(&self, event: impl Fn() -> Event) {
        let _ = self.tx.send(event());
        for s in &self.siblings {
            let _ = s.tx.send(event());
        }
    }

    /// The admission of choice `s` of this request: the same prompt and request, its own seed.
    pub(crate) fn sibling(&self, s: Sibling) -> Admission {
        let mut request = self.request.clone();
        request.sampling.seed = s.seed;
        Admission {
            id: s.id,
            tokens: self.tokens.clone(),
            generated: self.generated,
            request,
            embed: None,
            siblings: Vec::new(),
            tx: s.tx,
            prefill: None,
            cancel: s.cancel,
            deadline: self.deadline,
            queued: self.queued,
            warm_up: self.warm_up,
            span: self.span.clone(),
        }
    }

    /// The request's timeout in milliseconds (0 without one), as its timeout error reports it.
    pub(crate) fn timeout_ms(&self) -> u64 {
        self.request.timeout.map_or(0, |t| t.as_millis() as u64)
    }

    /// Refuses the request: it can never fit (the error says why).
    pub(crate) fn refuse(self, error: EngineError) {
        self.send_all(|| Event::Error(error.clone()));
    }
}
