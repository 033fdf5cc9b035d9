//! [`GuidedProcessor`]: one request's grammar state, as the engine's [`LogitsProcessor`].
//!
//! [`LogitsProcessor::allowed`] is llguidance's `Matcher::compute_mask` as the engine's [`TokenMask`]
//! (same bit layout: 32 ids a word, lowest id in bit 0): every end-of-generation token is in it
//! exactly when the grammar is complete, and a grammar that cannot go on allows only those.
//! [`LogitsProcessor::accept`] advances the parser by the token the engine took. A parser that fails
//! (a token it did not allow) is a [`ConstraintError`]: the engine ends the sequence with it.

use std::fmt;

use llguidance::Matcher;
use shoal_engine::{ConstraintError, LogitsProcessor, TokenMask};

/// A compiled constraint following one sequence.
pub struct GuidedProcessor {
    matcher: Matcher,
    vocab_size: usize,
}

impl GuidedProcessor {
    pub(crate) fn new(matcher: Matcher, vocab_size: usize) -> Self {
        Self {
            matcher,
            vocab_size,
        }
    }

    /// The tokens the grammar allows next.
    pub fn mask(&mut self) -> Result<TokenMask, ConstraintError> {
        let vob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| ConstraintError::new(e.to_string()))?;
        let mut words = vob.as_slice().to_vec();
        // Never wider than the vocabulary (llguidance pads to whole words).
        words.truncate(self.vocab_size.div_ceil(32));
        Ok(TokenMask::from_words(words))
    }

    /// Whether the text so far is a complete sentence of the grammar.
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

impl fmt::Debug for GuidedProcessor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuidedProcessor")
            .field("vocab_size", &self.vocab_size)
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl LogitsProcessor for GuidedProcessor {
    fn allowed(&mut self, _history: &[u32]) -> Result<Option<TokenMask>, ConstraintError> {
        self.mask().map(Some)
    }

    fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        if self.matcher.is_stopped() {
            // Complete: only an end-of-generation token may follow (the engine ends the sequence).
            let ends = self
                .matcher
                .tok_env()
                .is_ok_and(|env| env.tok_trie().eos_tokens().contains(&token));
            return if ends {
                Ok(())
            } else {
                Err(ConstraintError::new(format!(
                    "token {token} after the grammar was complete"
                )))
            };
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstraintError::new(format!("token {token}: {e}")))
    }

    fn clone_box(&self) -> Box<dyn LogitsProcessor> {
        Box::new(GuidedProcessor::new(
            self.matcher.deep_clone(),
            self.vocab_size,
        ))
    }
}
