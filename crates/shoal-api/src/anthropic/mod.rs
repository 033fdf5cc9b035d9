//! Anthropic's Messages API: `POST /v1/messages` (streaming and not) and
//! `POST /v1/messages/count_tokens`, answered the way the `anthropic` SDKs expect.
//!
//! A handler parses its body ([`types`]), checks it into a [`convert::Prepared`] (the conversation,
//! the tools and output format as shoal-guide's `ChatGuidance` from [`tools`], the sampling knobs) and
//! hands it to the one front half ([`crate::generate::start`]: shoal-guide's plan — the messages and
//! tools the template sees, the constraint for a forced call or a schema, the tool-call parser — off the
//! async workers, the render with the assistant prefill appended, one submit). A non-streaming answer
//! gathers the outcomes ([`crate::generate::collect`]) into one [`types::MessageOut`], calls split out as
//! `tool_use` blocks; a
//! streaming one hands the request to [`crate::sse`] with [`stream::MessageEvents`], which writes
//! Anthropic's named events. Every failure is an [`Error`]: an [`ApiError`] in Anthropic's shape and
//! statuses ([`error`]), malformed JSON and wrong types included. The `anthropic-version` header is
//! accepted and not required.
//!
//! An answer the token budget cut inside a tool call ends with that call as a `tool_use` block whose
//! `input` is its arguments as far as they parse (`{}` before any; the name empty when it was not
//! written whole) and `stop_reason: "max_tokens"` — streamed, as one `input_json_delta` of that
//! input, so the accumulated JSON always parses (decision 019).
//!
//! `stop_reason` comes from the engine's end: an end-of-generation token is `end_turn` (`tool_use` when
//! the answer called tools), a stop sequence `stop_sequence` (named in `stop_sequence`, as the engine
//! reports it), the token budget `max_tokens`, and a full context window
//! `model_context_window_exceeded`. A `max_tokens` that the prompt leaves no room for (the context, or a
//! KV budget smaller than it) is refused before anything is sent, in Anthropic's words
//! ([`crate::limits`]).

pub mod convert;
pub mod stream;
pub mod tools;
pub mod types;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::response::{IntoResponse, Response};
use shoal_engine::{FinishReason, SamplingParams};
use shoal_guide::ToolCallParser;

use self::stream::MessageEvents;
use self::types::{
    ContentOut, CountTokensRequest, MessageOut, MessagesRequest, TokenCount, UsageOut,
};
use crate::ApiState;
use crate::cancel::Caller;
pub use crate::dialect::anthropic::Error;
use crate::error::ApiError;
use crate::generate::reasoning::{self, Splitter};
use crate::generate::{self, Chat, Started, collect};
use crate::limits::{self, Budget, Words};
use crate::route_table::Routes;
use crate::sse::stream_response;

/// `type` of a message object.
const MESSAGE_TYPE: &str = "message";
/// `role` of every answer.
const ROLE: &str = "assistant";
/// The request field a prompt problem is reported against.
const PROMPT_PARAM: &str = "messages";

/// The generation routes (each takes a `model` in its body).
pub fn routes() -> Routes {
    Routes::new()
        .post("/v1/messages", messages)
        .post("/v1/messages/count_tokens", count_tokens)
}

