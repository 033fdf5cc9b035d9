//! The engine's live counters: [`Counters`], written by the engine thread and the handles where each
//! event happens, and [`EngineStats`], the snapshot tests, metrics and the dashboard read.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Live counters of the engine, for tests, metrics and the dashboard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineStats {
    /// Sequences currently holding KV (prefilling or decoding).
    pub active_sequences: usize,
    /// Requests waiting for admission.
    pub waiting: usize,
    /// Engine steps run so far.
    pub steps: u64,
    /// Tokens sampled so far, all sequences.
    pub generated_tokens: u64,
    /// Prompt tokens prefilled so far.
    pub prefilled_tokens: u64,
    /// Tokens of KV held: running sequences plus cached prefixes (bounded by the KV budget).
    pub kv_tokens: usize,
    /// Sequence KV caches held across all stages (a sequence in an n-stage pipeline holds n).
    pub stage_sequences: usize,
}

impl EngineStats {
    /// Both engines' counters added up (a node's total over its engines).
    pub fn plus(self, other: EngineStats) -> EngineStats {
        EngineStats {
            active_sequences: self.active_sequences + other.active_sequences,
            waiting: self.waiting + other.waiting,
            steps: self.steps + other.steps,
            generated_tokens: self.generated_tokens + other.generated_tokens,
            prefilled_tokens: self.prefilled_tokens + other.prefilled_tokens,
            kv_tokens: self.kv_tokens + other.kv_tokens,
            stage_sequences: self.stage_sequences + other.stage_sequences,
        }
    }
}

/// Counters shared between one engine thread and its handles (relaxed atomics: each is a gauge or a
/// total read on its own, never used to order other memory).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    active: AtomicUsize,
    waiting: AtomicUsize,
    steps: AtomicU64,
    generated: AtomicU64,
    prefilled: AtomicU64,
    kv_tokens: AtomicUsize,
    stage_sequences: AtomicUsize,
}

impl Counters {
    /// A handle queued a request for the engine.
    pub(crate) fn queued(&self) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` queued requests left the wait list (admitted, refused, cancelled or timed out).
    pub(crate) fn dequeued(&self, n: usize) {
        self.waiting.fetch_sub(n, Ordering::Relaxed);
    }

    /// A request became a sequence.
    pub(crate) fn started(&self) {
        self.active.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` sequences ended (finished, failed, cancelled or timed out).
    pub(crate) fn ended(&self, n: usize) {
        self.active.fetch_sub(n, Ordering::Relaxed);
    }

    /// A batch was launched.
    pub(crate) fn stepped(&self) {
        self.steps.fetch_add(1, Ordering::Relaxed);
    }

    /// A token was sampled for some sequence.
    pub(crate) fn generated(&self) {
        self.generated.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` prompt tokens were prefilled.
    pub(crate) fn prefilled(&self, n: usize) {
        self.prefilled.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// What the engine holds now: KV tokens (sequences + cached prefixes) and sequence caches over all
    /// stages.
    pub(crate) fn holding(&self, kv_tokens: usize, stage_sequences: usize) {
        self.kv_tokens.store(kv_tokens, Ordering::Relaxed);
        self.stage_sequences
            .store(stage_sequences, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> EngineStats {
        EngineStats {
            active_sequences: self.active.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            steps: self.steps.load(Ordering::Relaxed),
            generated_tokens: self.generated.load(Ordering::Relaxed),
            prefilled_tokens: self.prefilled.load(Ordering::Relaxed),
            kv_tokens: self.kv_tokens.load(Ordering::Relaxed),
            stage_sequences: self.stage_sequences.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_follow_events_and_stats_add_up() {
        let c = Counters::default();
        c.queued();
        c.queued();
        c.dequeued(1);
        c.started();
        c.stepped();
        c.generated();
        c.prefilled(7);
        c.holding(12, 2);
        let s = c.snapshot();
        assert_eq!(
            s,
            EngineStats {
                active_sequences: 1,
                waiting: 1,
                steps: 1,
                generated_tokens: 1,
                prefilled_tokens: 7,
                kv_tokens: 12,
                stage_sequences: 2,
            }
        );
        c.ended(1);
        assert_eq!(c.snapshot().active_sequences, 0);
        assert_eq!(s.plus(s).prefilled_tokens, 14);
    }
}
