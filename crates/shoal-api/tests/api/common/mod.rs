//! Shared helpers: one real engine per test binary on the real model, and `oneshot` request helpers.

pub mod counted;

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::Value;
use shoal_api::{ApiState, router};
use shoal_engine::EngineHandle;
use shoal_engine::engine::{EngineConfig, spawn_from_gguf};
use tower::ServiceExt;

/// The id the test engine serves its model under.
pub const MODEL_ID: &str = "smollm2-135m-instruct-q4_1";

pub use shoal_testkit::fixtures::model_path;

/// A cluster node of its own (one member, on loopback) with its state in `state_dir` and `cluster_key`.
pub async fn cluster_node(
    state_dir: &std::path::Path,
    cluster_key: &str,
) -> shoal_cluster::ClusterHandle {
    shoal_cluster::start(shoal_cluster::ClusterConfig {
        state_dir: state_dir.to_path_buf(),
        cluster_key: cluster_key.into(),
        listen: vec![shoal_cluster::parse_peer("127.0.0.1:0").expect("addr")],
        peers: vec![],
        mdns: false,
        api_url: None,
        models: vec![],
        backend: "test".into(),
        machine: None,
    })
    .await
    .expect("cluster node")
}

/// The engine shared by every test of this binary (loaded once).
pub fn engine() -> EngineHandle {
    static ENGINE: OnceLock<EngineHandle> = OnceLock::new();
    ENGINE.get_or_init(spawn_engine).clone()
}

/// A new engine on the real model, for tests that must not share [`engine`] (each call loads it).
pub fn spawn_engine() -> EngineHandle {
    spawn_from_gguf(
        &model_path(),
        MODEL_ID,
        EngineConfig {
            threads: 1,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("cannot start the engine on {}: {e}", model_path().display()))
}

pub fn state() -> ApiState {
    ApiState::new(engine())
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn sse_data(&self) -> Vec<String> {
        sse_data(&self.body)
    }
}

pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .flat_map(|event| event.lines())
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d).to_string())
        .collect()
}

/// Sends one request through a fresh router (no sockets) and reads the whole body.
pub async fn send_with(state: ApiState, request: Request<Body>) -> Reply {
    let response = router(state)
        .oneshot(request)
        .await
        .expect("the router is infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

pub async fn send(request: Request<Body>) -> Reply {
    send_with(state(), request).await
}

pub fn post_raw(uri: &str, content_type: Option<&str>, body: impl Into<Body>) -> Request<Body> {
    let mut builder = Request::post(uri);
    if let Some(ct) = content_type {
        builder = builder.header(header::CONTENT_TYPE, ct);
    }
    builder.body(body.into()).expect("request")
}

/// A request with any method, headers and body.
pub fn request_with(
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
    body: Body,
) -> Request<Body> {
    let mut b = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(body).expect("request")
}

pub fn json_body(v: Value) -> Body {
    Body::from(v.to_string())
}

pub async fn post_json(uri: &str, body: &Value) -> Reply {
    send(post_raw(uri, Some("application/json"), body.to_string())).await
}

pub async fn get(uri: &str) -> Reply {
    send(Request::get(uri).body(Body::empty()).expect("request")).await
}

/// Asserts an OpenAI-shaped error and returns its `error` object.
#[track_caller]
pub fn assert_error(reply: &Reply, status: u16, param: Option<&str>) -> Value {
    assert_eq!(reply.status.as_u16(), status, "body: {}", reply.body);
    let v = reply.json();
    let err = v
        .get("error")
        .unwrap_or_else(|| panic!("no error object: {}", reply.body))
        .clone();
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{err}"
    );
    assert!(err["type"].is_string(), "{err}");
    assert_eq!(err["param"].as_str(), param, "{err}");
    err
}

/// The engine of a synthetic fixture (`crates/shoal-model/tests/fixtures/synth/<file>`) serving it as
/// `id`, loaded once into `cell` (one thread: the fixtures are tiny).
pub fn synth_engine(cell: &'static OnceLock<EngineHandle>, file: &str, id: &str) -> EngineHandle {
    cell.get_or_init(|| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shoal-model/tests/fixtures/synth")
            .join(file);
        let config = EngineConfig {
            threads: 1,
            ..Default::default()
        };
        spawn_from_gguf(&path, id, config).unwrap_or_else(|e| panic!("{file} loads: {e}"))
    })
    .clone()
}

/// POSTs `body` as JSON to `route` of a fresh router over `engine`.
pub async fn post_to(engine: EngineHandle, route: &str, body: &Value) -> Reply {
    let request = Request::builder()
        .method(Method::POST)
        .uri(route)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("request");
    send_with(ApiState::new(engine), request).await
}

/// A chat body asking one question.
pub fn chat_body(question: &str, extra: Value) -> Value {
    let mut body = serde_json::json!({
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": question}],
    });
    merge(&mut body, extra);
    body
}

pub fn merge(body: &mut Value, extra: Value) {
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
}

/// The golden chat generations made with llama.cpp.
pub fn golden_chat() -> Value {
    shoal_testkit::fixtures::golden("smollm2-135m-q4_1.chat.json")
}

/// Parsed SSE chunks (without the final `[DONE]`, which is checked to be last).
pub fn chunks(reply: &Reply) -> Vec<Value> {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let ct = reply
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(ct.starts_with("text/event-stream"), "content-type {ct}");
    let data = reply.sse_data();
    assert_eq!(
        data.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        reply.body
    );
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1);
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("chunk JSON"))
        .collect()
}