/// `POST /v1/messages`.
#[utoipa::path(
    post,
    path = "/v1/messages",
    operation_id = "post_v1_messages",
    tag = "anthropic",
    request_body = types::MessagesRequest,
    responses(
        (status = 200, description = "The message; with `stream: true`, Anthropic's events (`message_start`, `content_block_delta`, …, `message_stop`) as server-sent events.", content((types::MessageOut = "application/json"), (stream::StreamData = "text/event-stream"))),
        crate::schema::AnthropicErrors
    )
)]
pub async fn messages(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    body: Result<Json<MessagesRequest>, JsonRejection>,
) -> Result<Response, Error> {
    let Json(req) = body?;
    let prepared = convert::prepare(&state.engine, req)?;
    let chat = Chat {
        model: prepared.model.clone(),
        messages: prepared.conversation.messages,
        guidance: prepared.guidance,
        prefill: prepared.conversation.prefill,
        thinking: prepared.thinking.clone(),
        sampling: prepared.sampling,
        max_tokens: Some(prepared.max_tokens),
        stop: prepared.stop,
        ignore_eos: false,
        timeout: None,
        n: 1,
        speculative: prepared.speculative,
        prompt_param: PROMPT_PARAM,
        guide_error: tools::guide_error,
    };
    let Started {
        choices,
        ticket,
        parser,
        prompt_tokens,
        reasoning,
    } = generate::start(&state, caller, chat).await?;
    limits::check(
        &state,
        &prepared.model,
        Budget {
            prompt_tokens,
            max_tokens: Some(prepared.max_tokens.get()),
            choices: 1,
        },
        Words::Anthropic,
    )?;
    let Some(mut live) = choices.into_iter().next() else {
        return Err(ApiError::Internal("no choice was submitted".into()).into());
    };
    let id = format!("msg_{}", ticket.token());
    let max_tokens = prepared.max_tokens.get();
    if prepared.stream {
        let tools = parser.as_ref().map(ToolCallParser::stream);
        let splitter = reasoning.map(Splitter::new);
        let events = MessageEvents::new(
            id,
            prepared.model,
            prompt_tokens,
            max_tokens,
            tools,
            splitter,
        );
        return Ok(stream_response(live, events));
    }
    let done = collect(&mut live, false).await?;
    let usage = UsageOut::from(done.usage);
    let cut_off = done.finish_reason == FinishReason::Length;
    let parts = reasoning::answer(done.text, reasoning);
    let (mut content, called) = tools::content(parts.content, parser.as_ref(), cut_off);
    if !parts.reasoning.is_empty() {
        // Only thoughts (the budget ran out inside them): no empty text block after them.
        content.retain(|b| !matches!(b, ContentOut::Text { text } if text.is_empty()));
        content.insert(
            0,
            ContentOut::Thinking {
                thinking: parts.reasoning,
                signature: String::new(),
            },
        );
    }
    let body = MessageOut {
        id,
        kind: MESSAGE_TYPE,
        role: ROLE,
        model: prepared.model,
        content,
        stop_reason: Some(stop_reason(
            done.finish_reason,
            done.stop_sequence.is_some(),
            called,
            usage.output_tokens,
            max_tokens,
        )),
        stop_sequence: done.stop_sequence,
        usage,
    };
    Ok(Json(body).into_response())
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens (system, messages and tools as the template
/// renders them), counted by the model's tokenizer as a generation would count them.
#[utoipa::path(
    post,
    path = "/v1/messages/count_tokens",
    operation_id = "post_v1_messages_count_tokens",
    tag = "anthropic",
    request_body = types::CountTokensRequest,
    responses(
        (status = 200, description = "The prompt's token count.", body = types::TokenCount),
        crate::schema::AnthropicErrors
    )
)]
pub async fn count_tokens(
    State(state): State<ApiState>,
    body: Result<Json<CountTokensRequest>, JsonRejection>,
) -> Result<Json<TokenCount>, Error> {
    let Json(req) = body?;
    let (model, conversation, guidance) = convert::prepare_count(&state.engine, req)?;
    let engine = state
        .engine
        .get(&model)
        .map_err(|e| ApiError::from_engine(e, PROMPT_PARAM))?;
    let chat = Chat {
        model,
        messages: conversation.messages,
        guidance,
        prefill: conversation.prefill,
        thinking: Default::default(),
        sampling: SamplingParams::default(),
        max_tokens: None,
        stop: Vec::new(),
        ignore_eos: false,
        timeout: None,
        n: 1,
        speculative: None,
        prompt_param: PROMPT_PARAM,
        guide_error: tools::guide_error,
    };
    // Nothing is generated: the tool-use ids the seed would make never show.
    let planned = generate::plan(&state, &engine, 0, &chat).await?;
    let input_tokens = state
        .engine
        .count_tokens(&chat.model, &planned.prompt, true)
        .map_err(|e| ApiError::from_engine(e, PROMPT_PARAM))?;
    Ok(Json(TokenCount { input_tokens }))
}

/// Anthropic's `stop_reason` for how generation ended.
fn stop_reason(
    reason: FinishReason,
    by_stop_sequence: bool,
    called: bool,
    output_tokens: u32,
    max_tokens: u32,
) -> &'static str {
    match reason {
        FinishReason::Stop if by_stop_sequence => "stop_sequence",
        FinishReason::Stop if called => "tool_use",
        FinishReason::Stop | FinishReason::Cancelled => "end_turn",
        FinishReason::Length if output_tokens >= max_tokens => "max_tokens",
        FinishReason::Length => "model_context_window_exceeded",
    }
}

/// The parameter a 400 names (for the module's tests).
#[cfg(test)]
fn param_of(err: ApiError) -> Option<String> {
    match err {
        ApiError::InvalidRequest { param, .. } => param,
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons() {
        use FinishReason::{Length, Stop};
        assert_eq!(stop_reason(Stop, false, false, 3, 10), "end_turn");
        assert_eq!(stop_reason(Stop, true, false, 3, 10), "stop_sequence");
        assert_eq!(stop_reason(Stop, false, true, 3, 10), "tool_use");
        assert_eq!(stop_reason(Length, false, true, 10, 10), "max_tokens");
        assert_eq!(
            stop_reason(Length, false, false, 7, 10),
            "model_context_window_exceeded"
        );
    }
}
