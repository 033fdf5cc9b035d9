//! Anthropic's Messages API on the real engine and model: the message shape, stop reasons and the named
//! stop sequence, prefill, the streaming event order, count_tokens, and every kind of bad input
//! answered with a 4xx in Anthropic's error shape.

use crate::common::*;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::{Value, json};

const MESSAGES: &str = "/v1/messages";
const COUNT: &str = "/v1/messages/count_tokens";
const CHAT: &str = "/v1/chat/completions";

/// A messages body asking one question, greedy.
fn ask(question: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL_ID,
        "max_tokens": 32,
        "temperature": 0,
        "messages": [{"role": "user", "content": question}],
    });
    merge(&mut body, extra);
    body
}

async fn ok(body: &Value) -> Value {
    let reply = post_json(MESSAGES, body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.json()
}

fn text(message: &Value) -> String {
    let content = message["content"].as_array().expect("content");
    assert_eq!(content.len(), 1, "{message}");
    assert_eq!(content[0]["type"], "text");
    content[0]["text"].as_str().expect("text").to_string()
}

/// Asserts an Anthropic-shaped error with this status and type; returns its message.
#[track_caller]
fn anthropic_error(reply: &Reply, status: u16, kind: &str) -> String {
    assert_eq!(reply.status.as_u16(), status, "body: {}", reply.body);
    let v = reply.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert!(v.get("param").is_none() && v["error"].get("param").is_none());
    let message = v["error"]["message"].as_str().expect("message").to_string();
    assert!(!message.is_empty());
    message
}

/// The SSE events of a reply: (event name, parsed data), checking that each name matches its `type`.
fn events(reply: &Reply) -> Vec<(String, Value)> {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let ct = reply
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(ct.starts_with("text/event-stream"), "content-type {ct}");
    let mut out = Vec::new();
    for block in reply.body.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut name = None;
        let mut data = String::new();
        for line in block.lines() {
            if let Some(n) = line.strip_prefix("event:") {
                name = Some(n.trim().to_string());
            } else if let Some(d) = line.strip_prefix("data:") {
                data.push_str(d.strip_prefix(' ').unwrap_or(d));
            }
        }
        let Some(name) = name else {
            // A keep-alive comment; never unnamed data.
            assert!(data.is_empty(), "unnamed event {block:?}");
            continue;
        };
        let v: Value = serde_json::from_str(&data).expect("event data is JSON");
        assert_eq!(v["type"], name.as_str(), "{block}");
        out.push((name, v));
    }
    out
}

