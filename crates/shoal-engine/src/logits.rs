//! [`LogitsProcessor`]: per-request code that says which tokens a sequence may take next (constrained
//! decoding: JSON schemas, grammars, banned tokens), carried on
//! [`crate::GenerateRequest::logits_processor`], and [`TokenMask`], its answer.
//!
//! The engine owns one processor per sequence and asks it, on the engine thread, for the
//! [`TokenMask`] of the sequence's next token before the step that samples it
//! ([`LogitsProcessor::allowed`], in `Sequence::refresh_mask`); the mask travels with the step to
//! whichever stage samples — in this process or on another node, in the sample job — and
//! [`crate::stage::sample_row`] sets every token it does not allow to `-inf` before the sampler draws.
//! Then the engine tells the processor the token taken ([`LogitsProcessor::accept`], in
//! `Sequence::push`). An unconstrained sequence has no processor and no mask, and pays nothing.

use std::fmt::Debug;

/// The tokens a sequence may take next: token `t` is allowed when bit `t % 32` of word `t / 32` is set
/// (llguidance's bitmask layout). Tokens past the last word are not allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
}

impl TokenMask {
    /// A mask from its words.
    pub fn from_words(words: Vec<u32>) -> Self {
        Self { words }
    }

    /// The mask of a `vocab`-token vocabulary allowing exactly `allowed` (ids past `vocab` ignored).
    pub fn allowing(vocab: usize, allowed: impl IntoIterator<Item = u32>) -> Self {
        let mut words = vec![0u32; vocab.div_ceil(32)];
        for t in allowed {
            if (t as usize) < vocab {
                words[t as usize / 32] |= 1 << (t % 32);
            }
        }
        Self { words }
    }

    /// The mask of a `vocab`-token vocabulary allowing everything but `banned`.
    pub fn banning(vocab: usize, banned: impl IntoIterator<Item = u32>) -> Self {
        let mut mask = Self::allowing(vocab, 0..vocab as u32);
        for t in banned {
            if let Some(w) = mask.words.get_mut(t as usize / 32) {
                *w &= !(1 << (t % 32));
            }
        }
        mask
    }

    /// Whether token `t` is allowed.
    pub fn allows(&self, t: u32) -> bool {
        self.words
            .get(t as usize / 32)
            .is_some_and(|w| w & (1 << (t % 32)) != 0)
    }

    /// Whether no token at all is allowed (the sequence cannot go on).
    pub fn allows_none(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    pub fn words(&self) -> &[u32] {
        &self.words
    }

    pub fn into_words(self) -> Vec<u32> {
        self.words
    }

    /// Sets every logit the mask does not allow to `-inf` (a row longer than the mask loses its tail).
    pub fn apply(&self, logits: &mut [f32]) {
        for (i, chunk) in logits.chunks_mut(32).enumerate() {
            match self.words.get(i).copied().unwrap_or(0) {
                u32::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                w => {
                    for (b, l) in chunk.iter_mut().enumerate() {
                        if w & (1 << b) == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
    }
}

/// A constraint that cannot go on (a grammar error, a token it cannot accept). The sequence ends with
/// this error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("constrained decoding failed: {0}")]
pub struct ConstraintError(pub String);

impl ConstraintError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// Says which tokens one sequence may take next, and follows the tokens it takes.
pub trait LogitsProcessor: Send + Debug {
    /// The tokens allowed for the sequence's next token; `Ok(None)`: no constraint on this one.
    /// `history` is the sequence so far, prompt first. Asked once per token, on the engine thread,
    /// before the step that samples it.
    fn allowed(&mut self, history: &[u32]) -> Result<Option<TokenMask>, ConstraintError>;
    /// The token the sequence took (one the last mask allowed), in order, once each.
    fn accept(&mut self, token: u32) -> Result<(), ConstraintError>;
    /// A copy with the same state, for a copy of the request (each sequence has its own).
    fn clone_box(&self) -> Box<dyn LogitsProcessor>;
}

impl Clone for Box<dyn LogitsProcessor> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SamplingParams;
    use crate::sampler::Sampler;

    /// Bans one token, and remembers what was accepted.
    #[derive(Debug, Clone)]
    struct Ban {
        token: u32,
        vocab: usize,
        accepted: Vec<u32>,
    }

    impl LogitsProcessor for Ban {
        fn allowed(&mut self, _history: &[u32]) -> Result<Option<TokenMask>, ConstraintError> {
            Ok(Some(TokenMask::banning(self.vocab, [self.token])))
        }
        fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
            self.accepted.push(token);
            Ok(())
        }
        fn clone_box(&self) -> Box<dyn LogitsProcessor> {
            Box::new(self.clone())
        }
    }

    #[test]
    fn a_processor_that_bans_a_token_makes_the_sampler_pick_another() {
        let greedy = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        let mut processor: Box<dyn LogitsProcessor> = Box::new(Ban {
            token: 2,
            vocab: 4,
            accepted: Vec::new(),
        });
        let history = [5, 6];
        let mut row = vec![0.1, 0.5, 3.0, 1.0];
        assert_eq!(
            Sampler::new(greedy.clone(), 1).sample(&mut row.clone(), &history),
            2
        );
        let mask = processor.allowed(&history).unwrap().unwrap();
        mask.apply(&mut row);
        assert_eq!(row, [0.1, 0.5, f32::NEG_INFINITY, 1.0]);
        let picked = Sampler::new(greedy, 1).sample(&mut row, &history);
        assert_eq!(picked, 3, "the banned favourite is never drawn");
        processor.accept(picked).unwrap();
        // A copy of the request gets its own state.
        let mut copy = processor.clone();
        copy.accept(1).unwrap();
        assert_eq!(
            format!("{processor:?}"),
            "Ban { token: 2, vocab: 4, accepted: [3] }"
        );
        assert_eq!(
            format!("{copy:?}"),
            "Ban { token: 2, vocab: 4, accepted: [3, 1] }"
        );
    }

    #[test]
    fn a_mask_allows_its_bits_and_nothing_past_its_words() {
        let m = TokenMask::allowing(70, [0, 31, 32, 69, 500]);
        assert_eq!(m.words(), [0x8000_0001, 0x0000_0001, 0x20]);
        assert!(m.allows(0) && m.allows(31) && m.allows(32) && m.allows(69));
        assert!(!m.allows(1) && !m.allows(68) && !m.allows(96) && !m.allows(500));
        let mut row: Vec<f32> = (0..100).map(|i| i as f32).collect();
        m.apply(&mut row);
        for (t, l) in row.iter().enumerate() {
            assert_eq!(l.is_finite(), m.allows(t as u32), "token {t}");
        }
        assert!(!m.allows_none());
        assert!(TokenMask::allowing(70, []).allows_none());
        let b = TokenMask::banning(40, [3, 39]);
        assert!((0..40).all(|t| b.allows(t) == (t != 3 && t != 39)));
        assert!(!b.allows(40));
    }
}
