//! A request's token budget against its instance ([`shoal_engine::limits`]), refused in each API's
//! words with a 400 before a byte of the answer is sent — streamed or not:
//!
//! - OpenAI (chat, completions, Responses): prompt + `max_tokens` beyond the context is vLLM's and
//!   OpenAI's `context_length_exceeded` ("This model's maximum context length is … However, you
//!   requested …"); beyond a KV budget smaller than the context, the same with the budget named
//!   (`kv_budget_exceeded`); `n` choices that together can never be held, `kv_budget_exceeded` on `n`.
//! - Anthropic: "input length and `max_tokens` exceed context limit: P + M > L, decrease input length
//!   or `max_tokens` and try again", Anthropic's own refusal, which clients parse to retry smaller.
//! - Ollama is not checked: Ollama takes `num_predict` as a cap and never refuses it, and so does shoal
//!   (a sequence ends at the context or the KV budget with `done_reason: "length"`).
//!
//! The check runs once the request is submitted, when its prompt's length is known; a refused
//! request's choices are dropped with the error, which cancels them before they compute more than a
//! step.

pub use shoal_engine::limits::Budget;
use shoal_engine::limits::Overrun;

use crate::ApiState;
use crate::error::ApiError;

/// The API whose words a refusal takes, and the field that set the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Words {
    /// OpenAI's, naming the request's budget field (`max_tokens`, `max_output_tokens`).
    OpenAi(&'static str),
    Anthropic,
}

/// Checks a submitted request of `model` (`prompt_tokens` long, `max_tokens`, `n` choices) against its
/// local instance; an error in `words` when it can never be held. A model this node does not serve
/// itself passes (its driving node checks it).
pub fn check(state: &ApiState, model: &str, budget: Budget, words: Words) -> Result<(), ApiError> {
    let Ok(engine) = state.engine.get(model) else {
        return Ok(());
    };
    engine
        .check_budget(budget)
        .map_err(|overrun| refusal(overrun, words))
}

/// `overrun` as `words` refuse it.
pub fn refusal(overrun: Overrun, words: Words) -> ApiError {
    let code = Some(overrun.error_type());
    let (prompt_tokens, max_tokens) = match overrun {
        // Only OpenAI's routes take `n`; Anthropic's always ask for one choice.
        Overrun::Choices { .. } => {
            return ApiError::InvalidRequest {
                message: format!("{overrun}: lower n or max_tokens"),
                param: Some("n".into()),
                code,
            };
        }
        Overrun::Context {
            prompt_tokens,
            max_tokens,
            ..
        }
        | Overrun::Sequence {
            prompt_tokens,
            max_tokens,
            ..
        } => (prompt_tokens, max_tokens),
    };
    let limit = overrun.limit();
    let (message, param) = match words {
        Words::Anthropic => (
            format!(
                "input length and `max_tokens` exceed context limit: {prompt_tokens} + {max_tokens} > {limit}, decrease input length or `max_tokens` and try again"
            ),
            "max_tokens",
        ),
        Words::OpenAi(param) => {
            let holds = match overrun {
                Overrun::Context { .. } => {
                    format!("This model's maximum context length is {limit} tokens.")
                }
                _ => format!(
                    "This instance's KV budget holds {limit} tokens, fewer than the model's context."
                ),
            };
            let total = Overrun::total(1, prompt_tokens, max_tokens);
            (
                format!(
                    "{holds} However, you requested {total} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion). Please reduce the length of the messages or completion."
                ),
                param,
            )
        }
    };
    ApiError::InvalidRequest {
        message,
        param: Some(param.into()),
        code,
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;
    use crate::dialect::anthropic;

    const CONTEXT: Overrun = Overrun::Context {
        prompt_tokens: 12,
        max_tokens: 1_000_000_000,
        context_length: 8192,
    };
    const SEQUENCE: Overrun = Overrun::Sequence {
        prompt_tokens: 20,
        max_tokens: 2000,
        kv_tokens: 1456,
    };

    #[test]
    fn openai_words_are_vllms_with_the_field_and_code() {
        let e = refusal(CONTEXT, Words::OpenAi("max_output_tokens"));
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let body = e.body().error;
        assert_eq!(body.kind, "invalid_request_error");
        assert_eq!(body.param.as_deref(), Some("max_output_tokens"));
        assert_eq!(body.code, Some("context_length_exceeded"));
        assert_eq!(
            body.message,
            "This model's maximum context length is 8192 tokens. However, you requested 1000000012 tokens (12 in the messages, 1000000000 in the completion). Please reduce the length of the messages or completion."
        );
        let body = refusal(SEQUENCE, Words::OpenAi("max_tokens")).body().error;
        assert_eq!(body.code, Some("kv_budget_exceeded"));
        assert!(
            body.message
                .starts_with("This instance's KV budget holds 1456 tokens")
        );
        assert!(body.message.contains("you requested 2020 tokens"));
    }

    #[test]
    fn anthropic_words_are_anthropics_own_for_the_context_and_the_budget_alike() {
        for (overrun, line) in [
            (CONTEXT, "12 + 1000000000 > 8192"),
            (SEQUENCE, "20 + 2000 > 1456"),
        ] {
            let e = anthropic::Error(refusal(overrun, Words::Anthropic));
            assert_eq!(e.status(), StatusCode::BAD_REQUEST);
            let body = e.body();
            assert_eq!(body.error.kind, "invalid_request_error");
            // Written as Anthropic writes it: no `max_tokens: ` in front, the message names it.
            assert_eq!(
                body.error.message,
                format!(
                    "input length and `max_tokens` exceed context limit: {line}, decrease input length or `max_tokens` and try again"
                )
            );
        }
    }

    #[test]
    fn choices_beyond_the_budget_name_n() {
        let overrun = Overrun::Choices {
            prompt_tokens: 28,
            max_tokens: 701,
            choices: 2,
            kv_tokens: 1456,
        };
        let body = refusal(overrun, Words::OpenAi("max_tokens")).body().error;
        assert_eq!(body.param.as_deref(), Some("n"));
        assert_eq!(body.code, Some("kv_budget_exceeded"));
        assert!(body.message.contains("need 1458 tokens of KV at once"));
        assert!(body.message.ends_with("lower n or max_tokens"));
    }
}
