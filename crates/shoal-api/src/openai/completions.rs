//! `POST /v1/completions`: raw text or token ids in, text out (no chat template).
//!
//! A text prompt is submitted with `add_bos: true`, so the engine adds BOS exactly when the model's
//! GGUF asks for it (as llama.cpp does); token-id prompts are used as given.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::response::{IntoResponse, Response};
use shoal_engine::{FinishReason, GenerateRequest, Prompt, Usage};

use super::params::CommonParams;
use super::types::{CompletionRequest, PromptInput, TextChoice, TextCompletion, TextLogprobs};
use super::{SYSTEM_FINGERPRINT, collect, unix_now};
use crate::ApiState;
use crate::error::ApiError;
use crate::sse::{ChunkFormat, sse_response, to_json};

const PROMPT_PARAM: &str = "prompt";

pub async fn completions(
    State(state): State<ApiState>,
    body: Result<Json<CompletionRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(mut req) = body?;
    refuse_unsupported(&req)?;
    let logprobs = req.logprobs.is_some();
    let params = CommonParams::from(&mut req).validate(&state.engine)?;
    let prompt = to_prompt(req.prompt)?;
    let add_bos = matches!(prompt, Prompt::Text(_));
    let request = GenerateRequest {
        model: params.model.clone(),
        prompt,
        sampling: params.sampling,
        max_tokens: params.max_tokens,
        stop: params.stop,
        add_bos,
        ignore_eos: params.ignore_eos,
        timeout: params.timeout,
        logits_processor: None,
    };
    let stream = state
        .engine
        .submit(request)
        .map_err(|e| ApiError::from_engine(e, PROMPT_PARAM))?;
    let mut stream = state.track(stream);
    let id = format!("cmpl-{}", stream.id());
    let created = unix_now();
    if params.stream {
        let format = TextChunks {
            id,
            created,
            model: params.model,
            logprobs,
            offset: 0,
            pending: None,
        };
        return Ok(sse_response(stream, format, params.include_usage));
    }
    let done = collect(&mut stream, logprobs).await?;
    let logprobs = logprobs.then(|| {
        let mut lp = TextLogprobs::default();
        let mut offset = 0;
        for (text, logprob) in done.tokens {
            push_logprob(&mut lp, &mut offset, text, logprob);
        }
        lp
    });
    let body = TextCompletion {
        id,
        object: "text_completion",
        created,
        model: params.model,
        system_fingerprint: SYSTEM_FINGERPRINT,
        choices: vec![TextChoice {
            index: 0,
            text: done.text,
            logprobs,
            finish_reason: Some(done.finish_reason.as_str()),
        }],
        usage: Some(done.usage.into()),
    };
    Ok(Json(body).into_response())
}

/// Options of the legacy API we do not implement, refused by name rather than silently ignored.
fn refuse_unsupported(req: &CompletionRequest) -> Result<(), ApiError> {
    if req.echo == Some(true) {
        return Err(ApiError::invalid("echo", "echo is not supported"));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "suffix is not supported"));
    }
    if let Some(b) = req.best_of
        && b != 1
    {
        return Err(ApiError::invalid(
            "best_of",
            format!("only best_of=1 is supported, got {b}"),
        ));
    }
    match req.logprobs {
        Some(k) if k < 0 => Err(ApiError::invalid("logprobs", "logprobs must be >= 0")),
        Some(k) if k > 0 => Err(ApiError::invalid(
            "logprobs",
            "only logprobs=0 (the sampled tokens' own log-probabilities) is supported",
        )),
        _ => Ok(()),
    }
}

/// One prompt per request: batches must hold exactly one.
fn to_prompt(input: PromptInput) -> Result<Prompt, ApiError> {
    let one = |n: usize| {
        ApiError::invalid(
            PROMPT_PARAM,
            format!("exactly one prompt per request is supported, got {n}"),
        )
    };
    Ok(match input {
        PromptInput::Text(text) => Prompt::Text(text),
        PromptInput::Tokens(ids) => Prompt::Tokens(ids),
        PromptInput::Texts(mut texts) => match texts.len() {
            1 => Prompt::Text(texts.remove(0)),
            n => return Err(one(n)),
        },
        PromptInput::TokenBatches(mut batches) => match batches.len() {
            1 => Prompt::Tokens(batches.remove(0)),
            n => return Err(one(n)),
        },
    })
}

fn push_logprob(lp: &mut TextLogprobs, offset: &mut usize, text: String, logprob: f32) {
    lp.text_offset.push(*offset);
    *offset += text.len();
    lp.tokens.push(text);
    lp.token_logprobs.push(logprob);
}

/// Shapes `text_completion` stream chunks.
struct TextChunks {
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    /// Byte offset of the next token's text in the completion.
    offset: usize,
    /// Log-probabilities of tokens whose text has not been sent yet (empty pieces).
    pending: Option<TextLogprobs>,
}

impl TextChunks {
    fn chunk(&self, choices: Vec<TextChoice>, usage: Option<Usage>) -> String {
        to_json(&TextCompletion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: SYSTEM_FINGERPRINT,
            choices,
            usage: usage.map(Into::into),
        })
    }
}

impl ChunkFormat for TextChunks {
    fn opening(&mut self) -> Option<String> {
        None
    }

    fn token(&mut self, text: &str, logprob: f32) -> Option<String> {
        if self.logprobs {
            let lp = self.pending.get_or_insert_with(TextLogprobs::default);
            push_logprob(lp, &mut self.offset, text.to_string(), logprob);
        }
        if text.is_empty() {
            return None;
        }
        let choice = TextChoice {
            index: 0,
            text: text.to_string(),
            logprobs: self.pending.take(),
            finish_reason: None,
        };
        Some(self.chunk(vec![choice], None))
    }

    fn finish(&mut self, reason: FinishReason) -> String {
        let choice = TextChoice {
            index: 0,
            text: String::new(),
            logprobs: self.pending.take(),
            finish_reason: Some(reason.as_str()),
        };
        self.chunk(vec![choice], None)
    }

    fn usage(&mut self, usage: Usage) -> String {
        self.chunk(Vec::new(), Some(usage))
    }
}
