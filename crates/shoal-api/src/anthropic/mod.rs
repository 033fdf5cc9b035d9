//! Anthropic's Messages API: `POST /v1/messages` (streaming and not) and
//! `POST /v1/messages/count_tokens`, answered the way the `anthropic` SDKs expect.
//!
//! A handler parses its body ([`types`]), checks it and renders the conversation through the model's
//! chat template ([`convert`]: [`convert::Prepared`]), and submits one
//! [`shoal_engine::GenerateRequest`]. A non-streaming answer gathers the engine's events
//! ([`crate::openai::collect`]) into one [`types::MessageOut`]; a streaming one hands the request to
//! [`crate::sse`] with [`stream::MessageEvents`], which writes Anthropic's named events. Every failure
//! is an [`Error`]: an [`ApiError`] in Anthropic's shape and statuses ([`error`]), malformed JSON and
//! wrong types included. The `anthropic-version` header is accepted and not required.
//!
//! `stop_reason` comes from the engine's end: an end-of-generation token is `end_turn`, a stop sequence
//! `stop_sequence` (named in `stop_sequence`, as the engine reports it), the token budget
//! `max_tokens`, and a full context window `model_context_window_exceeded`.

pub mod convert;
pub mod error;
pub mod stream;
pub mod types;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use shoal_engine::{FinishReason, GenerateRequest, Prompt};

pub use self::error::Error;
use self::stream::MessageEvents;
use self::types::{
    ContentOut, CountTokensRequest, MessageOut, MessagesRequest, TokenCount, UsageOut,
};
use crate::ApiState;
use crate::error::ApiError;
use crate::openai::collect;
use crate::sse::stream_response;

/// `type` of a message object.
const MESSAGE_TYPE: &str = "message";
/// `role` of every answer.
const ROLE: &str = "assistant";
/// The request field a prompt problem is reported against.
const PROMPT_PARAM: &str = "messages";

/// The generation routes (each takes a `model` in its body).
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
}

/// `POST /v1/messages`.
pub async fn messages(
    State(state): State<ApiState>,
    body: Result<Json<MessagesRequest>, JsonRejection>,
) -> Result<Response, Error> {
    let Json(req) = body?;
    let prepared = convert::prepare(&state.engine, req)?;
    let request = GenerateRequest {
        model: prepared.model.clone(),
        prompt: Prompt::Text(prepared.prompt),
        sampling: prepared.sampling,
        max_tokens: Some(prepared.max_tokens),
        stop: prepared.stop,
        // render_chat cut the template's own BOS where the tokenizer adds one.
        add_bos: true,
        ignore_eos: false,
        timeout: None,
        logits_processor: None,
    };
    let stream = state
        .engine
        .submit(request)
        .map_err(|e| ApiError::from_engine(e, PROMPT_PARAM))?;
    let prompt_tokens = stream.prompt_tokens();
    let mut live = state.track(stream);
    let id = format!("msg_{}", live.id());
    let max_tokens = prepared.max_tokens.get();
    if prepared.stream {
        let events = MessageEvents::new(id, prepared.model, prompt_tokens, max_tokens);
        return Ok(stream_response(live, events));
    }
    let done = collect(&mut live, false).await?;
    let usage = UsageOut::from(done.usage);
    let body = MessageOut {
        id,
        kind: MESSAGE_TYPE,
        role: ROLE,
        model: prepared.model,
        content: vec![ContentOut::Text { text: done.text }],
        stop_reason: Some(stop_reason(
            done.finish_reason,
            done.stop_sequence.is_some(),
            usage.output_tokens,
            max_tokens,
        )),
        stop_sequence: done.stop_sequence,
        usage,
    };
    Ok(Json(body).into_response())
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens (system and messages as the template renders
/// them), counted by the model's tokenizer as a generation would count them.
pub async fn count_tokens(
    State(state): State<ApiState>,
    body: Result<Json<CountTokensRequest>, JsonRejection>,
) -> Result<Json<TokenCount>, Error> {
    let Json(req) = body?;
    let (model, prompt) = convert::prepare_count(&state.engine, req)?;
    let input_tokens = state
        .engine
        .count_tokens(&model, &prompt, true)
        .map_err(|e| ApiError::from_engine(e, PROMPT_PARAM))?;
    Ok(Json(TokenCount { input_tokens }))
}

/// Anthropic's `stop_reason` for how generation ended.
fn stop_reason(
    reason: FinishReason,
    by_stop_sequence: bool,
    output_tokens: u32,
    max_tokens: u32,
) -> &'static str {
    match reason {
        FinishReason::Stop if by_stop_sequence => "stop_sequence",
        FinishReason::Stop | FinishReason::Cancelled => "end_turn",
        FinishReason::Length if output_tokens >= max_tokens => "max_tokens",
        FinishReason::Length => "model_context_window_exceeded",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons() {
        assert_eq!(stop_reason(FinishReason::Stop, false, 3, 10), "end_turn");
        assert_eq!(
            stop_reason(FinishReason::Stop, true, 3, 10),
            "stop_sequence"
        );
        assert_eq!(
            stop_reason(FinishReason::Length, false, 10, 10),
            "max_tokens"
        );
        assert_eq!(
            stop_reason(FinishReason::Length, false, 7, 10),
            "model_context_window_exceeded"
        );
    }
}
