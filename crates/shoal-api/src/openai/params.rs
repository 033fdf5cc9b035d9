//! Parameters both OpenAI endpoints share, turned into the engine's validated types.
//!
//! [`CommonParams`] gathers the raw fields of either request; [`CommonParams::validate`] checks each one
//! (naming it in the error) and yields a [`Validated`] with the engine's [`SamplingParams`], the token
//! budget and the stop sequences, plus how to answer (stream or not, usage chunk or not).

use std::num::NonZeroU32;
use std::time::Duration;

use shoal_engine::request::MAX_CHOICES;
use shoal_engine::{Engines, SamplingParams};

use super::types::{ChatRequest, CompletionRequest, StopInput};
use crate::error::ApiError;

/// More stop sequences than OpenAI's 4, which some clients exceed; each costs a little per token.
pub const MAX_STOP_SEQUENCES: usize = 16;

/// Longest accepted `timeout`, in seconds (one day): longer means "no timeout" in practice, and a bound
/// keeps the deadline arithmetic far from overflow.
pub const MAX_TIMEOUT_SECS: f64 = 86_400.0;

/// The shared raw fields, borrowed out of a request.
#[derive(Debug, Default)]
pub struct CommonParams {
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub include_usage: Option<bool>,
    pub include_progress: Option<bool>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<StopInput>,
    pub ignore_eos: Option<bool>,
    pub timeout: Option<f64>,
    pub n: Option<i64>,
    pub speculative: Option<serde_json::Value>,
}

/// Checked parameters, ready for a [`shoal_engine::GenerateRequest`].
#[derive(Debug)]
pub struct Validated {
    /// A model the engine serves.
    pub model: String,
    pub sampling: SamplingParams,
    pub max_tokens: Option<NonZeroU32>,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Give up after this long (queueing included).
    pub timeout: Option<Duration>,
    pub stream: bool,
    pub include_usage: bool,
    /// Send the prompt's prefill progress as SSE comments (`stream_options.include_progress`).
    pub include_progress: bool,
    /// Choices to generate from the prompt (`n`), at least 1.
    pub n: usize,
    /// Speculative decoding (`None`: the server's default).
    pub speculative: Option<shoal_engine::Speculation>,
}

impl CommonParams {
    pub fn validate(self, engine: &Engines) -> Result<Validated, ApiError> {
        let n = match self.n {
            None => 1,
            Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => n as usize,
            Some(n) => {
                return Err(ApiError::invalid(
                    "n",
                    format!("n must be between 1 and {MAX_CHOICES}, got {n}"),
                ));
            }
        };
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(v), _) => Some(token_budget("max_completion_tokens", v)?),
            (None, Some(v)) => Some(token_budget("max_tokens", v)?),
            (None, None) => None,
        };
        let timeout = self.timeout.map(request_timeout).transpose()?;
        let speculative = crate::speculative::parse("speculative", self.speculative.as_ref())?;
        let stop = stop_sequences(
            "stop",
            self.stop.map(StopInput::into_vec).unwrap_or_default(),
        )?;
        let defaults = SamplingParams::default();
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            // 0 and the -1 some clients send both mean "disabled".
            top_k: self.top_k.map_or(defaults.top_k, |k| {
                u32::try_from(k.max(0)).unwrap_or(u32::MAX)
            }),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repetition_penalty: self
                .repetition_penalty
                .unwrap_or(defaults.repetition_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(defaults.frequency_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(defaults.presence_penalty),
            // Any 64-bit pattern is a fine seed; negative seeds keep their bits.
            seed: self.seed.map(|s| s as u64),
            top_logprobs: 0,
        }
        .validate()
        .map_err(shoal_engine::EngineError::from)?;
        let model = resolve_model(engine, self.model)?;
        Ok(Validated {
            model,
            sampling,
            max_tokens,
            stop,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            timeout,
            stream: self.stream.unwrap_or(false),
            include_usage: self.include_usage.unwrap_or(false),
            include_progress: self.include_progress.unwrap_or(false),
            n,
            speculative,
        })
    }
}

