//! Speculative decoding's proposals: a [`DraftSource`] proposes the tokens that may come next, the
//! engine feeds them after the sequence's last token in one chunk, and the last stage verifies them
//! ([`crate::verify`]). [`NgramDraft`] is prompt lookup: it copies an earlier stretch of the
//! sequence's prompt and output, following the copy across a changed token (`draft::ngram`). A
//! draft model ([`crate::draft_model`]) or a model's own multi-token-prediction heads are other
//! [`DraftSource`]s.
//!
//! [`Adapt`] sizes each pass's draft for one sequence: it grows after a draft accepted whole, shrinks
//! after a rejection, is capped where one more drafted token is expected to cost more (its measured
//! share of a pass) than it brings (its measured acceptance), and turns speculation off for a while
//! when even one drafted token does not pay (then probes with one drafted token).

mod ngram;

pub use ngram::{MAX_NGRAM, NgramDraft, WINDOW};

/// Proposes tokens to verify for one sequence.
pub trait DraftSource: Send + std::fmt::Debug {
    /// Up to `max` tokens that may follow `tokens` (the sequence so far: prompt, then output).
    fn propose(&mut self, tokens: &[u32], max: usize) -> Vec<u32>;
}

/// A draft and how strongly the sequence so far supports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// Of the last [`WINDOW`] tokens, how many agree with the copy the draft continues.
    pub support: usize,
    /// The copy's last token disagreed (a substitution the draft steps over): its first drafted
    /// token is a guess that the copy resumes.
    pub resync: bool,
}

/// One sequence's speculation: where its drafts come from and how long they are.
#[derive(Debug)]
pub struct Speculator {
    pub source: Box<dyn DraftSource>,
    pub adapt: Adapt,
}

impl Speculator {
    pub fn new(source: Box<dyn DraftSource>, max_draft: usize) -> Self {
        Self {
            source,
            adapt: Adapt::new(max_draft),
        }
    }

    /// The next pass's draft for a sequence that is `tokens` so far: at most `room` tokens, and as
    /// many as [`Adapt::next_k`] says for a drafted token's measured `cost`.
    pub fn propose(&mut self, tokens: &[u32], room: usize, cost: Option<f64>) -> Vec<u32> {
        let k = self.adapt.next_k(cost).min(room);
        if k == 0 {
            return Vec::new();
        }
        self.source.propose(tokens, k)
    }
}

/// One sequence's draft length, adapted to what its passes measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Adapt {
    /// Drafted tokens the next pass proposes at most.
    k: usize,
    max: usize,
    /// Decayed counts of drafted tokens accepted and of rejections (each pass that stopped short):
    /// the acceptance probability of one drafted token is `accepted / (accepted + rejected)`.
    accepted: f64,
    rejected: f64,
    /// Tokens to generate without speculating before trying again.
    pause: usize,
    /// The next pass is a probe after a pause: it drafts at least one token whatever the estimate
    /// says (the estimate learns only from passes).
    probe: bool,
}

/// Weight the past keeps at each pass.
const DECAY: f64 = 0.9;
/// The pause after speculation did not pay, in tokens: a one-token probe after it costs a
/// drafted token's share of a step every this many tokens (a few percent at most).
const PAUSE: usize = 32;

impl Adapt {
    /// Starts at `min(4, max)` drafted tokens, acceptance assumed even.
    pub fn new(max: usize) -> Self {
        Self {
            k: max.min(4),
            max,
            accepted: 1.0,
            rejected: 1.0,
            pause: 0,
            probe: false,
        }
    }

    /// The measured probability that a drafted token is accepted.
    pub fn acceptance(&self) -> f64 {
        self.accepted / (self.accepted + self.rejected)
    }

    /// Drafted tokens for the next pass: the adapted length, capped where one more is expected to
    /// cost (`cost`: a drafted token's share of a pass over a plain step's time, when measured)
    /// more than it brings; 0 while paused. Call once per step the sequence decodes in.
    pub fn next_k(&mut self, cost: Option<f64>) -> usize {
        if self.pause > 0 {
            self.pause -= 1;
            self.probe = self.pause == 0;
            return 0;
        }
        let a = self.acceptance();
        let mut k = self.k;
        if let Some(c) = cost {
            // The j-th drafted token is used with probability a^j and costs c.
            k = 0;
            let mut p = 1.0;
            while k < self.k {
                p *= a;
                if p <= c {
                    break;
                }
                k += 1;
            }
        }
        if std::mem::take(&mut self.probe) {
            return k.max(1);
        }
        if k == 0 {
            self.pause = PAUSE;
        }
        k
    }

    /// Records a pass that drafted `drafted` tokens and accepted `accepted` of them.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.accepted = self.accepted * DECAY + accepted as f64;
        self.rejected = self.rejected * DECAY + f64::from(u8::from(accepted < drafted));
        if accepted == drafted {
            self.k = (self.k + 2).min(self.max);
        } else {
            self.k = (self.k - 1).min(accepted + 1).max(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_grows_on_full_acceptance_and_shrinks_on_rejection() {
        let mut a = Adapt::new(8);
        assert_eq!(a.next_k(None), 4);
        a.record(4, 4);
        assert_eq!(a.next_k(None), 6);
        a.record(6, 6);
        a.record(8, 8);
        assert_eq!(a.next_k(None), 8, "capped at the maximum");
        a.record(8, 1);
        assert_eq!(a.next_k(None), 2, "the accepted run and one more");
        a.record(2, 0);
        assert_eq!(a.next_k(None), 1, "never below one while on");
    }

    #[test]
    fn speculation_pauses_when_a_drafted_token_costs_more_than_it_brings() {
        let mut a = Adapt::new(8);
        for _ in 0..20 {
            a.record(1, 0);
        }
        assert!(a.acceptance() < 0.1);
        assert_eq!(a.next_k(Some(0.2)), 0);
        // Paused for PAUSE tokens, then one probe whatever the estimate; paused again if it fails.
        assert!((0..PAUSE).all(|_| a.next_k(Some(0.2)) == 0));
        assert_eq!(a.next_k(Some(0.2)), 1);
        a.record(1, 0);
        assert_eq!(a.next_k(Some(0.2)), 0);
        // A probe that succeeds, and another, bring the acceptance back over the cost.
        let mut d = a.clone();
        for _ in 0..PAUSE {
            d.next_k(Some(0.2));
        }
        assert_eq!(d.next_k(Some(0.2)), 1);
        d.record(1, 1);
        d.record(1, 1);
        assert!(d.next_k(Some(0.2)) >= 1, "{d:?}");
        // A well-accepted draft is kept long while tokens are cheap, cut where they are dear.
        let mut b = Adapt::new(8);
        for _ in 0..20 {
            b.record(8, 8);
        }
        assert_eq!(b.next_k(Some(0.01)), 8);
        // Acceptance 0.7: the 8th drafted token is used 6% of the time, the 3rd 34%.
        let c = Adapt {
            accepted: 7.0,
            rejected: 3.0,
            ..b
        };
        assert_eq!(c.clone().next_k(Some(0.05)), 8);
        assert_eq!(c.clone().next_k(Some(0.4)), 2);
    }
}
