//! [`Meters`]: one engine's metrics, recorded through the `metrics` facade where each event happens
//! (the engine thread) and rendered by whatever recorder the binary installed (Prometheus at
//! `GET /metrics`; without one every call is a no-op).
//!
//! Every handle is registered once, when the engine starts, with the model's id as its `model` label:
//! the decode loop then only bumps atomics (a counter add, a histogram sample pushed into the
//! recorder's lock-free bucket) — no label formatting, no registry lookup, no lock per token. The
//! engine's own warm-up request is never counted.
//!
//! [`ShareMeter`]s are the exception: what a hosted pipeline stage holds is read at each scrape
//! ([`hosted_shares`]), so it leaves with the stage.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};

use crate::request::FinishReason;

/// Metric names, shared with the exporter's descriptions and the docs (`docs/monitoring/`).
pub mod names {
    pub const TTFT: &str = "shoal_time_to_first_token_seconds";
    pub const ITL: &str = "shoal_inter_token_latency_seconds";
    pub const E2E: &str = "shoal_request_duration_seconds";
    pub const STEP: &str = "shoal_engine_step_seconds";
    pub const PROMPT_TOKENS: &str = "shoal_prompt_tokens_total";
    pub const GENERATED_TOKENS: &str = "shoal_generated_tokens_total";
    pub const CACHED_TOKENS: &str = "shoal_cached_prompt_tokens_total";
    pub const REQUESTS: &str = "shoal_engine_requests_total";
    pub const PREEMPTIONS: &str = "shoal_preemptions_total";
    pub const PREFIX_LOOKUPS: &str = "shoal_prefix_cache_lookups_total";
    pub const PREFIX_HITS: &str = "shoal_prefix_cache_hits_total";
    pub const PREFIX_EVICTIONS: &str = "shoal_prefix_cache_evictions_total";
    pub const KV_POOL_CAPACITY: &str = "shoal_kv_pool_capacity_bytes";
    pub const KV_POOL_USED: &str = "shoal_kv_pool_used_bytes";
    pub const KV_POOL_IDLE: &str = "shoal_kv_pool_idle_bytes";
    pub const SPEC_PASSES: &str = "shoal_speculative_passes_total";
    pub const SPEC_DRAFTED: &str = "shoal_speculative_drafted_tokens_total";
    pub const SPEC_ACCEPTED: &str = "shoal_speculative_accepted_tokens_total";
    pub const SPEC_TOKENS_PER_PASS: &str = "shoal_speculative_tokens_per_pass";
}

/// One engine's metric handles, labelled with its model.
pub(crate) struct Meters {
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    step: Histogram,
    prompt_tokens: Counter,
    generated_tokens: Counter,
    cached_tokens: Counter,
    preemptions: Counter,
    prefix_lookups: Counter,
    prefix_hits: Counter,
    prefix_evictions: Counter,
    /// Sequences that ended, by outcome.
    stop: Counter,
    length: Counter,
    cancelled: Counter,
    failed: Counter,
    embedding: Counter,
    /// Speculative decoding: verification passes, drafted and accepted tokens, tokens per pass.
    spec_passes: Counter,
    spec_drafted: Counter,
    spec_accepted: Counter,
    spec_tokens: Histogram,
}

impl Meters {
    /// Registers the handles of model `model`'s engine.
    pub(crate) fn new(model: &str) -> Self {
        let m = model.to_string();
        let outcome =
            |o: &'static str| counter!(names::REQUESTS, "model" => m.clone(), "outcome" => o);
        Self {
            ttft: histogram!(names::TTFT, "model" => m.clone()),
            itl: histogram!(names::ITL, "model" => m.clone()),
            e2e: histogram!(names::E2E, "model" => m.clone()),
            step: histogram!(names::STEP, "model" => m.clone()),
            prompt_tokens: counter!(names::PROMPT_TOKENS, "model" => m.clone()),
            generated_tokens: counter!(names::GENERATED_TOKENS, "model" => m.clone()),
            cached_tokens: counter!(names::CACHED_TOKENS, "model" => m.clone()),
            preemptions: counter!(names::PREEMPTIONS, "model" => m.clone()),
            prefix_lookups: counter!(names::PREFIX_LOOKUPS, "model" => m.clone()),
            prefix_hits: counter!(names::PREFIX_HITS, "model" => m.clone()),
            prefix_evictions: counter!(names::PREFIX_EVICTIONS, "model" => m.clone()),
            stop: outcome("stop"),
            length: outcome("length"),
            cancelled: outcome("cancelled"),
            failed: outcome("failed"),
            embedding: outcome("embedding"),
            spec_passes: counter!(names::SPEC_PASSES, "model" => m.clone()),
            spec_drafted: counter!(names::SPEC_DRAFTED, "model" => m.clone()),
            spec_accepted: counter!(names::SPEC_ACCEPTED, "model" => m.clone()),
            spec_tokens: histogram!(names::SPEC_TOKENS_PER_PASS, "model" => m.clone()),
        }
    }