/// Refuses the documented fields shoal does not implement, by name, when they are set to something that
/// would change the answer.
pub(crate) fn refuse_unimplemented(u: &super::types::Unimplemented) -> Result<(), ApiError> {
    use serde_json::Value;
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    let text_only = |v: &Value| v.as_array().is_some_and(|a| a.iter().all(|m| m == "text"));
    let checks: [(&str, &Option<Value>, bool, &str); 8] = [
        (
            "logit_bias",
            &u.logit_bias,
            false,
            "logit_bias is not supported",
        ),
        (
            "audio",
            &u.audio,
            false,
            "audio output is not supported: the models served are text-only",
        ),
        (
            "modalities",
            &u.modalities,
            text_only(u.modalities.as_ref().unwrap_or(&Value::Null)),
            "only the text modality is supported",
        ),
        (
            "prediction",
            &u.prediction,
            false,
            "predicted outputs are not supported",
        ),
        (
            "functions",
            &u.functions,
            false,
            "functions is not supported: use tools",
        ),
        (
            "function_call",
            &u.function_call,
            false,
            "function_call is not supported: use tool_choice",
        ),
        (
            "web_search_options",
            &u.web_search_options,
            false,
            "web search is not supported",
        ),
        (
            "verbosity",
            &u.verbosity,
            u.verbosity.as_ref().is_some_and(|v| v == "medium"),
            "verbosity is not supported",
        ),
    ];
    for (param, value, fine, why) in checks {
        if let Some(v) = value
            && !empty(v)
            && !fine
        {
            return Err(ApiError::invalid(param, why));
        }
    }
    Ok(())
}

/// A request's stop sequences (`param` names the field): at most [`MAX_STOP_SEQUENCES`]; empty strings
/// are dropped.
pub(crate) fn stop_sequences(param: &str, stop: Vec<String>) -> Result<Vec<String>, ApiError> {
    if stop.len() > MAX_STOP_SEQUENCES {
        return Err(ApiError::invalid(
            param,
            format!(
                "at most {MAX_STOP_SEQUENCES} stop sequences are supported, got {}",
                stop.len()
            ),
        ));
    }
    // An empty stop string would end every generation at once; clients mean "no stop" by it.
    Ok(stop.into_iter().filter(|s| !s.is_empty()).collect())
}

/// `max_tokens` must be positive; values beyond `u32` mean "as many as fit" anyway.
pub(crate) fn token_budget(param: &'static str, value: i64) -> Result<NonZeroU32, ApiError> {
    if value <= 0 {
        return Err(ApiError::invalid(
            param,
            format!("{param} must be at least 1, got {value}"),
        ));
    }
    let value = u32::try_from(value).unwrap_or(u32::MAX);
    Ok(NonZeroU32::new(value).unwrap_or(NonZeroU32::MAX))
}

/// `timeout` is in seconds, fractions allowed: more than 0, at most [`MAX_TIMEOUT_SECS`].
fn request_timeout(secs: f64) -> Result<Duration, ApiError> {
    if !(secs.is_finite() && secs > 0.0 && secs <= MAX_TIMEOUT_SECS) {
        return Err(ApiError::invalid(
            "timeout",
            format!("timeout must be a number of seconds in (0, {MAX_TIMEOUT_SECS}], got {secs}"),
        ));
    }
    // Below a nanosecond the deadline would be "now"; keep it positive as asked.
    Ok(Duration::from_secs_f64(secs).max(Duration::from_nanos(1)))
}

/// The requested model if the engine serves it; without one, the only model served.
pub(crate) fn resolve_model(
    engine: &Engines,
    requested: Option<String>,
) -> Result<String, ApiError> {
    let models = engine.models();
    match requested {
        Some(model) if models.iter().any(|m| m.id == model) => Ok(model),
        Some(model) => Err(ApiError::ModelNotFound { model }),
        None => match models.as_slice() {
            [only] => Ok(only.id.clone()),
            _ => Err(ApiError::invalid(
                "model",
                "you must provide a model parameter",
            )),
        },
    }
}

// The two conversions below look alike on purpose: flattening the shared fields into one serde struct
// would lose the field name in type errors (`param` in the 400 answer), which clients rely on.
impl From<&mut ChatRequest> for CommonParams {
    fn from(r: &mut ChatRequest) -> Self {
        CommonParams {
            model: r.model.take(),
            stream: r.stream,
            include_usage: r.stream_options.as_ref().and_then(|o| o.include_usage),
            include_progress: r.stream_options.as_ref().and_then(|o| o.include_progress),
            max_tokens: r.max_tokens,
            max_completion_tokens: r.max_completion_tokens,
            temperature: r.temperature,
            top_p: r.top_p,
            top_k: r.top_k,
            min_p: r.min_p,
            repetition_penalty: r.repetition_penalty,
            frequency_penalty: r.frequency_penalty,
            presence_penalty: r.presence_penalty,
            seed: r.seed,
            stop: r.stop.take(),
            ignore_eos: r.ignore_eos,
            timeout: r.timeout,
            n: r.n,
            speculative: r.speculative.take(),
        }
    }
}

