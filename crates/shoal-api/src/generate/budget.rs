//! A budget for the model's thoughts (Anthropic's `thinking.budget_tokens`): [`ThinkingBudget`] is the
//! request's logits processor while the answer may think. It reads the answer as the reasoning
//! [`Splitter`] does, counts the tokens spent inside the thoughts, and when the budget is spent with the
//! thoughts still open, makes the model close them — `</think>` (blank text around it, as the templates
//! write it), or harmony's end of the analysis message and the final channel's header — one forced token
//! at a time; then the model answers freely. Thoughts the model closes itself within the budget are left
//! alone. As it is the request's processor, a continuation after a stage's death carries it over like
//! any constraint. A constrained answer (a schema, a forced call) does not think, so the two never meet.

use std::sync::Arc;

use shoal_engine::{ConstraintError, LogitsProcessor, TokenMask};
use shoal_model::tokenizer::{StreamDecoder, Tokenizer};

use super::reasoning::{Splitter, Syntax};

/// What closes a `<think>` block when the budget is spent.
const THINK_CLOSE: &str = "\n</think>\n\n";
/// What ends a harmony analysis message and opens the final answer.
const HARMONY_CLOSE: &str = "<|end|><|start|>assistant<|channel|>final<|message|>";

/// The thoughts' budget of one sequence (see the module doc).
#[derive(Clone)]
pub struct ThinkingBudget {
    tokenizer: Arc<Tokenizer>,
    splitter: Splitter,
    decoder: StreamDecoder,
    /// Tokens the thoughts may still take.
    left: u32,
    /// The tokens that close the thoughts.
    close: Arc<[u32]>,
    /// Forcing the close: the index of its next token.
    forcing: Option<usize>,
    /// The thoughts are over (closed by the model or forced): nothing is constrained any more.
    done: bool,
}

impl std::fmt::Debug for ThinkingBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThinkingBudget")
            .field("left", &self.left)
            .field("forcing", &self.forcing)
            .field("done", &self.done)
            .finish()
    }
}

impl ThinkingBudget {
    /// A budget of `budget` tokens for an answer in `syntax`, by the model's `tokenizer`.
    pub fn new(tokenizer: Arc<Tokenizer>, syntax: Syntax, budget: u32) -> Self {
        let close = match syntax {
            Syntax::Think { .. } => THINK_CLOSE,
            Syntax::Harmony { .. } => HARMONY_CLOSE,
        };
        let close: Arc<[u32]> = tokenizer.encode(close, true).into();
        Self {
            tokenizer,
            splitter: Splitter::new(syntax),
            decoder: StreamDecoder::new(),
            left: budget,
            close,
            forcing: None,
            done: false,
        }
    }

    fn only(&self, i: usize) -> TokenMask {
        TokenMask::allowing(self.tokenizer.vocab_size(), [self.close[i]])
    }
}

impl LogitsProcessor for ThinkingBudget {
    fn allowed(&mut self, _history: &[u32]) -> Result<Option<TokenMask>, ConstraintError> {
        if self.done {
            return Ok(None);
        }
        if let Some(i) = self.forcing {
            return Ok(Some(self.only(i)));
        }
        if self.left == 0 && self.splitter.in_thoughts() && !self.close.is_empty() {
            self.forcing = Some(0);
            return Ok(Some(self.only(0)));
        }
        Ok(None)
    }

    fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        if self.done {
            return Ok(());
        }
        if let Some(i) = self.forcing {
            if self.close.get(i) != Some(&token) {
                return Err(ConstraintError::new(format!(
                    "token {token} while the thoughts were being closed"
                )));
            }
            self.forcing = Some(i + 1);
            self.done = i + 1 == self.close.len();
            return Ok(());
        }
        let text = self.decoder.push(&self.tokenizer, token);
        self.splitter.push(&text);
        if self.splitter.in_thoughts() {
            self.left = self.left.saturating_sub(1);
        } else if self.splitter.answering() {
            self.done = true;
        }
        Ok(())
    }

    fn clone_box(&self) -> Box<dyn LogitsProcessor> {
        Box::new(self.clone())
    }
}
