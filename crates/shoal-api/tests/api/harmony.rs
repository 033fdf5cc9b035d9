//! gpt-oss's harmony format through the real router on a model whose template writes `<|channel|>`
//! (the synthetic `qwen3-harmony-s-f16.gguf`: gpt-oss's tokenizer and specials, a harmony template written
//! for shoal, see scripts/synth/harmony_fixture.py). The template renders `reasoning_effort`, the tools'
//! namespace and earlier calls and results the way gpt-oss's does; a recorded gpt-oss answer tokenized by
//! the real vocabulary reads apart token by token; with `reasoning_effort: "high"` the fixture's prompt
//! opens an analysis message, so what the random model writes is reasoning; a forced call is written by
//! the grammar as harmony's commentary message and comes back as the API's tool call, whole, streamed
//! and cut by `max_tokens`; a JSON answer is written on the final channel; the analysis is a Responses
//! `reasoning` item and (opened by an assistant prefill) an Anthropic `thinking` block; earlier thoughts
//! sent back are rendered before their call. No special token ever reaches the content or the
//! reasoning.

use std::sync::OnceLock;

use serde_json::{Value, json};
use shoal_api::generate::reasoning::{Parts, Splitter, Syntax};
use shoal_engine::{ChatMessage, EngineHandle, Thinking};
use shoal_guide::{ToolCall, ToolFormat};

use crate::common::{Reply, chunks, merge};

const MODEL: &str = "qwen3-harmony";

fn engine() -> EngineHandle {
    static ENGINE: OnceLock<EngineHandle> = OnceLock::new();
    crate::common::synth_engine(&ENGINE, "qwen3-harmony-s-f16.gguf", MODEL)
}

async fn post(route: &str, body: Value) -> Reply {
    crate::common::post_to(engine(), route, &body).await
}

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}})
}

fn chat_body(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "max_tokens": 16, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}]});
    merge(&mut body, extra);
    body
}

fn forced(extra: Value) -> Value {
    let mut body = chat_body(json!({"tools": [weather()], "max_tokens": 80,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}));
    merge(&mut body, extra);
    body
}

/// No harmony special token in `text`.
fn clean(text: &str) -> bool {
    ![
        "<|channel|>",
        "<|message|>",
        "<|start|>",
        "<|end|>",
        "<|constrain|>",
    ]
    .iter()
    .any(|t| text.contains(t))
}

#[test]
fn the_template_renders_effort_tools_and_earlier_calls_as_gpt_oss_does() {
    let engine = engine();
    let template = engine.chat_template().expect("a template");
    assert!(template.writes_channels() && !template.writes_thinking());
    assert_eq!(ToolFormat::detect(Some(template)), ToolFormat::Harmony);
    let turns = vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Weather in Paris?"),
        ChatMessage {
            reasoning: Some("Need the weather.".into()),
            ..ChatMessage::assistant_tool_calls(
                "",
                vec![ToolCall {
                    id: "call_1".into(),
                    name: "get_weather".into(),
                    arguments: r#"{"city":"Paris"}"#.into(),
                }],
            )
        },
        ChatMessage::tool_result("call_1", "get_weather", "18 C"),
    ];
    let tools = [
        json!({"type": "function", "function": {"name": "get_weather",
        "description": "Weather of a city", "parameters": {"type": "object"}}}),
    ];
    let effort = |e: &str| Thinking {
        enable: None,
        effort: Some(e.into()),
        budget: None,
    };
    let low = engine
        .render_chat_thinking(&turns, &tools, &effort("low"))
        .expect("renders");
    assert!(low.contains("Reasoning: low\n"), "{low}");
    assert!(
        low.contains("<|start|>developer<|message|># Instructions\n\nBe brief.\n"),
        "{low}"
    );
    assert!(
        low.contains("type get_weather = (_: {\"type\": \"object\"}) => any;"),
        "{low}"
    );
    assert!(
        low.contains(
            "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>\
<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>\
<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"18 C\"<|end|><|start|>assistant"
        ),
        "{low}"
    );
    assert!(low.ends_with("<|start|>assistant"), "{low}");
    let default = engine
        .render_chat_thinking(&turns, &tools, &Thinking::default())
        .expect("renders");
    assert!(default.contains("Reasoning: medium\n"), "{default}");
    let high = engine
        .render_chat_thinking(&turns, &tools, &effort("high"))
        .expect("renders");
    assert!(
        high.ends_with("<|start|>assistant<|channel|>analysis<|message|>"),
        "{high}"
    );
}

