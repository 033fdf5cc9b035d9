//! `POST /v1/completions`: raw text or token ids in, text out (no chat template).
//!
//! Without `max_tokens` a completion stops after [`DEFAULT_MAX_TOKENS`] (16) tokens, OpenAI's documented
//! default for this endpoint (vLLM's too); the chat routes keep running to the end of the turn.
//!
//! A text prompt is submitted with `add_bos: true`, so the engine adds BOS exactly when the model's
//! GGUF asks for it (as llama.cpp does); token-id prompts are used as given. `n` choices come from one
//! prefill (each streamed with its `index`; usage counts the prompt once). `logprobs: k` (at most 20)
//! reports each token's log-probability (`tokens`, `token_logprobs`, `text_offset`) and, for k > 0,
//! `top_logprobs`: the k most likely tokens by their own text, plus the sampled one, as OpenAI does —
//! the model's raw log-probabilities, before penalties and temperature.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::response::{IntoResponse, Response};
use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;

use shoal_engine::request::MAX_TOP_LOGPROBS;
use shoal_engine::{FinishReason, GenerateRequest, Prompt, Usage};
use shoal_model::tokenizer::Tokenizer;

use super::params::CommonParams;
use super::stream::{ChunkFormat, sse_response};
use super::types::{CompletionRequest, PromptInput, TextChoice, TextCompletion, TextLogprobs};
use super::{SYSTEM_FINGERPRINT, unix_now};
use crate::ApiState;
use crate::cancel::{Caller, Ticket};
use crate::error::ApiError;
use crate::generate::{SampledToken, collect_all, submit, total_usage};
use crate::limits::{self, Budget, Words};
use crate::sse::to_json;

const PROMPT_PARAM: &str = "prompt";

/// The token budget of a completion that names none (OpenAI's default for `/v1/completions`).
pub const DEFAULT_MAX_TOKENS: NonZeroU32 = NonZeroU32::new(16).expect("16 is not zero");

#[utoipa::path(
    post,
    path = "/v1/completions",
    operation_id = "post_v1_completions",
    tag = "openai",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "The completion; with `stream: true`, the same object per chunk as server-sent events ending with `data: [DONE]`.", content((TextCompletion = "application/json"), (super::types::TextStreamData = "text/event-stream"))),
        crate::schema::OpenAiErrors
    )
)]
pub async fn completions(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    body: Result<Json<CompletionRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(mut req) = body?;
    let logprobs = refuse_unsupported(&req)?;
    let mut params = CommonParams::from(&mut req).validate(&state.engine)?;
    params.sampling.top_logprobs = logprobs.unwrap_or(0);
    let prompt = to_prompt(req.prompt)?;
    let add_bos = matches!(prompt, Prompt::Text(_));
    let tokenizer = state
        .engine
        .get(&params.model)
        .map_err(|e| ApiError::from_engine(e, PROMPT_PARAM))?
        .tokenizer()
        .clone();
    let request = GenerateRequest {
        model: params.model.clone(),
        prompt,
        sampling: params.sampling,
        max_tokens: Some(params.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
        stop: params.stop,
        add_bos,
        ignore_eos: params.ignore_eos,
        timeout: params.timeout,
        logits_processor: None,
        speculative: params.speculative,
    };
    let ticket = Ticket::new(caller)?;
    let mut choices = submit(&state, request, params.n, PROMPT_PARAM, &ticket)?;
    limits::check(
        &state,
        &params.model,
        Budget {
            prompt_tokens: choices.first().map_or(0, |c| c.prompt_tokens()),
            max_tokens: Some(params.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).get()),
            choices: params.n,
        },
        Words::OpenAi("max_tokens"),
    )?;
    let id = format!("cmpl-{}", ticket.token());
    let created = unix_now();
    let logprobs = logprobs.map(|k| Alternatives { k, tokenizer });
    if params.stream {
        let format = TextChunks {
            id,
            created,
            model: params.model,
            logprobs,
            choices: (0..params.n).map(|_| ChoiceState::default()).collect(),
        };
        return Ok(sse_response(
            choices,
            format,
            (params.include_usage, params.include_progress),
        ));
    }
    let done = collect_all(&mut choices, logprobs.is_some()).await?;
    let usage = total_usage(done.iter().map(|d| d.usage));
    let choices = done
        .into_iter()
        .enumerate()
        .map(|(index, d)| {
            let logprobs = logprobs.as_ref().map(|lp| {
                let mut state = ChoiceState::default();
                for token in d.tokens {
                    state.push(lp, token);
                }
                state.pending.unwrap_or_default()
            });
            TextChoice {
                index: index as u32,
                text: d.text,
                logprobs,
                finish_reason: Some(d.finish_reason.as_str()),
            }
        })
        .collect();
    let body = TextCompletion {
        id,
        object: "text_completion",
        created,
        model: params.model,
        system_fingerprint: SYSTEM_FINGERPRINT,
        choices,
        usage: Some(usage.into()),
    };
    Ok(Json(body).into_response())
}

