//! Reasoning output: a model whose template thinks in `<think>` blocks (the synthetic Qwen 3 with an
//! R1-style template: the generation prompt opens the thoughts) answers with `reasoning_content`, streamed
//! and not alike; `reasoning_effort: "none"` or `chat_template_kwargs.enable_thinking: false` close the
//! block in the prompt, and the answer is content.

use std::sync::OnceLock;

use serde_json::{Value, json};
use shoal_engine::EngineHandle;

use crate::common::{Reply, sse_data};

const MODEL: &str = "qwen3-think";

fn engine() -> EngineHandle {
    static ENGINE: OnceLock<EngineHandle> = OnceLock::new();
    crate::common::synth_engine(&ENGINE, "qwen3-think-s-f16.gguf", MODEL)
}

async fn chat(extra: Value) -> Reply {
    let mut body = json!({"model": MODEL, "max_tokens": 12, "temperature": 0,
        "messages": [{"role": "user", "content": "What is 7 times 8?"}]});
    crate::common::merge(&mut body, extra);
    crate::common::post_to(engine(), "/v1/chat/completions", &body).await
}

#[tokio::test]
async fn thoughts_opened_by_the_prompt_are_reasoning_content_streamed_or_not() {
    let reply = chat(json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let v = reply.json();
    let message = &v["choices"][0]["message"];
    let reasoning = message["reasoning_content"]
        .as_str()
        .expect("reasoning_content");
    assert!(!reasoning.is_empty());
    // The random model never closes its thoughts within 12 tokens: no answer after them.
    assert_eq!(message["content"], "", "{message}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    let reply = chat(json!({"stream": true})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let (mut streamed, mut content) = (String::new(), String::new());
    for data in sse_data(&reply.body) {
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(&data).expect("a chunk");
        let delta = &chunk["choices"][0]["delta"];
        streamed.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(delta["content"].as_str().unwrap_or(""));
    }
    assert_eq!(
        streamed, reasoning,
        "the stream's thoughts are the answer's"
    );
    assert_eq!(content, "");
}

#[tokio::test]
async fn thinking_turned_off_closes_the_block_and_the_answer_is_content() {
    let on = chat(json!({})).await.json();
    for extra in [
        json!({"reasoning_effort": "none"}),
        json!({"chat_template_kwargs": {"enable_thinking": false}}),
    ] {
        let reply = chat(extra.clone()).await;
        assert_eq!(reply.status, 200, "{extra}: {}", reply.body);
        let v = reply.json();
        let message = &v["choices"][0]["message"];
        assert!(
            message.get("reasoning_content").is_none(),
            "{extra}: {message}"
        );
        assert!(
            !message["content"].as_str().unwrap_or("").is_empty(),
            "{extra}"
        );
        // The closed block is in the prompt: `\n</think>\n\n` costs tokens.
        let (off_prompt, on_prompt) = (
            v["usage"]["prompt_tokens"].as_u64().expect("usage"),
            on["usage"]["prompt_tokens"].as_u64().expect("usage"),
        );
        assert!(
            off_prompt > on_prompt,
            "{extra}: {off_prompt} vs {on_prompt}"
        );
    }
    // An effort keeps thinking on.
    let v = chat(json!({"reasoning_effort": "high"})).await.json();
    assert_eq!(
        v["choices"][0]["message"]["reasoning_content"],
        on["choices"][0]["message"]["reasoning_content"]
    );
}

#[tokio::test]
async fn a_constrained_answer_does_not_think() {
    let reply = chat(json!({"max_tokens": 30, "response_format": {"type": "json_object"}})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let v = reply.json();
    let message = &v["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{message}");
    assert!(
        message["content"]
            .as_str()
            .expect("content")
            .trim_start()
            .starts_with('{'),
        "{message}"
    );
}

async fn ollama(route: &str, body: Value) -> Reply {
    crate::common::post_to(engine(), route, &body).await
}

/// The NDJSON lines of a streamed Ollama answer, joined: (thinking, content).
fn ndjson_parts(body: &str, content_of: fn(&Value) -> &Value) -> (String, String) {
    let (mut thinking, mut content) = (String::new(), String::new());
    for line in body.lines().filter(|l| !l.is_empty()) {
        let v: Value = serde_json::from_str(line).expect("a JSON line");
        let holder = content_of(&v);
        thinking.push_str(holder["thinking"].as_str().unwrap_or(""));
        content.push_str(
            holder["content"]
                .as_str()
                .or(v["response"].as_str())
                .unwrap_or(""),
        );
    }
    (thinking, content)
}

#[tokio::test]
async fn ollama_chat_and_generate_answer_thinking_apart_and_think_false_turns_it_off() {
    let chat_body = |extra: Value| {
        let mut b = json!({"model": MODEL, "messages": [{"role": "user", "content": "What is 7 times 8?"}],
            "options": {"num_predict": 12, "temperature": 0}});
        crate::common::merge(&mut b, extra);
        b
    };
    let whole = ollama("/api/chat", chat_body(json!({"stream": false}))).await;
    assert_eq!(whole.status, 200, "{}", whole.body);
    let v = whole.json();
    let thinking = v["message"]["thinking"].as_str().expect("message.thinking");
    assert!(!thinking.is_empty());
    assert_eq!(v["message"]["content"], "");
    let streamed = ollama("/api/chat", chat_body(json!({"think": true}))).await;
    assert_eq!(streamed.status, 200, "{}", streamed.body);
    assert_eq!(
        ndjson_parts(&streamed.body, |v| &v["message"]),
        (thinking.to_string(), String::new())
    );
    let off = ollama(
        "/api/chat",
        chat_body(json!({"stream": false, "think": false})),
    )
    .await;
    let v = off.json();
    assert!(v["message"].get("thinking").is_none(), "{v}");
    assert!(
        !v["message"]["content"].as_str().unwrap_or("").is_empty(),
        "{v}"
    );
    let bad = ollama("/api/chat", chat_body(json!({"think": "max"}))).await;
    assert_eq!(bad.status, 400, "{}", bad.body);

    let gen_body = json!({"model": MODEL, "prompt": "What is 7 times 8?", "stream": false,
        "options": {"num_predict": 12, "temperature": 0}});
    let v = ollama("/api/generate", gen_body.clone()).await.json();
    assert_eq!(v["thinking"].as_str(), Some(thinking), "{v}");
    assert_eq!(v["response"], "");
    let mut raw = gen_body;
    crate::common::merge(&mut raw, json!({"raw": true}));
    let v = ollama("/api/generate", raw).await.json();
    assert!(
        v.get("thinking").is_none(),
        "a raw prompt is not read for thoughts: {v}"
    );
}

#[tokio::test]
async fn anthropic_thinking_enabled_is_a_thinking_block_and_off_by_default() {
    let body = |extra: Value| {
        let mut b = json!({"model": MODEL, "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": "What is 7 times 8?"}]});
        crate::common::merge(&mut b, extra);
        b
    };
    let on = ollama(
        "/v1/messages",
        body(json!({"thinking": {"type": "enabled", "budget_tokens": 1024}})),
    )
    .await;
    assert_eq!(on.status, 200, "{}", on.body);
    let v = on.json();
    assert_eq!(v["content"][0]["type"], "thinking", "{v}");
    let thinking = v["content"][0]["thinking"].as_str().expect("thinking");
    assert!(!thinking.is_empty());
    assert_eq!(v["content"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v["stop_reason"], "max_tokens");
    // Streamed: the same thoughts in thinking_delta events.
    let streamed = ollama(
        "/v1/messages",
        body(json!({"stream": true, "thinking": {"type": "enabled", "budget_tokens": 1024}})),
    )
    .await;
    let deltas: String = sse_data(&streamed.body)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|e| e["delta"]["type"] == "thinking_delta")
        .map(|e| e["delta"]["thinking"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(deltas, thinking);
    // No `thinking` (Anthropic's default) turns the thoughts off: the answer is text.
    let v = ollama("/v1/messages", body(json!({}))).await.json();
    assert_eq!(v["content"][0]["type"], "text", "{v}");
    assert!(!v["content"][0]["text"].as_str().unwrap_or("").is_empty());
    // A thinking block sent back in the conversation is dropped, not refused.
    let back = ollama(
        "/v1/messages",
        json!({"model": MODEL, "max_tokens": 4, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""},
                                               {"type": "text", "text": "Hello"}]},
            {"role": "user", "content": "and?"}]}),
    )
    .await;
    assert_eq!(back.status, 200, "{}", back.body);
}

