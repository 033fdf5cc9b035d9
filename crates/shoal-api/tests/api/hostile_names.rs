//! Hostile model names on the real router (issue 26, items 1, 3 and 8), on a node with a cluster handle
//! and a models dir (SmolLM2 linked in, a folder `evil` that is a symbolic link to a folder outside, and
//! canary files next to the models dir): every route that takes a model name — `/api/pull`,
//! `/api/delete`, `/api/show`, `POST /downloads`, `DELETE /downloads/{model}` and the generation routes —
//! answers `..`, `../x`, `/etc/passwd`, an empty name, NUL, 64 KiB and the linked folder with a 4xx in
//! the API's own error shape, and nothing outside the models dir changes; a path answers the same
//! whether or not the file exists; a download's forwarding to another node refuses a model or node
//! that is not an id before anything is sent.

use std::path::Path;

use crate::common::*;
use crate::ollama_models::node_with_store;
use axum::body::Body;
use axum::http::Request;
use serde_json::{Value, json};
use shoal_api::ApiState;
use shoal_testkit::tree::{Entry, plant_canaries, snapshot};

fn hostile() -> Vec<String> {
    vec![
        "..".into(),
        "../x".into(),
        "../models".into(),
        "/etc/passwd".into(),
        String::new(),
        "a\0b".into(),
        "x".repeat(64 << 10),
        "evil".into(),
    ]
}

/// Percent-encodes every byte but letters, digits, `-`, `_` and `.` (so `/` is `%2F`).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn json_request(method: &str, uri: &str, body: &Value) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request")
}

/// The node of `node_with_store` plus the canaries next to its models dir and `<dir>/models/evil`, a
/// link to a folder outside ([`plant_canaries`]).
async fn hostile_node(dir: &Path) -> ApiState {
    let s = node_with_store(dir).await;
    plant_canaries(dir, &dir.join("models"));
    s
}

/// Every path under `dir` but inside `<dir>/models` and the node's state, with bytes and mtime.
fn outside_models(dir: &Path) -> Vec<Entry> {
    snapshot(dir, &[dir.join("models"), dir.join("state")])
}

/// A 4xx in the route's own error shape: Ollama's `{"error": "…"}` under `/api/`, else the OpenAI /
/// Anthropic object with a message.
#[track_caller]
fn assert_refused(reply: &Reply, what: &str) {
    assert!(
        reply.status.is_client_error(),
        "{what}: {} {}",
        reply.status,
        reply.body.chars().take(300).collect::<String>()
    );
    let v = reply.json();
    let message = v["error"]
        .as_str()
        .or_else(|| v["error"]["message"].as_str())
        .unwrap_or_else(|| panic!("{what}: no error message: {}", reply.body));
    assert!(!message.is_empty(), "{what}");
}

