//! shoal-guide on the real model (SmolLM2-135M-Instruct, `SHOAL_TEST_MODEL`): its 49k-token vocabulary
//! as llguidance's trie, masks that follow a grammar, and constrained greedy generations through the
//! real engine whose output parses and matches.

use std::num::NonZeroU32;
use std::sync::{Arc, OnceLock};

use serde_json::{Value, json};
use shoal_engine::engine::{EngineConfig, spawn_from_gguf};
use shoal_engine::{
    ChatMessage, EngineHandle, Event, FinishReason, GenerateRequest, LogitsProcessor, Prompt,
    SamplingParams,
};
use shoal_guide::{
    ChatGuidance, FunctionTool, Guides, ResponseFormat, ToolChoice, ToolEvent, ToolFormat,
};
use shoal_testkit::fixtures::model_path;

const MODEL: &str = "smollm2";

fn engine() -> EngineHandle {
    static ENGINE: OnceLock<EngineHandle> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            spawn_from_gguf(
                &model_path(),
                MODEL,
                EngineConfig {
                    threads: 1,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| {
                panic!("cannot start the engine on {}: {e}", model_path().display())
            })
        })
        .clone()
}

fn guides() -> &'static Guides {
    static GUIDES: OnceLock<Guides> = OnceLock::new();
    GUIDES.get_or_init(Guides::default)
}

/// Runs `messages` greedily under `guidance`; returns the text and how it ended.
fn generate(
    messages: Vec<ChatMessage>,
    guidance: &ChatGuidance,
    max_tokens: u32,
) -> (String, FinishReason, Option<shoal_guide::ToolCallParser>) {
    let engine = engine();
    let plan = guides()
        .plan(&engine, messages, guidance, 42)
        .expect("plan");
    let prompt = engine
        .render_chat_tools(&plan.messages, &plan.tools)
        .expect("renders");
    let request = GenerateRequest {
        model: MODEL.into(),
        prompt: Prompt::Text(prompt),
        sampling: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        max_tokens: NonZeroU32::new(max_tokens),
        stop: Vec::new(),
        add_bos: true,
        ignore_eos: false,
        timeout: None,
        logits_processor: plan.processor,
        speculative: None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (text, reason) = rt.block_on(async {
        let mut stream = engine.submit(request).expect("submit");
        let mut text = String::new();
        while let Some(event) = stream.next().await {
            match event {
                Event::Token { text: piece, .. } => text.push_str(&piece),
                Event::Done { finish_reason, .. } => return (text, finish_reason),
                Event::Error(e) => panic!("generation failed: {e}"),
            }
        }
        panic!("stream ended without Done");
    });
    (text, reason, plan.tool_parser)
}

#[test]
fn the_vocabulary_becomes_a_trie_whose_masks_follow_json() {
    let tokenizer = engine().tokenizer().clone();
    let guide = guides().for_tokenizer(&tokenizer).expect("guide");
    // Cached: the same guide for the same tokenizer.
    assert!(Arc::ptr_eq(
        &guide,
        &guides().for_tokenizer(&tokenizer).expect("guide")
    ));
    let mut p = guide
        .response_format(&ResponseFormat::JsonObject)
        .expect("compiles")
        .expect("a constraint");
    let first = p.mask().expect("mask");
    let id = |text: &str| {
        let ids = tokenizer.encode(text, false);
        assert_eq!(ids.len(), 1, "{text:?} is one token");
        ids[0]
    };
    assert!(first.allows(id("{")));
    assert!(!first.allows(id("Hello")) && !first.allows(id("[")));
    // Nothing ends an unfinished object.
    let im_end = tokenizer.token_id("<|im_end|>").expect("im_end");
    assert!(!first.allows(im_end));
    for t in tokenizer.encode("{\"a\": 1}", false) {
        assert!(
            p.mask().expect("mask").allows(t),
            "token {t} follows the grammar"
        );
        p.accept(t).expect("accepted");
    }
    // Complete: end-of-generation is allowed now, and only whitespace or the end after it.
    let done = p.mask().expect("mask");
    assert!(done.allows(im_end));
    assert!(!done.allows(id("x")));
    // A token the grammar does not allow is an error, not a silent skip.
    let mut q = p.clone_box();
    assert!(q.accept(id("x")).is_err());
    assert!(p.is_complete());
}

/// Constrained JSON has fixed separators and no other whitespace: `", "` and `": "`, nothing before,
/// inside brackets or after the object — a space or a line break inside a string is still text.
#[test]
fn constrained_json_leaves_no_room_for_whitespace() {
    let tokenizer = engine().tokenizer().clone();
    let guide = guides().for_tokenizer(&tokenizer).expect("guide");
    let mut p = guide
        .response_format(&ResponseFormat::JsonObject)
        .expect("compiles")
        .expect("a constraint");
    let one = |t: &str| match tokenizer.encode(t, false).as_slice() {
        [one] => Some(*one),
        _ => None,
    };
    // Never allowed outside a string: runs, line breaks, tabs.
    let blanks: Vec<u32> = ["\n", "  ", "\t", "   ", "\n\n"]
        .iter()
        .filter_map(|t| one(t))
        .collect();
    assert!(blanks.len() >= 3, "single-token blanks: {blanks:?}");
    let space = one(" ").expect("a space token");
    let refuses = |p: &mut shoal_guide::GuidedProcessor, at: &str, space_too: bool| {
        let mask = p.mask().expect("mask");
        for &b in &blanks {
            assert!(!mask.allows(b), "{:?} allowed {at}", tokenizer.decode(&[b]));
        }
        if space_too {
            assert!(!mask.allows(space), "a space allowed {at}");
        }
    };
    refuses(&mut p, "before the object", true);
    let mut fed = String::new();
    let mut checked = 0;
    for t in tokenizer.encode("{\"a\": \"x y\", \"b\": [1, 2]}", false) {
        assert!(p.mask().expect("mask").allows(t), "{fed:?} then {t}");
        p.accept(t).expect("accepted");
        fed.push_str(&tokenizer.decode(&[t]));
        if fed.ends_with([':', ',', '{', '[']) {
            refuses(&mut p, &format!("after {fed:?}"), fed.ends_with(['{', '[']));
            checked += 1;
        }
    }
    assert!(checked >= 2, "checked after {checked} separators only");
    assert!(p.is_complete());
    refuses(&mut p, "after the object", true);
}

#[test]
fn a_schema_constrained_generation_is_valid_json_of_that_schema() {
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}
        },
        "required": ["name", "age", "colors"],
        "additionalProperties": false
    });
    let guidance = ChatGuidance {
        response_format: ResponseFormat::JsonSchema {
            name: "person".into(),
            schema,
            strict: true,
        },
        ..Default::default()
    };
    let messages = vec![ChatMessage::new(
        "user",
        "Describe a person called Ann, 31 years old, who likes red, as JSON.",
    )];
    let (text, reason, parser) = generate(messages, &guidance, 120);
    assert!(parser.is_none());
    assert_eq!(
        reason,
        FinishReason::Stop,
        "the grammar completed: {text:?}"
    );
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let obj = v.as_object().expect("an object");
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["age", "colors", "name"], "{text}");
    assert!(
        obj["name"]
            .as_str()
            .is_some_and(|s| s.chars().count() <= 20)
    );
    assert!(obj["age"].as_u64().is_some_and(|a| a <= 150));
    let colors = obj["colors"].as_array().expect("array");
    assert!(colors.len() <= 3);
    assert!(
        colors
            .iter()
            .all(|c| ["red", "green", "blue"].contains(&c.as_str().unwrap_or("")))
    );
}

