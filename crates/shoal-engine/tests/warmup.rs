//! The warm-up and the measured figures on the real model: a warmed-up engine counts nothing and caches
//! nothing of its warm-up (its outputs are a cold engine's), fits the warm-up in a small KV room and
//! fails with the engine's own error where nothing fits; finished requests give the engine's recent
//! time to first token and one-stream decode rate (requests that ran beside others leave the rate alone).
//! A new engine leaves touched KV buffers in its node's pool, and a request growing through them takes
//! no fresh KV memory.

use std::time::Instant;

use shoal_engine::engine::{EngineConfig, spawn_from_gguf};
use shoal_engine::warmup::{
    TOUCHED_KV_TOKENS, WARM_UP_DECODE_TOKENS, WARM_UP_PROMPT_TOKENS, WARM_UP_TEXT,
};
use shoal_engine::{EngineError, EngineHandle, Event, Prompt, Usage};
use shoal_testkit::fixtures::model_path;

mod common;
use common::{PATIENCE, wait_for};

const MODEL: &str = "smollm2-135m-instruct-q4_1";

/// The test model on one thread, with KV room for `kv_tokens` tokens (the default budget if `None`).
fn engine(kv_tokens: Option<usize>) -> EngineHandle {
    // K and V × 30 layers × 3 KV heads × 64 values, f16 on CPU.
    let token_bytes = 2 * 30 * 3 * 64 * 2;
    let defaults = EngineConfig::default();
    let config = EngineConfig {
        threads: 1,
        kv_budget_bytes: kv_tokens.map_or(defaults.kv_budget_bytes, |t| t * token_bytes),
        ..defaults
    };
    spawn_from_gguf(&model_path(), MODEL, config).expect("engine")
}

