//! Ollama's `format` and `tools` on the real router and engine (SmolLM2), through shoal-guide: a JSON
//! schema in `format` constrains the answer (valid, matching JSON, streamed or not); with `tools`, an
//! answer in the template's tool-call form comes back as `message.tool_calls` with object arguments
//! (the call is made certain by a `format` schema of that form, as Ollama has no `tool_choice`), and the
//! call and its result render in the next turn.

use crate::common::*;
use axum::http::StatusCode;
use serde_json::{Value, json};

async fn ok(body: &Value) -> Value {
    let reply = post_json("/api/chat", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.json()
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
            "required": ["city"]}}})
}

/// The generic tool-call form (`{"tool_calls": [{"name", "arguments"}]}`) as a schema.
fn call_schema() -> Value {
    json!({"type": "object", "properties": {"tool_calls": {"type": "array", "minItems": 1, "maxItems": 1,
        "items": {"type": "object", "properties": {
            "name": {"const": "get_weather"},
            "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                "required": ["city"], "additionalProperties": false}},
            "required": ["name", "arguments"], "additionalProperties": false}}},
        "required": ["tool_calls"], "additionalProperties": false})
}

fn question(q: &str) -> Value {
    json!([{"role": "user", "content": q}])
}

#[tokio::test]
async fn a_format_schema_constrains_the_answer() {
    let schema = json!({"type": "object", "properties": {"capital": {"type": "string", "maxLength": 16}},
        "required": ["capital"], "additionalProperties": false});
    let body = json!({"model": MODEL_ID, "stream": false, "format": schema,
        "messages": question("What is the capital of France? Answer in JSON."),
        "options": {"temperature": 0, "num_predict": 40}});
    let v = ok(&body).await;
    assert_eq!(v["done_reason"], "stop", "{v}");
    let text = v["message"]["content"].as_str().expect("content");
    let parsed: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let capital = parsed["capital"].as_str().expect("capital");
    assert!(capital.chars().count() <= 16);
    assert_eq!(parsed.as_object().map(|o| o.len()), Some(1), "{parsed}");

    // "json": any JSON object, streamed.
    let mut body = body;
    body["format"] = json!("json");
    body["stream"] = json!(true);
    body["options"]["num_predict"] = json!(60);
    let reply = post_json("/api/chat", &body).await;
    let lines: Vec<Value> = reply
        .body
        .lines()
        .map(|l| serde_json::from_str(l).expect("line"))
        .collect();
    let text: String = lines
        .iter()
        .filter_map(|l| l["message"]["content"].as_str())
        .collect();
    if lines.last().is_some_and(|l| l["done_reason"] == "stop") {
        let parsed: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(parsed.is_object(), "{parsed}");
    } else {
        assert!(text.trim_start().starts_with('{'), "{text:?}");
    }

    // /api/generate takes a format too, raw or templated.
    let g = post_json(
        "/api/generate",
        &json!({"model": MODEL_ID, "stream": false, "prompt": "The capital of France",
        "raw": true, "format": schema, "options": {"temperature": 0, "num_predict": 40}}),
    )
    .await;
    assert_eq!(g.status, StatusCode::OK, "{}", g.body);
    let text = g.json()["response"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let parsed: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    assert!(parsed["capital"].is_string(), "{parsed}");
}

#[tokio::test]
async fn tool_calls_come_back_as_ollama_calls_and_render_in_the_next_turn() {
    let messages = question("What is the weather in Paris?");
    let body = json!({"model": MODEL_ID, "stream": false, "messages": messages, "tools": [weather_tool()],
        "format": call_schema(), "options": {"temperature": 0, "num_predict": 60}});
    let v = ok(&body).await;
    let msg = &v["message"];
    assert_eq!(msg["content"], "", "{v}");
    let calls = msg["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("no tool_calls: {v}"));
    assert_eq!(calls.len(), 1);
    let f = &calls[0]["function"];
    assert_eq!(f["name"], "get_weather");
    assert_eq!(f["index"], 0);
    assert!(
        f["arguments"]["city"].is_string(),
        "arguments are an object: {f}"
    );
    assert!(
        calls[0]["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_"))
    );

    // Streamed: the call arrives whole in one line, the text stays empty.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let reply = post_json("/api/chat", &streamed).await;
    let lines: Vec<Value> = reply
        .body
        .lines()
        .map(|l| serde_json::from_str(l).expect("line"))
        .collect();
    let with_calls: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"].get("tool_calls").is_some())
        .collect();
    assert_eq!(with_calls.len(), 1, "{lines:?}");
    assert_eq!(with_calls[0]["message"]["tool_calls"][0]["function"], *f);
    let text: String = lines
        .iter()
        .filter_map(|l| l["message"]["content"].as_str())
        .collect();
    assert_eq!(text, "");
    assert_eq!(lines.last().map(|l| l["done"].clone()), Some(json!(true)));

    // The next turn: the call and its result (Ollama's `tool_name`) render and the model answers.
    let next = json!({"model": MODEL_ID, "stream": false, "tools": [weather_tool()],
        "messages": [messages[0].clone(), {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_name": "get_weather", "content": "18 degrees and sunny"}],
        "options": {"temperature": 0, "num_predict": 30}});
    let answer = ok(&next).await;
    assert!(
        answer["prompt_eval_count"].as_u64() > v["prompt_eval_count"].as_u64(),
        "{answer}"
    );
    let has_text = answer["message"]["content"]
        .as_str()
        .is_some_and(|t| !t.is_empty());
    assert!(
        has_text || answer["message"]["tool_calls"].is_array(),
        "{answer}"
    );
}

#[tokio::test]
async fn a_bad_schema_is_a_400_naming_format() {
    let body = json!({"model": MODEL_ID, "stream": false, "messages": question("hi"),
        "format": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}});
    let reply = post_json("/api/chat", &body).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    let msg = reply.json()["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(msg.starts_with("format"), "{msg}");
}
