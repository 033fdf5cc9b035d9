//! The Ollama API on the real router and engine (SmolLM2): `/api/chat` and `/api/generate` as one object
//! and as NDJSON (Ollama's default), greedy answers equal to the OpenAI routes' for the same prompt,
//! `options` mapped to the sampler, real measurements in the last object, the model-loading requests, and
//! every kind of bad input answered `{"error": "..."}` with a 4xx naming what is wrong. A client that
//! drops the NDJSON body cancels its generation. Model listing and the store: `ollama_models`.

use std::time::{Duration, Instant};

use crate::common::*;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const QUESTION: &str = "What is the capital of France?";

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": QUESTION}],
    });
    merge(&mut body, extra);
    body
}

async fn ok(uri: &str, body: &Value) -> Value {
    let reply = post_json(uri, body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let ct = content_type(&reply);
    assert!(ct.starts_with("application/json"), "content-type {ct}");
    reply.json()
}

fn content_type(reply: &Reply) -> String {
    reply
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// The objects of an NDJSON answer; every line is one object and the body ends with a newline.
fn ndjson(reply: &Reply) -> Vec<Value> {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(content_type(reply), "application/x-ndjson");
    assert!(reply.body.ends_with('\n'), "{:?}", reply.body);
    reply
        .body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("line {l:?}: {e}")))
        .collect()
}

/// An Ollama error: the status, and `{"error": message}` with nothing else; returns the message.
#[track_caller]
fn ollama_error(reply: &Reply, status: u16) -> String {
    assert_eq!(reply.status.as_u16(), status, "{}", reply.body);
    let v = reply.json();
    let obj = v.as_object().expect("an object");
    assert_eq!(obj.len(), 1, "{v}");
    let msg = v["error"].as_str().expect("error is a string").to_string();
    assert!(!msg.is_empty());
    msg
}

/// `created_at` is RFC 3339 in UTC: `YYYY-MM-DDTHH:MM:SS.fffffffffZ`.
#[track_caller]
fn assert_timestamp(v: &Value) {
    let t = v["created_at"].as_str().expect("created_at");
    let b = t.as_bytes();
    assert!(
        t.len() == 30 && b[4] == b'-' && b[10] == b'T' && b[19] == b'.' && t.ends_with('Z'),
        "{t}"
    );
    assert!(t.starts_with("20"), "{t}");
}

/// The last object's measurements are real: counts from the engine, positive durations that add up.
#[track_caller]
fn assert_metrics(last: &Value, completion_tokens: u64) {
    assert_eq!(last["done"], true);
    let n = |k: &str| last[k].as_u64().unwrap_or_else(|| panic!("{k} in {last}"));
    assert!(n("prompt_eval_count") > 5, "{last}");
    assert_eq!(n("eval_count"), completion_tokens);
    for k in [
        "total_duration",
        "load_duration",
        "prompt_eval_duration",
        "eval_duration",
    ] {
        assert!(n(k) > 0, "{k} in {last}");
    }
    assert!(
        n("total_duration") >= n("load_duration") + n("prompt_eval_duration") + n("eval_duration")
    );
    assert!(n("total_duration") < 600_000_000_000, "nanoseconds: {last}");
}

#[tokio::test]
async fn greedy_chat_equals_the_openai_chat_and_reports_measurements() {
    let v = ok(
        "/api/chat",
        &chat(json!({"stream": false, "options": {"temperature": 0, "num_predict": 12}})),
    )
    .await;
    let openai = ok(
        "/v1/chat/completions",
        &chat_body(QUESTION, json!({"temperature": 0, "max_tokens": 12})),
    )
    .await;
    let text = v["message"]["content"].as_str().expect("content");
    assert_eq!(text, openai["choices"][0]["message"]["content"]);
    assert_eq!(v["message"]["role"], "assistant");
    assert_eq!(v["model"], MODEL_ID);
    assert_eq!(v["done_reason"], openai["choices"][0]["finish_reason"]);
    assert_eq!(v["prompt_eval_count"], openai["usage"]["prompt_tokens"]);
    assert_timestamp(&v);
    assert_metrics(
        &v,
        openai["usage"]["completion_tokens"].as_u64().unwrap_or(0),
    );
}

