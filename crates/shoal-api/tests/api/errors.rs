//! Every way a client can get a request wrong gets a 4xx in OpenAI's shape naming the parameter, and the
//! server keeps serving afterwards. Real engine, real model, `oneshot` requests.

use crate::common::*;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::json;
use shoal_api::ApiState;

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";

#[tokio::test]
async fn malformed_json_is_400() {
    let reply = send(post_raw(CHAT, Some("application/json"), "{\"messages\": [")).await;
    let err = assert_error(&reply, 400, None);
    assert_eq!(err["type"], "invalid_request_error");
    let reply = send(post_raw(
        COMPLETIONS,
        Some("application/json"),
        "not json at all",
    ))
    .await;
    assert_error(&reply, 400, None);
}

#[tokio::test]
async fn wrong_json_types_are_400_naming_the_field() {
    let reply = post_json(CHAT, &json!({"model": MODEL_ID, "messages": "hello"})).await;
    let err = assert_error(&reply, 400, Some("messages"));
    assert_eq!(err["type"], "invalid_request_error");

    let reply = post_json(CHAT, &chat_body("hi", json!({"temperature": "hot"}))).await;
    assert_error(&reply, 400, Some("temperature"));

    let reply = post_json(CHAT, &chat_body("hi", json!({"max_tokens": 1.5}))).await;
    assert_error(&reply, 400, Some("max_tokens"));

    let body = json!({"model": MODEL_ID, "messages": [{"role": "robot", "content": "hi"}]});
    assert_error(&post_json(CHAT, &body).await, 400, Some("messages[0].role"));

    let body = json!({"model": MODEL_ID, "messages": [{"role": "user", "content": 42}]});
    assert_error(
        &post_json(CHAT, &body).await,
        400,
        Some("messages[0].content"),
    );

    let reply = post_json(CHAT, &json!([1, 2, 3])).await;
    assert_error(&reply, 400, None);

    let reply = post_json(
        COMPLETIONS,
        &json!({"model": MODEL_ID, "prompt": {"text": "x"}}),
    )
    .await;
    assert_error(&reply, 400, Some("prompt"));
}

#[tokio::test]
async fn missing_required_field_is_400() {
    let reply = post_json(CHAT, &json!({"model": MODEL_ID})).await;
    assert_error(&reply, 400, Some("messages"));
    let reply = post_json(COMPLETIONS, &json!({"model": MODEL_ID})).await;
    assert_error(&reply, 400, Some("prompt"));
}

#[tokio::test]
async fn missing_content_type_is_415() {
    let body = chat_body("hi", json!({"max_tokens": 1})).to_string();
    let reply = send(post_raw(CHAT, None, body.clone())).await;
    let err = assert_error(&reply, 415, None);
    assert_eq!(err["type"], "invalid_request_error");
    let reply = send(post_raw(CHAT, Some("text/plain"), body)).await;
    assert_error(&reply, 415, None);
}

#[tokio::test]
async fn empty_messages_is_400() {
    let reply = post_json(CHAT, &json!({"model": MODEL_ID, "messages": []})).await;
    let err = assert_error(&reply, 400, Some("messages"));
    assert_eq!(err["type"], "invalid_request_error");
}

#[tokio::test]
async fn non_positive_max_tokens_is_400() {
    for bad in [0, -1] {
        let reply = post_json(CHAT, &chat_body("hi", json!({"max_tokens": bad}))).await;
        assert_error(&reply, 400, Some("max_tokens"));
        let reply = post_json(
            COMPLETIONS,
            &json!({"model": MODEL_ID, "prompt": "hi", "max_tokens": bad}),
        )
        .await;
        assert_error(&reply, 400, Some("max_tokens"));
    }
    let reply = post_json(CHAT, &chat_body("hi", json!({"max_completion_tokens": 0}))).await;
    assert_error(&reply, 400, Some("max_completion_tokens"));
}

