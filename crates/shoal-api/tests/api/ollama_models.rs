//! The Ollama model routes on the real router: `/api/tags`, `/api/ps`, `/api/show`, `/api/version`,
//! `/api/delete` and `/api/pull`, first on a bare engine (no store), then on a node with a real cluster
//! handle and a models directory holding the SmolLM2 file (details and metadata read from its header,
//! the catalog's sha256 as digest, a delete that removes the folder, a pull of a present model with its
//! progress lines). Pulls from a hub are tested with the real binary (tests/python/test_ollama_sdk.py).

use std::path::Path;

use crate::common::*;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use shoal_api::ApiState;

/// The catalog's sha256 of the SmolLM2 file.
const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

fn delete_json(uri: &str, body: &Value) -> Request<Body> {
    Request::delete(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request")
}

#[track_caller]
fn ollama_error(reply: &Reply, status: u16) -> String {
    assert_eq!(reply.status.as_u16(), status, "{}", reply.body);
    reply.json()["error"]
        .as_str()
        .expect("error message")
        .to_string()
}

#[tokio::test]
async fn a_bare_engine_lists_its_model() {
    let tags = get("/api/tags").await.json();
    let models = tags["models"].as_array().expect("models");
    let m = models
        .iter()
        .find(|m| m["name"] == MODEL_ID)
        .expect("listed");
    assert_eq!(m["model"], MODEL_ID);
    assert_eq!(m["details"]["format"], "gguf");
    assert!(m["modified_at"].as_str().is_some_and(|t| t.ends_with('Z')));

    let ps = get("/api/ps").await.json();
    let p = &ps["models"][0];
    assert_eq!(p["name"], MODEL_ID);
    assert_eq!(p["size_vram"], 0);
    assert_eq!(p["context_length"], 8192);
    assert!(p["expires_at"].is_string());

    let v = get("/api/version").await.json();
    assert_eq!(v, json!({"version": env!("CARGO_PKG_VERSION")}));

    let show = post_json("/api/show", &json!({"model": MODEL_ID})).await;
    assert_eq!(show.status, StatusCode::OK, "{}", show.body);
    let show = show.json();
    assert_eq!(show["capabilities"], json!(["completion", "tools"]));
    assert_eq!(show["parameters"], "num_ctx 8192");
    let missing = post_json("/api/show", &json!({"model": "ghost"})).await;
    assert_eq!(
        ollama_error(&missing, 404),
        "model \"ghost\" not found, try pulling it first"
    );

    // Without a store there is nothing to delete or pull into.
    let reply = send(delete_json("/api/delete", &json!({"model": MODEL_ID}))).await;
    ollama_error(&reply, 404);
    let reply = post_json("/api/pull", &json!({"model": MODEL_ID})).await;
    ollama_error(&reply, 404);
}

/// A node with a cluster handle and a models dir holding SmolLM2 under its catalog id.
pub(crate) async fn node_with_store(dir: &Path) -> ApiState {
    let models = dir.join("models");
    let folder = models.join(MODEL_ID);
    std::fs::create_dir_all(&folder).expect("models dir");
    let file = model_path();
    let name = file.file_name().expect("file name");
    std::os::unix::fs::symlink(&file, folder.join(name)).expect("link the model");
    let cluster = cluster_node(&dir.join("state"), "ollama-test").await;
    let store = shoal_store::Store::new(&models);
    let mut s = state();
    s.downloads = Some(shoal_transfer::Downloads::new(store, cluster.clone()));
    s.cluster = Some(cluster);
    s
}

#[tokio::test]
async fn a_store_model_shows_its_gguf_details() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = node_with_store(dir.path()).await;
    let tags = send_with(
        s.clone(),
        Request::get("/api/tags").body(Body::empty()).expect("req"),
    )
    .await
    .json();
    let m = tags["models"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == MODEL_ID))
        .cloned()
        .unwrap_or_else(|| panic!("{tags}"));
    assert_eq!(m["digest"], SMOLLM2_SHA256);
    assert_eq!(
        m["size"],
        std::fs::metadata(model_path()).expect("file").len()
    );
    let details = &m["details"];
    assert_eq!(details["family"], "llama");
    assert_eq!(details["families"], json!(["llama"]));
    assert_eq!(details["quantization_level"], "Q4_1");
    assert_eq!(details["parameter_size"], "134.52M");

    let show = send_with(
        s.clone(),
        post_raw(
            "/api/show",
            Some("application/json"),
            json!({"model": MODEL_ID}).to_string(),
        ),
    )
    .await;
    assert_eq!(show.status, StatusCode::OK, "{}", show.body);
    let show = show.json();
    let template = show["template"].as_str().expect("template");
    assert!(template.contains("<|im_start|>"), "{template}");
    assert!(
        show["modelfile"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("FROM {MODEL_ID}")))
    );
    let info = &show["model_info"];
    assert_eq!(info["general.architecture"], "llama");
    assert_eq!(info["llama.context_length"], 8192);
    assert_eq!(info["llama.block_count"], 30);
    assert_eq!(info["llama.attention.head_count"], 9);
    assert!(
        info["general.parameter_count"]
            .as_u64()
            .is_some_and(|n| n > 100_000_000)
    );
    assert_eq!(
        info["tokenizer.ggml.tokens"],
        json!([]),
        "long arrays only with verbose"
    );
    assert!(info.get("tokenizer.chat_template").is_none());
    let verbose = send_with(
        s.clone(),
        post_raw(
            "/api/show",
            Some("application/json"),
            json!({"model": MODEL_ID, "verbose": true}).to_string(),
        ),
    )
    .await
    .json();
    assert_eq!(
        verbose["model_info"]["tokenizer.ggml.tokens"]
            .as_array()
            .map(Vec::len),
        Some(49152)
    );

    let ps = send_with(
        s.clone(),
        Request::get("/api/ps").body(Body::empty()).expect("req"),
    )
    .await
    .json();
    assert_eq!(ps["models"][0]["digest"], SMOLLM2_SHA256);
    assert_eq!(ps["models"][0]["details"]["family"], "llama");
}