#[tokio::test]
async fn hostile_names_answer_4xx_on_every_model_route_and_touch_nothing_outside() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = hostile_node(dir.path()).await;
    let before = outside_models(dir.path());
    for name in hostile() {
        let short: String = name.chars().take(12).collect();
        let chat = json!({"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
        let requests = vec![
            (
                "/api/pull",
                json_request(
                    "POST",
                    "/api/pull",
                    &json!({"model": name, "stream": false}),
                ),
            ),
            (
                "/api/delete",
                json_request("DELETE", "/api/delete", &json!({"model": name})),
            ),
            (
                "/api/show",
                json_request("POST", "/api/show", &json!({"model": name})),
            ),
            (
                "POST /downloads",
                json_request("POST", "/downloads", &json!({"model": name})),
            ),
            (
                "/v1/chat/completions",
                json_request("POST", "/v1/chat/completions", &chat),
            ),
            (
                "/v1/completions",
                json_request(
                    "POST",
                    "/v1/completions",
                    &json!({"model": name, "prompt": "hi", "max_tokens": 1}),
                ),
            ),
            (
                "/v1/embeddings",
                json_request(
                    "POST",
                    "/v1/embeddings",
                    &json!({"model": name, "input": "hi"}),
                ),
            ),
            ("/v1/messages", json_request("POST", "/v1/messages", &chat)),
            (
                "/api/generate",
                json_request(
                    "POST",
                    "/api/generate",
                    &json!({"model": name, "prompt": "hi", "stream": false}),
                ),
            ),
            ("/api/chat", json_request("POST", "/api/chat", &chat)),
            (
                "/api/embed",
                json_request("POST", "/api/embed", &json!({"model": name, "input": "hi"})),
            ),
        ];
        for (what, req) in requests {
            let reply = send_with(s.clone(), req).await;
            assert_refused(&reply, &format!("{what} {short:?}"));
        }
        // The URL form: a 64 KiB path is past what a URI holds, 16 KiB is not.
        let in_path: String = name.chars().take(16 << 10).collect();
        for uri in [
            format!("/downloads/{}", encode(&in_path)),
            format!("/downloads/{}?node=x", encode(&in_path)),
        ] {
            assert_refused(&delete(&s, &uri).await, &format!("DELETE {short:?}"));
        }
    }
    // The raw `..` of a path, not encoded.
    assert_error(&delete(&s, "/downloads/..").await, 400, Some("model"));
    assert_eq!(outside_models(dir.path()), before);
    assert!(dir.path().join("models").join("evil").is_symlink());
    // The node still has and serves its model.
    let show = send_with(
        s.clone(),
        json_request("POST", "/api/show", &json!({"model": MODEL_ID})),
    )
    .await;
    assert_eq!(show.status.as_u16(), 200, "{}", show.body);
}

#[tokio::test]
async fn a_path_answers_the_same_whether_or_not_the_file_exists() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = hostile_node(dir.path()).await;
    let existing = dir.path().join("canary").join("keep.gguf");
    let missing = dir.path().join("canary").join("gone.gguf");
    let before = outside_models(dir.path());
    let ask = |route: &'static str, name: String| {
        let s = s.clone();
        async move {
            let body = match route {
                "/api/pull" => json!({"model": name, "stream": false}),
                _ => json!({"model": name}),
            };
            let reply = send_with(s, json_request("POST", route, &body)).await;
            let text = reply.body.replace(&name, "NAME");
            (reply.status.as_u16(), text)
        }
    };
    for route in ["/api/pull", "/downloads"] {
        for (there, gone) in [
            (
                existing.display().to_string(),
                missing.display().to_string(),
            ),
            ("canary/keep.gguf".into(), "canary/gone.gguf".into()),
            ("../canary/keep.gguf".into(), "../canary/gone.gguf".into()),
        ] {
            let a = ask(route, there).await;
            let b = ask(route, gone).await;
            assert_eq!(a, b, "{route}: an existing and a missing file answer alike");
            assert_eq!(a.0, 400, "{route}: {}", a.1);
        }
    }
    // Nothing was started (before, the path "downloaded": `done` when the file existed, else `failed`).
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let downloads = s.downloads.as_ref().expect("downloads").list();
    assert!(downloads.is_empty(), "{downloads:?}");
    assert_eq!(outside_models(dir.path()), before);
}

async fn delete(s: &ApiState, uri: &str) -> Reply {
    let req = Request::delete(uri).body(Body::empty()).expect("request");
    send_with(s.clone(), req).await
}

async fn post_download(s: &ApiState, body: Value) -> Reply {
    send_with(s.clone(), json_request("POST", "/downloads", &body)).await
}

#[tokio::test]
async fn delete_download_of_dot_dot_cannot_reach_another_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = hostile_node(dir.path()).await;
    // The requests: `..%2Finstance%2F<id>` deleted an instance on X, `..%2F..%2Fstate` read X's
    // /state. Refused here, before X is looked up or asked.
    for model in [
        "..%2Finstance%2Fabc",
        "..%2F..%2Fstate",
        "%2E%2E%2Fstate",
        "..",
        "%00",
    ] {
        let uri = format!("/downloads/{model}?node=12D3KooWPeerThatIsNotAMember");
        assert_error(&delete(&s, &uri).await, 400, Some("model"));
    }
    for node in ["..%2Fx", "a%2Fb", "%00", "x%3Fy"] {
        let uri = format!("/downloads/{MODEL_ID}?node={node}");
        assert_error(&delete(&s, &uri).await, 400, Some("node"));
        let body = json!({"model": MODEL_ID, "node": node.replace("%2F", "/")});
        assert_error(&post_download(&s, body).await, 400, Some("node"));
    }
    // A well-formed node id that is no member: a 400 naming the node, nothing forwarded.
    let body = json!({"model": MODEL_ID, "node": "12D3KooWPeerThatIsNotAMember"});
    assert_error(&post_download(&s, body).await, 400, Some("node"));
}
