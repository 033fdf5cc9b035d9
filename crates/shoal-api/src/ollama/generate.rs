//! `POST /api/chat` and `POST /api/generate`.
//!
//! Chat messages (`system`, `user`, `assistant`, `tool`) are rendered with the model's own chat template
//! ([`shoal_engine::Engines::render_chat`]) and submitted with `add_bos` (the engine adds BOS where the
//! model wants one, `render_chat` cut the template's own). `generate` renders `system` + `prompt` the same
//! way; with `raw: true`, or for a model without a chat template, the prompt is used as is. An empty
//! `messages` list or an empty `prompt` only checks that the model is loaded and answers `done_reason:
//! "load"`, as Ollama does. Both answer as [`super::stream::respond`] says.

use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::response::Response;
use shoal_engine::{ChatMessage, EngineError, GenerateRequest as EngineRequest, Prompt};

use super::Error;
use super::params::{Checked, Common, check};
use super::stream::{Answer, Kind, Run, json_response, ndjson_response, respond};
use super::types::{ChatRequest, Ending, GenerateRequest, MessageIn};
use crate::ApiState;
use crate::error::ApiError;

/// Roles a chat message may have.
const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

pub async fn chat(
    State(state): State<ApiState>,
    body: Result<Json<ChatRequest>, JsonRejection>,
) -> Result<Response, Error> {
    let started = Instant::now();
    let Json(mut req) = body?;
    let checked = check(
        &state,
        Common {
            model: &req.model,
            stream: req.stream,
            format: req.format.as_ref(),
            options: req.options.take(),
            think: req.think.as_ref(),
            tools: req.tools.as_deref(),
            logprobs: req.logprobs,
            top_logprobs: req.top_logprobs,
        },
    )?;
    let answer = answer(Kind::Chat, &checked);
    let messages = req.messages.take().unwrap_or_default();
    if messages.is_empty() {
        return Ok(loaded(&answer, checked.stream));
    }
    let messages = messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| to_chat_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let prompt = state
        .engine
        .render_chat(&checked.model, &messages)
        .map_err(|e| ApiError::from_engine(e, "messages"))?;
    let run = submit(&state, &checked, prompt, "messages", started)?;
    Ok(respond(run, answer, checked.stream).await)
}

pub async fn generate(
    State(state): State<ApiState>,
    body: Result<Json<GenerateRequest>, JsonRejection>,
) -> Result<Response, Error> {
    let started = Instant::now();
    let Json(mut req) = body?;
    let checked = check(
        &state,
        Common {
            model: &req.model,
            stream: req.stream,
            format: req.format.as_ref(),
            options: req.options.take(),
            think: req.think.as_ref(),
            tools: None,
            logprobs: req.logprobs,
            top_logprobs: req.top_logprobs,
        },
    )?;
    refuse_generate_fields(&req)?;
    let answer = answer(Kind::Generate, &checked);
    let prompt = req.prompt.take().unwrap_or_default();
    if prompt.is_empty() {
        return Ok(loaded(&answer, checked.stream));
    }
    let text = if req.raw == Some(true) {
        prompt
    } else {
        templated(&state, &checked.model, req.system.take(), prompt)?
    };
    let run = submit(&state, &checked, text, "prompt", started)?;
    Ok(respond(run, answer, checked.stream).await)
}

fn answer(kind: Kind, checked: &Checked) -> Answer {
    Answer {
        kind,
        model: checked.model.clone(),
        logprobs: checked.logprobs,
    }
}

/// The answer to a request that only loads the model (it is loaded: the handler found its engine).
fn loaded(answer: &Answer, stream: bool) -> Response {
    let end = Ending {
        done_reason: "load",
        metrics: None,
    };
    let object = answer.object(String::new(), Some(end), Vec::new());
    if stream {
        ndjson_response(futures::stream::iter([object + "\n"]))
    } else {
        json_response(object)
    }
}

/// `system` + `prompt` through the model's chat template; a model without one takes the prompt as is.
fn templated(
    state: &ApiState,
    model: &str,
    system: Option<String>,
    prompt: String,
) -> Result<String, Error> {
    let system = system.filter(|s| !s.is_empty());
    let mut messages = Vec::with_capacity(2);
    if let Some(s) = &system {
        messages.push(ChatMessage::new("system", s.clone()));
    }
    messages.push(ChatMessage::new("user", prompt.clone()));
    match state.engine.render_chat(model, &messages) {
        Ok(text) => Ok(text),
        Err(EngineError::NoChatTemplate { .. }) if system.is_none() => Ok(prompt),
        Err(e @ EngineError::NoChatTemplate { .. }) => Err(ApiError::invalid(
            "system",
            format!(
                "{e}: there is no place for a system message; send the whole prompt with raw: true"
            ),
        )
        .into()),
        Err(e) => Err(ApiError::from_engine(e, "prompt").into()),
    }
}

/// Queues the prompt; the [`Run`] times it from `started`.
fn submit(
    state: &ApiState,
    checked: &Checked,
    prompt: String,
    prompt_param: &str,
    started: Instant,
) -> Result<Run, Error> {
    let request = EngineRequest {
        model: checked.model.clone(),
        prompt: Prompt::Text(prompt),
        sampling: checked.sampling.clone(),
        max_tokens: checked.max_tokens,
        stop: checked.stop.clone(),
        add_bos: true,
        ignore_eos: false,
        timeout: None,
        logits_processor: None,
    };
    let stream = state
        .engine
        .submit(request)
        .map_err(|e| ApiError::from_engine(e, prompt_param))?;
    Ok(Run::new(state.track(stream), started))
}

/// One chat message as the template sees it; images and tool calls are refused by name.
fn to_chat_message(index: usize, m: MessageIn) -> Result<ChatMessage, Error> {
    if !ROLES.contains(&m.role.as_str()) {
        return Err(ApiError::invalid(
            format!("messages[{index}].role"),
            format!(
                "messages[{index}].role must be one of system, user, assistant, tool; got '{}'",
                m.role
            ),
        )
        .into());
    }
    if m.images.as_ref().is_some_and(|i| !i.is_empty()) {
        return Err(ApiError::invalid(
            format!("messages[{index}].images"),
            format!(
                "messages[{index}].images: images are not supported (shoal serves text models)"
            ),
        )
        .into());
    }
    if m.tool_calls.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::invalid(
            format!("messages[{index}].tool_calls"),
            format!("messages[{index}].tool_calls: tool calls are not supported yet"),
        )
        .into());
    }
    Ok(ChatMessage::new(m.role, m.content.unwrap_or_default()))
}

/// `generate` fields shoal does not implement: a 400 naming each when set.
fn refuse_generate_fields(req: &GenerateRequest) -> Result<(), Error> {
    let refuse = |param: &str, what: &str| -> Result<(), Error> {
        Err(ApiError::invalid(param, format!("{param}: {what}")).into())
    };
    if req.images.as_ref().is_some_and(|i| !i.is_empty()) {
        return refuse(
            "images",
            "images are not supported (shoal serves text models)",
        );
    }
    if req.template.as_ref().is_some_and(|t| !t.is_empty()) {
        return refuse(
            "template",
            "a custom template is not supported; shoal uses the model's own chat template (or send raw: true)",
        );
    }
    if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return refuse("suffix", "fill-in-the-middle (suffix) is not supported");
    }
    if req.context.as_ref().is_some_and(|c| !c.is_empty()) {
        return refuse(
            "context",
            "context (token ids of an earlier answer) is not supported; use /api/chat for conversations",
        );
    }
    Ok(())
}