    /// A token was sampled for a sequence queued at `queued` whose previous token came at `last`
    /// (`None`: this is its first), delivered `now`.
    #[inline]
    pub(crate) fn token(&self, queued: Instant, last: Option<Instant>, now: Instant) {
        self.generated_tokens.increment(1);
        match last {
            Some(t) => self.itl.record(now.saturating_duration_since(t)),
            None => self.ttft.record(now.saturating_duration_since(queued)),
        }
    }

    /// A request was admitted with a prompt of `tokens`.
    pub(crate) fn admitted(&self, tokens: usize) {
        self.prompt_tokens.increment(tokens as u64);
    }

    /// The prefix cache was asked for a prompt; `cached` tokens came from it (0: a miss).
    pub(crate) fn prefix_lookup(&self, cached: usize) {
        self.prefix_lookups.increment(1);
        if cached > 0 {
            self.prefix_hits.increment(1);
            self.cached_tokens.increment(cached as u64);
        }
    }

    /// `n` cached prefixes were evicted.
    pub(crate) fn evicted(&self, n: usize) {
        if n > 0 {
            self.prefix_evictions.increment(n as u64);
        }
    }

    pub(crate) fn preempted(&self) {
        self.preemptions.increment(1);
    }

    /// A step (a batch through every stage, launched to outputs) took `took`.
    pub(crate) fn step(&self, took: Duration) {
        self.step.record(took);
    }

    /// A sequence queued at `queued` ended with `reason` (`None`: it failed).
    pub(crate) fn ended(&self, queued: Instant, reason: Option<FinishReason>) {
        let c = match reason {
            Some(FinishReason::Stop) => &self.stop,
            Some(FinishReason::Length) => &self.length,
            Some(FinishReason::Cancelled) => &self.cancelled,
            None => &self.failed,
        };
        c.increment(1);
        if matches!(reason, Some(FinishReason::Stop | FinishReason::Length)) {
            self.e2e.record(queued.elapsed());
        }
    }

    /// A pass verified `drafted` tokens, accepted `accepted` and gave the sequence `tokens`.
    pub(crate) fn speculated(&self, drafted: usize, accepted: usize, tokens: usize) {
        self.spec_passes.increment(1);
        self.spec_drafted.increment(drafted as u64);
        self.spec_accepted.increment(accepted as u64);
        self.spec_tokens.record(tokens as f64);
    }

    /// An embedding queued at `queued` was answered.
    pub(crate) fn embedded(&self, queued: Instant) {
        self.embedding.increment(1);
        self.e2e.record(queued.elapsed());
    }
}

/// The node's KV pool figures as gauges (capacity once, use on every change).
pub(crate) struct PoolGauges {
    used: Gauge,
    idle: Gauge,
}

impl PoolGauges {
    pub(crate) fn new(budget: usize) -> Self {
        gauge!(names::KV_POOL_CAPACITY).set(budget as f64);
        Self {
            used: gauge!(names::KV_POOL_USED),
            idle: gauge!(names::KV_POOL_IDLE),
        }
    }

    #[inline]
    pub(crate) fn used(&self, bytes: usize) {
        self.used.set(bytes as f64);
    }

    /// Bytes of freed KV buffers the pool keeps for reuse.
    #[inline]
    pub(crate) fn idle(&self, bytes: usize) {
        self.idle.set(bytes as f64);
    }
}

impl std::fmt::Debug for PoolGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PoolGauges")
    }
}

/// The live figures of one pipeline stage this node hosts for another node's engine: the KV tokens it
/// holds of its share. Read at each scrape ([`hosted_shares`], `shoal_kv_share_used_tokens`), not
/// recorded into the global recorder, so a stage that went has no series left (a gauge there would
/// stay, at its last value, forever).
#[derive(Debug)]
pub struct ShareMeter(Arc<ShareFigures>);

#[derive(Debug)]
struct ShareFigures {
    instance: String,
    stage: usize,
    used_tokens: AtomicUsize,
}

/// Every [`ShareMeter`] alive in this process (weak: a meter dropped with its stage leaves).
static SHARES: Mutex<Vec<Weak<ShareFigures>>> = Mutex::new(Vec::new());

impl ShareMeter {
    /// Registers stage `stage` of instance `instance`, holding nothing yet.
    pub fn new(instance: String, stage: usize) -> Self {
        let figures = Arc::new(ShareFigures {
            instance,
            stage,
            used_tokens: AtomicUsize::new(0),
        });
        if let Ok(mut live) = SHARES.lock() {
            live.retain(|w| w.strong_count() > 0);
            live.push(Arc::downgrade(&figures));
        }
        Self(figures)
    }

