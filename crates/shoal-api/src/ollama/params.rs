//! What `/api/chat` and `/api/generate` share, checked into the engine's types: the model, `options`
//! mapped to [`SamplingParams`] (through [`crate::openai::params::CommonParams`], so every range and limit
//! has one rule in the code base), the token budget, the stop list, and the documented fields shoal does
//! not implement, refused by name with a 400.
//!
//! Mapping of `options`: `temperature`, `top_p`, `top_k`, `min_p`, `presence_penalty`,
//! `frequency_penalty` as named; `repeat_penalty` → `repetition_penalty`; `seed` (negative: random, as in
//! Ollama); `num_predict` → `max_tokens` (-1 unlimited and -2 fill the context both mean "until the
//! context is full"); `stop`; `num_ctx` accepted up to the model's context length. `mirostat`,
//! `typical_p` and `tfs_z` are refused unless off. Every other option is ignored, as Ollama ignores
//! unknown ones (`num_gpu`, `num_thread`, `repeat_last_n`, … tune what shoal sizes itself).

use std::num::NonZeroU32;

use serde_json::Value;
use shoal_engine::SamplingParams;

use super::types::Options;
use super::{Error, served_model};
use crate::ApiState;
use crate::error::ApiError;
use crate::openai::params::CommonParams;

/// The fields of a chat or generate request that shape the generation.
#[derive(Debug, Default)]
pub struct Common<'a> {
    pub model: &'a str,
    pub stream: Option<bool>,
    pub options: Option<Options>,
    pub think: Option<&'a Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub speculative: Option<&'a Value>,
}

/// Checked parameters, ready for a [`shoal_engine::GenerateRequest`].
#[derive(Debug)]
pub struct Checked {
    /// A model this node's engines serve (a `:latest` tag dropped).
    pub model: String,
    pub sampling: SamplingParams,
    pub max_tokens: Option<NonZeroU32>,
    pub stop: Vec<String>,
    /// NDJSON lines (Ollama's default) or one object.
    pub stream: bool,
    /// Each sampled token's log-probability in the answer (with `sampling.top_logprobs` alternatives).
    pub logprobs: bool,
    /// `think`: `true` / `false` turn a thinking model's thoughts on or off, `"low"`, `"medium"`,
    /// `"high"` set the effort (gpt-oss); unset keeps the template's default.
    pub thinking: shoal_engine::Thinking,
    /// Speculative decoding (`None`: the server's default).
    pub speculative: Option<shoal_engine::Speculation>,
}

/// Checks `c` against the model it names.
pub fn check(state: &ApiState, c: Common<'_>) -> Result<Checked, Error> {
    let model = served_model(state, c.model)?;
    let thinking = think(c.think)?;
    let top_logprobs = top_logprobs(c.top_logprobs)?;
    let speculative = crate::speculative::parse("speculative", c.speculative)?;
    let options = c.options.unwrap_or_default();
    refuse_sampling_methods(&options)?;
    if let Some(n) = options.num_ctx {
        let context = state
            .engine
            .get(&model)
            .map_err(ApiError::from)?
            .info()
            .context_length;
        if n < 1 || n as u64 > context as u64 {
            return Err(ApiError::invalid(
                "options.num_ctx",
                format!("options.num_ctx must be between 1 and the model's context length {context}, got {n}"),
            )
            .into());
        }
    }
    let max_tokens = num_predict(options.num_predict)?;
    let common = CommonParams {
        model: Some(model.clone()),
        temperature: options.temperature,
        top_p: options.top_p,
        top_k: options.top_k,
        min_p: options.min_p,
        repetition_penalty: options.repeat_penalty,
        frequency_penalty: options.frequency_penalty,
        presence_penalty: options.presence_penalty,
        // Ollama (like llama.cpp) reads a negative seed as "random".
        seed: options.seed.filter(|s| *s >= 0),
        stop: options.stop,
        max_tokens: max_tokens.map(|n| i64::from(n.get())),
        ..CommonParams::default()
    };
    let valid = common.validate(&state.engine).map_err(to_options_error)?;
    let sampling = SamplingParams {
        top_logprobs,
        ..valid.sampling
    }
    .validate()
    .map_err(|e| ApiError::from(shoal_engine::EngineError::from(e)))?;
    Ok(Checked {
        model: valid.model,
        sampling,
        max_tokens: valid.max_tokens,
        stop: valid.stop,
        stream: c.stream.unwrap_or(true),
        logprobs: c.logprobs.unwrap_or(false) || top_logprobs > 0,
        thinking,
        speculative,
    })
}

/// `top_logprobs`: how many of the most likely tokens to report at each position (it implies `logprobs`);
/// its upper bound is checked with the other sampling parameters.
fn top_logprobs(value: Option<i64>) -> Result<u8, Error> {
    match value.unwrap_or(0) {
        k if k < 0 => Err(ApiError::invalid(
            "top_logprobs",
            format!("top_logprobs must be at least 0, got {k}"),
        )
        .into()),
        k => Ok(u8::try_from(k).unwrap_or(u8::MAX)),
    }
}