/// Options of the legacy API we do not implement, refused by name rather than silently ignored; the
/// `logprobs` asked for (alternatives per token, at most [`MAX_TOP_LOGPROBS`]), if any.
fn refuse_unsupported(req: &CompletionRequest) -> Result<Option<u8>, ApiError> {
    if req.echo == Some(true) {
        return Err(ApiError::invalid("echo", "echo is not supported"));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "suffix is not supported"));
    }
    if req
        .logit_bias
        .as_ref()
        .is_some_and(|b| b.as_object().is_none_or(|m| !m.is_empty()) && !b.is_null())
    {
        return Err(ApiError::invalid(
            "logit_bias",
            "logit_bias is not supported",
        ));
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
        None => Ok(None),
        Some(k) if (0..=i64::from(MAX_TOP_LOGPROBS)).contains(&k) => Ok(Some(k as u8)),
        Some(k) => Err(ApiError::invalid(
            "logprobs",
            format!("logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"),
        )),
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

/// What `logprobs: k` reports: `k` alternatives per token (0: the sampled tokens' own only), each named
/// by its own piece of text.
#[derive(Clone)]
struct Alternatives {
    k: u8,
    tokenizer: Arc<Tokenizer>,
}

/// One choice's log-probabilities not yet sent, and where its next token starts in its text.
#[derive(Default)]
struct ChoiceState {
    /// Byte offset of the next token's text in the completion.
    offset: usize,
    /// Log-probabilities of tokens whose text has not been sent yet (empty pieces).
    pending: Option<TextLogprobs>,
}

impl ChoiceState {
    fn push(&mut self, lp: &Alternatives, token: SampledToken) {
        let out = self.pending.get_or_insert_with(TextLogprobs::default);
        out.text_offset.push(self.offset);
        self.offset += token.text.len();
        if lp.k > 0 {
            let piece = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
            let mut top = BTreeMap::new();
            for t in &token.top {
                top.entry(piece(&t.bytes)).or_insert(t.logprob);
            }
            // As OpenAI: the sampled token is always there, so up to k + 1 entries.
            let own = piece(lp.tokenizer.token_bytes(token.id));
            top.entry(own).or_insert(token.logprob);
            out.top_logprobs.get_or_insert_with(Vec::new).push(top);
        }
        out.tokens.push(token.text);
        out.token_logprobs.push(token.logprob);
    }
}

/// Shapes `text_completion` stream chunks.
struct TextChunks {
    id: String,
    created: u64,
    model: String,
    logprobs: Option<Alternatives>,
    choices: Vec<ChoiceState>,
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

    fn state(&mut self, index: u32) -> Option<&mut ChoiceState> {
        self.choices.get_mut(index as usize)
    }
}

impl ChunkFormat for TextChunks {
    fn opening(&mut self, _index: u32) -> Option<String> {
        None
    }

    fn token(&mut self, index: u32, token: SampledToken) -> Option<String> {
        let text = token.text.clone();
        if let Some(lp) = self.logprobs.clone()
            && let Some(state) = self.state(index)
        {
            state.push(&lp, token);
        }
        if text.is_empty() {
            return None;
        }
        let choice = TextChoice {
            index,
            text,
            logprobs: self.state(index).and_then(|s| s.pending.take()),
            finish_reason: None,
        };
        Some(self.chunk(vec![choice], None))
    }

    fn finish(&mut self, index: u32, reason: FinishReason) -> String {
        let choice = TextChoice {
            index,
            text: String::new(),
            logprobs: self.state(index).and_then(|s| s.pending.take()),
            finish_reason: Some(reason.as_str()),
        };
        self.chunk(vec![choice], None)
    }

    fn usage(&mut self, usage: Usage) -> String {
        self.chunk(Vec::new(), Some(usage))
    }
}
