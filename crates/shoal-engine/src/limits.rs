//! What one request may ask of an instance: a token budget it can never hold is refused up front, as
//! vLLM does, rather than queued to be cut short (a sequence that outgrows the KV budget ends as if it
//! had hit its length limit) or to wait and preempt its own choices over and over.
//!
//! A sequence holds its prompt and every token it generates; it can never hold more than the model's
//! context nor more than the instance's KV budget ([`EngineHandle::kv_capacity`]: the node's budget, or
//! what the remote stages of a pipeline hold, if fewer). A request's `n` choices each copy the prompt's
//! KV and grow apart, so together they need `n` × (prompt + `max_tokens`). [`check`] is the rule;
//! [`EngineHandle::check_budget`] applies it with an instance's figures. Which API refuses and which
//! clamps is the API's choice (Ollama, like Ollama itself, takes `num_predict` as a cap).

use crate::handle::EngineHandle;

/// A request's token budget: its prompt, its `max_tokens` (`None`: until the context ends), its choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub prompt_tokens: usize,
    pub max_tokens: Option<u32>,
    pub choices: usize,
}

/// Why a budget can never be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Overrun {
    /// Prompt plus `max_tokens` beyond the model's context.
    #[error(
        "the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) is more than the model's context of {context_length} tokens"
    )]
    Context {
        prompt_tokens: usize,
        max_tokens: u32,
        context_length: usize,
    },
    /// Prompt plus `max_tokens` beyond what the instance's KV budget holds (fewer tokens than the
    /// context).
    #[error(
        "the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) is more than this instance's KV budget holds ({kv_tokens} tokens)"
    )]
    Sequence {
        prompt_tokens: usize,
        max_tokens: u32,
        kv_tokens: usize,
    },
    /// `n` choices of prompt plus `max_tokens` each beyond the instance's KV budget together.
    #[error(
        "{choices} choices of {prompt_tokens} prompt + {max_tokens} max_tokens need {} tokens of KV at once, more than this instance's KV budget holds ({kv_tokens} tokens)",
        Overrun::total(*choices, *prompt_tokens, *max_tokens)
    )]
    Choices {
        prompt_tokens: usize,
        max_tokens: u32,
        choices: usize,
        kv_tokens: usize,
    },
}

impl Overrun {
    /// Tokens `choices` sequences of `prompt` + `max_tokens` hold at their end.
    pub fn total(choices: usize, prompt: usize, max_tokens: u32) -> usize {
        choices.saturating_mul(prompt.saturating_add(max_tokens as usize))
    }

    /// The tokens the bound that was overrun holds: the context, or the KV budget.
    pub fn limit(&self) -> usize {
        match *self {
            Overrun::Context { context_length, .. } => context_length,
            Overrun::Sequence { kv_tokens, .. } | Overrun::Choices { kv_tokens, .. } => kv_tokens,
        }
    }

    /// A short, stable label (for metrics and logs).
    pub fn error_type(&self) -> &'static str {
        match self {
            Overrun::Context { .. } => "context_length_exceeded",
            Overrun::Sequence { .. } | Overrun::Choices { .. } => "kv_budget_exceeded",
        }
    }
}

/// Checks `budget` against a model of `context_length` tokens on an instance whose KV budget holds
/// `kv_tokens`. A budget without `max_tokens` asks for nothing beyond its prompt (the prompt itself is
/// checked where it is tokenized): it generates until the context or the budget ends.
pub fn check(context_length: usize, kv_tokens: usize, budget: Budget) -> Result<(), Overrun> {
    let Some(max_tokens) = budget.max_tokens else {
        return Ok(());
    };
    let prompt_tokens = budget.prompt_tokens;
    let one = Overrun::total(1, prompt_tokens, max_tokens);
    if one > context_length {
        return Err(Overrun::Context {
            prompt_tokens,
            max_tokens,
            context_length,
        });
    }
    if one > kv_tokens {
        return Err(Overrun::Sequence {
            prompt_tokens,
            max_tokens,
            kv_tokens,
        });
    }
    let choices = budget.choices.max(1);
    if Overrun::total(choices, prompt_tokens, max_tokens) > kv_tokens {
        return Err(Overrun::Choices {
            prompt_tokens,
            max_tokens,
            choices,
            kv_tokens,
        });
    }
    Ok(())
}

impl EngineHandle {
    /// [`check`] with this instance's context length and KV capacity.
    pub fn check_budget(&self, budget: Budget) -> Result<(), Overrun> {
        check(self.info().context_length, self.kv_capacity(), budget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(prompt_tokens: usize, max_tokens: Option<u32>, choices: usize) -> Budget {
        Budget {
            prompt_tokens,
            max_tokens,
            choices,
        }
    }

    #[test]
    fn a_budget_within_the_context_and_the_kv_passes_up_to_the_last_token() {
        assert_eq!(check(8192, 20_000, budget(100, Some(8092), 1)), Ok(()));
        assert!(check(8192, 20_000, budget(100, Some(8093), 1)).is_err());
        assert_eq!(check(8192, 20_000, budget(100, Some(4_900), 4)), Ok(()));
    }

    #[test]
    fn without_max_tokens_nothing_beyond_the_prompt_is_asked() {
        assert_eq!(check(8192, 1000, budget(900, None, 8)), Ok(()));
    }

    #[test]
    fn a_huge_max_tokens_overruns_the_context() {
        let e = check(8192, 20_000, budget(12, Some(1_000_000_000), 1));
        assert_eq!(
            e,
            Err(Overrun::Context {
                prompt_tokens: 12,
                max_tokens: 1_000_000_000,
                context_length: 8192
            })
        );
        assert_eq!(e.unwrap_err().error_type(), "context_length_exceeded");
        assert_eq!(e.unwrap_err().limit(), 8192);
        // u32::MAX plus a prompt does not wrap.
        assert!(
            check(
                usize::MAX - 1,
                usize::MAX,
                budget(usize::MAX - 2, Some(u32::MAX), 1)
            )
            .is_err()
        );
    }

    #[test]
    fn a_sequence_beyond_a_kv_budget_smaller_than_the_context_overruns_the_budget() {
        let e = check(8192, 1456, budget(20, Some(1437), 1)).unwrap_err();
        assert_eq!(
            e,
            Overrun::Sequence {
                prompt_tokens: 20,
                max_tokens: 1437,
                kv_tokens: 1456
            }
        );
        assert!(e.to_string().contains("KV budget holds (1456 tokens)"));
        assert_eq!(check(8192, 1456, budget(20, Some(1436), 1)), Ok(()));
    }

    #[test]
    fn choices_together_beyond_the_kv_budget_overrun_it() {
        let e = check(8192, 1456, budget(28, Some(701), 2)).unwrap_err();
        assert_eq!(
            e,
            Overrun::Choices {
                prompt_tokens: 28,
                max_tokens: 701,
                choices: 2,
                kv_tokens: 1456
            }
        );
        assert!(
            e.to_string()
                .starts_with("2 choices of 28 prompt + 701 max_tokens need 1458")
        );
        assert_eq!(e.error_type(), "kv_budget_exceeded");
        // Exactly the budget fits.
        assert_eq!(check(8192, 1456, budget(28, Some(700), 2)), Ok(()));
    }
}