fn weather_tools() -> Vec<FunctionTool> {
    vec![
        FunctionTool::new(
            "get_weather",
            Some("Current weather in a city".into()),
            Some(json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                },
                "required": ["city", "unit"],
                "additionalProperties": false
            })),
        )
        .expect("tool"),
        FunctionTool::new("get_time", Some("Current time".into()), None).expect("tool"),
    ]
}

/// SmolLM2's template prints no tools: the generic format, taught in the system prompt and forced by
/// the grammar.
#[test]
fn a_forced_call_on_a_template_without_tools_parses_as_a_call() {
    let template = engine().chat_template().expect("template").tool_caps();
    assert!(!template.tools && !template.tool_calls);
    assert_eq!(
        ToolFormat::detect(engine().chat_template()),
        ToolFormat::Generic
    );
    let guidance = ChatGuidance {
        tools: weather_tools(),
        tool_choice: ToolChoice::Function("get_weather".into()),
        parallel_tool_calls: false,
        ..Default::default()
    };
    let messages = vec![ChatMessage::new("user", "What is the weather in Paris?")];
    let (text, reason, parser) = generate(messages, &guidance, 120);
    assert_eq!(reason, FinishReason::Stop, "{text:?}");
    let parser = parser.expect("tools offered: a parser");
    let (content, calls) = parser.parse(&text);
    assert_eq!(content, "", "{text:?}");
    assert_eq!(calls.len(), 1, "{text:?}");
    assert_eq!(calls[0].name, "get_weather");
    let args: Value = serde_json::from_str(&calls[0].arguments).expect("arguments are JSON");
    assert!(args["city"].is_string(), "{args}");
    assert!(
        ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap_or("")),
        "{args}"
    );
    // Streaming the same text piece by piece gives the same call.
    let mut stream = parser.stream();
    let mut events: Vec<ToolEvent> = text
        .split_inclusive(['"', ','])
        .flat_map(|piece| stream.push(piece))
        .collect();
    events.extend(stream.finish());
    assert_eq!(
        events,
        vec![ToolEvent::Call {
            index: 0,
            id: calls[0].id.clone(),
            name: calls[0].name.clone(),
            arguments: calls[0].arguments.clone(),
        }]
    );
}

