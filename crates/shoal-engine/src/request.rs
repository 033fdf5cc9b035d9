//! The engine's validated request type and the events it streams back.
//!
//! Every API adapter (today the OpenAI one in `shoal-api`) converts its raw input into a
//! [`GenerateRequest`]; the engine never sees unvalidated input. Construct [`SamplingParams`] through
//! [`SamplingParams::validate`] so out-of-range values are rejected with a clear error.

use serde::Serialize;

use crate::error::EngineError;

/// What to generate from: already-rendered text (chat templates are applied by the adapter through
/// [`crate::EngineHandle::render_chat`]) or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// Sampling knobs live in `shoal-wire`, which carries them to a remote last stage.
pub use shoal_wire::sampling::{MAX_TOP_LOGPROBS, SamplingError, SamplingParams};

impl From<SamplingError> for EngineError {
    fn from(e: SamplingError) -> Self {
        EngineError::InvalidParam {
            param: e.param,
            message: e.message,
        }
    }
}

/// A validated generation request.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Model id as listed by [`crate::Engines::models`] (one [`crate::EngineHandle`] serves it).
    pub model: String,
    pub prompt: Prompt,
    pub sampling: SamplingParams,
    /// Upper bound on generated tokens (at least one); `None` means "until the context is full".
    pub max_tokens: Option<std::num::NonZeroU32>,
    /// Stop sequences: generation ends before any of them and they are never emitted.
    pub stop: Vec<String>,
    /// Add the model's BOS token in front of a text prompt when the model asks for it
    /// (`tokenizer.ggml.add_bos_token`). Chat prompts too: `render_chat` cuts a BOS the template wrote
    /// itself when the tokenizer adds one.
    pub add_bos: bool,
    /// Keep generating past end-of-generation tokens (benchmarks that need exactly `max_tokens`).
    pub ignore_eos: bool,
    /// Give up (with [`EngineError::Timeout`]) when the request has not finished this long after it was
    /// submitted, queueing included.
    pub timeout: Option<std::time::Duration>,
    /// Code that says which tokens may come next (constrained decoding); works wherever the pipeline
    /// samples (the mask travels with the step).
    pub logits_processor: Option<Box<dyn crate::logits::LogitsProcessor>>,
    /// Speculative decoding for this request; `None`: the engine's default
    /// ([`crate::engine::EngineConfig::speculative`]).
    pub speculative: Option<Speculation>,
}

/// Speculative decoding ([`crate::draft`]): propose tokens cheaply, verify them in one pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Speculation {
    /// One token per step.
    #[default]
    Off,
    /// Prompt lookup: continue the latest earlier occurrence of the sequence's last tokens
    /// ([`crate::draft::NgramDraft`]), at most `max_draft` drafted tokens a pass.
    Ngram { max_draft: usize },
    /// A small model with the target's vocabulary drafts its greedy continuation
    /// ([`crate::draft_model::ModelDraft`]; the engine's [`crate::engine::EngineConfig::draft_model`]),
    /// at most `max_draft` drafted tokens a pass.
    Draft { max_draft: usize },
    /// The model's own multi-token-prediction block (GLM-4.5's `nextn` layer) drafts, chained
    /// ([`crate::mtp_draft::MtpDraft`]), on an engine whose last stage is in this process and whose
    /// model has the block; at most `max_draft` drafted tokens a pass.
    Mtp { max_draft: usize },
}

/// The most tokens one pass may draft.
pub const MAX_DRAFT: usize = 32;

impl Speculation {
    /// What a pass drafts at most (0 when off).
    pub fn max_draft(self) -> usize {
        match self {
            Speculation::Off => 0,
            Speculation::Ngram { max_draft }
            | Speculation::Draft { max_draft }
            | Speculation::Mtp { max_draft } => max_draft.min(MAX_DRAFT),
        }
    }

