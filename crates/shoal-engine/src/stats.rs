//! The engine's live counters: [`Counters`], written by the engine thread and the handles where each
//! event happens, and [`EngineStats`], the snapshot tests, metrics, the dashboard and the instance's
//! published load read.
//!
//! Besides totals and gauges, the engine thread keeps recent averages of what finished requests measured
//! ([`Finished`]): time to first token and the decode rate of a sequence that ran alone (one stream),
//! each an exponentially weighted average updated once per finished request, never in the step loop.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Weight of the newest request in the recent averages (the first one sets them).
const RECENT_WEIGHT: f64 = 0.25;

/// Live counters of the engine, for tests, metrics and the dashboard.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
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
    /// Sequences waiting to resume after a preemption.
    pub preempted: usize,
    /// Requests finished (to their end: a stop or the length limit; each choice and each embedding
    /// counts one), not cancelled or failed ones.
    pub finished: u64,
    /// Decode rate of one stream, tokens per second: recent average over finished requests that ran
    /// alone (no other sequence in the engine while they ran); `None` until one did.
    pub decode_tok_s: Option<f64>,
    /// Time to first token (queued → first token sampled), milliseconds: recent average over finished
    /// requests; `None` until one finished.
    pub ttft_ms: Option<f64>,
    /// Speculative decoding: passes that verified a draft, tokens drafted and drafted tokens
    /// accepted (accepted / drafted: the acceptance rate; (accepted + passes) / passes: tokens per
    /// pass).
    pub spec_passes: u64,
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
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
            preempted: self.preempted + other.preempted,
            finished: self.finished + other.finished,
            decode_tok_s: weighted(
                self.decode_tok_s,
                other.decode_tok_s,
                self.finished,
                other.finished,
            ),
            ttft_ms: weighted(self.ttft_ms, other.ttft_ms, self.finished, other.finished),
            spec_passes: self.spec_passes + other.spec_passes,
            drafted_tokens: self.drafted_tokens + other.drafted_tokens,
            accepted_tokens: self.accepted_tokens + other.accepted_tokens,
        }
    }
}

/// The average of two engines' figures weighted by the requests each finished (plain when neither
/// finished any); one alone when the other has none.
fn weighted(a: Option<f64>, b: Option<f64>, wa: u64, wb: u64) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if wa + wb > 0 => {
            Some((a * wa as f64 + b * wb as f64) / (wa + wb) as f64)
        }
        (Some(a), Some(b)) => Some((a + b) / 2.0),
        (a, b) => a.or(b),
    }
}

/// What one request measured when it finished.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Finished {
    /// Queued → first token; `None` when it sampled none (an embedding).
    pub(crate) ttft: Option<Duration>,
    /// Tokens after the first per second of decoding, when it ran alone and decoded at least two.
    pub(crate) decode_tok_s: Option<f64>,
}

/// A recent average kept in atomics: its value (f64 bits) and how many samples it holds (0: none).
/// Written by the engine thread alone, read by anyone.
#[derive(Debug, Default)]
struct Recent {
    value: AtomicU64,
    samples: AtomicU64,
}

impl Recent {
    fn add(&self, x: f64) {
        let n = self.samples.load(Ordering::Relaxed);
        let old = f64::from_bits(self.value.load(Ordering::Relaxed));
        let new = if n == 0 {
            x
        } else {
            old + RECENT_WEIGHT * (x - old)
        };
        self.value.store(new.to_bits(), Ordering::Relaxed);
        self.samples.store(n + 1, Ordering::Relaxed);
    }

    fn get(&self) -> Option<f64> {
        (self.samples.load(Ordering::Relaxed) > 0)
            .then(|| f64::from_bits(self.value.load(Ordering::Relaxed)))
    }