/// A gpt-oss answer as the model writes it, one token at a time through the fixture's real
/// vocabulary (every special a single token), reads as the whole answer does.
#[test]
fn a_recorded_answer_reads_apart_token_by_token() {
    let engine = engine();
    let tokenizer = engine.tokenizer();
    let answer = "<|channel|>analysis<|message|>The user wants the weather. Call the tool.<|end|>\
<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
    let ids = tokenizer.encode(answer, true);
    for special in [
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|start|>",
        "<|constrain|>",
    ] {
        let id = tokenizer.token_id(special).expect("a harmony special");
        assert!(ids.contains(&id), "{special} is one token");
    }
    let syntax = Syntax::Harmony {
        analysis: false,
        calls: true,
    };
    let mut splitter = Splitter::new(syntax);
    let mut got = Parts::default();
    for id in &ids {
        let part = splitter.push(&tokenizer.decode(&[*id]));
        got.reasoning.push_str(&part.reasoning);
        got.content.push_str(&part.content);
    }
    let rest = splitter.finish();
    got.reasoning.push_str(&rest.reasoning);
    got.content.push_str(&rest.content);
    assert_eq!(got.reasoning, "The user wants the weather. Call the tool.");
    assert_eq!(
        got.content,
        "<|start|>assistant to=functions.get_weather<|message|>{\"city\":\"Paris\"}"
    );
    let parser = shoal_guide::ToolCallParser::new(ToolFormat::Harmony, 1);
    let (content, calls) = parser.parse(&got.content);
    assert_eq!(content, "");
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(calls[0].arguments, "{\"city\":\"Paris\"}");
}