    /// The method's name as requests and the CLI spell it (`off`, `ngram`).
    pub fn method(self) -> &'static str {
        match self {
            Speculation::Off => "off",
            Speculation::Ngram { .. } => "ngram",
            Speculation::Draft { .. } => "draft",
            Speculation::Mtp { .. } => "mtp",
        }
    }

    /// Parses a method name (`off`/`none`, `ngram`, `draft`) with `max_draft` (default 8 when `None`);
    /// errs with a sentence naming what is allowed.
    pub fn parse(method: &str, max_draft: Option<u64>) -> Result<Self, String> {
        let max_draft = match max_draft {
            None => 8,
            Some(n) if (1..=MAX_DRAFT as u64).contains(&n) => n as usize,
            Some(n) => {
                return Err(format!(
                    "max_draft must be between 1 and {MAX_DRAFT}, got {n}"
                ));
            }
        };
        match method {
            "off" | "none" => Ok(Speculation::Off),
            "ngram" => Ok(Speculation::Ngram { max_draft }),
            "draft" => Ok(Speculation::Draft { max_draft }),
            "mtp" => Ok(Speculation::Mtp { max_draft }),
            other => Err(format!(
                "unknown speculative method {other:?}: use \"ngram\", \"draft\", \"mtp\" or \"off\""
            )),
        }
    }
}

/// The most choices one request may ask for ([`crate::Engines::submit_n`]).
pub const MAX_CHOICES: usize = 16;

/// A validated embedding request: one vector per input ([`crate::Engines::embed`]).
#[derive(Debug, Clone)]
pub struct EmbedRequest {
    /// Model id as listed by [`crate::Engines::models`].
    pub model: String,
    /// Text (tokenized as llama.cpp's server does: special tokens parsed, BOS/EOS as the GGUF asks) or
    /// token ids (used as given).
    pub inputs: Vec<Prompt>,
    /// Cut inputs longer than the context length (Ollama's default) instead of refusing them.
    pub truncate: bool,
    /// Give up when the whole request has not finished this long after it was submitted.
    pub timeout: Option<std::time::Duration>,
}

/// What [`crate::Engines::embed`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    /// One L2-normalized vector per input, in order, each as long as the model's hidden size.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens of all inputs together (what usage reports).
    pub prompt_tokens: u32,
}

/// `n` as a [`GenerateRequest::max_tokens`], for callers outside the HTTP API (the CLI, benchmarks):
/// 0 is refused.
pub fn max_tokens(n: u32) -> Result<std::num::NonZeroU32, EngineError> {
    std::num::NonZeroU32::new(n).ok_or_else(|| EngineError::InvalidParam {
        param: "max_tokens",
        message: "max_tokens must be at least 1".into(),
    })
}

/// Why a sequence finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// End-of-generation token or a stop sequence.
    Stop,
    /// `max_tokens` or the context length was reached.
    Length,
    /// The consumer went away or the request was cancelled.
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: u32,
}

/// How far the prompt of a request has been processed (its KV computed on every stage, cached prefix
/// included): what [`crate::RequestStream::prefill`] watches while a long prompt is prefilled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Prefill {
    /// Prompt tokens computed so far.
    pub done: u32,
    /// Prompt tokens in all.
    pub total: u32,
}

/// One of the most likely tokens at a position ([`Event::Token::top_logprobs`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TopLogprob {
    pub id: u32,
    pub logprob: f32,
    /// The token's own bytes (a piece of UTF-8 text, possibly part of a character).
    pub bytes: Vec<u8>,
}

/// What a request's stream yields, in order: any number of `Token`, then exactly one `Done` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// One sampled token. `text` is the newly decodable text (possibly empty while a UTF-8 character or a
    /// possible stop sequence is still incomplete).
    Token {
        id: u32,
        text: String,
        /// Log-probability of the token under the model's raw logits (before a constraint's mask,
        /// penalties and temperature).
        logprob: f32,
        /// The [`SamplingParams::top_logprobs`] most likely tokens at this position, best first
        /// (empty when none were asked).
        top_logprobs: Vec<TopLogprob>,
    },
    Done {
        finish_reason: FinishReason,
        usage: Usage,
        /// The stop sequence (one of [`GenerateRequest::stop`]) that ended generation, when one did
        /// (`finish_reason` is then `Stop`); `None` for an end-of-generation token or any other end.
        stop_sequence: Option<String>,
    },
    Error(EngineError),
}
