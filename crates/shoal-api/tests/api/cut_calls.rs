//! What the token budget and the grammar leave of a constrained answer, through the real router on the
//! real model: a forced call cut by `max_tokens` comes back as a call cut short in every API (never as
//! shoal's call format in the text), constrained JSON has fixed separators and no free whitespace, tool-call ids are unique per request,
//! and `/v1/completions` stops at 16 tokens when it names no budget.

use serde_json::{Value, json};

use crate::common::{self, MODEL_ID, chat_body, post_json};

const CHAT: &str = "/v1/chat/completions";
/// Budgets that cut the whole forced call of `tokens` tokens at different places: in its wrapper,
/// its name and its arguments.
fn budgets(tokens: u32) -> [u32; 3] {
    [tokens / 4, tokens / 2 + 1, tokens - 3]
}

fn weather_tool() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"],
                "additionalProperties": false
            }
        }
    })
}

fn forced(max_tokens: u32, extra: Value) -> Value {
    let mut body = chat_body(
        "What is the weather in Paris?",
        json!({
            "temperature": 0,
            "max_tokens": max_tokens,
            "tools": [weather_tool()],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}
        }),
    );
    common::merge(&mut body, extra);
    body
}

/// The one call of a non-streamed chat answer, and its finish reason.
async fn chat_call(body: &Value) -> (Value, Value) {
    let reply = post_json(CHAT, body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let v = reply.json();
    let choice = v["choices"][0].clone();
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("no tool_calls: {v}"));
    assert_eq!(calls.len(), 1, "{v}");
    (calls[0].clone(), choice["finish_reason"].clone())
}

/// The call of the whole (uncut) answer: its arguments text, and the answer's tokens.
async fn whole_arguments() -> (String, u32) {
    let reply = post_json(CHAT, &forced(80, json!({}))).await;
    let v = reply.json();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let args = v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .expect("arguments")
        .to_string();
    let tokens = v["usage"]["completion_tokens"].as_u64().expect("usage") as u32;
    (args, tokens)
}

#[tokio::test]
async fn a_chat_call_cut_by_max_tokens_is_a_partial_tool_call_streamed_or_not() {
    let (whole, tokens) = whole_arguments().await;
    let mut named = false;
    for budget in budgets(tokens) {
        let (call, reason) = chat_call(&forced(budget, json!({}))).await;
        assert_eq!(reason, "length", "{budget}: {call}");
        let name = call["function"]["name"].as_str().expect("name");
        let args = call["function"]["arguments"].as_str().expect("arguments");
        assert!(name == "get_weather" || name.is_empty(), "{budget}: {call}");
        assert!(whole.starts_with(args), "{budget}: {args:?} vs {whole:?}");
        assert!(!args.contains("tool_calls"), "{budget}: {args}");
        named |= name == "get_weather" && !args.is_empty();

        // Streamed: the same call in the deltas, the same finish, no text.
        let reply = post_json(CHAT, &forced(budget, json!({"stream": true}))).await;
        let chunks = common::chunks(&reply);
        let data = &reply.body;
        let deltas: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
            .flatten()
            .collect();
        assert_eq!(deltas.len(), 1, "{budget}: {data:?}");
        assert!(
            deltas[0]["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("call_")),
            "{data:?}"
        );
        assert_eq!(deltas[0]["function"]["name"], name);
        assert_eq!(deltas[0]["function"]["arguments"], args);
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "", "{budget}: {data:?}");
        let last = chunks.last().expect("chunks");
        assert_eq!(last["choices"][0]["finish_reason"], "length", "{budget}");
    }
    assert!(
        named,
        "no budget of {:?} cut inside the arguments",
        budgets(tokens)
    );
}