#[tokio::test]
async fn a_message_has_anthropics_shape() {
    let v = ok(&ask(
        "Tell me a long story about a dragon.",
        json!({"max_tokens": 5}),
    ))
    .await;
    assert!(
        v["id"].as_str().is_some_and(|id| id.starts_with("msg_")),
        "{v}"
    );
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], MODEL_ID);
    assert!(!text(&v).is_empty());
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["stop_sequence"], Value::Null);
    let usage = &v["usage"];
    assert_eq!(usage["output_tokens"], 5);
    let input = usage["input_tokens"].as_u64().expect("input_tokens");
    let cached = usage["cache_read_input_tokens"]
        .as_u64()
        .expect("cache read");
    assert_eq!(usage["cache_creation_input_tokens"], 0);
    // The prompt is what count_tokens counts: computed plus read from the prefix cache.
    let count = post_json(
        COUNT,
        &json!({"model": MODEL_ID, "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}]}),
    )
    .await;
    assert_eq!(count.status, StatusCode::OK, "{}", count.body);
    assert_eq!(count.json()["input_tokens"].as_u64(), Some(input + cached));
}

#[tokio::test]
async fn greedy_text_equals_the_openai_chat_routes() {
    let question = "What is the capital of France?";
    let anthropic = text(&ok(&ask(question, json!({"max_tokens": 24}))).await);
    let chat = post_json(
        CHAT,
        &chat_body(question, json!({"max_tokens": 24, "temperature": 0})),
    )
    .await;
    assert_eq!(chat.status, StatusCode::OK, "{}", chat.body);
    assert_eq!(
        anthropic,
        chat.json()["choices"][0]["message"]["content"]
            .as_str()
            .expect("content")
    );
}

#[tokio::test]
async fn end_turn_and_the_system_prompt() {
    let body = ask(
        "Say hi.",
        json!({"max_tokens": 200, "system": "You are a pirate."}),
    );
    let v = ok(&body).await;
    assert_eq!(v["stop_reason"], "end_turn", "{v}");
    assert_eq!(v["stop_sequence"], Value::Null);
    assert!(
        v["usage"]["output_tokens"]
            .as_u64()
            .is_some_and(|n| n < 200)
    );
    // The system prompt reaches the template (in place of SmolLM2's default one): it changes the prompt.
    let plain = ok(&ask("Say hi.", json!({"max_tokens": 1}))).await;
    let tokens = |v: &Value| {
        v["usage"]["input_tokens"].as_u64().unwrap_or(0)
            + v["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0)
    };
    assert_ne!(tokens(&v), tokens(&plain), "{v} vs {plain}");
    assert_ne!(text(&v), text(&plain));
    let blocks = ask(
        "Say hi.",
        json!({"max_tokens": 200, "system": [{"type": "text", "text": "You are a pirate."}]}),
    );
    assert_eq!(text(&ok(&blocks).await), text(&v));
}

#[tokio::test]
async fn a_stop_sequence_ends_the_message_and_is_named() {
    let base = ask("Name three colors.", json!({"max_tokens": 24}));
    let full = text(&ok(&base).await);
    let words: Vec<&str> = full.split_whitespace().filter(|w| w.len() >= 3).collect();
    assert!(words.len() >= 3, "output too short: {full:?}");
    let stop = words[words.len() / 2].to_string();
    let cut = full.find(&stop).expect("stop word in output");
    let mut body = base.clone();
    merge(
        &mut body,
        json!({"stop_sequences": ["\u{0}never", stop.clone()]}),
    );
    let v = ok(&body).await;
    assert_eq!(v["stop_reason"], "stop_sequence", "{v}");
    assert_eq!(v["stop_sequence"], stop.as_str());
    assert_eq!(text(&v), full[..cut]);

    merge(&mut body, json!({"stream": true}));
    let events = events(&post_json(MESSAGES, &body).await);
    let (_, delta) = events
        .iter()
        .find(|(n, _)| n == "message_delta")
        .expect("message_delta");
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence");
    assert_eq!(delta["delta"]["stop_sequence"], stop.as_str());
}

#[tokio::test]
async fn a_final_assistant_message_is_continued() {
    let question = "What is the capital of France?";
    let full = text(&ok(&ask(question, json!({"max_tokens": 16}))).await);
    // Prefill with the first word of the greedy answer: the answer continues after it.
    let first = full
        .split_inclusive(' ')
        .next()
        .expect("a word")
        .trim_end()
        .to_string();
    assert!(!first.is_empty() && first.len() < full.len(), "{full:?}");
    let mut body = ask(question, json!({"max_tokens": 15}));
    body["messages"]
        .as_array_mut()
        .expect("messages")
        .push(json!({"role": "assistant", "content": first}));
    let continued = text(&ok(&body).await);
    assert!(
        full.starts_with(&format!(
            "{first}{}",
            continued.chars().take(3).collect::<String>()
        )),
        "{first:?} + {continued:?} does not continue {full:?}"
    );
}

#[tokio::test]
async fn streaming_follows_anthropics_event_order() {
    let question = "Tell me a long story about a dragon.";
    let whole = ok(&ask(question, json!({"max_tokens": 12}))).await;
    let reply = post_json(
        MESSAGES,
        &ask(question, json!({"max_tokens": 12, "stream": true})),
    )
    .await;
    let events = events(&reply);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let n = names.len();
    assert!(n >= 7, "{names:?}");
    assert_eq!(names[..3], ["message_start", "content_block_start", "ping"]);
    assert!(
        names[3..n - 3].iter().all(|n| *n == "content_block_delta"),
        "{names:?}"
    );
    assert_eq!(
        names[n - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );

    let start = &events[0].1["message"];
    assert!(
        start["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("msg_"))
    );
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["stop_reason"], Value::Null);
    assert_eq!(start["model"], MODEL_ID);
    assert!(
        start["usage"]["input_tokens"]
            .as_u64()
            .is_some_and(|t| t > 5)
    );
    assert_eq!(events[1].1["index"], 0);
    assert_eq!(
        events[1].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    let streamed: String = events[3..n - 3]
        .iter()
        .map(|(_, v)| {
            assert_eq!(v["delta"]["type"], "text_delta");
            v["delta"]["text"].as_str().expect("text").to_string()
        })
        .collect();
    assert_eq!(
        streamed,
        text(&whole),
        "streaming and not give the same greedy text"
    );
    let delta = &events[n - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["delta"]["stop_sequence"], Value::Null);
    assert_eq!(delta["usage"]["output_tokens"], 12);
}

#[tokio::test]
async fn count_tokens_counts_system_and_messages() {
    let one = json!({"model": MODEL_ID, "messages": [{"role": "user", "content": "Hello there"}]});
    let reply = post_json(COUNT, &one).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let base = reply.json()["input_tokens"].as_u64().expect("input_tokens");
    assert!(base > 3, "{base}");
    let count = |system: &str| {
        let mut body = one.clone();
        merge(&mut body, json!({ "system": system }));
        async move {
            post_json(COUNT, &body).await.json()["input_tokens"]
                .as_u64()
                .expect("input_tokens")
        }
    };
    let short = count("Answer in French.").await;
    let long = count("Answer in French, and keep every answer under ten words.").await;
    assert_ne!(short, base, "the system prompt is counted");
    assert!(long > short, "{long} vs {short}");
    let blocks = post_json(
        COUNT,
        &json!({"model": MODEL_ID, "system": [{"type": "text", "text": "Answer in French."}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}]}),
    )
    .await;
    assert_eq!(blocks.json()["input_tokens"].as_u64(), Some(short));
    // max_tokens is not needed here.
    let bad = post_json(
        COUNT,
        &json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    anthropic_error(&bad, 404, "not_found_error");
}

#[tokio::test]
async fn the_anthropic_version_header_is_accepted() {
    let request = Request::post(MESSAGES)
        .header(header::CONTENT_TYPE, "application/json")
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "something-new")
        .body(Body::from(ask("Hi", json!({"max_tokens": 2})).to_string()))
        .expect("request");
    let reply = send(request).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}

#[tokio::test]
async fn bad_input_is_a_4xx_in_anthropics_shape() {
    let user = json!([{"role": "user", "content": "Hi"}]);
    let without = |field: &str| {
        let mut body = ask("Hi", json!({}));
        body.as_object_mut().expect("object").remove(field);
        body
    };
    let cases: Vec<(&str, Value, u16, &str, &str)> = vec![
        (
            "no max_tokens",
            without("max_tokens"),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            "max_tokens 0",
            ask("Hi", json!({"max_tokens": 0})),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            "max_tokens a string",
            ask("Hi", json!({"max_tokens": "many"})),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            "no model",
            without("model"),
            400,
            "invalid_request_error",
            "model",
        ),
        (
            "unknown model",
            ask("Hi", json!({"model": "claude-nope"})),
            404,
            "not_found_error",
            "claude-nope",
        ),
        (
            "no messages",
            without("messages"),
            400,
            "invalid_request_error",
            "messages",
        ),
        (
            "empty messages",
            ask("Hi", json!({"messages": []})),
            400,
            "invalid_request_error",
            "messages",
        ),
        (
            "system role in messages",
            ask(
                "Hi",
                json!({"messages": [{"role": "system", "content": "x"}]}),
            ),
            400,
            "invalid_request_error",
            "messages[0].role",
        ),
        (
            "content a number",
            ask("Hi", json!({"messages": [{"role": "user", "content": 7}]})),
            400,
            "invalid_request_error",
            "messages[0].content",
        ),
        (
            "an image",
            ask(
                "Hi",
                json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}),
            ),
            400,
            "invalid_request_error",
            "image",
        ),
        (
            "a text block without text",
            ask(
                "Hi",
                json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
            ),
            400,
            "invalid_request_error",
            "messages[0].content[0].text",
        ),
        (
            "temperature above 1",
            ask("Hi", json!({"temperature": 1.5})),
            400,
            "invalid_request_error",
            "temperature",
        ),
        (
            "negative top_k",
            ask("Hi", json!({"top_k": -1})),
            400,
            "invalid_request_error",
            "top_k",
        ),
        (
            "top_p above 1",
            ask("Hi", json!({"top_p": 1.5})),
            400,
            "invalid_request_error",
            "top_p",
        ),
        (
            "stop_sequences a string",
            ask("Hi", json!({"stop_sequences": "END"})),
            400,
            "invalid_request_error",
            "stop_sequences",
        ),
        (
            "too many stop sequences",
            ask("Hi", json!({"stop_sequences": vec!["x"; 17]})),
            400,
            "invalid_request_error",
            "stop_sequences",
        ),
        (
            "thinking of an unknown type",
            ask("Hi", json!({"thinking": {"type": "sometimes"}})),
            400,
            "invalid_request_error",
            "thinking.type",
        ),
        (
            "a tool without input_schema",
            ask("Hi", json!({"tools": [{"name": "f"}]})),
            400,
            "invalid_request_error",
            "tools[0].input_schema",
        ),
        (
            "a server tool",
            ask(
                "Hi",
                json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            ),
            400,
            "invalid_request_error",
            "tools[0].type",
        ),
        (
            "tool_choice naming an unknown tool",
            ask(
                "Hi",
                json!({"tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "g"}}),
            ),
            400,
            "invalid_request_error",
            "tool_choice",
        ),
        (
            "tool_choice any without tools",
            ask("Hi", json!({"tool_choice": {"type": "any"}})),
            400,
            "invalid_request_error",
            "tool_choice",
        ),
        (
            "a tool_result for no call",
            ask(
                "Hi",
                json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "4"}]}]}),
            ),
            400,
            "invalid_request_error",
            "messages[0].content[0].tool_use_id",
        ),
        (
            "mcp servers",
            ask(
                "Hi",
                json!({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}),
            ),
            400,
            "invalid_request_error",
            "mcp_servers",
        ),
        (
            "an output format other than json_schema",
            ask("Hi", json!({"output_config": {"format": {"type": "xml"}}})),
            400,
            "invalid_request_error",
            "output_config.format",
        ),
        (
            "stream a string",
            ask("Hi", json!({"stream": "yes"})),
            400,
            "invalid_request_error",
            "stream",
        ),
    ];
    for (what, body, status, kind, named) in cases {
        let reply = post_json(MESSAGES, &body).await;
        let message = anthropic_error(&reply, status, kind);
        assert!(
            message.contains(named),
            "{what}: {message:?} does not name {named:?}"
        );
    }
    // Accepted and harmless: metadata, thinking disabled, tool_choice none without tools, hints, extras.
    let fine = ask(
        "Hi",
        json!({"max_tokens": 2, "metadata": {"user_id": "u1"}, "thinking": {"type": "disabled"},
               "tool_choice": {"type": "none"}, "service_tier": "auto", "some_future_field": 1, "messages": user,
               "output_config": {"effort": "low"}, "cache_control": {"type": "ephemeral"}, "container": null}),
    );
    ok(&fine).await;
}