#[tokio::test]
async fn pull_of_a_present_model_and_delete() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = node_with_store(dir.path()).await;
    // Pulling what is here answers at once, with Ollama's progress lines.
    let reply = send_with(
        s.clone(),
        post_raw(
            "/api/pull",
            Some("application/json"),
            json!({"model": MODEL_ID}).to_string(),
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let lines: Vec<Value> = reply
        .body
        .lines()
        .map(|l| serde_json::from_str(l).expect("line"))
        .collect();
    let size = std::fs::metadata(model_path()).expect("file").len();
    let digest = format!("sha256:{SMOLLM2_SHA256}");
    assert_eq!(lines.first(), Some(&json!({"status": "pulling manifest"})));
    assert!(lines.contains(&json!({"status": format!("downloading {digest}"), "digest": digest, "total": size, "completed": size})), "{lines:?}");
    assert_eq!(
        lines[lines.len() - 2],
        json!({"status": "verifying sha256 digest"})
    );
    assert_eq!(lines.last(), Some(&json!({"status": "success"})));
    let one = send_with(
        s.clone(),
        post_raw(
            "/api/pull",
            Some("application/json"),
            json!({"model": MODEL_ID, "stream": false}).to_string(),
        ),
    )
    .await;
    assert_eq!(one.json(), json!({"status": "success"}));
    // Names that cannot be pulled.
    for (body, status, needle) in [
        (json!({"model": "no-such-model"}), 404, "no-such-model"),
        (json!({"model": "/tmp/x.gguf"}), 400, "path"),
        (json!({"name": ""}), 400, "model"),
        (
            json!({"model": MODEL_ID, "insecure": true}),
            400,
            "insecure",
        ),
    ] {
        let reply = send_with(
            s.clone(),
            post_raw("/api/pull", Some("application/json"), body.to_string()),
        )
        .await;
        let msg = ollama_error(&reply, status);
        assert!(msg.contains(needle), "{body}: {msg}");
    }

    let reply = send_with(
        s.clone(),
        delete_json("/api/delete", &json!({"model": "../models"})),
    )
    .await;
    ollama_error(&reply, 400);
    let reply = send_with(
        s.clone(),
        delete_json("/api/delete", &json!({"model": MODEL_ID})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(!dir.path().join("models").join(MODEL_ID).exists());
    assert!(model_path().is_file(), "the linked file itself stays");
    let again = send_with(
        s.clone(),
        delete_json("/api/delete", &json!({"name": MODEL_ID})),
    )
    .await;
    assert_eq!(
        ollama_error(&again, 404),
        format!("model \"{MODEL_ID}\" not found, try pulling it first")
    );
    // The engine keeps serving from memory; the listing no longer has the file's digest.
    let tags = send_with(
        s.clone(),
        Request::get("/api/tags").body(Body::empty()).expect("req"),
    )
    .await
    .json();
    assert_eq!(tags["models"][0]["digest"], "");
}
