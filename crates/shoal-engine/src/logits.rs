//! [`LogitsProcessor`]: per-request code that masks or adjusts a row of logits before it is sampled
//! (constrained decoding: JSON schemas, grammars, banned tokens), carried on
//! [`crate::GenerateRequest::logits_processor`].
//!
//! The engine owns one processor per sequence: it tells it every token the sequence accepts
//! ([`LogitsProcessor::accept`], in `Sequence::push`), and the sampling path calls
//! [`LogitsProcessor::process`] on the sequence's row just before drawing from it
//! ([`crate::stage::sample_row`], through the sequence's [`crate::stage::SampleRef`]). A processor is
//! plain code, so it runs only where the engine that owns it runs: an engine whose pipeline samples on
//! another node refuses a request that carries one (`EngineHandle::submit`), never ignores it.

use std::fmt::Debug;

/// Masks or adjusts the logits of one sequence before each sample, and follows the tokens it accepts.
pub trait LogitsProcessor: Send + Sync + Debug {
    /// Adjusts `logits` (one row, vocabulary-sized) in place before the sampler draws from it: a banned
    /// token is set to `f32::NEG_INFINITY`. `history` is the sequence so far, prompt first.
    fn process(&self, history: &[u32], logits: &mut [f32]);
    /// The token the sequence accepted after the last [`LogitsProcessor::process`] (in order, once
    /// each).
    fn accept(&mut self, token: u32);
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
        accepted: Vec<u32>,
    }

    impl LogitsProcessor for Ban {
        fn process(&self, _history: &[u32], logits: &mut [f32]) {
            if let Some(l) = logits.get_mut(self.token as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        fn accept(&mut self, token: u32) {
            self.accepted.push(token);
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
            accepted: Vec::new(),
        });
        let history = [5, 6];
        let mut row = vec![0.1, 0.5, 3.0, 1.0];
        assert_eq!(
            Sampler::new(greedy.clone(), 1).sample(&mut row.clone(), &history),
            2
        );
        processor.process(&history, &mut row);
        let picked = Sampler::new(greedy, 1).sample(&mut row, &history);
        assert_eq!(picked, 3, "the banned favourite is never drawn");
        processor.accept(picked);
        // A copy of the request gets its own state.
        let mut copy = processor.clone();
        copy.accept(1);
        assert_eq!(format!("{processor:?}"), "Ban { token: 2, accepted: [3] }");
        assert_eq!(format!("{copy:?}"), "Ban { token: 2, accepted: [3, 1] }");
    }
}