#[tokio::test]
async fn a_responses_call_cut_by_max_output_tokens_is_an_incomplete_function_call() {
    let (whole, tokens) = whole_arguments().await;
    let body = |budget: u32, stream: bool| {
        json!({
            "model": MODEL_ID,
            "input": "What is the weather in Paris?",
            "temperature": 0,
            "max_output_tokens": budget,
            "stream": stream,
            "tools": [{"type": "function", "name": "get_weather", "parameters": weather_tool()["function"]["parameters"]}],
            "tool_choice": {"type": "function", "name": "get_weather"}
        })
    };
    for budget in budgets(tokens) {
        let reply = post_json("/v1/responses", &body(budget, false)).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let v = reply.json();
        assert_eq!(v["status"], "incomplete", "{v}");
        let output = v["output"].as_array().expect("output");
        assert_eq!(output.len(), 1, "only the call: {v}");
        let item = &output[0];
        assert_eq!(item["type"], "function_call", "{v}");
        assert_eq!(item["status"], "incomplete", "{v}");
        let args = item["arguments"].as_str().expect("arguments");
        assert!(whole.starts_with(args), "{budget}: {args:?} vs {whole:?}");

        // Streamed: the item closes incomplete and the response ends incomplete with it.
        let reply = post_json("/v1/responses", &body(budget, true)).await;
        let events: Vec<Value> = reply
            .sse_data()
            .iter()
            .map(|d| serde_json::from_str(d).expect("event"))
            .collect();
        let last = events.last().expect("events");
        assert_eq!(last["type"], "response.incomplete", "{events:?}");
        let streamed = &last["response"]["output"];
        assert_eq!(streamed.as_array().map(Vec::len), Some(1), "{last}");
        assert_eq!(streamed[0]["status"], "incomplete", "{last}");
        assert_eq!(streamed[0]["arguments"], item["arguments"], "{last}");
        assert!(
            events
                .iter()
                .all(|e| e["type"] != "response.output_text.delta"),
            "{events:?}"
        );
    }
}

#[tokio::test]
async fn an_anthropic_call_cut_by_max_tokens_is_an_incomplete_tool_use() {
    let (whole, tokens) = whole_arguments().await;
    let whole: Value = serde_json::from_str(&whole).expect("JSON");
    let body = |budget: u32, stream: bool| {
        json!({
            "model": MODEL_ID,
            "max_tokens": budget,
            "temperature": 0,
            "stream": stream,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [{"name": "get_weather", "description": "Current weather in a city",
                       "input_schema": weather_tool()["function"]["parameters"]}],
            "tool_choice": {"type": "tool", "name": "get_weather"}
        })
    };
    for budget in budgets(tokens) {
        let reply = post_json("/v1/messages", &body(budget, false)).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let v = reply.json();
        assert_eq!(v["stop_reason"], "max_tokens", "{v}");
        let content = v["content"].as_array().expect("content");
        assert_eq!(content.len(), 1, "only the call: {v}");
        let block = &content[0];
        assert_eq!(block["type"], "tool_use", "{v}");
        assert!(block["id"].as_str().is_some_and(|id| !id.is_empty()));
        let input = block["input"].as_object().expect("input is an object");
        // As far as it parses: every finished field is the whole answer's, a cut string its beginning.
        for (key, value) in input {
            let full = &whole[key];
            match (value.as_str(), full.as_str()) {
                (Some(part), Some(all)) => assert!(all.starts_with(part), "{key}: {v}"),
                _ => assert_eq!(value, full, "{key}: {v}"),
            }
        }

        // Streamed: the accumulated input_json_delta parses, and is the same input.
        let reply = post_json("/v1/messages", &body(budget, true)).await;
        let events: Vec<Value> = reply
            .sse_data()
            .iter()
            .map(|d| serde_json::from_str(d).expect("event"))
            .collect();
        let json: String = events
            .iter()
            .filter_map(|e| e["delta"]["partial_json"].as_str())
            .collect();
        let streamed: Value = serde_json::from_str(&json).expect("the streamed input parses");
        assert_eq!(&streamed, &block["input"], "{events:?}");
        let stop = events.iter().find(|e| e["type"] == "message_delta");
        assert_eq!(
            stop.expect("message_delta")["delta"]["stop_reason"],
            "max_tokens"
        );
        assert!(
            events.iter().all(|e| e["delta"]["type"] != "text_delta"),
            "{events:?}"
        );
    }
}