    fn clear(&self) {
        self.samples.store(0, Ordering::Relaxed);
        self.value.store(0, Ordering::Relaxed);
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
    preempted: AtomicUsize,
    finished: AtomicU64,
    decode_tok_s: Recent,
    ttft_ms: Recent,
    spec_passes: AtomicU64,
    drafted: AtomicU64,
    accepted: AtomicU64,
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

    /// A pass verified `drafted` tokens and accepted `accepted`.
    pub(crate) fn speculated(&self, drafted: usize, accepted: usize) {
        self.spec_passes.fetch_add(1, Ordering::Relaxed);
        self.drafted.fetch_add(drafted as u64, Ordering::Relaxed);
        self.accepted.fetch_add(accepted as u64, Ordering::Relaxed);
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

    /// `n` sequences wait to resume after a preemption now.
    pub(crate) fn preempted_waiting(&self, n: usize) {
        self.preempted.store(n, Ordering::Relaxed);
    }

    /// A request ran to its end, having measured `what` (one call per finished request, on the engine
    /// thread).
    pub(crate) fn finished(&self, what: Finished) {
        self.finished.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = what.ttft {
            self.ttft_ms.add(t.as_secs_f64() * 1e3);
        }
        if let Some(r) = what.decode_tok_s {
            self.decode_tok_s.add(r);
        }
    }

    /// Forgets the totals and recent averages (the gauges stay): what an idle engine's warm-up counted
    /// is not the instance's work.
    pub(crate) fn reset_totals(&self) {
        for total in [
            &self.steps,
            &self.generated,
            &self.prefilled,
            &self.finished,
            &self.spec_passes,
            &self.drafted,
            &self.accepted,
        ] {
            total.store(0, Ordering::Relaxed);
        }
        self.decode_tok_s.clear();
        self.ttft_ms.clear();
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
            preempted: self.preempted.load(Ordering::Relaxed),
            finished: self.finished.load(Ordering::Relaxed),
            decode_tok_s: self.decode_tok_s.get(),
            ttft_ms: self.ttft_ms.get(),
            spec_passes: self.spec_passes.load(Ordering::Relaxed),
            drafted_tokens: self.drafted.load(Ordering::Relaxed),
            accepted_tokens: self.accepted.load(Ordering::Relaxed),
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
        c.preempted_waiting(3);
        c.speculated(4, 3);
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
                preempted: 3,
                finished: 0,
                decode_tok_s: None,
                ttft_ms: None,
                spec_passes: 1,
                drafted_tokens: 4,
                accepted_tokens: 3,
            }
        );
        c.ended(1);
        assert_eq!(c.snapshot().active_sequences, 0);
        assert_eq!(s.plus(s).prefilled_tokens, 14);
        assert_eq!(s.plus(s).accepted_tokens, 6);
    }

    #[test]
    fn recent_averages_follow_finished_requests_and_reset_with_the_totals() {
        let c = Counters::default();
        // An embedding: counted, no timing.
        c.finished(Finished::default());
        assert_eq!(c.snapshot().finished, 1);
        assert_eq!(
            (c.snapshot().ttft_ms, c.snapshot().decode_tok_s),
            (None, None)
        );
        c.finished(Finished {
            ttft: Some(Duration::from_millis(100)),
            decode_tok_s: Some(40.0),
        });
        // The first sample sets the average; later ones move it by RECENT_WEIGHT of the difference.
        assert_eq!(c.snapshot().ttft_ms, Some(100.0));
        c.finished(Finished {
            ttft: Some(Duration::from_millis(200)),
            decode_tok_s: None, // ran with others: not a one-stream rate
        });
        let s = c.snapshot();
        assert_eq!(s.finished, 3);
        assert_eq!(s.ttft_ms, Some(125.0));
        assert_eq!(s.decode_tok_s, Some(40.0));
        c.stepped();
        c.started();
        c.reset_totals();
        let s = c.snapshot();
        assert_eq!(
            (s.finished, s.steps, s.ttft_ms, s.decode_tok_s),
            (0, 0, None, None)
        );
        assert_eq!(s.active_sequences, 1, "gauges stay");
    }

    #[test]
    fn two_engines_average_their_rates_by_requests_finished() {
        let a = EngineStats {
            finished: 3,
            decode_tok_s: Some(10.0),
            ttft_ms: None,
            ..Default::default()
        };
        let b = EngineStats {
            finished: 1,
            decode_tok_s: Some(30.0),
            ttft_ms: Some(5.0),
            ..Default::default()
        };
        let s = a.plus(b);
        assert_eq!(
            (s.finished, s.decode_tok_s, s.ttft_ms),
            (4, Some(15.0), Some(5.0))
        );
        assert_eq!(
            EngineStats::default()
                .plus(EngineStats::default())
                .decode_tok_s,
            None
        );
    }
}