    /// The stage holds `tokens` of KV now (one relaxed store: cheap enough for every frame).
    #[inline]
    pub fn used(&self, tokens: usize) {
        self.0.used_tokens.store(tokens, Ordering::Relaxed);
    }
}

/// One hosted stage's figures as of now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostedShare {
    pub instance: String,
    pub stage: usize,
    pub used_tokens: usize,
}

/// The figures of every stage this process hosts now, by instance and stage.
pub fn hosted_shares() -> Vec<HostedShare> {
    let Ok(live) = SHARES.lock() else {
        return Vec::new();
    };
    let mut shares: Vec<HostedShare> = live
        .iter()
        .filter_map(Weak::upgrade)
        .map(|f| HostedShare {
            instance: f.instance.clone(),
            stage: f.stage,
            used_tokens: f.used_tokens.load(Ordering::Relaxed),
        })
        .collect();
    shares.sort_by(|a, b| (&a.instance, a.stage).cmp(&(&b.instance, b.stage)));
    shares
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    #[test]
    fn a_hosted_share_is_listed_while_its_meter_lives() {
        let mine = |s: &HostedShare| s.instance.starts_with("share-test-");
        let a = ShareMeter::new("share-test-a".into(), 1);
        let b = ShareMeter::new("share-test-b".into(), 2);
        a.used(42);
        let listed: Vec<HostedShare> = hosted_shares().into_iter().filter(mine).collect();
        assert_eq!(
            listed,
            [
                HostedShare {
                    instance: "share-test-a".into(),
                    stage: 1,
                    used_tokens: 42
                },
                HostedShare {
                    instance: "share-test-b".into(),
                    stage: 2,
                    used_tokens: 0
                },
            ]
        );
        drop(a);
        b.used(7);
        let listed: Vec<(String, usize)> = hosted_shares()
            .into_iter()
            .filter(mine)
            .map(|s| (s.instance, s.used_tokens))
            .collect();
        assert_eq!(listed, [("share-test-b".to_string(), 7)]);
    }

    #[test]
    fn events_reach_the_recorder_with_the_model_label() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let m = Meters::new("m1");
            let t0 = Instant::now();
            m.admitted(7);
            m.prefix_lookup(0);
            m.prefix_lookup(4);
            m.token(t0, None, t0 + Duration::from_millis(50));
            m.token(
                t0,
                Some(t0 + Duration::from_millis(50)),
                t0 + Duration::from_millis(70),
            );
            m.ended(t0, Some(FinishReason::Stop));
            m.ended(t0, None);
            m.evicted(2);
            m.preempted();
        });
        type Labelled = (String, Vec<(String, String)>, DebugValue);
        let values: Vec<Labelled> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(k, _, _, v)| {
                let key = k.key();
                let labels = key
                    .labels()
                    .map(|l| (l.key().to_string(), l.value().to_string()))
                    .collect();
                (key.name().to_string(), labels, v)
            })
            .collect();
        let get = |name: &str, outcome: Option<&str>| {
            values
                .iter()
                .find(|(n, l, _)| {
                    n == name
                        && l.contains(&("model".into(), "m1".into()))
                        && outcome.is_none_or(|o| l.contains(&("outcome".into(), o.into())))
                })
                .map(|(_, _, v)| v)
                .unwrap_or_else(|| panic!("{name} missing"))
        };
        assert_eq!(get(names::PROMPT_TOKENS, None), &DebugValue::Counter(7));
        assert_eq!(get(names::GENERATED_TOKENS, None), &DebugValue::Counter(2));
        assert_eq!(get(names::CACHED_TOKENS, None), &DebugValue::Counter(4));
        assert_eq!(get(names::PREFIX_LOOKUPS, None), &DebugValue::Counter(2));
        assert_eq!(get(names::PREFIX_HITS, None), &DebugValue::Counter(1));
        assert_eq!(get(names::PREFIX_EVICTIONS, None), &DebugValue::Counter(2));
        assert_eq!(get(names::PREEMPTIONS, None), &DebugValue::Counter(1));
        assert_eq!(get(names::REQUESTS, Some("stop")), &DebugValue::Counter(1));
        assert_eq!(
            get(names::REQUESTS, Some("failed")),
            &DebugValue::Counter(1)
        );
        let DebugValue::Histogram(ttft) = get(names::TTFT, None) else {
            panic!("ttft is a histogram")
        };
        assert_eq!(ttft.len(), 1);
        assert!((ttft[0].into_inner() - 0.05).abs() < 1e-9);
        let DebugValue::Histogram(itl) = get(names::ITL, None) else {
            panic!("itl is a histogram")
        };
        assert!((itl[0].into_inner() - 0.02).abs() < 1e-9);
        let DebugValue::Histogram(e2e) = get(names::E2E, None) else {
            panic!("e2e is a histogram")
        };
        assert_eq!(
            e2e.len(),
            1,
            "only the finished request, not the failed one"
        );
    }
}