#[tokio::test]
async fn malformed_bodies_answer_in_anthropics_shape() {
    let reply = send(post_raw(MESSAGES, Some("application/json"), "{\"model\": ")).await;
    anthropic_error(&reply, 400, "invalid_request_error");
    let reply = send(post_raw(MESSAGES, Some("application/json"), "[1, 2]")).await;
    anthropic_error(&reply, 400, "invalid_request_error");
    let reply = send(post_raw(MESSAGES, None, ask("Hi", json!({})).to_string())).await;
    anthropic_error(&reply, 400, "invalid_request_error");
    let reply = send(post_raw(COUNT, Some("application/json"), "nonsense")).await;
    anthropic_error(&reply, 400, "invalid_request_error");
    let mut state = state();
    state.body_limit = 1024;
    let big = ask(&"word ".repeat(1000), json!({}));
    let reply = send_with(
        state,
        post_raw(MESSAGES, Some("application/json"), big.to_string()),
    )
    .await;
    anthropic_error(&reply, 413, "request_too_large");
    // The server keeps serving.
    ok(&ask("Hi", json!({"max_tokens": 2}))).await;
}

#[tokio::test]
async fn a_prompt_longer_than_the_context_is_a_400() {
    let long = "hello ".repeat(9000);
    let reply = post_json(MESSAGES, &ask(&long, json!({}))).await;
    let message = anthropic_error(&reply, 400, "invalid_request_error");
    assert!(message.contains("messages"), "{message}");
}

