//! The clonable handle API adapters use to reach the engine, and the per-request event stream.
//!
//! (Interface first; the implementation lands with the engine loop.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use tokio::sync::mpsc;

use crate::error::EngineError;
use crate::request::{Event, GenerateRequest};

/// One chat message, as adapters pass them to the model's chat template.
pub use shoal_model::chat::ChatMessage;

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

/// Live counters of the engine, for tests, metrics and the dashboard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineStats {
    /// Sequences currently holding KV (prefilling or decoding).
    pub active_sequences: usize,
    /// Requests waiting for admission.
    pub waiting: usize,
    /// Engine steps run so far.
    pub steps: u64,
    /// Tokens sampled so far, all sequences.
    pub generated_tokens: u64,
    /// Prompt tokens prefilled so far.
    pub prefilled_tokens: u64,
    /// Tokens of KV held: running sequences plus cached prefixes (bounded by the KV budget).
    pub kv_tokens: usize,
    /// Sequence KV caches held across all stages (a sequence in an n-stage pipeline holds n).
    pub stage_sequences: usize,
}

/// Handle to a running engine. Cheap to clone; all methods are safe to call from async code.
#[derive(Clone)]
pub struct EngineHandle {
    pub(crate) inner: Arc<crate::engine::Shared>,
}

/// The stream of one request's events. Dropping it cancels the request: the engine frees the sequence
/// at its next step.
pub struct RequestStream {
    pub(crate) id: u64,
    pub(crate) prompt_tokens: usize,
    pub(crate) rx: mpsc::UnboundedReceiver<Event>,
    pub(crate) cancel: Arc<AtomicBool>,
}

impl RequestStream {
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
        self.rx.recv().await
    }

    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.rx.poll_recv(cx)
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

impl EngineHandle {
    /// Models this engine serves.
    pub fn models(&self) -> Vec<ModelInfo> {
        self.inner.models()
    }

    /// Renders chat messages with the model's own chat template, generation prompt appended.
    pub fn render_chat(
        &self,
        model: &str,
        messages: &[ChatMessage],
    ) -> Result<String, EngineError> {
        self.inner.render_chat(model, messages)
    }

    /// Tokenizes and checks the request, then queues it. The event channel exists before the engine
    /// sees the request, so no token can be lost however fast the engine is.
    pub fn submit(&self, request: GenerateRequest) -> Result<RequestStream, EngineError> {
        self.inner.submit(request)
    }

    /// Whether `other` is a handle to this same engine.
    pub fn same_engine(&self, other: &EngineHandle) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Current counters.
    pub fn stats(&self) -> EngineStats {
        self.inner.stats()
    }

    /// Cancels request `id` (as returned by [`RequestStream::id`]) wherever it is: queued or running. The
    /// engine frees it at its next step and its stream ends with `Done { Cancelled }`. Returns false when
    /// no such request is live.
    pub fn cancel(&self, id: u64) -> bool {
        self.inner.cancel(id)
    }
}
