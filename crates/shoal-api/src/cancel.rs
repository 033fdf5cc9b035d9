//! Cancelling a request by id: `POST /v1/cancel/{id}`.
//!
//! The id is a response id as clients see it (`chatcmpl-N`, `cmpl-N`, Responses' `resp_N`, Anthropic's
//! `msg_N`) or the bare engine request id `N`.
//! The route asks the engine to stop request `N` ([`shoal_engine::EngineHandle::cancel`]) and notes the
//! id in [`Cancellations`], so the handler still serving that request can tell the client why its answer
//! stopped: a non-streaming request answers 409 ([`ApiError::Cancelled`]), a stream ends with a
//! `cancelled` error event and `[DONE]` ([`crate::sse`]).
//!
//! Handlers hold each submitted request as a [`LiveRequest`], which pairs the engine's
//! [`RequestStream`] with the registry and forgets its id when dropped, so the registry only ever holds
//! ids of requests still being answered.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Json;
use axum::extract::{Path, State};
use serde::Serialize;
use shoal_engine::RequestStream;

use crate::ApiState;
use crate::error::ApiError;

/// Prefixes of the response ids the OpenAI routes build from engine request ids.
const ID_PREFIXES: [&str; 4] = ["chatcmpl-", "cmpl-", "resp_", "msg_"];

/// Ids of requests cancelled through the cancel route whose handlers are still answering them.
#[derive(Debug, Default)]
pub struct Cancellations {
    ids: Mutex<HashSet<u64>>,
}

impl Cancellations {
    fn ids(&self) -> MutexGuard<'_, HashSet<u64>> {
        // The set stays consistent even if a holder panicked: every operation is a single insert/remove.
        self.ids
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn mark(&self, id: u64) {
        self.ids().insert(id);
    }

    fn forget(&self, id: u64) {
        self.ids().remove(&id);
    }

    /// Whether request `id` was cancelled through the cancel route.
    pub fn contains(&self, id: u64) -> bool {
        self.ids().contains(&id)
    }
}

/// A submitted request as a handler holds it: the engine's event stream plus the knowledge of whether
/// a client cancelled it by id. Dropping it drops the stream (the engine then frees the sequence).
pub struct LiveRequest {
    stream: RequestStream,
    cancellations: Arc<Cancellations>,
}

impl LiveRequest {
    pub fn new(stream: RequestStream, cancellations: Arc<Cancellations>) -> Self {
        LiveRequest {
            stream,
            cancellations,
        }
    }

    pub fn id(&self) -> u64 {
        self.stream.id()
    }

    pub fn stream(&mut self) -> &mut RequestStream {
        &mut self.stream
    }

    /// Whether a client cancelled this request through `POST /v1/cancel/{id}`.
    pub fn cancelled_by_id(&self) -> bool {
        self.cancellations.contains(self.stream.id())
    }
}

impl Drop for LiveRequest {
    fn drop(&mut self) {
        self.cancellations.forget(self.stream.id());
    }
}

/// The engine request id behind a client-visible id: `chatcmpl-N`, `cmpl-N` or `N` (decimal digits only).
pub fn parse_request_id(id: &str) -> Option<u64> {
    let digits = ID_PREFIXES
        .iter()
        .find_map(|p| id.strip_prefix(p))
        .unwrap_or(id);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The answer to a successful cancellation.
#[derive(Debug, Serialize)]
pub struct Cancellation {
    /// The id as the client gave it.
    pub id: String,
    pub object: &'static str,
    pub cancelled: bool,
}

/// `POST /v1/cancel/{id}`: 200 when the request was live, 404 when no such request is queued or
/// running, 400 when the id is not a request id.
pub async fn cancel_request(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<Cancellation>, ApiError> {
    let Some(request_id) = parse_request_id(&id) else {
        return Err(ApiError::InvalidRequest {
            message: format!(
                "'{id}' is not a request id (expected chatcmpl-N, cmpl-N, resp_N, msg_N or N, N a non-negative integer)"
            ),
            param: Some("id".into()),
            code: Some("invalid_request_id"),
        });
    };
    // Mark first: the handler may see the stream end as soon as the engine's flag is set.
    state.cancellations.mark(request_id);
    if !state.engine.cancel(request_id) {
        state.cancellations.forget(request_id);
        return Err(ApiError::RequestNotFound { id });
    }
    tracing::debug!(request = request_id, "cancelled by id");
    Ok(Json(Cancellation {
        id,
        object: "cancellation",
        cancelled: true,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_client_ids() {
        assert_eq!(parse_request_id("chatcmpl-12"), Some(12));
        assert_eq!(parse_request_id("cmpl-0"), Some(0));
        assert_eq!(parse_request_id("resp_7"), Some(7));
        assert_eq!(parse_request_id("msg_8"), Some(8));
        assert_eq!(parse_request_id("7"), Some(7));
        for bad in [
            "",
            "chatcmpl-",
            "cmpl-x",
            "+5",
            "-1",
            "abc",
            "chatcmpl-1a",
            "18446744073709551616",
            "resp-3",
        ] {
            assert_eq!(parse_request_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn mark_and_forget() {
        let registry = Cancellations::default();
        registry.mark(3);
        assert!(registry.contains(3));
        registry.forget(3);
        assert!(!registry.contains(3));
    }
}
