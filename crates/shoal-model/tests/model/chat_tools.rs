//! Tools in chat templates: `tools`, assistant `tool_calls` and `tool` results render as llama.cpp
//! renders them, and each template's tool capabilities are probed right.
//!
//! The templates in `tests/templates/` were written for shoal with the tool constructs of Qwen 2.5
//! (tools as JSON lines, `<tool_call>` blocks with `arguments | tojson`, consecutive results in one
//! user turn), Llama 3.1 (tools with `tojson(indent=4)` in the first user turn, one call as
//! `{"name", "parameters"}`, `'tool_calls' in message`, `ipython` turns) and Mistral Nemo
//! (`tool_call.function | tojson` cut open to add a 9-character id, `[TOOL_RESULTS]` with the call id).
//! `llama_cpp_renders.json` holds llama.cpp's renders of five conversations with each (llama-server
//! 0.5.0-dev, `/apply-template`, 2026-11-24). The same comparison run locally on the real templates
//! (llama.cpp's `models/templates/`: Qwen 2.5 7B, Qwen 3 0.6B, Llama 3.1 8B, Llama 3.2 3B, Mistral
//! Nemo, Hermes 3, SmolLM3) matched byte for byte too.

use serde::Deserialize;
use serde_json::Value;
use shoal_model::chat::{AddedSpecials, ChatMessage, ChatTemplate, ToolCall, ToolCaps};

#[derive(Deserialize)]
struct Case {
    name: String,
    messages: Vec<ChatMessage>,
    tools: Vec<Value>,
    add_generation_prompt: bool,
}

#[derive(Deserialize)]
struct Renders {
    cases: Vec<Case>,
    renders: std::collections::BTreeMap<String, Vec<String>>,
}

fn template(name: &str) -> ChatTemplate {
    let path = format!("{}/tests/templates/{name}", env!("CARGO_MANIFEST_DIR"));
    let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    ChatTemplate::new(&source, "<|im_start|>", "<|im_end|>").expect("compiles")
}

fn renders() -> Renders {
    let path = format!(
        "{}/tests/templates/llama_cpp_renders.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).expect("fixture parses")
}

#[test]
fn tools_calls_and_results_render_as_llama_cpp_renders_them() {
    let fixture = renders();
    assert_eq!(fixture.renders.len(), 3);
    for (name, expected) in &fixture.renders {
        let t = template(name);
        assert_eq!(expected.len(), fixture.cases.len());
        for (case, want) in fixture.cases.iter().zip(expected) {
            let got = t
                .apply_tools(
                    &case.messages,
                    &case.tools,
                    case.add_generation_prompt,
                    AddedSpecials::default(),
                )
                .unwrap_or_else(|e| panic!("{name} / {}: {e}", case.name));
            assert_eq!(&got, want, "{name} / {}", case.name);
        }
    }
}

#[test]
fn tool_capabilities_are_probed() {
    let all = ToolCaps {
        tools: true,
        tool_calls: true,
        object_arguments: true,
    };
    assert_eq!(template("qwen_tools_like.jinja").tool_caps(), all);
    assert_eq!(template("llama3_tools_like.jinja").tool_caps(), all);
    assert_eq!(template("mistral_tools_like.jinja").tool_caps(), all);
    // ChatML without tools (SmolLM2's shape): nothing.
    let chatml =
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
    let t = ChatTemplate::new(chatml, "", "").expect("compiles");
    assert_eq!(t.tool_caps(), ToolCaps::default());
    // A template that glues string arguments in: calls yes, object arguments no.
    let glue = "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.name + '(' + c.function.arguments + ')' }}{% endfor %}{% endfor %}";
    let t = ChatTemplate::new(glue, "", "").expect("compiles");
    assert_eq!(
        t.tool_caps(),
        ToolCaps {
            tools: false,
            tool_calls: true,
            object_arguments: false,
        }
    );
    let call = ChatMessage::assistant_tool_calls(
        "",
        vec![ToolCall {
            id: "c1".into(),
            name: "f".into(),
            arguments: "{\"a\": 1}".into(),
        }],
    );
    assert_eq!(t.render(&[call], false).expect("renders"), "f({\"a\": 1})");
}

/// Messages without tool fields still enumerate as `role`, `content` only; with them, the fields
/// follow in llama.cpp's order.
#[test]
fn tool_fields_are_mapping_keys_only_when_present() {
    let src = "{% for m in messages %}{% for k, v in m.items() %}{{ k }};{% endfor %}|{% endfor %}";
    let t = ChatTemplate::new(src, "", "").expect("compiles");
    let messages = [
        ChatMessage::new("user", "hi"),
        ChatMessage::assistant_tool_calls(
            "",
            vec![ToolCall {
                id: "c1".into(),
                name: "f".into(),
                arguments: "{}".into(),
            }],
        ),
        ChatMessage::tool_result("c1", "f", "ok"),
    ];
    assert_eq!(
        t.render(&messages, false).expect("renders"),
        "role;content;|role;content;tool_calls;|role;content;name;tool_call_id;|"
    );
    // No tools given: `tools` stays undefined, as before tools existed.
    let t = ChatTemplate::new("{{ tools is defined }}", "", "").expect("compiles");
    assert_eq!(t.render(&[], false).expect("renders"), "False");
    let tools = [serde_json::json!({"type": "function", "function": {"name": "f"}})];
    let out = t
        .apply_tools(&[], &tools, false, AddedSpecials::default())
        .expect("renders");
    assert_eq!(out, "True");
}
