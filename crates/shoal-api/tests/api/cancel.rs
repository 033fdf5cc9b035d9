//! Cancelling a request by id (`POST /v1/cancel/{id}`) and per-request `timeout`, on an engine of this
//! file's own.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::counted::{self, SERIAL, engine, post_json, state};
use crate::common::*;
use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use shoal_api::{ApiState, router};
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

/// The token of the one request live in `state` (tests that hold [`SERIAL`] run one at a time).
async fn live_token(state: &ApiState) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let [token] = state.cancellations.tokens().as_slice() {
            return token.clone();
        }
        assert!(Instant::now() < deadline, "the request never became live");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends `cancel()` until it answers 200 (a request is registered a moment before the engine queues it:
/// 404 until then), then checks that the non-streaming request of `task` answered 409 `cancelled`.
async fn cancel_then_409(
    app: &Router,
    cancel: impl Fn() -> Request<Body>,
    task: tokio::task::JoinHandle<Reply>,
) {
    let deadline = Instant::now() + WAIT;
    loop {
        let reply = read_reply(app, cancel()).await;
        if reply.status == StatusCode::OK {
            assert_eq!(reply.json()["cancelled"], true, "{}", reply.body);
            break;
        }
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
        assert!(Instant::now() < deadline, "the owner could not cancel");
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
async fn cancelling_a_non_streaming_request_by_id_answers_409() {
    let _serial = SERIAL.lock().await;
    wait_idle("before").await;
    let state = state();
    let app = router(state.clone());
    let task = tokio::spawn({
        let app = app.clone();
        async move { read_reply(&app, post("/v1/chat/completions", &long_chat(json!({})))).await }
    });
    // A non-streaming client learns its id only with the answer; the registry knows it meanwhile.
    let token = live_token(&state).await;
    let cancel_token = || {
        Request::post(format!("/v1/cancel/{token}"))
            .body(Body::empty())
            .expect("request")
    };
    cancel_then_409(&app, cancel_token, task).await;
}

/// A long request that `owner` starts through `as_client`, which `stranger` cannot cancel (the same 404
/// as for an id that does not exist, the request still running) and `owner` can.
async fn only_the_owner_cancels(
    state: ApiState,
    as_client: fn(&str, Request<Body>) -> Request<Body>,
    owner: &str,
    stranger: &str,
) {
    let app = router(state.clone());
    let task = tokio::spawn({
        let app = app.clone();
        let request = as_client(owner, post("/v1/chat/completions", &long_chat(json!({}))));
        async move { read_reply(&app, request).await }
    });
    let id = format!("chatcmpl-{}", live_token(&state).await);
    let cancel_as = |who: &str| {
        let request = Request::post(format!("/v1/cancel/{id}"))
            .body(Body::empty())
            .expect("request");
        as_client(who, request)
    };
    let refused = read_reply(&app, cancel_as(stranger)).await;
    let err = assert_error(&refused, 404, None);
    assert_eq!(err["code"], "request_not_found", "{err}");
    assert!(
        !task.is_finished(),
        "the stranger's cancel stopped the request"
    );
    cancel_then_409(&app, || cancel_as(owner), task).await;
}

#[tokio::test]
async fn another_client_cannot_cancel_a_request_even_knowing_its_id() {
    let _serial = SERIAL.lock().await;
    wait_idle("before").await;
    // The API reads the peer address the server records for each connection.
    let from = |ip: &str, mut request: Request<Body>| {
        let addr: SocketAddr = format!("{ip}:40000").parse().expect("address");
        request.extensions_mut().insert(ConnectInfo(addr));
        request
    };
    only_the_owner_cancels(state(), from, "10.0.0.1", "10.0.0.2").await;
}

#[tokio::test]
async fn with_api_keys_only_the_key_that_started_a_request_cancels_it() {
    let _serial = SERIAL.lock().await;
    wait_idle("before").await;
    let mut state = state();
    state.api_keys = shoal_api::auth::ApiKeys::new(["key-a", "key-b"]);
    let keyed = |key: &str, mut request: Request<Body>| {
        let value = format!("Bearer {key}").parse().expect("header");
        request.headers_mut().insert("authorization", value);
        request
    };
    only_the_owner_cancels(state, keyed, "key-a", "key-b").await;
}

#[tokio::test]
async fn response_ids_are_unguessable_not_sequential() {
    let _serial = SERIAL.lock().await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let reply = post_json(
            "/v1/completions",
            &json!({"model": MODEL_ID, "prompt": "Hi", "max_tokens": 1}),
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let id = reply.json()["id"].as_str().expect("id").to_string();
        let token = id.strip_prefix("cmpl-").expect("cmpl- id");
        assert_eq!(token.len(), 24, "{id}");
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        ids.push(token.to_string());
    }
    assert_ne!(ids[0], ids[1]);
    let as_number = |t: &str| u128::from_str_radix(t, 16).expect("hex");
    assert!(
        as_number(&ids[0]).abs_diff(as_number(&ids[1])) > 1_000_000,
        "{ids:?}"
    );
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

/// Decision 019: the engine ends a cancelled request itself — taken off its queue before it ever ran, or
/// stopped while running — with `Done { Cancelled }`, so the API's cancellation registry needs no flag of
/// its own to tell a cancellation by id from a stream that broke: it only maps the client's id to the
/// engine's sequences and their owner.
#[tokio::test]
async fn the_engine_ends_a_cancelled_request_itself_queued_or_running() {
    use shoal_engine::{Event, FinishReason, GenerateRequest, Prompt};
    let _serial = SERIAL.lock().await;
    wait_idle("before").await;
    let handle = engine();
    for attempt in 0..12 {
        let request = GenerateRequest {
            model: MODEL_ID.into(),
            prompt: Prompt::Text("Once upon a time".into()),
            sampling: Default::default(),
            max_tokens: std::num::NonZeroU32::new(LONG),
            stop: Vec::new(),
            add_bos: true,
            ignore_eos: true,
            timeout: None,
            logits_processor: None,
            speculative: None,
        };
        let mut stream = handle.submit(request).expect("submitted");
        // At once (mostly still queued), or after the first token (running).
        if attempt % 2 == 1 {
            let first = tokio::time::timeout(WAIT, stream.next())
                .await
                .expect("a token");
            assert!(matches!(first, Some(Event::Token { .. })), "{first:?}");
        }
        assert!(handle.cancel(stream.id()), "{attempt}: live");
        let end = tokio::time::timeout(WAIT, async {
            loop {
                match stream.next().await {
                    Some(Event::Token { .. }) => continue,
                    other => return other,
                }
            }
        })
        .await
        .expect("the stream ends");
        assert!(
            matches!(
                end,
                Some(Event::Done {
                    finish_reason: FinishReason::Cancelled,
                    ..
                })
            ),
            "{attempt}: {end:?}"
        );
    }
    wait_idle("after").await;
}
