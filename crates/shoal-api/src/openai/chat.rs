//! `POST /v1/chat/completions`.
//!
//! Messages are flattened to text, rendered with the model's own chat template
//! ([`shoal_engine::EngineHandle::render_chat_tools`]) and submitted as a text prompt without an extra
//! BOS (the template writes it when the model wants one).
//!
//! `n` choices come from one prefill (each streamed with its `index`; usage counts the prompt once).
//! `logprobs: true` reports each token's log-probability, `top_logprobs: k` (at most 20) also the k most
//! likely tokens (the model's raw log-probabilities, before penalties and temperature, as llama-server
//! and vLLM report them).
//!
//! `tools`, `tool_choice` and `response_format` go through [`super::tools`] into shoal-guide's
//! guidance; the request goes to the one front half ([`crate::generate::start`]: the guide plan — the
//! messages and tools the template sees, the constraint the engine applies while decoding (a forced
//! call, or the JSON schema), the parser that splits the answer into `content` and `tool_calls`
//! (`finish_reason: "tool_calls"`), whole or as stream deltas — render and submit).

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::response::{IntoResponse, Response};
use shoal_engine::request::MAX_TOP_LOGPROBS;
use shoal_engine::{ChatMessage, FinishReason, Usage};
use shoal_guide::{
    ChatGuidance, ResponseFormat, ToolCallParser, ToolCallStream, ToolChoice, ToolEvent,
};

use super::params::CommonParams;
use super::stream::{ChunkFormat, sse_response};
use super::tools::{self, ToolCallJson};
use super::types::{
    AssistantMessage, ChatChoice, ChatChunk, ChatChunkChoice, ChatCompletion, ChatLogprobs,
    ChatMessageIn, ChatRequest, Delta, MessageContent, Role, TokenLogprob, TopLogprob,
};
use super::{SYSTEM_FINGERPRINT, unix_now};
use crate::ApiState;
use crate::cancel::Caller;
use crate::error::ApiError;
use crate::generate::reasoning::{self, Parts, Splitter};
use crate::generate::{self, Chat, SampledToken, Started, collect_all, total_usage};
use crate::limits::{self, Budget, Words};
use crate::sse::to_json;

/// The request field a prompt problem is reported against.
const PROMPT_PARAM: &str = "messages";

/// The request field the token budget came from (`max_completion_tokens` wins when both are sent).
fn budget_param(completion_tokens: bool) -> &'static str {
    if completion_tokens {
        "max_completion_tokens"
    } else {
        "max_tokens"
    }
}

