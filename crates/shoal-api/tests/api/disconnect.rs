//! A client that goes away cancels its generation: dropping the SSE body (streaming, OpenAI's and
//! Anthropic's) or the handler future (non-streaming) drops the `RequestStream`, and the engine frees the
//! sequence. On an engine of this file's own.

use std::time::{Duration, Instant};

use crate::common::counted::{self, SERIAL, engine, post_json, state};
use crate::common::*;
use axum::http::StatusCode;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use shoal_api::router;
use tower::ServiceExt;

const LONG: u32 = 4000;

/// Tokens the engine may still produce between the client leaving and its next step noticing.
const SLACK: u64 = 16;

/// Waits until the engine holds no sequence; returns the tokens generated meanwhile.
async fn wait_idle(what: &str) -> u64 {
    counted::wait_idle(what, Duration::from_secs(30)).await
}

/// `ignore_eos` so the generation can only end by cancellation or after `LONG` tokens.
fn long_body(stream: bool) -> String {
    chat_body(
        "What is the capital of France?",
        json!({"max_tokens": LONG, "temperature": 0, "ignore_eos": true, "stream": stream}),
    )
    .to_string()
}

#[tokio::test]
async fn dropping_the_stream_cancels_generation() {
    let _serial = SERIAL.lock().await;
    wait_idle("before").await;
    let before = engine().stats().generated_tokens;
    let request = post_raw(
        "/v1/chat/completions",
        Some("application/json"),
        long_body(true),
    );
    let response = router(state()).oneshot(request).await.expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    // Read until some content arrived, so the sequence is surely running.
    let mut seen = String::new();
    while !seen.contains("\"content\":\"") || seen.matches("data:").count() < 3 {
        let frame = body
            .frame()
            .await
            .expect("stream ended early")
            .expect("frame");
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
    assert!(engine().stats().active_sequences >= 1);
    drop(body); // the client went away
    let at_drop = engine().stats().generated_tokens;
    let after = wait_idle("after dropping the SSE body").await;
    assert!(
        after - at_drop <= SLACK,
        "{} tokens generated after the client left",
        after - at_drop
    );
    assert!(after - before < u64::from(LONG));
}

#[tokio::test]
async fn dropping_a_non_streaming_request_cancels_generation() {
    let _serial = SERIAL.lock().await;
    wait_idle("before").await;
    let before = engine().stats().generated_tokens;
    let request = post_raw(
        "/v1/chat/completions",
        Some("application/json"),
        long_body(false),
    );
    let task = tokio::spawn(router(state()).oneshot(request));
    // Wait until the engine is generating for it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine().stats().generated_tokens < before + 3 {
        assert!(Instant::now() < deadline, "generation never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task.abort(); // the connection closed: hyper drops the handler future
    let _ = task.await;
    let at_drop = engine().stats().generated_tokens;
    let after = wait_idle("after dropping the handler").await;
    assert!(
        after - at_drop <= SLACK,
        "{} tokens generated after the client left",
        after - at_drop
    );
    assert!(after - before < u64::from(LONG));
}

/// An Anthropic request whose greedy answer runs past `max_tokens` (checked first).
fn anthropic_body(stream: bool) -> Value {
    json!({
        "model": MODEL_ID,
        "max_tokens": ANTHROPIC_LONG,
        "temperature": 0,
        "stream": stream,
        "messages": [{"role": "user", "content": "Write a long, detailed essay about the history of Rome."}],
    })
}

/// Anthropic has no `ignore_eos`: a budget the model's own answer reaches.
const ANTHROPIC_LONG: u32 = 300;

#[tokio::test]
async fn dropping_an_anthropic_stream_cancels_generation() {
    let _serial = SERIAL.lock().await;
    // Precondition: left alone, this greedy request runs to its budget.
    let whole = post_json("/v1/messages", &anthropic_body(false)).await;
    assert_eq!(whole.status, StatusCode::OK, "{}", whole.body);
    assert_eq!(whole.json()["stop_reason"], "max_tokens", "{}", whole.body);
    let before = wait_idle("before").await;
    let request = post_raw(
        "/v1/messages",
        Some("application/json"),
        anthropic_body(true).to_string(),
    );
    let response = router(state()).oneshot(request).await.expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut seen = String::new();
    while seen.matches("event: content_block_delta").count() < 3 {
        let frame = body
            .frame()
            .await
            .expect("stream ended early")
            .expect("frame");
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
    assert!(engine().stats().active_sequences >= 1);
    drop(body); // the client went away
    let at_drop = engine().stats().generated_tokens;
    let after = wait_idle("after dropping the Anthropic SSE body").await;
    assert!(
        after - at_drop <= SLACK,
        "{} tokens generated after the client left",
        after - at_drop
    );
    assert!(
        after - before < u64::from(ANTHROPIC_LONG) / 2,
        "{}",
        after - before
    );
}