#[tokio::test]
async fn responses_put_the_thoughts_in_a_reasoning_item_streamed_or_not() {
    let body = |extra: Value| {
        let mut b = json!({"model": MODEL, "input": "What is 7 times 8?", "max_output_tokens": 12,
            "temperature": 0});
        crate::common::merge(&mut b, extra);
        b
    };
    let v = ollama("/v1/responses", body(json!({}))).await.json();
    assert_eq!(v["output"][0]["type"], "reasoning", "{v}");
    let thoughts = v["output"][0]["content"][0]["text"]
        .as_str()
        .expect("reasoning text");
    assert!(!thoughts.is_empty());
    assert_eq!(v["output"].as_array().map(Vec::len), Some(1), "{v}");
    let streamed = ollama("/v1/responses", body(json!({"stream": true}))).await;
    let events: Vec<Value> = sse_data(&streamed.body)
        .iter()
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.reasoning_text.delta")
        .map(|e| e["delta"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(deltas, thoughts);
    let last = events.last().expect("events");
    let output = &last["response"]["output"];
    assert_eq!(output.as_array().map(Vec::len), Some(1), "{last}");
    assert_eq!(output[0]["content"], v["output"][0]["content"], "{last}");
    // `reasoning.effort: none` turns the thoughts off: a message.
    let v = ollama(
        "/v1/responses",
        body(json!({"reasoning": {"effort": "none"}})),
    )
    .await
    .json();
    assert_eq!(v["output"][0]["type"], "message", "{v}");
    let bad = ollama(
        "/v1/responses",
        body(json!({"reasoning": {"effort": "max"}})),
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
}

#[tokio::test]
async fn anthropic_budget_tokens_closes_the_thoughts_when_spent_and_the_model_answers() {
    let body = |budget: u32, stream: bool| {
        json!({"model": MODEL, "max_tokens": 24, "temperature": 0, "stream": stream,
            "thinking": {"type": "enabled", "budget_tokens": budget},
            "messages": [{"role": "user", "content": "What is 7 times 8?"}]})
    };
    // A budget the answer never reaches: all thoughts (the random model never closes them).
    let free = ollama("/v1/messages", body(1024, false)).await.json();
    let all = free["content"][0]["thinking"]
        .as_str()
        .expect("thinking")
        .to_string();
    assert_eq!(free["content"].as_array().map(Vec::len), Some(1), "{free}");
    // Four tokens of thoughts: the same thoughts cut there, closed, then an answer.
    let cut = ollama("/v1/messages", body(4, false)).await.json();
    println!("{cut}");
    let thoughts = cut["content"][0]["thinking"].as_str().expect("thinking");
    assert!(
        !thoughts.is_empty() && thoughts.len() < all.len(),
        "{thoughts:?} of {all:?}"
    );
    assert!(
        all.starts_with(thoughts.trim_end()),
        "{thoughts:?} is not how {all:?} starts"
    );
    assert_eq!(cut["content"][1]["type"], "text", "{cut}");
    assert!(
        !cut["content"][1]["text"]
            .as_str()
            .unwrap_or("")
            .contains("think>"),
        "{cut}"
    );
    assert_eq!(
        cut["usage"]["output_tokens"],
        free["usage"]["output_tokens"]
    );
}
