//! `POST /api/chat` and `POST /api/generate`.
//!
//! Chat messages (`system`, `user`, `assistant` with its `tool_calls`, `tool`), the `tools` and
//! `format` ([`super::tools`]) go to the one front half ([`crate::generate::start`]: shoal-guide's plan
//! off the async workers, the render with the model's own chat template, one submit with `add_bos` —
//! the engine adds BOS where the model wants one, the render cut the template's own — and the plan's
//! constraint, `format` as JSON or a schema). `generate` renders `system` + `prompt` through the template; with `raw: true`,
//! or for a model without a chat template, the prompt is used as is; its `format` constrains the same
//! way. An empty
//! `messages` list or an empty `prompt` only checks that the model is loaded and answers `done_reason:
//! "load"`, as Ollama does. Both answer as [`super::stream::respond`] says.

use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::response::Response;
use shoal_engine::{
    ChatMessage, EngineError, EngineHandle, GenerateRequest as EngineRequest, LogitsProcessor,
    Prompt,
};

use super::Error;
use super::params::{Checked, Common, check};
use super::stream::{Answer, Kind, Run, json_response, ndjson_response, respond};
use super::tools::{self, format_processor, guide_error, to_chat_messages};
use super::types::{ChatRequest, Ending, GenerateRequest};
use crate::ApiState;
use crate::cancel::Caller;
use crate::error::ApiError;
use crate::generate::{self, Chat};

#[utoipa::path(
    post,
    path = "/api/chat",
    operation_id = "post_api_chat",
    tag = "ollama",
    request_body = super::types::ChatRequest,
    responses(
        (status = 200, description = "The answer; streamed (the default) as one JSON object per line, the last with `done: true`.", content((super::types::ChatResponse = "application/json"), (super::types::ChatLine = "application/x-ndjson"))),
        crate::schema::OllamaErrors
    )
)]
pub async fn chat(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    body: Result<Json<ChatRequest>, JsonRejection>,
) -> Result<Response, Error> {
    let started = Instant::now();
    let Json(mut req) = body?;
    let checked = check(
        &state,
        Common {
            model: &req.model,
            stream: req.stream,
            options: req.options.take(),
            think: req.think.as_ref(),
            logprobs: req.logprobs,
            top_logprobs: req.top_logprobs,
            speculative: req.speculative.as_ref(),
        },
    )?;
    let guidance = tools::guidance(req.tools.take().unwrap_or_default(), req.format.as_ref())?;
    let mut answer = answer(Kind::Chat, &checked);
    let messages = req.messages.take().unwrap_or_default();
    if messages.is_empty() {
        return Ok(loaded(&answer, checked.stream));
    }
    let messages = to_chat_messages(messages)?;
    let chat = Chat {
        model: checked.model.clone(),
        messages,
        guidance,
        prefill: None,
        thinking: checked.thinking.clone(),
        sampling: checked.sampling.clone(),
        max_tokens: checked.max_tokens,
        stop: checked.stop.clone(),
        ignore_eos: false,
        timeout: None,
        n: 1,
        speculative: checked.speculative,
        prompt_param: "messages",
        guide_error: |e| guide_error(e).0,
    };
    let started_chat = generate::start(&state, caller, chat).await?;
    answer.tools = started_chat.parser;
    answer.reasoning = started_chat.reasoning;
    let Some(live) = started_chat.choices.into_iter().next() else {
        return Err(ApiError::Internal("no choice was submitted".into()).into());
    };
    let run = Run::new(live, started);
    Ok(respond(run, answer, checked.stream).await)
}

#[utoipa::path(
    post,
    path = "/api/generate",
    operation_id = "post_api_generate",
    tag = "ollama",
    request_body = super::types::GenerateRequest,
    responses(
        (status = 200, description = "The answer; streamed (the default) as one JSON object per line, the last with `done: true`.", content((super::types::GenerateResponse = "application/json"), (super::types::GenerateLine = "application/x-ndjson"))),
        crate::schema::OllamaErrors
    )
)]
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
            options: req.options.take(),
            think: req.think.as_ref(),
            logprobs: req.logprobs,
            top_logprobs: req.top_logprobs,
            speculative: req.speculative.as_ref(),
        },
    )?;
    refuse_generate_fields(&req)?;
    let format = tools::response_format(req.format.as_ref())?;
    let mut answer = answer(Kind::Generate, &checked);
    let prompt = req.prompt.take().unwrap_or_default();
    if prompt.is_empty() {
        return Ok(loaded(&answer, checked.stream));
    }
    let engine = state
        .engine
        .get(&checked.model)
        .map_err(|e| ApiError::from_engine(e, "prompt"))?;
    let processor = format_processor(&state.guides, &engine, &format).await?;
    let raw = req.raw == Some(true);
    let thinking = generate::reasoning::thinking_for(&checked.thinking, processor.is_some());
    let text = if raw {
        prompt
    } else {
        templated(&engine, req.system.take(), prompt, &thinking)?
    };
    answer.reasoning = match raw {
        true => None,
        false => {
            generate::reasoning::syntax(engine.chat_template(), &text, processor.is_some(), false)
        }
    };
    let run = submit(&state, &checked, text, processor, "prompt", started)?;
    Ok(respond(run, answer, checked.stream).await)
}

fn answer(kind: Kind, checked: &Checked) -> Answer {
    Answer {
        kind,
        model: checked.model.clone(),
        logprobs: checked.logprobs,
        tools: None,
        reasoning: None,
    }
}

/// The answer to a request that only loads the model (it is loaded: the handler found its engine).
fn loaded(answer: &Answer, stream: bool) -> Response {
    let end = Ending {
        done_reason: "load",
        metrics: None,
    };
    let object = answer.object(
        String::new(),
        String::new(),
        Vec::new(),
        Some(end),
        Vec::new(),
    );
    if stream {
        ndjson_response(futures::stream::iter([object + "\n"]))
    } else {
        json_response(object)
    }
}

/// `system` + `prompt` through the model's chat template; a model without one takes the prompt as is.
fn templated(
    engine: &EngineHandle,
    system: Option<String>,
    prompt: String,
    thinking: &shoal_engine::Thinking,
) -> Result<String, Error> {
    let system = system.filter(|s| !s.is_empty());
    let mut messages = Vec::with_capacity(2);
    if let Some(s) = &system {
        messages.push(ChatMessage::new("system", s.clone()));
    }
    messages.push(ChatMessage::new("user", prompt.clone()));
    match engine.render_chat_thinking(&messages, &[], thinking) {
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

/// Queues the prompt (decoded under `processor`'s constraint); the [`Run`] times it from `started`.
fn submit(
    state: &ApiState,
    checked: &Checked,
    prompt: String,
    processor: Option<Box<dyn LogitsProcessor>>,
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
        logits_processor: processor,
        speculative: checked.speculative,
    };
    let stream = state
        .engine
        .submit(request)
        .map_err(|e| ApiError::from_engine(e, prompt_param))?;
    Ok(Run::new(state.track(stream), started))
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