#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    operation_id = "post_v1_chat_completions",
    tag = "openai",
    request_body = ChatRequest,
    responses(
        (status = 200, description = "The completion; with `stream: true`, `chat.completion.chunk` objects as server-sent events ending with `data: [DONE]`.", content((ChatCompletion = "application/json"), (super::types::ChatStreamData = "text/event-stream"))),
        crate::schema::OpenAiErrors
    )
)]
pub async fn chat_completions(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    body: Result<Json<ChatRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(mut req) = body?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages must contain at least one message",
        ));
    }
    super::params::refuse_unimplemented(&req.unimplemented)?;
    let logprobs = wants_logprobs(&req)?;
    let guidance = tools::guidance(&mut req)?;
    let mut thinking = super::params::thinking(
        req.reasoning_effort.as_deref(),
        req.chat_template_kwargs.as_ref(),
    )?;
    thinking.budget = match req.thinking_budget_tokens {
        Some(0) => {
            return Err(ApiError::invalid(
                "thinking_budget_tokens",
                "thinking_budget_tokens must be at least 1",
            ));
        }
        budget => budget,
    };
    let budget_param = budget_param(req.max_completion_tokens.is_some());
    let mut params = CommonParams::from(&mut req).validate(&state.engine)?;
    params.sampling.top_logprobs = logprobs.unwrap_or(0);
    if params.ignore_eos && constrains(&guidance) {
        return Err(ApiError::invalid(
            "ignore_eos",
            "ignore_eos cannot be combined with response_format or a forced tool_choice",
        ));
    }
    let messages = to_chat_messages(req.messages)?;
    let created = unix_now();
    let chat = Chat {
        model: params.model.clone(),
        messages,
        guidance,
        prefill: None,
        thinking,
        sampling: params.sampling,
        max_tokens: params.max_tokens,
        stop: params.stop,
        ignore_eos: params.ignore_eos,
        timeout: params.timeout,
        n: params.n,
        speculative: params.speculative,
        prompt_param: PROMPT_PARAM,
        guide_error: tools::guide_error,
    };
    let Started {
        mut choices,
        ticket,
        parser: tool_parser,
        reasoning,
        prompt_tokens,
    } = generate::start(&state, caller, chat).await?;
    limits::check(
        &state,
        &params.model,
        Budget {
            prompt_tokens,
            max_tokens: params.max_tokens.map(|m| m.get()),
            choices: params.n,
        },
        Words::OpenAi(budget_param),
    )?;
    let id = format!("chatcmpl-{}", ticket.token());
    let logprobs = logprobs.is_some();
    if params.stream {
        let format = ChatChunks {
            id,
            created,
            model: params.model,
            logprobs,
            choices: (0..params.n)
                .map(|_| ChoiceState {
                    pending: Vec::new(),
                    tools: tool_parser.as_ref().map(ToolCallParser::stream),
                    reasoning: reasoning.map(Splitter::new),
                })
                .collect(),
        };
        return Ok(sse_response(
            choices,
            format,
            (params.include_usage, params.include_progress),
        ));
    }
    let done = collect_all(&mut choices, logprobs).await?;
    let usage = total_usage(done.iter().map(|d| d.usage));
    let choices = done
        .into_iter()
        .enumerate()
        .map(|(index, d)| {
            let logprobs = logprobs.then(|| ChatLogprobs {
                content: d.tokens.into_iter().map(token_logprob).collect(),
            });
            let parts = reasoning::answer(d.text, reasoning);
            let (mut message, finish_reason) =
                answer(parts.content, d.finish_reason, tool_parser.as_ref());
            message.reasoning_content = (!parts.reasoning.is_empty()).then_some(parts.reasoning);
            ChatChoice {
                index: index as u32,
                message,
                logprobs,
                finish_reason,
            }
        })
        .collect();
    let body = ChatCompletion {
        id,
        object: "chat.completion",
        created,
        model: params.model,
        system_fingerprint: SYSTEM_FINGERPRINT,
        choices,
        usage: usage.into(),
    };
    Ok(Json(body).into_response())
}

/// The log-probabilities asked for: `None` without `logprobs: true`, else how many alternatives per
/// token (`top_logprobs`, 0 to [`MAX_TOP_LOGPROBS`]; it needs `logprobs: true`, as in OpenAI).
fn wants_logprobs(req: &ChatRequest) -> Result<Option<u8>, ApiError> {
    let k = match req.top_logprobs {
        None => 0,
        Some(k) if (0..=i64::from(MAX_TOP_LOGPROBS)).contains(&k) => k as u8,
        Some(k) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"),
            ));
        }
    };
    match req.logprobs.unwrap_or(false) {
        true => Ok(Some(k)),
        false if k > 0 => Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        )),
        false => Ok(None),
    }
}

/// Whether the request constrains decoding (a schema or a forced call).
fn constrains(guidance: &ChatGuidance) -> bool {
    guidance.response_format != ResponseFormat::Text
        || matches!(
            guidance.tool_choice,
            ToolChoice::Required | ToolChoice::Function(_)
        )
}

/// The assistant message of a finished answer: calls split out where tools were offered. An answer
/// the token budget cut inside a call reports that call as written so far (its name when known, the
/// unfinished `arguments`) with `finish_reason: "length"`, as OpenAI does — never shoal's call format
/// as text.
fn answer(
    text: String,
    reason: FinishReason,
    parser: Option<&ToolCallParser>,
) -> (AssistantMessage, &'static str) {
    let plain = |text: String| AssistantMessage {
        role: "assistant",
        content: Some(text),
        reasoning_content: None,
        tool_calls: None,
    };
    let Some(parser) = parser else {
        return (plain(text), reason.as_str());
    };
    let parsed = parser.parse_ended(&text, reason == FinishReason::Length);
    if parsed.calls.is_empty() && parsed.cut.is_none() {
        return (plain(text), reason.as_str());
    }
    let called = !parsed.calls.is_empty();
    let mut calls: Vec<ToolCallJson> = parsed
        .calls
        .into_iter()
        .map(|c| ToolCallJson::new(c, None))
        .collect();
    calls.extend(parsed.cut.map(|c| ToolCallJson::cut(c, None)));
    let content = parsed.content;
    let message = AssistantMessage {
        role: "assistant",
        content: (!content.is_empty()).then_some(content),
        reasoning_content: None,
        tool_calls: Some(calls),
    };
    (message, finish_reason(reason, called))
}