impl From<&mut CompletionRequest> for CommonParams {
    fn from(r: &mut CompletionRequest) -> Self {
        CommonParams {
            model: r.model.take(),
            stream: r.stream,
            include_usage: r.stream_options.as_ref().and_then(|o| o.include_usage),
            include_progress: r.stream_options.as_ref().and_then(|o| o.include_progress),
            max_tokens: r.max_tokens,
            max_completion_tokens: r.max_completion_tokens,
            temperature: r.temperature,
            top_p: r.top_p,
            top_k: r.top_k,
            min_p: r.min_p,
            repetition_penalty: r.repetition_penalty,
            frequency_penalty: r.frequency_penalty,
            presence_penalty: r.presence_penalty,
            seed: r.seed,
            stop: r.stop.take(),
            ignore_eos: r.ignore_eos,
            timeout: r.timeout,
            n: r.n,
            speculative: r.speculative.take(),
        }
    }
}

/// What a chat request asks of the model's thinking: `reasoning_effort` and the `enable_thinking` /
/// `reasoning_effort` of `chat_template_kwargs` (the latter win, as they name the template's own variables).
pub(crate) fn thinking(
    effort: Option<&str>,
    kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<shoal_engine::Thinking, ApiError> {
    let mut thinking = effort_thinking("reasoning_effort", effort)?;
    for (key, value) in kwargs.into_iter().flatten() {
        let param = "chat_template_kwargs";
        match (key.as_str(), value) {
            ("enable_thinking", serde_json::Value::Bool(b)) => thinking.enable = Some(*b),
            ("reasoning_effort", serde_json::Value::String(e)) => {
                thinking.effort = effort_thinking(param, Some(e))?.effort
            }
            ("enable_thinking" | "reasoning_effort", _) => {
                return Err(ApiError::invalid(
                    param,
                    format!(
                        "chat_template_kwargs.{key} has the wrong type (enable_thinking: boolean, reasoning_effort: string)"
                    ),
                ));
            }
            _ => {
                return Err(ApiError::invalid(
                    param,
                    format!(
                        "chat_template_kwargs.{key} is not supported: only enable_thinking and reasoning_effort are read"
                    ),
                ));
            }
        }
    }
    Ok(thinking)
}

/// A `reasoning_effort` value (OpenAI's levels) as the template's variables.
pub(crate) fn effort_thinking(
    param: &str,
    effort: Option<&str>,
) -> Result<shoal_engine::Thinking, ApiError> {
    let effort = match effort {
        None => return Ok(shoal_engine::Thinking::default()),
        Some("none") => {
            return Ok(shoal_engine::Thinking {
                enable: Some(false),
                effort: None,
                budget: None,
            });
        }
        Some("minimal" | "low") => "low",
        Some("medium") => "medium",
        Some("high") => "high",
        Some(other) => {
            return Err(ApiError::invalid(
                param,
                format!(
                    "reasoning_effort must be none, minimal, low, medium or high, got {other:?}"
                ),
            ));
        }
    };
    Ok(shoal_engine::Thinking {
        enable: Some(true),
        effort: Some(effort.to_string()),
        budget: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_budget_rejects_non_positive() {
        assert!(token_budget("max_tokens", 0).is_err());
        assert!(token_budget("max_tokens", -3).is_err());
        assert_eq!(token_budget("max_tokens", 5).ok(), NonZeroU32::new(5));
        assert_eq!(
            token_budget("max_tokens", i64::MAX).ok(),
            Some(NonZeroU32::MAX)
        );
    }

    #[test]
    fn timeout_must_be_positive_and_bounded() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, MAX_TIMEOUT_SECS + 1.0] {
            let err = request_timeout(bad).expect_err("must be refused");
            assert!(
                matches!(&err, ApiError::InvalidRequest { param: Some(p), .. } if p == "timeout"),
                "{err:?}"
            );
        }
        assert_eq!(request_timeout(0.25).ok(), Some(Duration::from_millis(250)));
        assert_eq!(
            request_timeout(MAX_TIMEOUT_SECS).ok(),
            Some(Duration::from_secs(86_400))
        );
    }
}
