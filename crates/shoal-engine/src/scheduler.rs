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

#[cfg(test)]
mod tests {
    use super::*;

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
