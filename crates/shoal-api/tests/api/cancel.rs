//! Cancelling a request by id (`POST /v1/cancel/{id}`) and per-request `timeout`, on an engine of this
//! file's own.

use std::time::{Duration, Instant};

use crate::common::counted::{self, SERIAL, engine, post_json, state};
use crate::common::*;
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use shoal_api::router;
use tower::ServiceExt;

/// Long enough that only a cancellation or a timeout can end the generation within the test.
const LONG: u32 = 4000;

/// Bound on every wait in this file.
const WAIT: Duration = Duration::from_secs(60);

/// Waits until the engine holds no sequence, running or queued.
async fn wait_idle(what: &str) {
    counted::wait_idle(what, WAIT).await;
}

fn long_chat(extra: Value) -> Value {
    let mut body = chat_body(
        "Tell me a very long story about the sea.",
        json!({"max_tokens": LONG, "temperature": 0, "ignore_eos": true}),
    );
    merge(&mut body, extra);
    body
}

fn post(uri: &str, body: &Value) -> Request<Body> {
    post_raw(uri, Some("application/json"), body.to_string())
}

async fn read_reply(app: &Router, request: Request<Body>) -> Reply {
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = tokio::time::timeout(WAIT, response.into_body().collect())
        .await
        .expect("body did not end in time")
        .expect("body")
        .to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

async fn cancel(app: &Router, id: &str) -> Reply {
    let request = Request::post(format!("/v1/cancel/{id}"))
        .body(Body::empty())
        .expect("request");
    read_reply(app, request).await
}

#[tokio::test]
async fn cancelling_a_stream_by_id_ends_it_with_an_error_event_then_done() {
    let _serial = SERIAL.lock().await;
    wait_idle("before").await;
    let app = router(state());
    let response = app
        .clone()
        .oneshot(post(
            "/v1/chat/completions",
            &long_chat(json!({"stream": true})),
        ))
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();

    // Read until the first chunk (its id) and some content arrived: the sequence is surely running.
    let mut seen = String::new();
    let deadline = Instant::now() + WAIT;
    while !seen.contains("\"content\":\"") || seen.matches("data:").count() < 3 {
        assert!(Instant::now() < deadline, "no content yet: {seen}");
        let frame = tokio::time::timeout(WAIT, body.frame())
            .await
            .expect("no frame in time")
            .expect("stream ended early")
            .expect("frame");
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
    let first: Value = serde_json::from_str(&sse_data(&seen)[0]).expect("first chunk is JSON");
    let id = first["id"].as_str().expect("chunk id").to_string();
    assert!(id.starts_with("chatcmpl-"), "{id}");
    assert!(engine().stats().active_sequences >= 1);

    let reply = cancel(&app, &id).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(
        reply.json(),
        json!({"id": id, "object": "cancellation", "cancelled": true})
    );

    // The rest of the stream: maybe a few more tokens, then the cancellation error and [DONE].
    let rest = tokio::time::timeout(WAIT, body.collect())
        .await
        .expect("the stream did not end after the cancellation")
        .expect("body")
        .to_bytes();
    seen.push_str(&String::from_utf8_lossy(&rest));
    let data = sse_data(&seen);
    let n = data.len();
    assert!(n >= 2, "{seen}");
    assert_eq!(data[n - 1], "[DONE]", "{seen}");
    let err: Value = serde_json::from_str(&data[n - 2]).expect("error event is JSON");
    assert_eq!(err["error"]["type"], "cancelled", "{err}");
    assert_eq!(err["error"]["code"], "request_cancelled", "{err}");
    assert_eq!(
        err["error"]["message"], "the request was cancelled",
        "{err}"
    );
    // No chunk carries a (non-OpenAI) "cancelled" finish reason, and every other event is a chunk.
    for d in &data[..n - 2] {
        let chunk: Value = serde_json::from_str(d).expect("chunk is JSON");
        assert_eq!(chunk["object"], "chat.completion.chunk", "{d}");
        assert!(chunk["choices"][0]["finish_reason"].is_null(), "{d}");
    }
    assert_eq!(seen.matches("[DONE]").count(), 1);

    wait_idle("after the cancellation").await;
    // The request is gone: cancelling it again finds nothing.
    let again = cancel(&app, &id).await;
    let err = assert_error(&again, 404, None);
    assert_eq!(err["code"], "request_not_found", "{err}");
}

#[tokio::test]
async fn cancelling_a_non_streaming_request_by_id_answers_409() {
    let _serial = SERIAL.lock().await;
    wait_idle("before").await;
    let app = router(state());
    // Engine request ids are sequential: a probe tells which id the next request will get.
    let probe = read_reply(
        &app,
        post(
            "/v1/completions",
            &json!({"model": MODEL_ID, "prompt": "Hi", "max_tokens": 1}),
        ),
    )
    .await;
    assert_eq!(probe.status, StatusCode::OK, "{}", probe.body);
    let probe_id: u64 = probe.json()["id"]
        .as_str()
        .and_then(|s| s.strip_prefix("cmpl-"))
        .and_then(|n| n.parse().ok())
        .expect("cmpl-N id");
    let next = probe_id + 1;

    let task = tokio::spawn({
        let app = app.clone();
        async move { read_reply(&app, post("/v1/chat/completions", &long_chat(json!({})))).await }
    });
    // Cancel as soon as the request is live (its id known to the engine); the bare id form works too.
    let deadline = Instant::now() + WAIT;
    loop {
        let reply = cancel(&app, &next.to_string()).await;
        if reply.status == StatusCode::OK {
            assert_eq!(reply.json()["id"], next.to_string());
            break;
        }
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
        assert!(
            Instant::now() < deadline,
            "request {next} never became live"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reply = tokio::time::timeout(WAIT, task)
        .await
        .expect("the request did not end after the cancellation")
        .expect("task");
    let err = assert_error(&reply, 409, None);
    assert_eq!(err["type"], "cancelled", "{err}");
    assert_eq!(err["code"], "request_cancelled", "{err}");
    wait_idle("after the cancellation").await;
}

#[tokio::test]
async fn cancelling_an_unknown_request_is_404() {
    let app = router(state());
    for id in ["chatcmpl-987654321", "cmpl-987654321", "987654321"] {
        let reply = cancel(&app, id).await;
        let err = assert_error(&reply, 404, None);
        assert_eq!(err["code"], "request_not_found", "{err}");
        assert_eq!(err["type"], "invalid_request_error", "{err}");
    }
}

#[tokio::test]
async fn cancelling_a_malformed_id_is_400() {
    let app = router(state());
    for id in [
        "abc",
        "chatcmpl-",
        "cmpl-x",
        "-1",
        "chatcmpl-1a",
        "99999999999999999999",
    ] {
        let reply = cancel(&app, id).await;
        let err = assert_error(&reply, 400, Some("id"));
        assert_eq!(err["code"], "invalid_request_id", "{err}");
    }
    // Only POST cancels.
    let reply = read_reply(
        &app,
        Request::get("/v1/cancel/1")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_error(&reply, 405, None);
}

#[tokio::test]
async fn a_non_streaming_request_past_its_timeout_answers_408() {
    let _serial = SERIAL.lock().await;
    wait_idle("before").await;
    let started = Instant::now();
    let reply = post_json("/v1/chat/completions", &long_chat(json!({"timeout": 0.2}))).await;
    let err = assert_error(&reply, 408, Some("timeout"));
    assert_eq!(err["type"], "timeout", "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    wait_idle("after the timeout").await;

    let reply = post_json(
        "/v1/completions",
        &json!({"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": LONG,
                "ignore_eos": true, "timeout": 0.2}),
    )
    .await;
    let err = assert_error(&reply, 408, Some("timeout"));
    assert_eq!(err["type"], "timeout", "{err}");
    wait_idle("after the completions timeout").await;
}

#[tokio::test]
async fn a_stream_past_its_timeout_ends_with_an_error_event() {
    let _serial = SERIAL.lock().await;
    wait_idle("before").await;
    let app = router(state());
    let reply = read_reply(
        &app,
        post(
            "/v1/chat/completions",
            &long_chat(json!({"stream": true, "timeout": 0.3})),
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let data = reply.sse_data();
    let last: Value = serde_json::from_str(data.last().expect("events")).expect("JSON");
    assert_eq!(last["error"]["type"], "timeout", "{}", reply.body);
    assert!(!reply.body.contains("[DONE]"), "{}", reply.body);
    wait_idle("after the timeout").await;
}

#[tokio::test]
async fn a_generous_timeout_changes_nothing() {
    let body = chat_body(
        "What is the capital of France?",
        json!({"max_tokens": 4, "temperature": 0, "timeout": 600}),
    );
    let reply = post_json("/v1/chat/completions", &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.json()["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn a_bad_timeout_is_400_naming_it() {
    for (uri, base) in [
        ("/v1/chat/completions", chat_body("Hi", json!({}))),
        (
            "/v1/completions",
            json!({"model": MODEL_ID, "prompt": "Hi"}),
        ),
    ] {
        for bad in [
            json!(-1),
            json!(0),
            json!(0.0),
            json!(86401),
            json!("10"),
            json!(true),
            json!([1]),
        ] {
            let mut body = base.clone();
            merge(&mut body, json!({"timeout": bad}));
            let reply = post_json(uri, &body).await;
            let err = assert_error(&reply, 400, Some("timeout"));
            assert_eq!(err["type"], "invalid_request_error", "{uri} {bad}: {err}");
        }
    }
}
