//! [`SamplingParams`]: a request's sampling knobs, one type for the engine that samples and the wire
//! that carries them to a remote last stage ([`crate::SampleJob`]), checked by
//! [`SamplingParams::validate`] ([`SamplingError`] names the offending parameter).

/// Sampling knobs, validated. Defaults are the OpenAI defaults (temperature 1, top_p 1, no penalties).
///
/// On the wire (a [`crate::SampleJob`]) every field but `seed` travels: the job carries the random
/// generator's state instead, so a decoded job has `seed: None`.
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
    /// Alternatives reported with each sampled token, best first (0 = none; at most
    /// [`MAX_TOP_LOGPROBS`]). Not a sampling knob, but decided where the logits are, so it travels
    /// with them.
    pub top_logprobs: u8,
}

/// The most alternatives a request may ask for per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u8 = 20;

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
            top_logprobs: 0,
        }
    }
}

/// A sampling parameter out of its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for '{param}': {message}")]
pub struct SamplingError {
    /// The field's name, as the APIs spell it (`"top_p"`).
    pub param: &'static str,
    /// What is wrong, for the client.
    pub message: String,
}

impl SamplingError {
    /// A short, stable label (for metrics and logs).
    pub fn error_type(&self) -> &'static str {
        "invalid_param"
    }
}

impl SamplingParams {
    /// Checks every field's range; the error names the offending parameter.
    pub fn validate(self) -> Result<Self, SamplingError> {
        fn check(ok: bool, param: &'static str, message: String) -> Result<(), SamplingError> {
            if ok {
                Ok(())
            } else {
                Err(SamplingError { param, message })
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
        check(
            s.top_logprobs <= MAX_TOP_LOGPROBS,
            "top_logprobs",
            format!(
                "top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {}",
                s.top_logprobs
            ),
        )?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_out_of_range_values_name_their_parameter() {
        assert_eq!(
            SamplingParams::default().validate(),
            Ok(SamplingParams::default())
        );
        let bad = |p: SamplingParams| p.validate().map_err(|e| e.param);
        let d = SamplingParams::default;
        assert_eq!(
            bad(SamplingParams {
                temperature: 2.5,
                ..d()
            }),
            Err("temperature")
        );
        assert_eq!(bad(SamplingParams { top_p: 0.0, ..d() }), Err("top_p"));
        assert_eq!(bad(SamplingParams { min_p: 1.5, ..d() }), Err("min_p"));
        assert_eq!(
            bad(SamplingParams {
                repetition_penalty: 0.0,
                ..d()
            }),
            Err("repetition_penalty")
        );
        assert_eq!(
            bad(SamplingParams {
                frequency_penalty: f32::NAN,
                ..d()
            }),
            Err("frequency_penalty")
        );
        let e = SamplingParams {
            presence_penalty: -3.0,
            ..d()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid value for 'presence_penalty': presence_penalty must be between -2 and 2, got -3"
        );
        assert_eq!(e.error_type(), "invalid_param");
        assert_eq!(
            bad(SamplingParams {
                top_logprobs: MAX_TOP_LOGPROBS + 1,
                ..d()
            }),
            Err("top_logprobs")
        );
        assert!(
            SamplingParams {
                top_logprobs: MAX_TOP_LOGPROBS,
                ..d()
            }
            .validate()
            .is_ok()
        );
    }
}
