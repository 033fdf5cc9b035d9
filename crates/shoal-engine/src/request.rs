//! The engine's validated request type and the events it streams back.
//!
//! Every API adapter (OpenAI, Anthropic, Ollama) converts its raw input into a [`GenerateRequest`];
//! the engine never sees unvalidated input. Construct [`SamplingParams`] through
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

/// Sampling knobs, validated. Defaults are the OpenAI defaults (temperature 1, top_p 1, no penalties).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1].
    pub top_p: f32,
    /// 0 disables top-k.
    pub top_k: u32,
    /// Drop tokens whose probability is below `min_p * p_max`; 0 disables.
    pub min_p: f32,
    /// Multiplicative penalty (llama.cpp style) on tokens already seen; 1 disables.
    pub repetition_penalty: f32,
    /// OpenAI frequency penalty in [-2, 2].
    pub frequency_penalty: f32,
    /// OpenAI presence penalty in [-2, 2].
    pub presence_penalty: f32,
    /// Same seed and same request give the same output.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Checks every field's range; the error names the offending parameter.
    pub fn validate(self) -> Result<Self, EngineError> {
        fn check(ok: bool, param: &'static str, msg: String) -> Result<(), EngineError> {
            if ok {
                Ok(())
            } else {
                Err(EngineError::InvalidParam {
                    param,
                    message: msg,
                })
            }
        }
        let s = &self;
        check(
            s.temperature.is_finite() && (0.0..=2.0).contains(&s.temperature),
            "temperature",
            format!("temperature must be between 0 and 2, got {}", s.temperature),
        )?;
        check(
            s.top_p.is_finite() && s.top_p > 0.0 && s.top_p <= 1.0,
            "top_p",
            format!("top_p must be in (0, 1], got {}", s.top_p),
        )?;
        check(
            s.min_p.is_finite() && (0.0..=1.0).contains(&s.min_p),
            "min_p",
            format!("min_p must be in [0, 1], got {}", s.min_p),
        )?;
        check(
            s.repetition_penalty.is_finite() && s.repetition_penalty > 0.0,
            "repetition_penalty",
            format!(
                "repetition_penalty must be > 0, got {}",
                s.repetition_penalty
            ),
        )?;
        check(
            s.frequency_penalty.is_finite() && (-2.0..=2.0).contains(&s.frequency_penalty),
            "frequency_penalty",
            format!(
                "frequency_penalty must be between -2 and 2, got {}",
                s.frequency_penalty
            ),
        )?;
        check(
            s.presence_penalty.is_finite() && (-2.0..=2.0).contains(&s.presence_penalty),
            "presence_penalty",
            format!(
                "presence_penalty must be between -2 and 2, got {}",
                s.presence_penalty
            ),
        )?;
        Ok(self)
    }
}

/// A validated generation request.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Model id as listed by [`crate::EngineHandle::models`].
    pub model: String,
    pub prompt: Prompt,
    pub sampling: SamplingParams,
    /// Upper bound on generated tokens; `None` means "until the context is full".
    pub max_tokens: Option<u32>,
    /// Stop sequences: generation ends before any of them and they are never emitted.
    pub stop: Vec<String>,
    /// Add the model's BOS token in front of a text prompt when the model asks for it
    /// (`tokenizer.ggml.add_bos_token`). Chat prompts rendered from a template already contain it.
    pub add_bos: bool,
    /// Keep generating past end-of-generation tokens (benchmarks that need exactly `max_tokens`).
    pub ignore_eos: bool,
    /// Give up (with [`EngineError::Timeout`]) when the request has not finished this long after it was
    /// submitted, queueing included.
    pub timeout: Option<std::time::Duration>,
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

/// What a request's stream yields, in order: any number of `Token`, then exactly one `Done` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// One sampled token. `text` is the newly decodable text (possibly empty while a UTF-8 character or a
    /// possible stop sequence is still incomplete).
    Token {
        id: u32,
        text: String,
        logprob: f32,
    },
    Done {
        finish_reason: FinishReason,
        usage: Usage,
    },
    Error(EngineError),
}