/// `tool_calls` when the model stopped by itself after calling; otherwise the engine's reason.
fn finish_reason(reason: FinishReason, called: bool) -> &'static str {
    if called && reason == FinishReason::Stop {
        "tool_calls"
    } else {
        reason.as_str()
    }
}

/// The request's messages for the chat template, tool calls and results included.
fn to_chat_messages(messages: Vec<ChatMessageIn>) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len());
    for (i, mut m) in messages.into_iter().enumerate() {
        let calls = m.tool_calls.take();
        let (call_id, name) = (m.tool_call_id.take(), m.name.take());
        let reasoning = m.reasoning_content.take().filter(|r| !r.is_empty());
        let role = m.role;
        let mut message = to_chat_message(i, m)?;
        match role {
            Role::Tool => {
                message = tools::tool_result(i, message.content, call_id, name, &out)?;
            }
            Role::Assistant => {
                if let Some(calls) = calls {
                    message.tool_calls = tools::tool_calls(i, calls)?;
                }
                message.reasoning = reasoning;
            }
            _ => {}
        }
        out.push(message);
    }
    Ok(out)
}

/// One message as the chat template sees it: text parts concatenated, other part types refused.
fn to_chat_message(index: usize, message: ChatMessageIn) -> Result<ChatMessage, ApiError> {
    let content = match message.content {
        None => String::new(),
        Some(MessageContent::Text(text)) => text,
        Some(MessageContent::Parts(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.into_iter().enumerate() {
                let param = format!("messages[{index}].content[{j}]");
                if part.kind != "text" {
                    return Err(ApiError::invalid(
                        param,
                        format!(
                            "content parts of type '{}' are not supported; only 'text' is",
                            part.kind
                        ),
                    ));
                }
                let Some(part_text) = part.text else {
                    return Err(ApiError::invalid(
                        format!("{param}.text"),
                        "a text part needs a 'text' field",
                    ));
                };
                text.push_str(&part_text);
            }
            text
        }
    };
    Ok(ChatMessage::new(message.role.template_name(), content))
}

/// A sampled token's log-probability entry: its text, and its alternatives by their own pieces.
fn token_logprob(token: SampledToken) -> TokenLogprob {
    let bytes = token.text.as_bytes().to_vec();
    let top_logprobs = token
        .top
        .into_iter()
        .map(|t| TopLogprob {
            token: String::from_utf8_lossy(&t.bytes).into_owned(),
            logprob: t.logprob,
            bytes: t.bytes,
        })
        .collect();
    TokenLogprob {
        token: token.text,
        logprob: token.logprob,
        bytes,
        top_logprobs,
    }
}

/// Shapes `chat.completion.chunk`s.
struct ChatChunks {
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    /// Each choice's stream state, by index.
    choices: Vec<ChoiceState>,
}

/// What one choice's stream holds between chunks.
struct ChoiceState {
    /// Log-probabilities of tokens whose text has not been sent yet (empty pieces).
    pending: Vec<TokenLogprob>,
    /// Splits calls out of the text where tools were offered.
    tools: Option<ToolCallStream>,
    /// Splits the model's thoughts from its answer where it may think.
    reasoning: Option<Splitter>,
}

impl ChatChunks {
    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> String {
        to_json(&ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: SYSTEM_FINGERPRINT,
            choices,
            usage: usage.map(Into::into),
        })
    }

    fn take_logprobs(&mut self, index: u32) -> Option<ChatLogprobs> {
        let pending = &mut self.choices.get_mut(index as usize)?.pending;
        if pending.is_empty() {
            return None;
        }
        Some(ChatLogprobs {
            content: std::mem::take(pending),
        })
    }
}

