//! What the engine's integration tests share.

use std::time::{Duration, Instant};

use shoal_engine::{EngineHandle, EngineStats};

/// Upper bound for waiting on the engine in these tests (generous for a loaded CI box).
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Polls `cond` on the engine's stats until it holds (bounded).
pub fn wait_for(engine: &EngineHandle, what: &str, cond: impl Fn(&EngineStats) -> bool) {
    let start = Instant::now();
    while !cond(&engine.stats()) {
        assert!(
            start.elapsed() < PATIENCE,
            "timed out waiting for {what}: {:?}",
            engine.stats()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}