#[tokio::test]
async fn an_analysis_message_is_reasoning_content_streamed_or_not() {
    let body = chat_body(json!({"reasoning_effort": "high"}));
    let reply = post("/v1/chat/completions", body.clone()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let v = reply.json();
    let message = &v["choices"][0]["message"];
    let reasoning = message["reasoning_content"]
        .as_str()
        .unwrap_or_else(|| panic!("reasoning_content: {v}"));
    let content = message["content"].as_str().unwrap_or("");
    assert!(
        !reasoning.is_empty() && clean(reasoning) && clean(content),
        "{v}"
    );

    let mut streamed = body;
    merge(&mut streamed, json!({"stream": true}));
    let reply = post("/v1/chat/completions", streamed).await;
    let (mut r, mut c) = (String::new(), String::new());
    for chunk in chunks(&reply) {
        let delta = &chunk["choices"][0]["delta"];
        r.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        c.push_str(delta["content"].as_str().unwrap_or(""));
    }
    assert_eq!((r.as_str(), c.as_str()), (reasoning, content));

    // Without the high effort the prompt ends at `<|start|>assistant`: whatever the random model
    // writes, no special token is shown.
    let v = post("/v1/chat/completions", chat_body(json!({})))
        .await
        .json();
    let message = &v["choices"][0]["message"];
    assert!(clean(message["content"].as_str().unwrap_or("")), "{v}");
    assert!(
        clean(message["reasoning_content"].as_str().unwrap_or("")),
        "{v}"
    );
}

#[tokio::test]
async fn a_forced_call_is_a_tool_call_in_every_api_streamed_or_not() {
    let v = post("/v1/chat/completions", forced(json!({}))).await.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{v}");
    let args = call["arguments"].as_str().expect("arguments");
    let parsed: Value = serde_json::from_str(args).expect("JSON arguments");
    assert!(parsed["city"].is_string(), "{args}");
    assert!(
        clean(choice["message"]["content"].as_str().unwrap_or("")),
        "{v}"
    );

    let reply = post("/v1/chat/completions", forced(json!({"stream": true}))).await;
    let streamed: Vec<Value> = chunks(&reply)
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(streamed.len(), 1, "{}", reply.body);
    assert_eq!(streamed[0]["function"]["arguments"], args);

    // Anthropic's tool_use and Ollama's tool_calls carry the same arguments.
    let body = json!({"model": MODEL, "max_tokens": 80, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [{"name": "get_weather", "description": "Weather of a city",
            "input_schema": weather()["function"]["parameters"]}],
        "tool_choice": {"type": "tool", "name": "get_weather"}});
    let v = post("/v1/messages", body).await.json();
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let block = v["content"]
        .as_array()
        .and_then(|c| c.iter().find(|b| b["type"] == "tool_use"))
        .unwrap_or_else(|| panic!("no tool_use: {v}"));
    assert_eq!(
        (&block["name"], &block["input"]),
        (&json!("get_weather"), &parsed)
    );
}

#[tokio::test]
async fn a_forced_call_cut_by_max_tokens_is_a_call_cut_short() {
    let v = post("/v1/chat/completions", forced(json!({}))).await.json();
    let whole = v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .expect("arguments")
        .to_string();
    let tokens = v["usage"]["completion_tokens"].as_u64().expect("usage");
    // Cut in the header (before its `<|message|>`: no arguments yet), then in the arguments.
    for (budget, in_args) in [(tokens / 3, false), (tokens - 2, true)] {
        let v = post(
            "/v1/chat/completions",
            forced(json!({"max_tokens": budget})),
        )
        .await
        .json();
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "length", "{budget}: {v}");
        let call = &choice["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "get_weather", "{budget}: {v}");
        let args = call["arguments"].as_str().expect("arguments");
        assert!(whole.starts_with(args), "{budget}: {args:?} vs {whole:?}");
        assert_eq!(!args.is_empty(), in_args, "{budget}: {args:?}");
        assert!(
            clean(choice["message"]["content"].as_str().unwrap_or("")),
            "{v}"
        );
    }
}

#[tokio::test]
async fn a_json_answer_is_written_on_the_final_channel() {
    let schema = json!({"type": "object", "properties": {"n": {"enum": [1, 2, 3]}},
        "required": ["n"], "additionalProperties": false});
    let body = chat_body(json!({"max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}}));
    let v = post("/v1/chat/completions", body).await.json();
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("content: {v}"));
    let parsed: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {v}"));
    assert!(parsed["n"].is_i64(), "{v}");
    assert!(
        v["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{v}"
    );
}

/// An earlier call's thoughts sent back (OpenAI's `reasoning_content`, Ollama's `thinking`, an
/// Anthropic `thinking` block) are rendered before the call: the prompt grows by them.
#[tokio::test]
async fn earlier_thoughts_sent_back_are_rendered_before_their_call() {
    let call = json!({"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}});
    let openai = |reasoning: Option<&str>| {
        let mut turn = json!({"role": "assistant", "content": null, "tool_calls": [call]});
        if let Some(r) = reasoning {
            turn["reasoning_content"] = json!(r);
        }
        json!({"model": MODEL, "max_tokens": 1, "tools": [weather()], "messages": [
            {"role": "user", "content": "Weather in Paris?"}, turn,
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]})
    };
    let prompt = |v: Value, key: &str| v["usage"][key].as_u64().unwrap_or_else(|| panic!("{v}"));
    let without = prompt(
        post("/v1/chat/completions", openai(None)).await.json(),
        "prompt_tokens",
    );
    let with = prompt(
        post(
            "/v1/chat/completions",
            openai(Some("Need the weather of Paris.")),
        )
        .await
        .json(),
        "prompt_tokens",
    );
    assert!(with > without + 5, "{with} vs {without}");

    let ollama = |thinking: Option<&str>| {
        let mut turn = json!({"role": "assistant", "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]});
        if let Some(t) = thinking {
            turn["thinking"] = json!(t);
        }
        json!({"model": MODEL, "stream": false, "options": {"num_predict": 1}, "tools": [weather()],
            "messages": [{"role": "user", "content": "Weather in Paris?"}, turn,
                {"role": "tool", "tool_name": "get_weather", "content": "18 C"}]})
    };
    let n = |v: Value| {
        v["prompt_eval_count"]
            .as_u64()
            .unwrap_or_else(|| panic!("{v}"))
    };
    let plain = n(post("/api/chat", ollama(None)).await.json());
    let thought = n(
        post("/api/chat", ollama(Some("Need the weather of Paris.")))
            .await
            .json(),
    );
    assert_eq!(thought - plain, with - without);

    let anthropic = |thinking: bool| {
        let mut blocks = vec![
            json!({"type": "tool_use", "id": "call_1", "name": "get_weather",
            "input": {"city": "Paris"}}),
        ];
        if thinking {
            blocks.insert(
                0,
                json!({"type": "thinking", "thinking": "Need the weather of Paris.",
                "signature": ""}),
            );
        }
        json!({"model": MODEL, "max_tokens": 1, "tools": [{"name": "get_weather",
            "input_schema": weather()["function"]["parameters"]}], "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": blocks},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "18 C"}]}]})
    };
    let input = |v: Value| {
        let u = &v["usage"];
        u["input_tokens"].as_u64().unwrap_or(0) + u["cache_read_input_tokens"].as_u64().unwrap_or(0)
    };
    let plain = input(post("/v1/messages", anthropic(false)).await.json());
    let thought = input(post("/v1/messages", anthropic(true)).await.json());
    assert_eq!(thought - plain, with - without);
}

/// The Responses API puts the analysis in a `reasoning` item (its `reasoning.effort` is the
/// template's), streamed as `response.reasoning_text.delta`.
#[tokio::test]
async fn responses_put_the_analysis_in_a_reasoning_item() {
    let body = json!({"model": MODEL, "input": "What is 7 times 8?", "max_output_tokens": 16,
        "temperature": 0, "reasoning": {"effort": "high"}});
    let v = post("/v1/responses", body.clone()).await.json();
    assert_eq!(v["output"][0]["type"], "reasoning", "{v}");
    let thoughts = v["output"][0]["content"][0]["text"]
        .as_str()
        .expect("reasoning text");
    assert!(!thoughts.is_empty() && clean(thoughts), "{v}");
    let mut streamed = body;
    merge(&mut streamed, json!({"stream": true}));
    let reply = post("/v1/responses", streamed).await;
    let deltas: String = crate::common::sse_data(&reply.body)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|e| e["type"] == "response.reasoning_text.delta")
        .map(|e| e["delta"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(deltas, thoughts);
}

/// Anthropic's assistant prefill may open the analysis itself: what follows is a `thinking` block.
#[tokio::test]
async fn an_anthropic_prefill_that_opens_the_analysis_answers_a_thinking_block() {
    let body = json!({"model": MODEL, "max_tokens": 16, "temperature": 0,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [{"role": "user", "content": "What is 7 times 8?"},
            {"role": "assistant", "content": "<|channel|>analysis<|message|>"}]});
    let v = post("/v1/messages", body).await.json();
    assert_eq!(v["content"][0]["type"], "thinking", "{v}");
    let thinking = v["content"][0]["thinking"].as_str().unwrap_or("");
    assert!(!thinking.is_empty() && clean(thinking), "{v}");
}

#[tokio::test]
async fn a_thinking_budget_ends_the_analysis_message_and_the_final_channel_answers() {
    let body = |budget: u32| {
        chat_body(json!({"reasoning_effort": "high", "max_tokens": 24,
            "thinking_budget_tokens": budget}))
    };
    let free = post("/v1/chat/completions", body(1024)).await.json();
    let cut = post("/v1/chat/completions", body(3)).await.json();
    let (free, cut) = (
        &free["choices"][0]["message"],
        &cut["choices"][0]["message"],
    );
    let all = free["reasoning_content"]
        .as_str()
        .expect("reasoning_content");
    let thoughts = cut["reasoning_content"]
        .as_str()
        .expect("reasoning_content");
    assert!(!thoughts.is_empty() && thoughts.len() < all.len(), "{cut}");
    assert!(
        all.starts_with(thoughts),
        "{thoughts:?} is not how {all:?} starts"
    );
    // The analysis was closed and the final channel opened: what follows is the answer.
    let content = cut["content"].as_str().unwrap_or("");
    assert!(!content.is_empty() && clean(content), "{cut}");
    assert_eq!(free["content"].as_str().unwrap_or(""), "", "{free}");
}