/// A greedy generation of exactly `max_tokens` tokens (BOS added, EOS ignored): its tokens, usage and how long the client
/// waited for the first token and for all of them (seconds).
async fn generate(engine: &EngineHandle, prompt: &str, max_tokens: u32) -> (Vec<u32>, Usage, f64) {
    let mut req = common::greedy(MODEL, Prompt::Text(prompt.into()), max_tokens);
    req.add_bos = true;
    req.ignore_eos = true;
    let sent = Instant::now();
    let mut stream = engine.submit(req).expect("submit");
    let mut tokens = Vec::new();
    loop {
        match tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("engine stalled")
        {
            Some(Event::Token { id, .. }) => tokens.push(id),
            Some(Event::Done { usage, .. }) => {
                return (tokens, usage, sent.elapsed().as_secs_f64());
            }
            other => panic!("unexpected end: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_warmed_up_engine_counts_and_keeps_nothing_of_it_and_answers_as_a_cold_one() {
    let cold = engine(None);
    let warm = engine(None);
    let done = warm.warm_up().await.expect("warm-up");
    assert_eq!(done.prompt_tokens, WARM_UP_PROMPT_TOKENS);
    assert_eq!(done.generated_tokens, WARM_UP_DECODE_TOKENS as usize);
    // Its KV is released, not kept as a cached prefix (the gauge is published after the sequence ends).
    wait_for(&warm, "the warm-up's KV to be freed", |s| s.kv_tokens == 0);
    let s = warm.stats();
    assert_eq!(
        (s.steps, s.generated_tokens, s.prefilled_tokens, s.finished),
        (0, 0, 0, 0),
        "{s:?}"
    );
    assert_eq!(
        (s.decode_tok_s, s.ttft_ms, s.active_sequences),
        (None, None, 0)
    );
    // A prompt that starts as the warm-up's did reuses nothing and gives what a cold engine gives.
    let (tokens, usage, _) = generate(&warm, WARM_UP_TEXT, 12).await;
    let (expected, _, _) = generate(&cold, WARM_UP_TEXT, 12).await;
    assert_eq!(usage.cached_tokens, 0);
    assert_eq!(tokens, expected);
    assert_eq!(warm.stats().finished, 1);
}

#[tokio::test]
async fn the_warm_up_fits_a_small_kv_room_and_fails_with_the_engine_error_where_nothing_fits() {
    // Room for 10 tokens: the prompt shrinks so it and its decode steps fit.
    let small = engine(Some(10));
    assert_eq!(small.kv_capacity(), 10);
    let done = small.warm_up().await.expect("warm-up in 10 tokens");
    assert_eq!(
        (done.prompt_tokens, done.generated_tokens),
        (
            10 - WARM_UP_DECODE_TOKENS as usize - 1,
            WARM_UP_DECODE_TOKENS as usize
        )
    );
    // Room for one token: not even a one-token prompt and its first token fit.
    let none = engine(Some(1));
    let err = none.warm_up().await.expect_err("nothing fits");
    assert!(matches!(err, EngineError::PromptTooLong { .. }), "{err:?}");
}

#[tokio::test]
async fn finished_requests_give_the_recent_ttft_and_one_stream_decode_rate() {
    let engine = engine(None);
    assert_eq!(engine.stats().finished, 0);
    let (tokens, _, total) = generate(&engine, "The capital of France is", 16).await;
    let s = engine.stats();
    assert_eq!(s.finished, 1);
    let (rate, ttft) = (s.decode_tok_s.expect("a rate"), s.ttft_ms.expect("a TTFT"));
    // Measured inside what the client waited: the first token came before the end, and the decode
    // (tokens after the first) took at most the whole request.
    assert!(
        ttft > 0.0 && ttft <= total * 1e3,
        "TTFT {ttft} ms of {total} s"
    );
    let floor = (tokens.len() - 1) as f64 / total;
    assert!(
        rate >= floor && rate.is_finite(),
        "{rate} tok/s, at least {floor}"
    );
    // Two at once: both finish and move the TTFT average, but neither ran alone, so the one-stream
    // rate stays what it was.
    let (a, b) = tokio::join!(
        generate(&engine, "Name three rivers:", 16),
        generate(&engine, "Count to ten:", 16)
    );
    assert_eq!((a.0.len(), b.0.len()), (16, 16));
    let s = engine.stats();
    assert_eq!(s.finished, 3);
    assert_eq!(s.decode_tok_s, Some(rate));
    assert_ne!(s.ttft_ms, Some(ttft));
}

#[tokio::test]
async fn a_request_growing_through_the_touched_kv_sizes_takes_no_fresh_kv_memory() {
    let token_bytes = 2 * 30 * 3 * 64 * 2;
    let budget = 4096 * token_bytes;
    let pool = std::sync::Arc::new(shoal_engine::kvpool::KvPool::new(budget));
    let config = EngineConfig {
        threads: 1,
        prefix_cache_tokens: 0, // every finished sequence's buffers go back to the pool
        kv_pool: Some(pool.clone()),
        ..EngineConfig::default()
    };
    let engine = spawn_from_gguf(&model_path(), MODEL, config).expect("engine");
    let touched: usize = TOUCHED_KV_TOKENS.iter().sum::<usize>() * token_bytes;
    assert_eq!((pool.idle(), pool.reserved()), (touched, 0));
    // A prompt of more than 128 tokens, decoded past 256: the cache takes the 256 and then the 512
    // tokens' buffers (it holds kept buffers while it runs), and gives every one back.
    let mut req = common::greedy(MODEL, Prompt::Text(WARM_UP_TEXT.repeat(6)), 120);
    req.ignore_eos = true;
    let mut stream = engine.submit(req).expect("submit");
    let (mut tokens, mut in_use) = (0, None);
    let usage = loop {
        match tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("engine stalled")
        {
            Some(Event::Token { .. }) => {
                tokens += 1;
                if tokens == 110 {
                    in_use = Some(pool.idle());
                }
            }
            Some(Event::Done { usage, .. }) => break usage,
            other => panic!("unexpected end: {other:?}"),
        }
    };
    assert_eq!(tokens, 120);
    let total = usage.prompt_tokens + 120;
    assert!(
        usage.prompt_tokens > 128 && total > 256 && total <= 512,
        "{usage:?}"
    );
    assert_eq!(
        in_use,
        Some(touched - 512 * token_bytes),
        "past 256 tokens the sequence holds the 512 tokens' buffers"
    );
    wait_for(&engine, "the request's KV to be freed", |s| {
        s.kv_tokens == 0
    });
    assert_eq!(
        (pool.idle(), pool.reserved()),
        (touched, 0),
        "every buffer the request used came from the pool and went back to it"
    );
}