#[tokio::test]
async fn chat_streams_ndjson_by_default() {
    let options = json!({"options": {"temperature": 0, "num_predict": 10}});
    let whole = ok(
        "/api/chat",
        &chat(json!({"stream": false, "options": {"temperature": 0, "num_predict": 10}})),
    )
    .await;
    let lines = ndjson(&post_json("/api/chat", &chat(options)).await);
    let (last, pieces) = lines.split_last().expect("lines");
    assert!(pieces.len() >= 2, "{lines:?}");
    let mut text = String::new();
    for p in pieces {
        assert_eq!(p["done"], false, "{p}");
        assert_eq!(p["message"]["role"], "assistant");
        assert!(p.get("done_reason").is_none(), "{p}");
        assert_timestamp(p);
        text.push_str(p["message"]["content"].as_str().expect("piece"));
    }
    assert_eq!(text, whole["message"]["content"]);
    assert_eq!(last["message"]["content"], "");
    assert_eq!(last["done_reason"], "length");
    assert_metrics(last, 10);
}

#[tokio::test]
async fn generate_renders_system_and_prompt_through_the_template() {
    let options = json!({"temperature": 0, "num_predict": 8});
    let g = ok(
        "/api/generate",
        &json!({"model": MODEL_ID, "prompt": QUESTION, "system": "Answer briefly.", "stream": false, "options": options}),
    )
    .await;
    let messages = json!([{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}]);
    let c = ok(
        "/api/chat",
        &json!({"model": MODEL_ID, "messages": messages, "stream": false, "options": options}),
    )
    .await;
    assert_eq!(g["response"], c["message"]["content"]);
    assert!(g.get("message").is_none());
    assert_metrics(&g, 8);

    // Streaming is the default here too.
    let lines = ndjson(&post_json("/api/generate", &json!({"model": MODEL_ID, "prompt": QUESTION, "system": "Answer briefly.", "options": options})).await);
    let text: String = lines
        .iter()
        .filter_map(|l| l["response"].as_str())
        .collect();
    assert_eq!(text, g["response"].as_str().unwrap_or_default());
    assert_eq!(lines.last().map(|l| l["done"].clone()), Some(json!(true)));
}

#[tokio::test]
async fn raw_generate_uses_the_prompt_as_is() {
    let prompt = "The capital of France is";
    let g = ok(
        "/api/generate",
        &json!({"model": MODEL_ID, "prompt": prompt, "raw": true, "stream": false, "options": {"temperature": 0, "num_predict": 6}}),
    )
    .await;
    let c = ok(
        "/v1/completions",
        &json!({"model": MODEL_ID, "prompt": prompt, "temperature": 0, "max_tokens": 6}),
    )
    .await;
    assert_eq!(g["response"], c["choices"][0]["text"]);
    assert_eq!(g["prompt_eval_count"], c["usage"]["prompt_tokens"]);
}

