//! The origin policy on the real router (issue 26, item 2): web pages of other origins get no CORS
//! consent and their state-changing requests are refused in each API's error shape before any handler
//! runs (even a `text/plain` POST a browser sends without asking); pages on this machine and configured
//! origins get consent, echoed, never `*` and never with credentials; a node bound to loopback refuses
//! requests for a rebound host name.

use crate::common::*;
use axum::body::Body;
use axum::http::{HeaderMap, Method, header};
use serde_json::json;
use shoal_api::ApiState;
use shoal_api::guard::origin::OriginPolicy;

const EVIL: &str = "http://evil.example";

fn allow_origin(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
        .and_then(|v| v.to_str().ok())
}

fn with_origins(extra: &[&str]) -> ApiState {
    let mut s = state();
    s.origins = OriginPolicy::new(extra).expect("origins");
    s
}

#[tokio::test]
async fn a_foreign_origins_writes_are_403_in_each_apis_shape_and_run_nothing() {
    let engine = spawn_engine();
    let before = engine.stats();
    let s = ApiState::new(engine.clone());
    let json = [("origin", EVIL), ("content-type", "application/json")];

    let chat = json_body(chat_body("Say hi.", json!({"max_tokens": 4})));
    let reply = send_with(
        s.clone(),
        request_with(Method::POST, "/v1/chat/completions", &json, chat),
    )
    .await;
    let err = assert_error(&reply, 403, None);
    assert_eq!(err["code"], "forbidden");
    assert!(
        err["message"]
            .as_str()
            .is_some_and(|m| m.contains("--cors-origin")),
        "{err}"
    );
    assert_eq!(allow_origin(&reply.headers), None);

    // A text/plain POST: what a page sends without a preflight.
    let plain = [("origin", EVIL), ("content-type", "text/plain")];
    let body = json_body(chat_body("Say hi.", json!({"max_tokens": 4})));
    let reply = send_with(
        s.clone(),
        request_with(Method::POST, "/api/chat", &plain, body),
    )
    .await;
    assert_eq!(reply.status, 403, "{}", reply.body);
    assert!(
        reply.json()["error"].is_string(),
        "Ollama's shape: {}",
        reply.body
    );

    let body = json_body(json!({"model": MODEL_ID, "max_tokens": 4, "messages": []}));
    let reply = send_with(
        s.clone(),
        request_with(Method::POST, "/v1/messages", &json, body),
    )
    .await;
    assert_eq!(reply.status, 403, "{}", reply.body);
    assert_eq!(reply.json()["type"], "error", "Anthropic's shape");
    assert_eq!(reply.json()["error"]["type"], "permission_error");

    // A bare engine answers this delete 404 from its handler: 403 means no handler ran.
    let body = json_body(json!({"model": MODEL_ID}));
    let reply = send_with(
        s.clone(),
        request_with(Method::DELETE, "/api/delete", &json, body),
    )
    .await;
    assert_eq!(reply.status, 403, "{}", reply.body);
    let reply = send_with(
        s.clone(),
        request_with(Method::DELETE, "/instance/x", &json, Body::empty()),
    )
    .await;
    assert_error(&reply, 403, None);

    let after = engine.stats();
    assert_eq!(
        (after.prefilled_tokens, after.finished),
        (before.prefilled_tokens, before.finished),
        "the engine ran nothing"
    );
    // The same requests without an Origin (curl, SDKs) reach their handlers.
    let reply = send_with(
        s,
        request_with(
            Method::DELETE,
            "/api/delete",
            &json[1..],
            json_body(json!({"model": MODEL_ID})),
        ),
    )
    .await;
    assert_eq!(reply.status, 404, "{}", reply.body);
}

#[tokio::test]
async fn a_foreign_preflight_and_read_get_no_allow_origin() {
    let preflight = [
        ("origin", EVIL),
        ("access-control-request-method", "DELETE"),
        ("access-control-request-headers", "content-type"),
    ];
    let reply = send(request_with(
        Method::OPTIONS,
        "/api/delete",
        &preflight,
        Body::empty(),
    ))
    .await;
    assert_eq!(allow_origin(&reply.headers), None, "{:?}", reply.headers);
    // A simple GET is answered (no state changes), but without consent the browser hides it.
    let reply = send(request_with(
        Method::GET,
        "/v1/models",
        &[("origin", EVIL)],
        Body::empty(),
    ))
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(allow_origin(&reply.headers), None);
}

