//! The three HTTP APIs: any body posted to every JSON route, through the real router (its middleware
//! included) to a real engine on a tiny synthetic model.

use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, header};
use http_body_util::BodyExt;
use serde_json::Value;
use shoal_api::{ApiState, router};
use shoal_engine::engine::{EngineConfig, spawn_from_gguf};
use tower::ServiceExt;

/// The id the fuzzed server serves its model under (what the corpus's requests name).
pub const MODEL: &str = "m";

/// Every route with a JSON body (never `/api/pull`, which would reach the internet, nor `/api/delete`).
pub const ROUTES: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/api/chat",
    "/api/generate",
    "/api/embed",
    "/api/embeddings",
    "/api/show",
    "/instance",
    "/cluster/enroll",
    "/cluster/remove",
];

/// Longest a fuzzed request may take, streamed answer included, before it counts as a hang.
const DEADLINE: Duration = Duration::from_secs(60);

/// The engine's KV budget: 1,024 tokens of the model's 2 layers × (1 key + 1 value head of 32) in f16.
const KV_BUDGET_BYTES: usize = 1024 * 2 * 2 * 32 * 2;

struct Server {
    runtime: tokio::runtime::Runtime,
    router: Router,
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let path = crate::synth_dir().join("llama3-s-f16.gguf");
        let engine = spawn_from_gguf(
            &path,
            MODEL,
            EngineConfig {
                threads: 1,
                // A KV budget of about a thousand tokens: a request without a token cap ends there (the
                // model's own context is 131,072 tokens), so every answer is short and the fuzzer fast.
                kv_budget_bytes: KV_BUDGET_BYTES,
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let router = runtime.block_on(async { router(ApiState::new(engine)) });
        Server { runtime, router }
    })
}

/// The first byte picks the route ([`ROUTES`]), the rest is the body, sent as JSON. The answer is never
/// a 500-class error but 503 (busy), it ends within [`DEADLINE`], and an error is a JSON body in the
/// shape of the route's API (OpenAI's `{"error": {"message"}}`, Anthropic's `{"type": "error", "error":
/// {"message"}}`, Ollama's `{"error": "…"}`).
pub fn api(data: &[u8]) {
    answer(data);
}

/// [`api`], returning the answer's status (`None` for an empty input).
pub fn answer(data: &[u8]) -> Option<u16> {
    let (&pick, body) = data.split_first()?;
    let route = ROUTES[pick as usize % ROUTES.len()];
    let s = server();
    let request = Request::post(route)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_vec()))
        .expect("a request");
    let (status, bytes) = s.runtime.block_on(async {
        tokio::time::timeout(DEADLINE, async {
            let response = s.router.clone().oneshot(request).await.expect("infallible");
            let status = response.status();
            let bytes = response.into_body().collect().await.map(|b| b.to_bytes());
            (status, bytes)
        })
        .await
        .unwrap_or_else(|_| panic!("{route}: no complete answer within {DEADLINE:?}"))
    });
    let text = String::from_utf8_lossy(bytes.as_deref().unwrap_or_default()).into_owned();
    assert!(
        !status.is_server_error() || status.as_u16() == 503,
        "{route}: {status}: {text}"
    );
    if status.is_success() {
        assert!(bytes.is_ok(), "{route}: the answer's body broke off");
        return Some(status.as_u16());
    }
    let json: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{route}: {status}: an error that is not JSON ({e}): {text}"));
    let message = if route.starts_with("/v1/messages") {
        assert_eq!(json["type"], "error", "{route}: {text}");
        &json["error"]["message"]
    } else if route.starts_with("/api/") {
        &json["error"]
    } else {
        &json["error"]["message"]
    };
    assert!(
        message.as_str().is_some_and(|m| !m.is_empty()),
        "{route}: {status}: an error without a message in the API's shape: {text}"
    );
    Some(status.as_u16())
}