/// `num_predict`: -1 (unlimited) and -2 (fill the context) mean no budget; otherwise at least 1.
fn num_predict(value: Option<i64>) -> Result<Option<NonZeroU32>, Error> {
    match value {
        None | Some(-1) | Some(-2) => Ok(None),
        Some(n) if n >= 1 => Ok(Some(
            NonZeroU32::new(u32::try_from(n).unwrap_or(u32::MAX)).unwrap_or(NonZeroU32::MAX),
        )),
        Some(n) => Err(ApiError::invalid(
            "options.num_predict",
            format!(
                "options.num_predict must be at least 1, or -1 (unlimited) or -2 (fill the context), got {n}"
            ),
        )
        .into()),
    }
}

/// Ollama's `think`: a boolean, or an effort level (`"low"`, `"medium"`, `"high"`, as gpt-oss takes).
fn think(value: Option<&Value>) -> Result<shoal_engine::Thinking, Error> {
    match value {
        None | Some(Value::Null) => Ok(shoal_engine::Thinking::default()),
        Some(Value::Bool(b)) => Ok(shoal_engine::Thinking {
            enable: Some(*b),
            effort: None,
            budget: None,
        }),
        Some(Value::String(level)) if matches!(level.as_str(), "low" | "medium" | "high") => {
            Ok(shoal_engine::Thinking {
                enable: Some(true),
                effort: Some(level.clone()),
                budget: None,
            })
        }
        Some(other) => Err(ApiError::invalid(
            "think",
            format!("think must be true, false, \"low\", \"medium\" or \"high\", got {other}"),
        )
        .into()),
    }
}

/// Sampling methods the engine does not have: accepted only when set to their "off" value.
fn refuse_sampling_methods(o: &Options) -> Result<(), Error> {
    if o.mirostat.is_some_and(|m| m != 0) {
        return Err(ApiError::invalid(
            "options.mirostat",
            "options.mirostat is not supported (only 0, off)",
        )
        .into());
    }
    for (name, value) in [
        ("options.typical_p", o.typical_p),
        ("options.tfs_z", o.tfs_z),
    ] {
        if value.is_some_and(|v| v != 1.0) {
            return Err(ApiError::invalid(
                name,
                format!("{name} is not supported (only 1.0, off)"),
            )
            .into());
        }
    }
    Ok(())
}

/// The OpenAI adapter's parameter names, as Ollama's `options` spell them.
const OPTION_NAMES: [(&str, &str); 10] = [
    ("temperature", "options.temperature"),
    ("top_p", "options.top_p"),
    ("top_k", "options.top_k"),
    ("min_p", "options.min_p"),
    ("repetition_penalty", "options.repeat_penalty"),
    ("frequency_penalty", "options.frequency_penalty"),
    ("presence_penalty", "options.presence_penalty"),
    ("seed", "options.seed"),
    ("stop", "options.stop"),
    ("max_tokens", "options.num_predict"),
];

/// An error of the shared parameter checks, naming the option the client set.
fn to_options_error(err: ApiError) -> Error {
    let ApiError::InvalidRequest {
        message,
        param: Some(param),
        code,
    } = err
    else {
        return Error(err);
    };
    let Some((old, new)) = OPTION_NAMES.iter().find(|(old, _)| *old == param) else {
        return Error(ApiError::InvalidRequest {
            message,
            param: Some(param),
            code,
        });
    };
    // "repetition_penalty must be > 0" → "options.repeat_penalty must be > 0".
    let message = match message.strip_prefix(old) {
        Some(rest) => format!("{new}{rest}"),
        None => message,
    };
    Error(ApiError::InvalidRequest {
        message,
        param: Some(new.to_string()),
        code,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn num_predict_values() {
        assert_eq!(num_predict(None).ok(), Some(None));
        assert_eq!(num_predict(Some(-1)).ok(), Some(None));
        assert_eq!(num_predict(Some(-2)).ok(), Some(None));
        assert_eq!(num_predict(Some(7)).ok(), Some(NonZeroU32::new(7)));
        assert_eq!(
            num_predict(Some(i64::MAX)).ok(),
            Some(Some(NonZeroU32::MAX))
        );
        for bad in [0, -3, i64::MIN] {
            let err = num_predict(Some(bad)).expect_err("refused");
            assert!(err.message().starts_with("options.num_predict"), "{err:?}");
        }
    }

    #[test]
    fn shared_errors_name_the_option() {
        let e = to_options_error(ApiError::invalid(
            "repetition_penalty",
            "repetition_penalty must be > 0, got -1",
        ));
        assert_eq!(e.message(), "options.repeat_penalty must be > 0, got -1");
        let e = to_options_error(ApiError::invalid("model", "x"));
        assert_eq!(e.message(), "model: x");
    }

    #[test]
    fn unsupported_fields_are_named() {
        let on = think(Some(&Value::Bool(true))).expect("a boolean");
        assert_eq!(on.enable, Some(true));
        assert_eq!(
            think(Some(&Value::Bool(false))).expect("a boolean").enable,
            Some(false)
        );
        let high = think(Some(&Value::String("high".into()))).expect("a level");
        assert_eq!(high.effort.as_deref(), Some("high"));
        assert_eq!(
            think(None).expect("unset"),
            shoal_engine::Thinking::default()
        );
        for bad in [Value::String("max".into()), Value::from(1)] {
            assert!(think(Some(&bad)).is_err_and(|e| e.message().starts_with("think")));
        }
        let o = Options {
            mirostat: Some(2),
            ..Options::default()
        };
        assert!(refuse_sampling_methods(&o).is_err());
        let o = Options {
            mirostat: Some(0),
            typical_p: Some(1.0),
            ..Options::default()
        };
        assert!(refuse_sampling_methods(&o).is_ok());
    }
}