#[test]
fn required_parallel_calls_are_one_or_more_valid_calls() {
    let guidance = ChatGuidance {
        tools: weather_tools(),
        tool_choice: ToolChoice::Required,
        parallel_tool_calls: true,
        ..Default::default()
    };
    let messages = vec![ChatMessage::new(
        "user",
        "What time is it, and is it raining in Oslo?",
    )];
    let (text, reason, parser) = generate(messages, &guidance, 160);
    assert_eq!(reason, FinishReason::Stop, "{text:?}");
    let (_, calls) = parser.expect("parser").parse(&text);
    assert!(!calls.is_empty(), "{text:?}");
    for call in &calls {
        assert!(
            ["get_weather", "get_time"].contains(&call.name.as_str()),
            "{text}"
        );
        let args: Value = serde_json::from_str(&call.arguments).expect("JSON");
        assert!(args.is_object());
    }
}

#[test]
fn bad_requests_are_typed_errors_naming_the_field() {
    let engine = engine();
    let plan = |guidance: ChatGuidance| {
        guides()
            .plan(&engine, vec![ChatMessage::new("user", "hi")], &guidance, 1)
            .expect_err("refused")
    };
    let e = plan(ChatGuidance {
        response_format: ResponseFormat::JsonSchema {
            name: "x".into(),
            schema: json!({"type": "object", "properties": {"a": {"type": "no-such-type"}}}),
            strict: true,
        },
        ..Default::default()
    });
    assert_eq!(e.param(), Some("response_format"), "{e}");
    let e = plan(ChatGuidance {
        tools: weather_tools(),
        tool_choice: ToolChoice::Function("nope".into()),
        ..Default::default()
    });
    assert_eq!(e.param(), Some("tool_choice"), "{e}");
    assert!(e.to_string().contains("nope"));
    let e = plan(ChatGuidance {
        tool_choice: ToolChoice::Required,
        ..Default::default()
    });
    assert_eq!(e.param(), Some("tool_choice"), "{e}");
    let mut bad = weather_tools();
    bad[1].parameters = json!({"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}});
    let e = plan(ChatGuidance {
        tools: bad,
        tool_choice: ToolChoice::Required,
        ..Default::default()
    });
    assert_eq!(e.param(), Some("tools"), "{e}");
    assert!(e.to_string().contains("get_time"), "{e}");
}

/// Every family's forced-call grammar accepts that family's own call text, token by token, ends
/// there, and the parser reads the call back (on SmolLM2's vocabulary: the markers are plain text in
/// it; a vocabulary with `[TOOL_CALLS]` as a control token gets `<[id]>` in the grammar instead).
#[test]
fn each_familys_forced_grammar_accepts_its_own_call_text() {
    let tokenizer = engine().tokenizer().clone();
    let guide = guides().for_tokenizer(&tokenizer).expect("guide");
    let tools = weather_tools();
    let args = r#"{"city": "Paris", "unit": "celsius"}"#;
    let cases = [
        (
            ToolFormat::Hermes,
            format!(
                "<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {args}}}\n</tool_call>"
            ),
        ),
        (
            ToolFormat::Llama3,
            format!("{{\"name\": \"get_weather\", \"parameters\": {args}}}"),
        ),
        (
            ToolFormat::MistralJson,
            format!("[TOOL_CALLS][{{\"name\": \"get_weather\", \"arguments\": {args}}}]"),
        ),
        (
            ToolFormat::MistralArgs,
            format!("[TOOL_CALLS]get_weather[ARGS]{args}"),
        ),
        (
            ToolFormat::Generic,
            format!("{{\"tool_calls\": [{{\"name\": \"get_weather\", \"arguments\": {args}}}]}}"),
        ),
    ];
    let im_end = tokenizer.token_id("<|im_end|>").expect("im_end");
    for (format, text) in cases {
        let mut p = guide
            .forced_call(format, &[&tools[0], &tools[1]], false)
            .expect("compiles");
        for t in tokenizer.encode(&text, false) {
            let mask = p.mask().expect("mask");
            assert!(mask.allows(t), "{format:?}: token {t} of {text:?}");
            assert!(!mask.allows(im_end), "{format:?}: not complete yet");
            p.accept(t).expect("accepted");
        }
        assert!(
            p.mask().expect("mask").allows(im_end),
            "{format:?}: complete"
        );
        let (content, calls) = shoal_guide::ToolCallParser::new(format, 3).parse(&text);
        assert_eq!(content, "", "{format:?}");
        assert_eq!(calls.len(), 1, "{format:?}");
        assert_eq!(calls[0].name, "get_weather");
        let parsed: Value = serde_json::from_str(&calls[0].arguments).expect("JSON");
        assert_eq!(parsed, serde_json::from_str::<Value>(args).expect("JSON"));
        // A wrong function name is refused at its first differing token.
        let mut q = guide
            .forced_call(format, &[&tools[0]], false)
            .expect("compiles");
        let wrong = text.replace("get_weather", "get_time");
        let mut refused = false;
        for t in tokenizer.encode(&wrong, false) {
            if !q.mask().expect("mask").allows(t) {
                refused = true;
                break;
            }
            q.accept(t).expect("accepted");
        }
        assert!(
            refused,
            "{format:?}: {wrong:?} is not a call to get_weather"
        );
    }
}