#[tokio::test]
async fn options_reach_the_sampler() {
    // num_predict → length; stop → same cut as the OpenAI route; seeded sampling repeats itself.
    let v = ok(
        "/api/chat",
        &chat(json!({"stream": false, "options": {"num_predict": 3, "temperature": 0}})),
    )
    .await;
    assert_eq!(v["done_reason"], "length");
    assert_eq!(v["eval_count"], 3);
    // A stop sequence taken from the greedy answer cuts it there, as on the OpenAI route.
    let free = ok(
        "/api/chat",
        &chat(json!({"stream": false, "options": {"temperature": 0, "num_predict": 20}})),
    )
    .await;
    let free = free["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let word = free
        .split_whitespace()
        .nth(2)
        .expect("a few words")
        .to_string();
    let stop = json!([word]);
    let o = ok(
        "/v1/chat/completions",
        &chat_body(
            QUESTION,
            json!({"temperature": 0, "max_tokens": 20, "stop": stop}),
        ),
    )
    .await;
    let v = ok("/api/chat", &chat(json!({"stream": false, "options": {"temperature": 0, "num_predict": 20, "stop": stop}}))).await;
    let cut = v["message"]["content"].as_str().unwrap_or_default();
    assert_eq!(cut, o["choices"][0]["message"]["content"]);
    assert!(
        !cut.contains(&word) && free.starts_with(cut),
        "{cut:?} of {free:?} at {word:?}"
    );
    assert_eq!(v["done_reason"], "stop");
    let seeded = json!({"stream": false, "options": {"temperature": 1.0, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "seed": 7,
        "repeat_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.5, "num_predict": 12, "num_ctx": 2048,
        "num_gpu": 99, "num_thread": 4, "use_mmap": true, "no_such_option": "ignored"}});
    let a = ok("/api/chat", &chat(seeded.clone())).await;
    let b = ok("/api/chat", &chat(seeded)).await;
    assert_eq!(a["message"]["content"], b["message"]["content"]);
    // keep_alive in both spellings, an empty format and no tools are accepted.
    let extras = json!({"stream": false, "keep_alive": "5m", "format": "", "tools": [], "think": false, "options": {"num_predict": 1}});
    ok("/api/chat", &chat(extras)).await;
    ok(
        "/api/chat",
        &chat(json!({"stream": false, "keep_alive": -1, "options": {"num_predict": 1}})),
    )
    .await;
    // Ollama's "latest" tag names the same model.
    let latest = json!({"model": format!("{MODEL_ID}:latest"), "prompt": "Hi", "stream": false, "options": {"num_predict": 1}});
    assert_eq!(ok("/api/generate", &latest).await["done"], true);
}

#[tokio::test]
async fn logprobs_of_the_sampled_tokens() {
    let v = ok("/api/chat", &chat(json!({"stream": false, "logprobs": true, "options": {"temperature": 0, "num_predict": 4}}))).await;
    let lps = v["logprobs"].as_array().expect("logprobs");
    assert_eq!(lps.len(), 4);
    let joined: String = lps.iter().filter_map(|l| l["token"].as_str()).collect();
    assert_eq!(joined, v["message"]["content"].as_str().unwrap_or_default());
    assert!(
        lps.iter()
            .all(|l| l["logprob"].as_f64().is_some_and(|x| x <= 0.0))
    );
    let plain = ok(
        "/api/chat",
        &chat(json!({"stream": false, "options": {"num_predict": 1}})),
    )
    .await;
    assert!(plain.get("logprobs").is_none());
    // top_logprobs implies logprobs; greedy picks the most likely token, streamed pieces carry theirs.
    let body = chat(json!({"top_logprobs": 3, "options": {"temperature": 0, "num_predict": 4}}));
    let lines = ndjson(&post_json("/api/chat", &body).await);
    let lps: Vec<&Value> = lines
        .iter()
        .filter_map(|l| l["logprobs"].as_array())
        .flatten()
        .collect();
    assert_eq!(lps.len(), 4, "{lines:?}");
    for lp in lps {
        let top = lp["top_logprobs"].as_array().expect("top_logprobs");
        assert_eq!(top.len(), 3, "{lp}");
        assert_eq!(top[0]["logprob"], lp["logprob"], "{lp}");
        let ps: Vec<f64> = top.iter().filter_map(|t| t["logprob"].as_f64()).collect();
        assert!(ps.windows(2).all(|w| w[0] >= w[1]), "{lp}");
    }
}

#[tokio::test]
async fn empty_prompt_or_messages_load_the_model() {
    let lines = ndjson(&post_json("/api/generate", &json!({"model": MODEL_ID})).await);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["done"], true);
    assert_eq!(lines[0]["done_reason"], "load");
    assert_eq!(lines[0]["response"], "");
    let v = ok(
        "/api/chat",
        &json!({"model": MODEL_ID, "messages": [], "stream": false}),
    )
    .await;
    assert_eq!(v["done_reason"], "load");
    assert_eq!(v["message"], json!({"role": "assistant", "content": ""}));
    let reply = post_json("/api/generate", &json!({"model": "nope"})).await;
    assert_eq!(
        ollama_error(&reply, 404),
        "model \"nope\" not found, try pulling it first"
    );
}

