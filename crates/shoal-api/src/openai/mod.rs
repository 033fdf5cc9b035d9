//! The OpenAI-compatible API: `/v1/chat/completions`, `/v1/completions`, `/v1/responses`
//! ([`responses`]), `/v1/embeddings` ([`embeddings`]), `/v1/models`.
//!
//! Each handler parses its body into [`types`], checks it through [`params`] into a
//! [`shoal_engine::GenerateRequest`], submits it (chat and completions: its `n` choices, [`submit`]), and
//! answers either with one JSON object (events gathered by [`collect`]) or with an SSE stream
//! ([`stream`] for chat and completions, [`crate::sse`] for the Responses API).

pub mod chat;
pub mod completions;
pub mod embeddings;
pub mod params;
pub mod responses;
pub mod stream;
pub mod tools;
pub mod types;

use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Path, State};
use shoal_engine::{Event, FinishReason, GenerateRequest, TopLogprob, Usage};

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

/// One sampled token as the routes report it: the text it made decodable, its log-probability and the
/// most likely alternatives (when asked).
#[derive(Debug, Clone)]
pub struct SampledToken {
    pub id: u32,
    pub text: String,
    pub logprob: f32,
    pub top: Vec<TopLogprob>,
}

/// A finished generation, for non-streaming answers.
#[derive(Debug)]
pub struct Generated {
    pub text: String,
    /// Per sampled token (only when asked for).
    pub tokens: Vec<SampledToken>,
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
                id,
                text: piece,
                logprob,
                top_logprobs,
            } => {
                text.push_str(&piece);
                if keep_tokens {
                    tokens.push(SampledToken {
                        id,
                        text: piece,
                        logprob,
                        top: top_logprobs,
                    });
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

/// Submits the `n` choices of `request` (`n` ≤ [`shoal_engine::request::MAX_CHOICES`]) and tracks them
/// under `ticket`, in `index` order; a problem with the prompt is reported against `prompt_param`.
pub fn submit(
    state: &ApiState,
    request: GenerateRequest,
    n: usize,
    prompt_param: &str,
    ticket: &std::sync::Arc<crate::cancel::Ticket>,
) -> Result<Vec<LiveRequest>, ApiError> {
    let streams = state
        .engine
        .submit_n(request, n)
        .map_err(|e| ApiError::from_engine(e, prompt_param))?;
    Ok(streams
        .into_iter()
        .map(|s| state.track_ticket(s, ticket))
        .collect())
}

/// Reads every choice's events to the end ([`collect`] each; they run side by side in the engine).
pub async fn collect_all(
    choices: &mut [LiveRequest],
    keep_tokens: bool,
) -> Result<Vec<Generated>, ApiError> {
    let mut out = Vec::with_capacity(choices.len());
    for choice in choices.iter_mut() {
        out.push(collect(choice, keep_tokens).await?);
    }
    Ok(out)
}

/// The usage of a request's choices: its prompt once (the first choice's, cached tokens included),
/// the completions of all.
pub fn total_usage(choices: impl Iterator<Item = Usage>) -> Usage {
    choices
        .enumerate()
        .fold(Usage::default(), |total, (i, u)| match i {
            0 => u,
            _ => Usage {
                completion_tokens: total.completion_tokens + u.completion_tokens,
                ..total
            },
        })
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
