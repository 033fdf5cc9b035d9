//! `/v1/chat/completions` with `response_format`, `tools`, `tool_choice` and tool conversations, on
//! the real model through the router (no sockets). SmolLM2's template prints no tools, so calls come
//! in the generic JSON format, forced by the grammar where `tool_choice` asks for one.

use crate::common::{self, assert_error, chat_body, post_json};

const CHAT: &str = "/v1/chat/completions";
use serde_json::{Value, json};

fn weather_tool() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": false
            }
        }
    })
}

#[tokio::test]
async fn a_json_schema_answer_is_valid_json_of_the_schema() {
    let schema = json!({
        "type": "object",
        "properties": {"answer": {"type": "integer"}, "unit": {"enum": ["apples", "pears"]}},
        "required": ["answer", "unit"],
        "additionalProperties": false
    });
    let body = chat_body(
        "How many apples are 2 apples plus 3 apples?",
        json!({
            "temperature": 0,
            "max_tokens": 60,
            "response_format": {"type": "json_schema", "json_schema": {"name": "sum", "schema": schema, "strict": true}}
        }),
    );
    let reply = post_json(CHAT, &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let v = reply.json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    let answer: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content}"));
    assert!(answer["answer"].is_i64(), "{answer}");
    assert!(["apples", "pears"].contains(&answer["unit"].as_str().unwrap_or("")));
    assert_eq!(answer.as_object().map(|o| o.len()), Some(2));
    // json_object: any object.
    let body = chat_body(
        "Give me a JSON object describing a cat.",
        json!({"temperature": 0, "max_tokens": 60, "response_format": {"type": "json_object"}}),
    );
    let reply = post_json(CHAT, &body).await;
    let v = reply.json();
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(
            serde_json::from_str::<Value>(content).is_ok_and(|j| j.is_object()),
            "{content}"
        );
    } else {
        assert!(content.trim_start().starts_with('{'), "{content}");
    }
}

#[tokio::test]
async fn a_forced_call_comes_back_as_tool_calls() {
    let body = chat_body(
        "What is the weather in Paris?",
        json!({
            "temperature": 0,
            "max_tokens": 80,
            "tools": [weather_tool()],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}
        }),
    );
    let reply = post_json(CHAT, &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let v = reply.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["content"], Value::Null, "{v}");
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .expect("tool_calls");
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["type"], "function");
    assert!(
        calls[0]["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_"))
    );
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().expect("text"))
            .expect("arguments are JSON");
    assert!(args["city"].is_string(), "{args}");

    // The same, streamed: one delta carries the whole call, the last chunk says tool_calls.
    let mut body = body;
    body["stream"] = json!(true);
    let reply = post_json(CHAT, &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let data = reply.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("chunk JSON"))
        .collect();
    let streamed: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(streamed.len(), 1, "{data:?}");
    assert_eq!(streamed[0]["index"], 0);
    assert_eq!(streamed[0]["function"]["name"], "get_weather");
    assert_eq!(
        streamed[0]["function"]["arguments"],
        calls[0]["function"]["arguments"]
    );
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "", "no text around the call: {data:?}");
    let last = chunks.last().expect("chunks");
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
}

/// A call and its result in the history render through the template, and the model answers.
#[tokio::test]
async fn a_tool_conversation_renders_and_answers() {
    let body = json!({
        "model": common::MODEL_ID,
        "temperature": 0,
        "max_tokens": 20,
        "tools": [weather_tool()],
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}
        ]
    });
    let reply = post_json(CHAT, &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let v = reply.json();
    let usage = &v["usage"];
    // The system paragraph, the call as JSON and the result made it into the prompt.
    assert!(
        usage["prompt_tokens"].as_u64().is_some_and(|n| n > 150),
        "{v}"
    );
    assert!(
        v["choices"][0]["message"]["content"].is_string()
            || v["choices"][0]["message"]["tool_calls"].is_array()
    );
    // tool_choice none: no tools in the prompt, no parsing.
    let mut none = body.clone();
    none["tool_choice"] = json!("none");
    let reply = post_json(CHAT, &none).await;
    let v2 = reply.json();
    assert!(
        v2["usage"]["prompt_tokens"].as_u64() < usage["prompt_tokens"].as_u64(),
        "{v2}"
    );
    assert!(v2["choices"][0]["message"].get("tool_calls").is_none());
}

#[tokio::test]
async fn bad_tool_requests_are_400s_naming_the_field() {
    let cases = [
        (
            json!({"tools": [weather_tool()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": [weather_tool()], "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]}),
            "tools[0].function.name",
        ),
        (
            json!({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}),
            "tools[0].type",
        ),
        (
            json!({"tools": [weather_tool(), {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"$ref": "#/missing"}}}}}], "tool_choice": "required"}),
            "tools",
        ),
        (
            json!({"response_format": {"type": "json_object"}, "ignore_eos": true}),
            "ignore_eos",
        ),
    ];
    for (extra, param) in cases {
        let reply = post_json(CHAT, &chat_body("hi", extra.clone())).await;
        assert_error(&reply, 400, Some(param));
    }
    // A tool message without the call id it answers.
    let body = json!({
        "model": common::MODEL_ID,
        "messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "r"}]
    });
    assert_error(
        &post_json(CHAT, &body).await,
        400,
        Some("messages[1].tool_call_id"),
    );
}
