//! Step planning as a pure function: every running sequence decodes one token first, then waiting
//! prompts are prefilled in chunks that fit the remaining token budget, oldest first. A long prompt is
//! split over several steps, so it never freezes the streams already running.

/// Limits of one engine step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBudget {
    /// Tokens processed per step, all sequences together.
    pub max_tokens: usize,
    /// Prefill tokens per step while some sequence is decoding. On a CPU, prefill and decode share the
    /// same cores, so every prefill token lengthens the running streams' inter-token latency; a small
    /// chunk keeps them flowing while a long prompt advances.
    pub max_prefill_while_decoding: usize,
}

/// What the planner needs to know of a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqView {
    /// Tokens not yet in the KV cache (1 for a decoding sequence, the rest of the prompt otherwise).
    pub pending: usize,
    /// Prompt fully computed: the sequence is decoding.
    pub decoding: bool,
}

/// Plans one step: `(index into seqs, tokens to feed)`, decodes first, in `seqs` order within each kind.
pub fn plan_step(seqs: &[SeqView], budget: StepBudget) -> Vec<(usize, usize)> {
    plan_micro_batch(seqs, budget, usize::MAX)
}

/// [`plan_step`] for one micro-batch of a pipeline: at most `max_seqs` sequences, so the others can form
/// the next micro-batch while this one is on a later stage.
pub fn plan_micro_batch(
    seqs: &[SeqView],
    budget: StepBudget,
    max_seqs: usize,
) -> Vec<(usize, usize)> {
    let mut left = budget.max_tokens.max(1);
    let mut plan = Vec::new();
    let max_seqs = max_seqs.max(1);
    for (i, s) in seqs.iter().enumerate() {
        if plan.len() == max_seqs {
            return plan;
        }
        if s.decoding && s.pending > 0 && left > 0 {
            plan.push((i, 1));
            left -= 1;
        }
    }
    if !plan.is_empty() {
        left = left.min(budget.max_prefill_while_decoding);
    }
    for (i, s) in seqs.iter().enumerate() {
        if left == 0 || plan.len() == max_seqs {
            break;
        }
        if !s.decoding && s.pending > 0 {
            let n = s.pending.min(left);
            plan.push((i, n));
            left -= n;
        }
    }
    plan
}

/// Step timings, as exponential moving averages, that size the prefill chunk taken while streams decode.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    /// Seconds of a step that only decodes (what an idle stream's inter-token latency is made of).
    pub decode_step: Option<f64>,
    /// Seconds per prefilled token.
    pub prefill_token: Option<f64>,
}

/// Weight of a new observation in the moving averages.
const EMA_WEIGHT: f64 = 0.2;

fn ema(old: Option<f64>, new: f64) -> Option<f64> {
    Some(old.map_or(new, |o| o + EMA_WEIGHT * (new - o)))
}

impl StepTimes {
    /// Records a step of `decodes` decode tokens and `prefill` prompt tokens that took `secs`.
    pub fn record(&mut self, decodes: usize, prefill: usize, secs: f64) {
        if !(secs.is_finite() && secs > 0.0) {
            return;
        }
        match (decodes, prefill) {
            (0, 0) => {}
            (_, 0) => self.decode_step = ema(self.decode_step, secs),
            (0, p) => self.prefill_token = ema(self.prefill_token, secs / p as f64),
            (_, p) => {
                if let Some(d) = self.decode_step {
                    let per = (secs - d).max(0.0) / p as f64;
                    self.prefill_token = ema(self.prefill_token, per);
                }
            }
        }
    }