#[tokio::test]
async fn loopback_and_configured_origins_get_allow_origin_never_star_nor_credentials() {
    let s = with_origins(&["https://chat.example.com", "http://lab:*"]);
    for origin in [
        "http://localhost:3000",
        "http://127.0.0.1:8080",
        "http://[::1]:5173",
        "tauri://localhost",
        "https://chat.example.com",
        "http://lab:8443",
    ] {
        let preflight = [
            ("origin", origin),
            ("access-control-request-method", "DELETE"),
            (
                "access-control-request-headers",
                "authorization,content-type",
            ),
        ];
        let reply = send_with(
            s.clone(),
            request_with(Method::OPTIONS, "/api/delete", &preflight, Body::empty()),
        )
        .await;
        assert_eq!(
            allow_origin(&reply.headers),
            Some(origin),
            "{origin}: {:?}",
            reply.headers
        );
        assert!(
            !reply
                .headers
                .contains_key(header::ACCESS_CONTROL_ALLOW_CREDENTIALS),
            "{origin}"
        );
        let methods = reply.headers[header::ACCESS_CONTROL_ALLOW_METHODS]
            .to_str()
            .unwrap_or("");
        assert!(methods.contains("DELETE"), "{methods}");
        let headers = reply.headers[header::ACCESS_CONTROL_ALLOW_HEADERS]
            .to_str()
            .unwrap_or("");
        assert!(headers.contains("authorization"), "{headers}");
        // Its write reaches the handler (a bare engine's 404) and the answer is readable.
        let body = json_body(json!({"model": MODEL_ID}));
        let write = [("origin", origin), ("content-type", "application/json")];
        let reply = send_with(
            s.clone(),
            request_with(Method::DELETE, "/api/delete", &write, body),
        )
        .await;
        assert_eq!(reply.status, 404, "{origin}: {}", reply.body);
        assert_eq!(allow_origin(&reply.headers), Some(origin));
    }
    // `*` lets any page in, still echoed and without credentials.
    let any = with_origins(&["*"]);
    let preflight = [("origin", EVIL), ("access-control-request-method", "POST")];
    let reply = send_with(
        any,
        request_with(
            Method::OPTIONS,
            "/v1/chat/completions",
            &preflight,
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(allow_origin(&reply.headers), Some(EVIL));
    assert!(
        !reply
            .headers
            .contains_key(header::ACCESS_CONTROL_ALLOW_CREDENTIALS)
    );
    // The node's own page is same-origin.
    let own = [
        ("origin", "http://192.168.1.5:52415"),
        ("host", "192.168.1.5:52415"),
        ("content-type", "application/json"),
    ];
    let reply = send(request_with(
        Method::DELETE,
        "/api/delete",
        &own,
        json_body(json!({"model": MODEL_ID})),
    ))
    .await;
    assert_eq!(reply.status, 404, "{}", reply.body);
}

#[tokio::test]
async fn a_loopback_node_refuses_a_rebound_host() {
    let mut s = state();
    s.origins = OriginPolicy::default().bound_to("127.0.0.1:52415".parse().expect("addr"));
    let rebound = [("host", "evil.example:52415")];
    let reply = send_with(
        s.clone(),
        request_with(Method::GET, "/v1/models", &rebound, Body::empty()),
    )
    .await;
    let err = assert_error(&reply, 403, None);
    assert!(
        err["message"]
            .as_str()
            .is_some_and(|m| m.contains("loopback")),
        "{err}"
    );
    let reply = send_with(
        s.clone(),
        request_with(Method::GET, "/api/tags", &rebound, Body::empty()),
    )
    .await;
    assert_eq!(reply.status, 403);
    assert!(reply.json()["error"].is_string(), "Ollama's shape");
    for host in ["127.0.0.1:52415", "localhost:52415", "[::1]:52415"] {
        let reply = send_with(
            s.clone(),
            request_with(Method::GET, "/v1/models", &[("host", host)], Body::empty()),
        )
        .await;
        assert_eq!(reply.status, 200, "{host}: {}", reply.body);
    }
    // Bound to every address, it is reached by any name.
    s.origins = OriginPolicy::default().bound_to("0.0.0.0:52415".parse().expect("addr"));
    let reply = send_with(
        s,
        request_with(Method::GET, "/v1/models", &rebound, Body::empty()),
    )
    .await;
    assert_eq!(reply.status, 200);
}
