//! One generation path under every API: the front half every chat-like handler shares ([`front`]: a
//! validated [`Chat`] in — engine handle, the request's id allocated up front, the guide plan built off
//! the async workers, sampling parameters — one submit, a [`Started`] request out), and the one reading
//! of the engine's events every output format renders ([`Outcome`]).
//!
//! The engine speaks in [`Event`]s on a request's stream; what an API answer needs is one of four
//! outcomes, decided here once ([`outcome`]): a sampled token, a finish (with its reason, usage and the
//! stop sequence that ended it), a cancellation by id (`POST /v1/cancel/{id}`; the engine ends a
//! cancelled request — queued or running — with `Done { Cancelled }`, and since the handler still holds
//! the stream, that can only be a cancellation by id), or a failure (an engine error midway, or a
//! stream closed without a final event). OpenAI's JSON and SSE chunks ([`crate::openai`]), the
//! Responses API's events, Anthropic's events ([`crate::sse`]'s `StreamFormat`s) and Ollama's NDJSON
//! lines ([`crate::ollama`]) each render outcomes; none of them matches on engine events.
//!
//! [`collect`] reads a request to its end for a non-streamed answer ([`Generated`]);
//! [`collect_all`] does so for the `n` choices of one request and [`total_usage`] counts their prompt
//! once.

pub mod budget;
pub mod front;
pub mod harmony;
pub mod reasoning;

pub use front::{Chat, Planned, Started, plan, start, submit};

use shoal_engine::{Event, FinishReason, TopLogprob, Usage};

use crate::cancel::LiveRequest;
use crate::error::ApiError;

/// One sampled token as the routes report it: the text it made decodable, its log-probability and the
/// most likely alternatives (when asked).
#[derive(Debug, Clone)]
pub struct SampledToken {
    pub id: u32,
    pub text: String,
    pub logprob: f32,
    pub top: Vec<TopLogprob>,
}

/// How a generation ended (never `Cancelled`: that is [`Outcome::Cancelled`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub reason: FinishReason,
    pub usage: Usage,
    /// The stop sequence that ended generation, when one did.
    pub stop_sequence: Option<String>,
}

/// What one engine event means to an answer, whatever its format.
#[derive(Debug)]
pub enum Outcome {
    /// A sampled token; its text may be empty while a character or a possible stop sequence is
    /// incomplete.
    Token(SampledToken),
    /// Generation ended; nothing follows.
    Finished(Finish),
    /// The request was cancelled through `POST /v1/cancel/{id}`; nothing follows.
    Cancelled,
    /// The request failed midway (or its stream closed without a final event); nothing follows.
    Failed(ApiError),
}

/// The outcome of `event`, the next event of `request`'s stream (`None`: the stream closed). The one
/// place an engine event becomes an answer's outcome.
pub fn outcome(event: Option<Event>, request: &LiveRequest) -> Outcome {
    match event {
        Some(Event::Token {
            id,
            text,
            logprob,
            top_logprobs,
        }) => Outcome::Token(SampledToken {
            id,
            text,
            logprob,
            top: top_logprobs,
        }),
        // We still hold the stream, so the request was cancelled by id.
        Some(Event::Done {
            finish_reason: FinishReason::Cancelled,
            ..
        }) => {
            tracing::debug!(request = request.id(), "cancelled by id");
            Outcome::Cancelled
        }
        Some(Event::Done {
            finish_reason,
            usage,
            stop_sequence,
        }) => Outcome::Finished(Finish {
            reason: finish_reason,
            usage,
            stop_sequence,
        }),
        Some(Event::Error(err)) => {
            tracing::warn!(request = request.id(), error = %err, "generation failed midway");
            Outcome::Failed(err.into())
        }
        None => {
            let err = ApiError::Internal(
                "the engine closed the request's stream without finishing".into(),
            );
            tracing::error!(request = request.id(), "{err}");
            Outcome::Failed(err)
        }
    }
}

/// Waits for `request`'s next event and says what it means.
pub async fn next(request: &mut LiveRequest) -> Outcome {
    let event = request.stream().next().await;
    outcome(event, request)
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

/// Reads a request's events to the end. A request cancelled by id answers [`ApiError::Cancelled`]; one
/// that runs past its `timeout` answers [`ApiError::Timeout`].
pub async fn collect(request: &mut LiveRequest, keep_tokens: bool) -> Result<Generated, ApiError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    loop {
        match next(request).await {
            Outcome::Token(token) => {
                text.push_str(&token.text);
                if keep_tokens {
                    tokens.push(token);
                }
            }
            Outcome::Finished(end) => {
                return Ok(Generated {
                    text,
                    tokens,
                    finish_reason: end.reason,
                    usage: end.usage,
                    stop_sequence: end.stop_sequence,
                });
            }
            Outcome::Cancelled => return Err(ApiError::Cancelled),
            Outcome::Failed(err) => return Err(err),
        }
    }
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
