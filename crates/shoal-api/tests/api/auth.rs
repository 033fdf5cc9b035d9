//! API keys on the real router and a real engine: without keys the API is open; with keys every route but
//! `/health` needs one (bearer token or `x-api-key`), and a missing or wrong key is a 401 in the error
//! shape of the API the path belongs to — after which the server keeps serving.

use crate::common::*;
use axum::body::Body;
use axum::http::{Request, header};
use serde_json::json;
use shoal_api::auth::ApiKeys;

fn keyed() -> shoal_api::ApiState {
    let mut s = state();
    s.api_keys = ApiKeys::new(["k-one", "k-two"]);
    s
}

fn get_with(uri: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::get(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::empty()).expect("request")
}

#[tokio::test]
async fn without_keys_the_api_is_open() {
    let reply = send(get_with("/v1/models", &[])).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[tokio::test]
async fn keys_are_required_everywhere_but_health() {
    let reply = send_with(keyed(), get_with("/v1/models", &[])).await;
    let err = assert_error(&reply, 401, None);
    assert_eq!(err["code"], "invalid_api_key");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("Authorization: Bearer"),
        "{err}"
    );
    assert_eq!(reply.headers[header::WWW_AUTHENTICATE], "Bearer");

    let wrong = send_with(
        keyed(),
        get_with("/v1/models", &[("authorization", "Bearer nope")]),
    )
    .await;
    let err = assert_error(&wrong, 401, None);
    assert_eq!(err["message"], "invalid API key");
    assert!(
        !wrong.body.contains("k-one"),
        "keys never appear in answers"
    );

    for headers in [
        [("authorization", "Bearer k-one")],
        [("authorization", "bearer k-two")],
        [("x-api-key", "k-two")],
    ] {
        let ok = send_with(keyed(), get_with("/v1/models", &headers)).await;
        assert_eq!(ok.status, 200, "{headers:?}: {}", ok.body);
    }
    let health = send_with(keyed(), get_with("/health", &[])).await;
    assert_eq!(health.status, 200);

    // Generation too, and the server keeps serving after refusals.
    let body = chat_body("Say hi.", json!({"max_tokens": 2}));
    let refused = send_with(
        keyed(),
        post_raw(
            "/v1/chat/completions",
            Some("application/json"),
            body.to_string(),
        ),
    )
    .await;
    assert_error(&refused, 401, None);
    let mut req = post_raw(
        "/v1/chat/completions",
        Some("application/json"),
        body.to_string(),
    );
    req.headers_mut()
        .insert(header::AUTHORIZATION, "Bearer k-one".parse().unwrap());
    let answered = send_with(keyed(), req).await;
    assert_eq!(answered.status, 200, "{}", answered.body);
}

#[tokio::test]
async fn a_refusal_has_the_shape_of_the_api_asked() {
    let anthropic = send_with(keyed(), get_with("/v1/messages/count_tokens", &[])).await;
    assert_eq!(anthropic.status, 401);
    let v = anthropic.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "authentication_error");

    let ollama = send_with(keyed(), get_with("/api/tags", &[])).await;
    assert_eq!(ollama.status, 401);
    assert!(ollama.json()["error"].as_str().is_some(), "{}", ollama.body);

    let cluster = send_with(keyed(), get_with("/state", &[])).await;
    assert_error(&cluster, 401, None);
}