/// Whitespace outside JSON strings other than the one space after a `,` or a `:`.
fn free_blanks(text: &str) -> usize {
    let (mut in_string, mut escaped, mut blanks, mut prev) = (false, false, 0, ' ');
    for c in text.chars() {
        match (in_string, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => in_string = !in_string,
            (false, _, ' ') if matches!(prev, ',' | ':') => {}
            (false, _, c) if c.is_whitespace() => blanks += 1,
            _ => {}
        }
        prev = c;
    }
    blanks
}

#[tokio::test]
async fn constrained_json_sampled_at_temperature_one_is_compact() {
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "colors": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "colors"],
        "additionalProperties": false
    });
    for seed in [1, 7, 42] {
        let body = chat_body(
            "Describe a cat in JSON.",
            json!({
                "temperature": 1, "seed": seed, "max_tokens": 48,
                "response_format": {"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}}
            }),
        );
        let v = post_json(CHAT, &body).await.json();
        let content = v["choices"][0]["message"]["content"]
            .as_str()
            .expect("content");
        assert!(content.starts_with('{'), "{seed}: {content:?}");
        assert_eq!(free_blanks(content), 0, "{seed}: {content:?}");
        let (call, _) = chat_call(&forced(60, json!({"temperature": 1, "seed": seed}))).await;
        let args = call["function"]["arguments"].as_str().expect("arguments");
        assert_eq!(free_blanks(args), 0, "{seed}: {args:?}");
    }
}

#[tokio::test]
async fn concurrent_tool_calling_requests_get_their_own_call_ids() {
    let body = forced(60, json!({}));
    let (a, b) = tokio::join!(chat_call(&body), chat_call(&body));
    let (a, b) = (a.0["id"].clone(), b.0["id"].clone());
    assert!(a.as_str().is_some_and(|id| id.starts_with("call_")), "{a}");
    assert_ne!(a, b, "two requests, one call id");
    // The Responses API's calls too.
    let responses = json!({
        "model": MODEL_ID, "input": "Weather in Oslo?", "temperature": 0, "max_output_tokens": 60,
        "tools": [{"type": "function", "name": "get_weather", "parameters": weather_tool()["function"]["parameters"]}],
        "tool_choice": "required"
    });
    let (x, y) = tokio::join!(
        post_json("/v1/responses", &responses),
        post_json("/v1/responses", &responses)
    );
    let call_id = |r: &common::Reply| r.json()["output"][0]["call_id"].clone();
    assert!(call_id(&x).is_string(), "{}", x.body);
    assert_ne!(call_id(&x), call_id(&y));
}

#[tokio::test]
async fn completions_without_max_tokens_stop_at_sixteen_and_the_chat_routes_do_not() {
    let body = json!({"model": MODEL_ID, "prompt": "Once upon a time", "ignore_eos": true});
    let v = post_json("/v1/completions", &body).await.json();
    assert_eq!(v["usage"]["completion_tokens"], 16, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    // OpenAI chat keeps running to the end of the turn.
    let chat = chat_body(
        "List the seven days of the week, one per line.",
        json!({"temperature": 0}),
    );
    let v = post_json(CHAT, &chat).await.json();
    assert!(v["usage"]["completion_tokens"].as_u64() > Some(16), "{v}");
    // So do Ollama's generate and chat.
    let ask = "List the seven days of the week, one per line.";
    let generate =
        json!({"model": MODEL_ID, "prompt": ask, "stream": false, "options": {"temperature": 0}});
    let v = post_json("/api/generate", &generate).await.json();
    assert!(v["eval_count"].as_u64() > Some(16), "{v}");
    let chat = json!({"model": MODEL_ID, "stream": false, "options": {"temperature": 0},
                      "messages": [{"role": "user", "content": ask}]});
    let v = post_json("/api/chat", &chat).await.json();
    assert!(v["eval_count"].as_u64() > Some(16), "{v}");
}
