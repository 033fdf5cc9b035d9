//! `POST /v1/responses`: OpenAI's Responses API.
//!
//! The request ([`types::ResponsesRequest`]) is checked field by field ([`unsupported`]: a documented
//! field shoal does not implement is a 400 naming it), its `instructions` and `input` items (messages,
//! `function_call`s, `function_call_output`s) become chat messages ([`to_messages`]); its function
//! tools, `tool_choice` and `text.format` become shoal-guide's guidance ([`tools`]); the one front half
//! ([`crate::generate::start`]) plans the prompt (rendered with the model's own template), the
//! constraint and the tool-call parser off the async workers, and submits. The answer
//! is one `response` object (a `message` item and `function_call` items) or the Responses event stream
//! ([`stream::ResponseEvents`]: `response.created` … `response.output_text.delta` …
//! `response.completed`, each event numbered).

pub mod stream;
pub mod tools;
pub mod types;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use shoal_engine::{ChatMessage, FinishReason, Usage};
use shoal_guide::ParsedAnswer;

use super::params::{CommonParams, token_budget};
use super::unix_now;
use crate::ApiState;
use crate::cancel::Caller;
use crate::error::ApiError;
use crate::generate::reasoning::Splitter;
use crate::generate::{self, Chat, Started, collect};
use crate::limits::{self, Budget, Words};
use crate::sse::stream_response;
use types::{Input, ResponseObject, ResponsesRequest};

/// The request field a prompt problem is reported against.
const PROMPT_PARAM: &str = "input";

#[utoipa::path(
    post,
    path = "/v1/responses",
    operation_id = "post_v1_responses",
    tag = "openai",
    request_body = ResponsesRequest,
    responses(
        (status = 200, description = "The response; with `stream: true`, Responses events (`response.created`, `response.output_text.delta`, …, `response.completed`) as server-sent events.", content((ResponseObject = "application/json"), (Object = "text/event-stream"))),
        crate::schema::OpenAiErrors
    )
)]
pub async fn create_response(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    body: Result<Json<ResponsesRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body?;
    unsupported(&req)?;
    let messages = to_messages(&req)?;
    let guidance = tools::guidance(&req)?;
    let parallel_tool_calls = guidance.parallel_tool_calls;
    let max_tokens = req
        .max_output_tokens
        .map(|v| token_budget("max_output_tokens", v))
        .transpose()?;
    let params = CommonParams {
        model: req.model.clone(),
        stream: req.stream,
        temperature: req.temperature,
        top_p: req.top_p,
        seed: req.seed,
        timeout: req.timeout,
        speculative: req.speculative.clone(),
        ..CommonParams::default()
    }
    .validate(&state.engine)?;
    let chat = Chat {
        model: params.model.clone(),
        messages,
        guidance,
        prefill: None,
        thinking: reasoning_thinking(req.reasoning.as_ref())?,
        sampling: params.sampling.clone(),
        max_tokens,
        stop: Vec::new(),
        ignore_eos: false,
        timeout: params.timeout,
        n: 1,
        speculative: params.speculative,
        prompt_param: PROMPT_PARAM,
        guide_error: super::tools::guide_error,
    };
    let Started {
        choices,
        ticket,
        parser,
        reasoning,
        prompt_tokens,
    } = generate::start(&state, caller, chat).await?;
    limits::check(
        &state,
        &params.model,
        Budget {
            prompt_tokens,
            max_tokens: max_tokens.map(|m| m.get()),
            choices: 1,
        },
        Words::OpenAi("max_output_tokens"),
    )?;
    let Some(mut stream) = choices.into_iter().next() else {
        return Err(ApiError::Internal("no choice was submitted".into()));
    };
    let shell = Shell {
        id: format!("resp_{}", ticket.token()),
        created_at: unix_now(),
        model: params.model,
        instructions: req.instructions.clone(),
        max_output_tokens: req.max_output_tokens,
        temperature: params.sampling.temperature,
        top_p: params.sampling.top_p,
        store: req.store.unwrap_or(false),
        user: req.user.clone(),
        metadata: req.metadata.clone().unwrap_or_else(|| json!({})),
        tools: req.tools.clone().unwrap_or_default(),
        tool_choice: req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        parallel_tool_calls,
        text: json!({ "format": req.text.as_ref().and_then(|t| t.format.clone())
            .unwrap_or_else(|| json!({ "type": "text" })) }),
    };
    if params.stream {
        let splitter = reasoning.map(Splitter::new);
        let events = stream::ResponseEvents::new(shell, parser.map(|p| p.stream()), splitter);
        return Ok(stream_response(stream, events));
    }
    let done = collect(&mut stream, false).await?;
    let cut_off = done.finish_reason == FinishReason::Length;
    let parts = generate::reasoning::answer(done.text, reasoning);
    let parsed = match parser {
        Some(parser) => parser.parse_ended(&parts.content, cut_off),
        None => ParsedAnswer {
            content: parts.content,
            ..ParsedAnswer::default()
        },
    };
    let body = shell.finished(&parts.reasoning, &parsed, done.finish_reason, done.usage);
    Ok(Json(body).into_response())
}