impl ChunkFormat for ChatChunks {
    fn opening(&mut self, index: u32) -> Option<String> {
        let delta = Delta {
            role: Some("assistant"),
            content: Some(String::new()),
            ..Delta::default()
        };
        let choice = ChatChunkChoice {
            index,
            delta,
            logprobs: None,
            finish_reason: None,
        };
        Some(self.chunk(vec![choice], None))
    }

    fn token(&mut self, index: u32, token: SampledToken) -> Option<String> {
        let logprobs = self.logprobs;
        let state = self.choices.get_mut(index as usize)?;
        let text = token.text.clone();
        if logprobs {
            state.pending.push(token_logprob(token));
        }
        let parts = reasoning::piece(state.reasoning.as_mut(), &text);
        let delta = content_delta(state, parts);
        if delta.content.is_none()
            && delta.tool_calls.is_none()
            && delta.reasoning_content.is_none()
        {
            return None;
        }
        let choice = ChatChunkChoice {
            index,
            delta,
            logprobs: self.take_logprobs(index),
            finish_reason: None,
        };
        Some(self.chunk(vec![choice], None))
    }

    fn finish(&mut self, index: u32, reason: FinishReason) -> String {
        let state = self.choices.get_mut(index as usize);
        let (delta, called) = match state {
            Some(state) => {
                // What the splitter still held goes out first, through the tool parser as any text.
                let held = state.reasoning.as_mut().map(Splitter::finish);
                let mut delta = held.map(|p| content_delta(state, p)).unwrap_or_default();
                let (end, called) = match &mut state.tools {
                    // Cut by the budget inside a call: the call as written so far, not text.
                    Some(stream) if reason == FinishReason::Length => {
                        (tool_delta(stream.finish_cut()), stream.saw_calls())
                    }
                    Some(stream) => (tool_delta(stream.finish()), stream.saw_calls()),
                    None => (Delta::default(), false),
                };
                merge(&mut delta, end);
                (delta, called)
            }
            None => (Delta::default(), false),
        };
        let choice = ChatChunkChoice {
            index,
            delta,
            logprobs: self.take_logprobs(index),
            finish_reason: Some(finish_reason(reason, called)),
        };
        self.chunk(vec![choice], None)
    }

    fn usage(&mut self, usage: Usage) -> String {
        self.chunk(Vec::new(), Some(usage))
    }
}

/// The delta of one piece of a choice's answer: its thoughts as `reasoning_content`, the rest as
/// content — through the tool parser where tools were offered.
fn content_delta(state: &mut ChoiceState, parts: Parts) -> Delta {
    let mut delta = match &mut state.tools {
        Some(stream) => tool_delta(stream.push(&parts.content)),
        None if parts.content.is_empty() => Delta::default(),
        None => Delta {
            content: Some(parts.content),
            ..Delta::default()
        },
    };
    delta.reasoning_content = (!parts.reasoning.is_empty()).then_some(parts.reasoning);
    delta
}

/// `more` appended to `delta` (text joined, calls after calls).
fn merge(delta: &mut Delta, more: Delta) {
    if let Some(text) = more.content {
        delta
            .content
            .get_or_insert_with(String::new)
            .push_str(&text);
    }
    if let Some(calls) = more.tool_calls {
        delta.tool_calls.get_or_insert_with(Vec::new).extend(calls);
    }
}

/// A stream delta from tool-parser events: their text joined, their calls with indexes.
fn tool_delta(events: Vec<ToolEvent>) -> Delta {
    let mut content = String::new();
    let mut calls = Vec::new();
    for event in events {
        match event {
            ToolEvent::Content(text) => content.push_str(&text),
            ToolEvent::Call {
                index,
                id,
                name,
                arguments,
            } => calls.push(ToolCallJson::new(
                shoal_guide::ToolCallOut {
                    id,
                    name,
                    arguments,
                },
                Some(index),
            )),
            ToolEvent::Cut {
                index,
                id,
                name,
                arguments,
            } => calls.push(ToolCallJson::cut(
                shoal_guide::CutToolCall {
                    index,
                    id,
                    name,
                    arguments,
                },
                Some(index),
            )),
        }
    }
    Delta {
        role: None,
        content: (!content.is_empty()).then_some(content),
        reasoning_content: None,
        tool_calls: (!calls.is_empty()).then_some(calls),
    }
}
