#![allow(dead_code)] // each test binary uses a different subset
//! What the engine's integration tests share.

pub mod scripted;

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use shoal_engine::{
    EngineHandle, EngineStats, Event, FinishReason, GenerateRequest, Prompt, RequestStream,
    SamplingParams, TopLogprob, Usage,
};

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
        speculative: None,
    }
}

/// What a stream sent: each token's id, logprob and alternatives, then how it finished.
pub struct Drained {
    pub tokens: Vec<(u32, f32, Vec<TopLogprob>)>,
    pub finish: FinishReason,
    pub usage: Usage,
}

impl Drained {
    pub fn ids(&self) -> Vec<u32> {
        self.tokens.iter().map(|t| t.0).collect()
    }
}

/// Submits `req` to `engine` and drains it: the token ids it generated.
pub async fn ids(engine: &EngineHandle, req: GenerateRequest) -> Vec<u32> {
    let mut stream = engine.submit(req).expect("submit");
    drain(&mut stream)
        .await
        .tokens
        .iter()
        .map(|t| t.0)
        .collect()
}

/// Reads `stream` to its `Done` (panics on anything else, or when the engine stalls).
pub async fn drain(stream: &mut RequestStream) -> Drained {
    let mut tokens = Vec::new();
    loop {
        match tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("engine stalled")
        {
            Some(Event::Token {
                id,
                logprob,
                top_logprobs,
                ..
            }) => tokens.push((id, logprob, top_logprobs)),
            Some(Event::Done {
                finish_reason,
                usage,
                ..
            }) => {
                return Drained {
                    tokens,
                    finish: finish_reason,
                    usage,
                };
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
