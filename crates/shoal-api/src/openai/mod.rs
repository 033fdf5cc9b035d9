//! The OpenAI-compatible API: `/v1/chat/completions`, `/v1/completions`, `/v1/responses`
//! ([`responses`]), `/v1/embeddings` ([`embeddings`]), `/v1/models`.
//!
//! Each handler parses its body into [`types`], checks it through [`params`] into a
//! [`shoal_engine::GenerateRequest`], submits it, and answers either with one JSON object (events
//! gathered by [`collect`]) or with an SSE stream ([`crate::sse`]).

pub mod chat;
pub mod completions;
pub mod embeddings;
pub mod params;
pub mod responses;
pub mod tools;
pub mod types;

use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Path, State};
use shoal_engine::{Event, FinishReason, Usage};

use crate::ApiState;
use crate::cancel::LiveRequest;
use crate::error::ApiError;
use types::{ModelList, ModelObject};

/// Reported as `system_fingerprint`: which server build produced the output.
pub const SYSTEM_FINGERPRINT: &str = concat!("shoal-", env!("CARGO_PKG_VERSION"));

/// Unix seconds, for `created`.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A finished generation, for non-streaming answers.
#[derive(Debug)]
pub struct Generated {
    pub text: String,
    /// Per sampled token: the text it made decodable and its log-probability (only when asked for).
    pub tokens: Vec<(String, f32)>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    /// The stop sequence that ended generation, when one did.
    pub stop_sequence: Option<String>,
}

/// Reads a request's events to the end. A request cancelled by id (`POST /v1/cancel/{id}`) answers
/// [`ApiError::Cancelled`]; one that runs past its `timeout` answers [`ApiError::Timeout`].
pub async fn collect(request: &mut LiveRequest, keep_tokens: bool) -> Result<Generated, ApiError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    while let Some(event) = request.stream().next().await {
        match event {
            Event::Token {
                text: piece,
                logprob,
                ..
            } => {
                text.push_str(&piece);
                if keep_tokens {
                    tokens.push((piece, logprob));
                }
            }
            // We still hold the stream, so the request was cancelled by id.
            Event::Done {
                finish_reason: FinishReason::Cancelled,
                ..
            } => return Err(ApiError::Cancelled),
            Event::Done {
                finish_reason,
                usage,
                stop_sequence,
            } => {
                return Ok(Generated {
                    text,
                    tokens,
                    finish_reason,
                    usage,
                    stop_sequence,
                });
            }
            Event::Error(err) => return Err(err.into()),
        }
    }
    // A request cancelled while still queued is dropped from the queue without a final event.
    if request.cancelled_by_id() {
        return Err(ApiError::Cancelled);
    }
    Err(ApiError::Internal(
        "the engine closed the request's stream without finishing".into(),
    ))
}

/// `GET /v1/models`.
pub async fn list_models(State(state): State<ApiState>) -> Json<ModelList> {
    let data = crate::cluster::served_models(&state)
        .into_iter()
        .map(ModelObject::from)
        .collect();
    Json(ModelList {
        object: "list",
        data,
    })
}

/// `GET /v1/models/{id}` (ids may contain `/`).
pub async fn get_model(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<ModelObject>, ApiError> {
    crate::cluster::served_models(&state)
        .into_iter()
        .find(|m| m.id == id)
        .map(|m| Json(ModelObject::from(m)))
        .ok_or(ApiError::ModelNotFound { model: id })
}