#[tokio::test]
async fn bad_input_is_a_4xx_in_ollamas_shape() {
    let malformed = send(post_raw(
        "/api/chat",
        Some("application/json"),
        "{\"model\": ",
    ))
    .await;
    assert!(ollama_error(&malformed, 400).contains("JSON"));
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        (
            "/api/chat",
            chat(json!({"model": "no-such-model"})),
            404,
            "model \"no-such-model\" not found",
        ),
        (
            "/api/chat",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
            400,
            "model",
        ),
        (
            "/api/chat",
            json!({"model": MODEL_ID, "messages": "hi"}),
            400,
            "messages",
        ),
        (
            "/api/chat",
            json!({"model": MODEL_ID, "messages": [{"role": "robot", "content": "hi"}]}),
            400,
            "messages[0].role",
        ),
        (
            "/api/chat",
            json!({"model": MODEL_ID, "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}),
            400,
            "messages[0].images",
        ),
        ("/api/chat", chat(json!({"think": "max"})), 400, "think"),
        ("/api/chat", chat(json!({"format": 5})), 400, "format"),
        ("/api/chat", chat(json!({"format": "yaml"})), 400, "format"),
        (
            "/api/chat",
            chat(json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]})),
            400,
            "tools[0].function.name",
        ),
        (
            "/api/chat",
            chat(json!({"tools": [{"function": {"name": "f", "parameters": 5}}]})),
            400,
            "tools[0].function.parameters",
        ),
        (
            "/api/chat",
            chat(json!({"tools": [{"type": "function"}]})),
            400,
            "tools[0]",
        ),
        (
            "/api/chat",
            chat(json!({"tools": [{"type": "retrieval", "function": {"name": "f"}}]})),
            400,
            "tools[0].type",
        ),
        (
            "/api/chat",
            json!({"model": MODEL_ID, "messages": [{"role": "assistant", "tool_calls": [{"name": "f"}]}]}),
            400,
            "messages[0].tool_calls[0]",
        ),
        (
            "/api/chat",
            chat(json!({"top_logprobs": 21})),
            400,
            "top_logprobs",
        ),
        (
            "/api/chat",
            chat(json!({"options": {"temperature": "hot"}})),
            400,
            "options.temperature",
        ),
        (
            "/api/chat",
            chat(json!({"options": {"top_p": 5}})),
            400,
            "options.top_p",
        ),
        (
            "/api/chat",
            chat(json!({"options": {"repeat_penalty": -1}})),
            400,
            "options.repeat_penalty",
        ),
        (
            "/api/chat",
            chat(json!({"options": {"num_predict": 0}})),
            400,
            "options.num_predict",
        ),
        (
            "/api/chat",
            chat(json!({"options": {"num_ctx": 1_000_000_000}})),
            400,
            "options.num_ctx",
        ),
        (
            "/api/chat",
            chat(json!({"options": {"mirostat": 2}})),
            400,
            "options.mirostat",
        ),
        (
            "/api/chat",
            chat(json!({"options": {"stop": (0..40).map(|i| i.to_string()).collect::<Vec<_>>()}})),
            400,
            "options.stop",
        ),
        (
            "/api/generate",
            json!({"model": MODEL_ID, "prompt": "x", "images": ["aGk="]}),
            400,
            "images",
        ),
        (
            "/api/generate",
            json!({"model": MODEL_ID, "prompt": "x", "template": "{{ .Prompt }}"}),
            400,
            "template",
        ),
        (
            "/api/generate",
            json!({"model": MODEL_ID, "prompt": "x", "suffix": "y"}),
            400,
            "suffix",
        ),
        (
            "/api/generate",
            json!({"model": MODEL_ID, "prompt": "x", "context": [1, 2]}),
            400,
            "context",
        ),
        (
            "/api/generate",
            json!({"model": MODEL_ID, "prompt": 5}),
            400,
            "prompt",
        ),
        ("/api/show", json!({}), 400, "model"),
    ];
    for (uri, body, status, needle) in cases {
        let msg = ollama_error(&post_json(uri, &body).await, status);
        assert!(
            msg.contains(needle),
            "{uri} {body}: {msg:?} lacks {needle:?}"
        );
    }
    let unknown = send(
        Request::post("/api/copy")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from("{}"))
            .expect("request"),
    )
    .await;
    assert!(ollama_error(&unknown, 404).contains("/api/copy"));
    let huge = "x".repeat(shoal_api::DEFAULT_BODY_LIMIT + 10);
    let reply = post_json("/api/generate", &json!({"model": MODEL_ID, "prompt": huge})).await;
    ollama_error(&reply, 413);
    // And it keeps serving.
    ok(
        "/api/chat",
        &chat(json!({"stream": false, "options": {"num_predict": 1}})),
    )
    .await;
}