/// `reasoning.effort` as the template's variables (`none` turns a thinking model's thoughts off).
fn reasoning_thinking(reasoning: Option<&Value>) -> Result<shoal_engine::Thinking, ApiError> {
    let effort = reasoning
        .and_then(|r| r.get("effort"))
        .filter(|e| !e.is_null());
    match effort {
        None => Ok(shoal_engine::Thinking::default()),
        Some(Value::String(e)) => {
            crate::openai::params::effort_thinking("reasoning.effort", Some(e))
        }
        Some(other) => Err(ApiError::invalid(
            "reasoning.effort",
            format!("reasoning.effort must be a string, got {other}"),
        )),
    }
}

/// What every `response` object of one request shares; the output and status come at the end.
#[derive(Debug, Clone)]
pub struct Shell {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub temperature: f32,
    pub top_p: f32,
    pub store: bool,
    pub user: Option<String>,
    pub metadata: Value,
    /// Echoed as the request gave them.
    pub tools: Vec<Value>,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    pub text: Value,
}

impl Shell {
    /// The id of the one output message.
    pub fn message_id(&self) -> String {
        format!("msg_{}", self.id.trim_start_matches("resp_"))
    }

    /// The response while it runs: no output yet.
    pub fn in_progress(&self) -> ResponseObject {
        self.object("in_progress", None, Vec::new(), None)
    }

    /// The finished response: `completed`, or `incomplete` when the token budget ran out. The output
    /// is the message (when there is text, or nothing else) and then one item per call, the one the
    /// budget cut last (`status: "incomplete"`).
    pub fn finished(
        &self,
        reasoning: &str,
        answer: &ParsedAnswer,
        reason: FinishReason,
        usage: Usage,
    ) -> ResponseObject {
        let mut output = Vec::new();
        if !reasoning.is_empty() {
            output.push(self.reasoning(reasoning, "completed"));
        }
        let nothing_else = answer.calls.is_empty() && answer.cut.is_none() && reasoning.is_empty();
        if !answer.content.is_empty() || nothing_else {
            output.push(self.message(&answer.content, finish_status(reason)));
        }
        output.extend(answer.calls.iter().map(tools::function_call_item));
        output.extend(answer.cut.iter().map(tools::cut_call_item));
        self.ended(output, reason, usage)
    }

    /// The finished response with `output` as given.
    pub fn ended(&self, output: Vec<Value>, reason: FinishReason, usage: Usage) -> ResponseObject {
        let status = finish_status(reason);
        let details = (status == "incomplete").then(|| json!({ "reason": "max_output_tokens" }));
        self.object(status, details, output, Some(usage))
    }

    /// The id of the reasoning item.
    pub fn reasoning_id(&self) -> String {
        format!("rs_{}", self.id.trim_start_matches("resp_"))
    }

    /// The reasoning item holding the model's thoughts (`text`: as far as they went).
    pub fn reasoning(&self, text: &str, status: &str) -> Value {
        json!({
            "type": "reasoning",
            "id": self.reasoning_id(),
            "status": status,
            "summary": [],
            "content": if text.is_empty() {
                json!([])
            } else {
                json!([{ "type": "reasoning_text", "text": text }])
            },
        })
    }

    /// The output message item holding `text`.
    pub fn message(&self, text: &str, status: &str) -> Value {
        json!({
            "type": "message",
            "id": self.message_id(),
            "status": status,
            "role": "assistant",
            "content": if text.is_empty() && status == "in_progress" {
                json!([])
            } else {
                json!([output_text(text)])
            },
        })
    }

    fn object(
        &self,
        status: &'static str,
        incomplete_details: Option<Value>,
        output: Vec<Value>,
        usage: Option<Usage>,
    ) -> ResponseObject {
        ResponseObject {
            id: self.id.clone(),
            object: "response",
            created_at: self.created_at,
            status,
            error: None,
            incomplete_details,
            instructions: self.instructions.clone(),
            max_output_tokens: self.max_output_tokens,
            model: self.model.clone(),
            output,
            parallel_tool_calls: self.parallel_tool_calls,
            previous_response_id: None,
            reasoning: json!({ "effort": null, "summary": null }),
            store: self.store,
            temperature: self.temperature,
            text: self.text.clone(),
            tool_choice: self.tool_choice.clone(),
            tools: self.tools.clone(),
            top_p: self.top_p,
            truncation: "disabled",
            usage: usage.map(Into::into),
            user: self.user.clone(),
            metadata: self.metadata.clone(),
        }
    }
}