#[tokio::test]
async fn temperature_out_of_range_is_400() {
    for bad in [2.5, -0.1, 1e300] {
        let reply = post_json(CHAT, &chat_body("hi", json!({"temperature": bad}))).await;
        let err = assert_error(&reply, 400, Some("temperature"));
        assert_eq!(err["type"], "invalid_request_error");
    }
}

#[tokio::test]
async fn other_sampling_params_out_of_range_are_400() {
    let cases = [
        ("top_p", json!(0.0)),
        ("top_p", json!(1.5)),
        ("min_p", json!(2.0)),
        ("frequency_penalty", json!(3.0)),
        ("presence_penalty", json!(-3.0)),
        ("repetition_penalty", json!(0.0)),
    ];
    for (param, value) in cases {
        let mut extra = serde_json::Map::new();
        extra.insert(param.to_string(), value);
        let reply = post_json(CHAT, &chat_body("hi", serde_json::Value::Object(extra))).await;
        assert_error(&reply, 400, Some(param));
    }
    // `repeat_penalty` (llama.cpp's name) is the same parameter.
    let reply = post_json(CHAT, &chat_body("hi", json!({"repeat_penalty": -1.0}))).await;
    assert_error(&reply, 400, Some("repetition_penalty"));
}

#[tokio::test]
async fn unknown_model_is_404() {
    let reply = post_json(
        CHAT,
        &json!({"model": "gpt-17", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    let err = assert_error(&reply, 404, Some("model"));
    assert_eq!(err["code"], "model_not_found");
    assert_eq!(err["type"], "invalid_request_error");

    let reply = post_json(COMPLETIONS, &json!({"model": "gpt-17", "prompt": "hi"})).await;
    let err = assert_error(&reply, 404, Some("model"));
    assert_eq!(err["code"], "model_not_found");

    let reply = get("/v1/models/gpt-17").await;
    let err = assert_error(&reply, 404, Some("model"));
    assert_eq!(err["code"], "model_not_found");
}

#[tokio::test]
async fn prompt_longer_than_context_is_400_with_both_numbers() {
    let models = get("/v1/models").await.json();
    let context = models["data"][0]["context_length"]
        .as_u64()
        .expect("context_length");
    let long = "hello ".repeat(context as usize + 16);

    let reply = post_json(CHAT, &chat_body(&long, json!({"max_tokens": 1}))).await;
    let err = assert_error(&reply, 400, Some("messages"));
    assert_eq!(err["code"], "context_length_exceeded");
    let message = err["message"].as_str().unwrap_or_default();
    let numbers: Vec<u64> = message
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|s| s.parse().ok())
        .collect();
    assert!(numbers.contains(&context), "{message}");
    assert!(
        numbers.iter().any(|&n| n > context),
        "prompt size missing: {message}"
    );

    let reply = post_json(
        COMPLETIONS,
        &json!({"model": MODEL_ID, "prompt": long, "max_tokens": 1}),
    )
    .await;
    let err = assert_error(&reply, 400, Some("prompt"));
    assert!(
        err["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&context.to_string())
    );
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let state = ApiState {
        body_limit: 1024,
        ..state()
    };
    let body = chat_body(&"x".repeat(4096), json!({})).to_string();
    let reply = send_with(state, post_raw(CHAT, Some("application/json"), body)).await;
    assert_error(&reply, 413, None);

    // The default limit (4 MiB) applies without configuration.
    let body = chat_body(&"x".repeat(5 * 1024 * 1024), json!({})).to_string();
    let reply = send(post_raw(CHAT, Some("application/json"), body)).await;
    assert_error(&reply, 413, None);
}

#[tokio::test]
async fn unsupported_options_are_400_by_name() {
    let reply = post_json(CHAT, &chat_body("hi", json!({"n": 17}))).await;
    assert_error(&reply, 400, Some("n"));
    let reply = post_json(
        CHAT,
        &chat_body("hi", json!({"logprobs": true, "top_logprobs": 21})),
    )
    .await;
    assert_error(&reply, 400, Some("top_logprobs"));
    let reply = post_json(CHAT, &chat_body("hi", json!({"stop": vec!["x"; 17]}))).await;
    assert_error(&reply, 400, Some("stop"));
    let body = json!({"model": MODEL_ID, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    ]}]});
    assert_error(
        &post_json(CHAT, &body).await,
        400,
        Some("messages[0].content[0]"),
    );

    let reply = post_json(
        COMPLETIONS,
        &json!({"model": MODEL_ID, "prompt": "hi", "echo": true}),
    )
    .await;
    assert_error(&reply, 400, Some("echo"));
    let reply = post_json(
        COMPLETIONS,
        &json!({"model": MODEL_ID, "prompt": ["a", "b"]}),
    )
    .await;
    assert_error(&reply, 400, Some("prompt"));
    let reply = post_json(
        COMPLETIONS,
        &json!({"model": MODEL_ID, "prompt": "hi", "logprobs": 21}),
    )
    .await;
    assert_error(&reply, 400, Some("logprobs"));
    let reply = post_json(COMPLETIONS, &json!({"model": MODEL_ID, "prompt": []})).await;
    assert_error(&reply, 400, Some("prompt"));
    let reply = post_json(
        COMPLETIONS,
        &json!({"model": MODEL_ID, "prompt": [1, 99999999]}),
    )
    .await;
    assert_error(&reply, 400, Some("prompt"));
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_in_openai_shape() {
    let reply = get("/v1/nothing-here").await;
    assert_error(&reply, 404, None);
    let reply = get(CHAT).await;
    assert_error(&reply, 405, None);
}

#[tokio::test]
async fn documented_parameters_shoal_does_not_implement_are_400_by_name() {
    for (extra, param) in [
        (json!({"logit_bias": {"50256": -100}}), "logit_bias"),
        (
            json!({"audio": {"voice": "alloy", "format": "wav"}}),
            "audio",
        ),
        (json!({"modalities": ["text", "audio"]}), "modalities"),
        (
            json!({"prediction": {"type": "content", "content": "x"}}),
            "prediction",
        ),
        (json!({"functions": [{"name": "f"}]}), "functions"),
        (json!({"function_call": "auto"}), "function_call"),
        (
            json!({"web_search_options": {"search_context_size": "low"}}),
            "web_search_options",
        ),
        (json!({"reasoning_effort": "extreme"}), "reasoning_effort"),
        (
            json!({"chat_template_kwargs": {"enable_thinking": "no"}}),
            "chat_template_kwargs",
        ),
        (
            json!({"chat_template_kwargs": {"add_vision_id": true}}),
            "chat_template_kwargs",
        ),
        (json!({"verbosity": "low"}), "verbosity"),
    ] {
        let reply = post_json(CHAT, &chat_body("hi", extra.clone())).await;
        assert_error(&reply, 400, Some(param));
    }
    // What clients send by default passes, and so do fields no API documents.
    let defaults = json!({"logit_bias": {}, "modalities": ["text"], "verbosity": "medium",
        "reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": false}, "store": false, "metadata": {"a": "b"}, "user": "u",
        "service_tier": "auto", "some_client_extra": 1, "max_tokens": 2});
    let reply = post_json(CHAT, &chat_body("hi", defaults)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let reply = post_json(
        COMPLETIONS,
        &json!({"model": MODEL_ID, "prompt": "hi", "logit_bias": {"1": 5}}),
    )
    .await;
    assert_error(&reply, 400, Some("logit_bias"));
}

#[tokio::test]
async fn unknown_routes_under_anthropic_and_ollama_answer_in_their_shape() {
    let reply = get("/v1/messages/nothing-here").await;
    assert_eq!(reply.status, 404);
    let v = reply.json();
    assert_eq!(v["type"], "error", "{}", reply.body);
    assert_eq!(v["error"]["type"], "not_found_error", "{}", reply.body);
    let reply = get("/api/nothing-here").await;
    assert_eq!(reply.status, 404);
    let v = reply.json();
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|m| m.contains("/api/nothing-here")),
        "{}",
        reply.body
    );
    let reply = get("/v1/messages").await;
    assert_eq!(reply.status, 405);
    assert_eq!(reply.json()["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn good_request_works_after_bad_ones() {
    // A burst of bad requests of every kind...
    send(post_raw(CHAT, Some("application/json"), "{")).await;
    send(post_raw(CHAT, None, "{}")).await;
    post_json(CHAT, &json!({"model": MODEL_ID, "messages": []})).await;
    post_json(CHAT, &chat_body("hi", json!({"temperature": 9}))).await;
    post_json(CHAT, &chat_body("hi", json!({"max_tokens": -5}))).await;
    post_json(
        CHAT,
        &json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    post_json(
        COMPLETIONS,
        &json!({"model": MODEL_ID, "prompt": [[1], [2]]}),
    )
    .await;
    let huge = "y".repeat(5 * 1024 * 1024);
    send(post_raw(CHAT, Some("application/json"), huge)).await;
    // ...and the server still answers a good one, with unknown extra fields ignored.
    let body = chat_body(
        "Say hello.",
        json!({"max_tokens": 3, "temperature": 0, "user": "someone", "some_future_field": {"a": [1]},
               "tools": [], "parallel_tool_calls": false}),
    );
    let reply = post_json(CHAT, &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(
        reply.json()["usage"]["completion_tokens"]
            .as_u64()
            .map(|n| n > 0),
        Some(true)
    );
    let health = send(
        Request::get("/health")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(
        health
            .headers
            .get(header::CONTENT_TYPE)
            .map(|v| v.as_bytes()),
        Some(&b"application/json"[..])
    );
}

#[tokio::test]
async fn json_nested_100000_deep_is_refused_at_once_on_every_api() {
    let depth = 100_000;
    let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    for (path, body) in [
        (
            CHAT,
            format!(r#"{{"model":"{MODEL_ID}","messages":{deep}}}"#),
        ),
        (
            COMPLETIONS,
            format!(r#"{{"model":"{MODEL_ID}","prompt":{deep}}}"#),
        ),
        (
            "/v1/responses",
            format!(r#"{{"model":"{MODEL_ID}","input":{deep}}}"#),
        ),
        (
            "/v1/embeddings",
            format!(r#"{{"model":"{MODEL_ID}","input":{deep}}}"#),
        ),
        (
            "/v1/messages",
            format!(r#"{{"model":"{MODEL_ID}","max_tokens":5,"messages":{deep}}}"#),
        ),
        (
            "/api/chat",
            format!(r#"{{"model":"{MODEL_ID}","messages":{deep}}}"#),
        ),
        (
            "/api/generate",
            format!(r#"{{"model":"{MODEL_ID}","options":{deep}}}"#),
        ),
        (
            "/api/embed",
            format!(r#"{{"model":"{MODEL_ID}","input":{deep}}}"#),
        ),
        // The nesting first, before the model the middleware looks for.
        (CHAT, format!(r#"{{"x":{deep},"model":"{MODEL_ID}"}}"#)),
    ] {
        // Bounded: a parser that recursed or looped over the nesting would hang or overflow here.
        let reply = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            send(post_raw(path, Some("application/json"), body)),
        )
        .await
        .unwrap_or_else(|_| panic!("{path}: no answer to deep JSON"));
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{path}: {}",
            reply.body
        );
    }
    // Still serving.
    let reply = post_json(CHAT, &chat_body("hi", json!({"max_tokens": 1}))).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}

#[tokio::test]
async fn more_than_2048_embedding_inputs_are_400_on_the_openai_and_ollama_routes() {
    let inputs = vec!["a"; 2049];
    let reply = post_json(
        "/v1/embeddings",
        &json!({"model": MODEL_ID, "input": inputs}),
    )
    .await;
    let err = assert_error(&reply, 400, Some("input"));
    assert!(
        err["message"].as_str().unwrap_or("").contains("2048"),
        "{err}"
    );
    let reply = post_json("/api/embed", &json!({"model": MODEL_ID, "input": inputs})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    assert!(
        reply.json()["error"]
            .as_str()
            .unwrap_or("")
            .contains("2048"),
        "{}",
        reply.body
    );
}
