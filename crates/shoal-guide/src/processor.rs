//! [`GuidedProcessor`]: one request's grammar state, as the engine's [`LogitsProcessor`].
//!
//! The core is [`GuidedProcessor::allowed`] — the [`TokenMask`] of tokens the grammar accepts next
//! (llguidance's `Matcher::compute_mask`: every end-of-generation token is in it exactly when the
//! grammar is complete; a grammar that cannot go on allows only those). [`LogitsProcessor::process`]
//! applies that mask to the row; [`LogitsProcessor::accept`] advances the parser by the token the
//! engine sampled. A parser that fails (a token it did not allow: only possible when something
//! outside changed the row's winner) allows only end-of-generation from then on, so the output
//! stops instead of going on unconstrained.

use std::fmt;
use std::sync::Mutex;

use llguidance::Matcher;
use shoal_engine::LogitsProcessor;

use crate::tokens::TokenMask;

/// A compiled constraint following one sequence.
pub struct GuidedProcessor {
    /// `process` takes `&self`; the matcher's mask computation needs `&mut`. Only the engine thread
    /// that owns the sequence ever locks it, so it is never contended.
    matcher: Mutex<Matcher>,
    /// Ids that end a generation (allowed alone once the parser has failed).
    eog: Vec<u32>,
    vocab_size: usize,
}

impl GuidedProcessor {
    pub(crate) fn new(matcher: Matcher, eog: Vec<u32>, vocab_size: usize) -> Self {
        Self {
            matcher: Mutex::new(matcher),
            eog,
            vocab_size,
        }
    }

    /// The tokens the grammar allows next.
    pub fn allowed(&self) -> TokenMask {
        let Ok(mut matcher) = self.matcher.lock() else {
            return self.only_end();
        };
        match matcher.compute_mask_or_eos() {
            Ok(vob) => TokenMask::from_vob(&vob),
            Err(e) => {
                tracing::warn!("constrained decoding stopped: {e}");
                self.only_end()
            }
        }
    }

    /// Whether the text so far is a complete sentence of the grammar.
    pub fn is_complete(&self) -> bool {
        self.matcher
            .lock()
            .ok()
            .and_then(|mut m| m.is_accepting().ok())
            .unwrap_or(false)
    }

    fn only_end(&self) -> TokenMask {
        TokenMask::only(self.vocab_size, &self.eog)
    }
}

impl fmt::Debug for GuidedProcessor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuidedProcessor")
            .field("vocab_size", &self.vocab_size)
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

impl LogitsProcessor for GuidedProcessor {
    fn process(&self, _history: &[u32], logits: &mut [f32]) {
        self.allowed().apply(logits);
    }

    fn accept(&mut self, token: u32) {
        let matcher = match self.matcher.get_mut() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        };
        if matcher.is_stopped() {
            return;
        }
        if let Err(e) = matcher.consume_token(token) {
            tracing::warn!(
                token,
                "constrained decoding: the sampled token broke the grammar: {e}"
            );
        }
    }

    fn clone_box(&self) -> Box<dyn LogitsProcessor> {
        let matcher = match self.matcher.lock() {
            Ok(m) => m.deep_clone(),
            Err(poisoned) => poisoned.into_inner().deep_clone(),
        };
        Box::new(GuidedProcessor::new(
            matcher,
            self.eog.clone(),
            self.vocab_size,
        ))
    }
}
