//! [`Admission`]: a request a handle accepted (tokenized, checked against the model, its event channel
//! created), on its way to the engine thread — a generation, or an embedding with its [`EmbedJob`] —
//! and what the engine sends a request that never ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use crate::error::EngineError;
use crate::request::{Event, FinishReason, GenerateRequest, Usage};

/// An embedding sequence's instructions, on its admission ([`crate::embed`]).
pub(crate) struct EmbedJob {
    pub(crate) pooling: shoal_model::Pooling,
    /// Where the vector goes.
    pub(crate) reply: tokio::sync::oneshot::Sender<Vec<f32>>,
}

/// A request accepted by a handle, on its way to the engine thread.
pub(crate) struct Admission {
    pub(crate) id: u64,
    pub(crate) tokens: Vec<u32>,
    pub(crate) request: GenerateRequest,
    /// Set for an embedding: pool the hidden states instead of generating.
    pub(crate) embed: Option<EmbedJob>,
    pub(crate) tx: UnboundedSender<Event>,
    pub(crate) cancel: Arc<AtomicBool>,
    pub(crate) deadline: Option<Instant>,
}

impl Admission {
    /// Ends the request if, while it waited, its client went away, it was cancelled (a `Done` with
    /// `Cancelled` follows) or its deadline passed (an `Error`); true when it is still wanted.
    pub(crate) fn still_wanted(&self, now: Instant) -> bool {
        if self.tx.is_closed() {
            return false;
        }
        if self.cancel.load(Ordering::Relaxed) {
            let usage = Usage {
                prompt_tokens: self.tokens.len() as u32,
                ..Usage::default()
            };
            let _ = self.tx.send(Event::Done {
                finish_reason: FinishReason::Cancelled,
                usage,
                stop_sequence: None,
            });
            return false;
        }
        if self.deadline.is_some_and(|d| now >= d) {
            let _ = self.tx.send(Event::Error(EngineError::Timeout {
                after_ms: self.timeout_ms(),
            }));
            return false;
        }
        true
    }

    /// The request's timeout in milliseconds (0 without one), as its timeout error reports it.
    pub(crate) fn timeout_ms(&self) -> u64 {
        self.request.timeout.map_or(0, |t| t.as_millis() as u64)
    }

    /// Refuses the request: it can never fit (the error says why).
    pub(crate) fn refuse(self, error: EngineError) {
        let _ = self.tx.send(Event::Error(error));
    }
}