/// An engine of its own, so no other test's sequences show in its counters.
fn own_engine() -> shoal_engine::EngineHandle {
    shoal_engine::engine::spawn_from_gguf(
        &model_path(),
        MODEL_ID,
        shoal_engine::engine::EngineConfig {
            threads: 1,
            ..Default::default()
        },
    )
    .expect("engine")
}

/// A long streamed generation on `engine`, read until three lines arrived: its body and those lines.
async fn long_stream(engine: &shoal_engine::EngineHandle) -> (axum::body::Body, String) {
    let state = shoal_api::ApiState::new(engine.clone());
    let body = json!({"model": MODEL_ID, "prompt": "Write a very long story about a dragon and a knight.",
        "options": {"temperature": 0, "num_predict": 2000}});
    let request = post_raw("/api/generate", Some("application/json"), body.to_string());
    let response = shoal_api::router(state)
        .oneshot(request)
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut seen = String::new();
    while seen.matches('\n').count() < 3 {
        let frame = body
            .frame()
            .await
            .expect("stream ended early")
            .expect("frame");
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
    assert_eq!(engine.stats().active_sequences, 1);
    (body, seen)
}

async fn wait_idle(engine: &shoal_engine::EngineHandle) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine.stats().active_sequences > 0 {
        assert!(
            Instant::now() < deadline,
            "still generating: {:?}",
            engine.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Dropping the NDJSON body cancels the generation.
#[tokio::test]
async fn dropping_the_ndjson_body_cancels_generation() {
    let engine = own_engine();
    let (body, _) = long_stream(&engine).await;
    drop(body);
    let at_drop = engine.stats().generated_tokens;
    wait_idle(&engine).await;
    let after = engine.stats().generated_tokens;
    assert!(
        after - at_drop <= 16,
        "{} tokens after the client left",
        after - at_drop
    );
}

/// A generation that ends badly midway (here: cancelled in the engine) ends the stream with an
/// `{"error": ...}` line, which Ollama clients raise.
#[tokio::test]
async fn a_stream_failing_midway_ends_with_an_error_line() {
    let engine = own_engine();
    let (body, seen) = long_stream(&engine).await;
    // Request ids are process-wide: find the running one.
    assert!(
        (1..100_000).any(|id| engine.cancel(id)),
        "no running request to cancel"
    );
    let rest = body.collect().await.expect("body").to_bytes();
    let all = seen + &String::from_utf8_lossy(&rest);
    let lines: Vec<Value> = all
        .lines()
        .map(|l| serde_json::from_str(l).expect("line"))
        .collect();
    let (last, before) = lines.split_last().expect("lines");
    assert_eq!(last, &json!({"error": "the request was cancelled"}));
    assert!(before.iter().all(|l| l["done"] == false), "{lines:?}");
    wait_idle(&engine).await;
}

#[tokio::test]
async fn embed_gives_the_engines_normalized_vectors() {
    let texts = ["The sky is blue.", "Paris is the capital of France."];
    let v = ok("/api/embed", &json!({"model": MODEL_ID, "input": texts})).await;
    let vectors: Vec<Vec<f64>> = serde_json::from_value(v["embeddings"].clone()).expect("vectors");
    assert_eq!(vectors.len(), 2);
    let engine = shoal_engine::Engines::from(engine())
        .embed(shoal_engine::EmbedRequest {
            model: MODEL_ID.into(),
            inputs: texts
                .iter()
                .map(|t| shoal_engine::Prompt::Text(t.to_string()))
                .collect(),
            truncate: true,
            timeout: None,
        })
        .await
        .expect("engine embeddings");
    for (ours, theirs) in vectors.iter().zip(&engine.vectors) {
        assert_eq!(ours.len(), 576);
        let norm: f64 = ours.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "{norm}");
        assert!(
            ours.iter()
                .zip(theirs)
                .all(|(a, b)| (a - f64::from(*b)).abs() < 1e-6)
        );
    }
    assert_ne!(vectors[0], vectors[1]);
    assert_eq!(v["prompt_eval_count"], engine.prompt_tokens);
    assert_eq!(v["model"], MODEL_ID);
    assert!(v["total_duration"].as_u64().is_some_and(|d| d > 0));

    // One string, the older route, and `dimensions`.
    let one = ok("/api/embed", &json!({"model": MODEL_ID, "input": texts[0]})).await;
    assert_eq!(one["embeddings"][0], v["embeddings"][0]);
    let legacy = ok(
        "/api/embeddings",
        &json!({"model": MODEL_ID, "prompt": texts[0]}),
    )
    .await;
    assert_eq!(legacy["embedding"], v["embeddings"][0]);
    let short = ok(
        "/api/embed",
        &json!({"model": MODEL_ID, "input": texts[0], "dimensions": 64}),
    )
    .await;
    let short: Vec<f64> = serde_json::from_value(short["embeddings"][0].clone()).expect("vector");
    assert_eq!(short.len(), 64);
    let scale = short[0] / vectors[0][0];
    assert!(
        short
            .iter()
            .zip(&vectors[0])
            .all(|(s, f)| (s - f * scale).abs() < 1e-5)
    );
    // No input at all: no vectors, as Ollama answers.
    let none = ok("/api/embed", &json!({"model": MODEL_ID, "input": ""})).await;
    assert_eq!(none["embeddings"], json!([]));
    let none = ok("/api/embeddings", &json!({"model": MODEL_ID, "prompt": ""})).await;
    assert_eq!(none["embedding"], json!([]));

    let long = "hello ".repeat(9000);
    let cases = [
        (json!({"model": MODEL_ID, "input": ["a", ""]}), 400, "input"),
        (json!({"model": MODEL_ID, "input": 5}), 400, "input"),
        (
            json!({"model": MODEL_ID, "input": "a", "dimensions": 0}),
            400,
            "dimensions",
        ),
        (
            json!({"model": MODEL_ID, "input": "a", "dimensions": 5000}),
            400,
            "dimensions",
        ),
        (
            json!({"model": MODEL_ID, "input": long, "truncate": false}),
            400,
            "input",
        ),
        (json!({"model": "nope", "input": "a"}), 404, "nope"),
    ];
    for (body, status, needle) in cases {
        let msg = ollama_error(&post_json("/api/embed", &body).await, status);
        assert!(msg.contains(needle), "{msg}");
    }
}

/// Ollama reads bodies as JSON whatever they are declared as (`curl -d` says form data).
#[tokio::test]
async fn bodies_are_json_whatever_their_content_type() {
    let body =
        json!({"model": MODEL_ID, "prompt": "Hi", "stream": false, "options": {"num_predict": 2}});
    for ct in [
        Some("application/x-www-form-urlencoded"),
        Some("text/plain"),
        None,
    ] {
        let reply = send(post_raw("/api/generate", ct, body.to_string())).await;
        assert_eq!(reply.status, StatusCode::OK, "{ct:?}: {}", reply.body);
        assert_eq!(reply.json()["done"], true);
    }
    let tags = send(post_raw(
        "/api/show",
        Some("text/plain"),
        json!({"model": MODEL_ID}).to_string(),
    ))
    .await;
    assert_eq!(tags.status, StatusCode::OK, "{}", tags.body);
}