    /// Prefill tokens a step may add to running decodes so it lasts at most `slack` times a decode-only
    /// step (the inter-token latency streams see while a long prompt is prefilled), capped at `max`.
    /// `None` slack, or no timings yet: `max`.
    pub fn prefill_chunk(&self, slack: Option<f64>, max: usize) -> usize {
        let (Some(slack), Some(d), Some(p)) = (slack, self.decode_step, self.prefill_token) else {
            return max;
        };
        if p <= 0.0 {
            return max;
        }
        let fits = ((slack - 1.0).max(0.0) * d / p).floor() as usize;
        fits.clamp(1, max.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_chunk_keeps_steps_within_the_slack() {
        let mut t = StepTimes::default();
        assert_eq!(t.prefill_chunk(Some(2.0), 16), 16, "no timings yet");
        t.record(4, 0, 0.020); // decode-only step: 20 ms
        t.record(0, 100, 0.500); // 5 ms per prompt token
        // 2x slack leaves 20 ms of prefill per step: 4 tokens.
        assert_eq!(t.prefill_chunk(Some(2.0), 16), 4);
        assert_eq!(t.prefill_chunk(Some(3.0), 16), 8);
        assert_eq!(t.prefill_chunk(Some(100.0), 16), 16, "capped");
        assert_eq!(t.prefill_chunk(Some(1.0), 16), 1, "always progress");
        assert_eq!(t.prefill_chunk(None, 16), 16, "off");
        // Mixed steps refine the per-token cost with the decode part taken out.
        t.record(4, 10, 0.020 + 10.0 * 0.010);
        assert!(t.prefill_token.unwrap() > 0.005);
        t.record(0, 0, 1.0);
        t.record(1, 0, f64::NAN);
        assert!(t.decode_step.unwrap() > 0.019 && t.decode_step.unwrap() < 0.021);
    }

    #[test]
    fn micro_batches_take_at_most_max_seqs_decodes_first() {
        let budget = StepBudget {
            max_tokens: 256,
            max_prefill_while_decoding: 16,
        };
        let pre = SeqView {
            pending: 40,
            decoding: false,
        };
        let idle = SeqView {
            pending: 0,
            decoding: true,
        };
        let seqs = [pre, dec(), idle, dec(), dec()];
        assert_eq!(plan_micro_batch(&seqs, budget, 2), vec![(1, 1), (3, 1)]);
        assert_eq!(
            plan_micro_batch(&seqs, budget, 4),
            vec![(1, 1), (3, 1), (4, 1), (0, 16)]
        );
        assert_eq!(
            plan_micro_batch(&seqs, budget, 0),
            vec![(1, 1)],
            "at least one"
        );
        assert_eq!(
            plan_step(&seqs, budget),
            plan_micro_batch(&seqs, budget, 99)
        );
    }

    fn dec() -> SeqView {
        SeqView {
            pending: 1,
            decoding: true,
        }
    }
    fn pre(n: usize) -> SeqView {
        SeqView {
            pending: n,
            decoding: false,
        }
    }

    #[test]
    fn decodes_come_first_then_prefill_fills_the_budget() {
        let seqs = [pre(100), dec(), dec()];
        assert_eq!(
            plan_step(
                &seqs,
                StepBudget {
                    max_tokens: 50,
                    max_prefill_while_decoding: 1000
                }
            ),
            vec![(1, 1), (2, 1), (0, 48)]
        );
    }

    #[test]
    fn long_prompt_is_chunked_and_never_starves_decodes() {
        let mut seqs = vec![pre(1000), dec()];
        let mut steps = 0;
        while seqs[0].pending > 0 {
            let plan = plan_step(
                &seqs,
                StepBudget {
                    max_tokens: 64,
                    max_prefill_while_decoding: 1000,
                },
            );
            assert!(
                plan.contains(&(1, 1)),
                "the running stream decodes every step"
            );
            for (i, n) in plan {
                if i == 0 {
                    seqs[0].pending -= n;
                }
            }
            steps += 1;
            assert!(steps < 100);
        }
        assert_eq!(steps, 1000usize.div_ceil(63));
    }

    #[test]
    fn prefill_is_throttled_only_while_something_decodes() {
        let b = StepBudget {
            max_tokens: 256,
            max_prefill_while_decoding: 16,
        };
        assert_eq!(plan_step(&[pre(1000)], b), vec![(0, 256)]);
        assert_eq!(
            plan_step(&[pre(1000), dec(), dec()], b),
            vec![(1, 1), (2, 1), (0, 16)]
        );
    }

    #[test]
    fn several_prompts_share_the_budget_oldest_first() {
        let seqs = [pre(10), pre(30), pre(5)];
        assert_eq!(
            plan_step(
                &seqs,
                StepBudget {
                    max_tokens: 32,
                    max_prefill_while_decoding: 1000
                }
            ),
            vec![(0, 10), (1, 22)]
        );
    }

    #[test]
    fn budget_never_exceeded() {
        let seqs: Vec<SeqView> = (0..10)
            .map(|i| if i % 2 == 0 { dec() } else { pre(7) })
            .collect();
        for max in 1..40 {
            let total: usize = plan_step(
                &seqs,
                StepBudget {
                    max_tokens: max,
                    max_prefill_while_decoding: 1000,
                },
            )
            .iter()
            .map(|p| p.1)
            .sum();
            assert!(total <= max);
        }
    }
}