/// A response's status for how generation ended.
pub fn finish_status(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "incomplete",
        _ => "completed",
    }
}

/// An `output_text` content part.
pub fn output_text(text: &str) -> Value {
    json!({ "type": "output_text", "text": text, "annotations": [], "logprobs": [] })
}

/// Documented fields shoal does not implement: a 400 naming each, never silently ignored.
fn unsupported(req: &ResponsesRequest) -> Result<(), ApiError> {
    let refuse = |param: &str, why: &str| Err(ApiError::invalid(param, why.to_string()));
    if req.previous_response_id.is_some() || req.conversation.is_some() {
        let param = if req.previous_response_id.is_some() {
            "previous_response_id"
        } else {
            "conversation"
        };
        return refuse(
            param,
            "shoal does not store responses: send the whole conversation in `input`",
        );
    }
    if req.background == Some(true) {
        return refuse("background", "background responses are not supported");
    }
    if req.prompt.is_some() {
        return refuse("prompt", "stored prompt templates are not supported");
    }
    if req.top_logprobs.is_some_and(|k| k != 0) {
        return refuse(
            "top_logprobs",
            "top_logprobs is not supported on /v1/responses; use /v1/chat/completions",
        );
    }
    if let Some(include) = &req.include
        && let Some(first) = include.first()
    {
        return Err(ApiError::invalid(
            "include",
            format!("include '{first}' is not supported"),
        ));
    }
    if let Some(t) = &req.truncation
        && t != "disabled"
        && t != "auto"
    {
        return Err(ApiError::invalid(
            "truncation",
            format!("truncation must be 'auto' or 'disabled', got '{t}'"),
        ));
    }
    Ok(())
}

/// `instructions` (a system message) then the `input` items, as chat messages.
fn to_messages(req: &ResponsesRequest) -> Result<Vec<ChatMessage>, ApiError> {
    let mut messages = Vec::new();
    if let Some(sys) = &req.instructions {
        messages.push(ChatMessage::new("system", sys.clone()));
    }
    match &req.input {
        None => return Err(ApiError::invalid("input", "input is required")),
        Some(Input::Text(text)) => messages.push(ChatMessage::new("user", text.clone())),
        Some(Input::Items(items)) => {
            if items.is_empty() {
                return Err(ApiError::invalid("input", "input must not be empty"));
            }
            for (i, item) in items.iter().enumerate() {
                let param = format!("input[{i}]");
                match item.get("type").and_then(Value::as_str) {
                    Some("function_call") => {
                        tools::push_function_call(&mut messages, &param, item)?;
                    }
                    Some("function_call_output") => {
                        let m = tools::function_call_output(&messages, &param, item)?;
                        messages.push(m);
                    }
                    _ => messages.push(item_message(&param, item)?),
                }
            }
        }
    }
    Ok(messages)
}

/// One input item: a message (`type: "message"` or just a `role`) with text content.
fn item_message(param: &str, item: &Value) -> Result<ChatMessage, ApiError> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    if kind != "message" {
        return Err(ApiError::invalid(
            format!("{param}.type"),
            format!("input items of type '{kind}' are not supported"),
        ));
    }
    let role = item
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(format!("{param}.role"), "a message needs a role"))?;
    if !matches!(role, "user" | "assistant" | "system" | "developer") {
        return Err(ApiError::invalid(
            format!("{param}.role"),
            format!("unknown role '{role}': use user, assistant, system or developer"),
        ));
    }
    let content = match item.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let ptype = part.get("type").and_then(Value::as_str).unwrap_or("");
                match (ptype, part.get("text").and_then(Value::as_str)) {
                    ("input_text" | "output_text" | "text", Some(t)) => text.push_str(t),
                    _ => {
                        return Err(ApiError::invalid(
                            format!("{param}.content[{j}]"),
                            format!(
                                "content parts of type '{ptype}' are not supported: the models served are text-only"
                            ),
                        ));
                    }
                }
            }
            text
        }
        _ => {
            return Err(ApiError::invalid(
                format!("{param}.content"),
                "content must be a string or a list of input_text parts",
            ));
        }
    };
    Ok(ChatMessage::new(role, content))
}
