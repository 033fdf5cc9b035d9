#![allow(dead_code)] // each test binary uses a different subset
//! What the engine's integration tests share.

pub mod scripted;

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use shoal_engine::{EngineHandle, EngineStats, GenerateRequest, Prompt, SamplingParams};

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

/// A greedy request for `model` of at most `max_tokens` tokens, no stop strings, no BOS added.
pub fn greedy(model: &str, prompt: Prompt, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        model: model.into(),
        prompt,
        sampling: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        max_tokens: NonZeroU32::new(max_tokens),
        stop: Vec::new(),
        add_bos: false,
        ignore_eos: false,
        timeout: None,
        logits_processor: None,
    }
}