fn weather_tools() -> Value {
    json!([{
        "name": "get_weather",
        "description": "The current weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }])
}

/// The `tool_use` blocks of a message.
fn tool_uses(message: &Value) -> Vec<Value> {
    message["content"]
        .as_array()
        .expect("content")
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_forced_tool_call_is_a_valid_tool_use_block() {
    for choice in [
        json!({"type": "tool", "name": "get_weather"}),
        json!({"type": "any", "disable_parallel_tool_use": true}),
    ] {
        let body = ask(
            "What is the weather like in Paris?",
            json!({"max_tokens": 64, "tools": weather_tools(), "tool_choice": choice}),
        );
        let v = ok(&body).await;
        let calls = tool_uses(&v);
        assert_eq!(calls.len(), 1, "{v}");
        assert_eq!(calls[0]["name"], "get_weather");
        assert!(calls[0]["id"].as_str().is_some_and(|id| !id.is_empty()));
        assert!(calls[0]["input"]["city"].is_string(), "{v}");
        assert_eq!(v["stop_reason"], "tool_use", "{v}");
    }
}

#[tokio::test]
async fn a_streamed_tool_call_arrives_as_input_json_deltas() {
    let body = ask(
        "What is the weather like in Paris?",
        json!({"max_tokens": 64, "tools": weather_tools(),
               "tool_choice": {"type": "tool", "name": "get_weather"}}),
    );
    let whole = ok(&body).await;
    let mut streaming = body.clone();
    merge(&mut streaming, json!({"stream": true}));
    let events = events(&post_json(MESSAGES, &streaming).await);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "ping"], "{names:?}");
    let n = names.len();
    assert_eq!(names[n - 2..], ["message_delta", "message_stop"]);
    let start = events
        .iter()
        .find(|(n, v)| n == "content_block_start" && v["content_block"]["type"] == "tool_use")
        .map(|(_, v)| v.clone())
        .expect("a tool_use block");
    let index = start["index"].clone();
    assert_eq!(start["content_block"]["name"], "get_weather");
    assert_eq!(start["content_block"]["input"], json!({}));
    let json: String = events
        .iter()
        .filter(|(n, v)| n == "content_block_delta" && v["index"] == index)
        .map(|(_, v)| {
            assert_eq!(v["delta"]["type"], "input_json_delta");
            v["delta"]["partial_json"]
                .as_str()
                .expect("partial_json")
                .to_string()
        })
        .collect();
    let input: Value = serde_json::from_str(&json).expect("the deltas are the input's JSON");
    assert_eq!(input, tool_uses(&whole)[0]["input"]);
    assert!(
        events
            .iter()
            .any(|(n, v)| n == "content_block_stop" && v["index"] == index)
    );
    assert_eq!(events[n - 2].1["delta"]["stop_reason"], "tool_use");
}

#[tokio::test]
async fn a_tool_result_turn_renders_and_is_counted() {
    let conversation = json!([
        {"role": "user", "content": "What is the weather like in Paris?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 24 degrees Celsius."}]},
    ]);
    let body = ask(
        "unused",
        json!({"max_tokens": 40, "tools": weather_tools(), "messages": conversation}),
    );
    let v = ok(&body).await;
    assert!(
        v["content"].as_array().is_some_and(|c| !c.is_empty()),
        "{v}"
    );
    let input = v["usage"]["input_tokens"].as_u64().unwrap_or(0)
        + v["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0);
    let count = |extra: Value| {
        let mut body = json!({"model": MODEL_ID, "messages": conversation.clone()});
        merge(&mut body, extra);
        async move {
            let reply = post_json(COUNT, &body).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            reply.json()["input_tokens"].as_u64().expect("input_tokens")
        }
    };
    let with_tools = count(json!({"tools": weather_tools()})).await;
    assert_eq!(
        with_tools, input,
        "count_tokens renders what a message renders"
    );
    let without = count(json!({})).await;
    assert!(
        with_tools > without,
        "tools are counted: {with_tools} vs {without}"
    );
    // The result reaches the prompt: a different result is a different prompt.
    let mut other = conversation.clone();
    other[2]["content"][0]["content"] = json!("Heavy rain and storms all day long, 9 degrees.");
    let changed = post_json(COUNT, &json!({"model": MODEL_ID, "messages": other})).await;
    assert_ne!(changed.json()["input_tokens"].as_u64(), Some(without));
}

#[tokio::test]
async fn an_output_format_constrains_the_answer_to_its_schema() {
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": false,
    });
    let body = ask(
        "Invent a person.",
        json!({"max_tokens": 80, "output_config": {"format": {"type": "json_schema", "schema": schema}}}),
    );
    let v = ok(&body).await;
    assert_eq!(v["stop_reason"], "end_turn", "{v}");
    let answer: Value = serde_json::from_str(&text(&v)).expect("the answer is JSON");
    assert!(
        answer["name"].is_string() && answer["age"].is_i64(),
        "{answer}"
    );
    assert_eq!(answer.as_object().map(|o| o.len()), Some(2), "{answer}");
}
