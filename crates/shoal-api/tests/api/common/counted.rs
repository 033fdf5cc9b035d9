//! An engine of its own for the tests that read the engine's counters (`cancel`, `disconnect`): no other
//! test's sequences show up in them when the tests share a process (`cargo test`). Its `engine`, `state`
//! and `post_json` shadow `common`'s where imported by name; the other helpers of `common` go to the
//! shared engine.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use shoal_api::ApiState;
use shoal_engine::EngineHandle;

use super::{Reply, post_raw, send_with, spawn_engine};

/// Tests that read this engine's counters run one at a time.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub fn engine() -> EngineHandle {
    static ENGINE: OnceLock<EngineHandle> = OnceLock::new();
    ENGINE.get_or_init(spawn_engine).clone()
}

pub fn state() -> ApiState {
    ApiState::new(engine())
}

pub async fn post_json(uri: &str, body: &Value) -> Reply {
    send_with(
        state(),
        post_raw(uri, Some("application/json"), body.to_string()),
    )
    .await
}

/// Waits (up to `within`) until the engine holds no sequence, running or queued; returns the tokens it
/// generated so far.
pub async fn wait_idle(what: &str, within: Duration) -> u64 {
    let engine = engine();
    let deadline = Instant::now() + within;
    loop {
        let s = engine.stats();
        if s.active_sequences == 0 && s.waiting == 0 {
            return s.generated_tokens;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: engine still busy after {within:?}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
