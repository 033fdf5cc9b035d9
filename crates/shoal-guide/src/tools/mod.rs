//! Tools: what a request offers ([`FunctionTool`], [`ToolChoice`]), how each model family writes a
//! call ([`ToolFormat`], recognised from its chat template), and the conversation as the template
//! should see it ([`prepare_messages`]).
//!
//! Formats, as the families' templates and llama.cpp write them:
//! - [`ToolFormat::Hermes`] (Qwen 2.5 / 3, Hermes 2 Pro / 3, SmolLM3):
//!   `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, one block per call;
//! - [`ToolFormat::Llama3`] (Llama 3.1+): `{"name": "f", "parameters": {...}}`, possibly after
//!   `<|python_tag|>`;
//! - [`ToolFormat::MistralJson`] (Mistral v3 / Nemo): `[TOOL_CALLS][{"name": "f", "arguments": {...}}]`;
//!   [`ToolFormat::MistralArgs`] (Mistral Small 3.2, Devstral): `[TOOL_CALLS]f[ARGS]{...}` per call;
//! - [`ToolFormat::Harmony`] (gpt-oss): a message on the commentary channel addressed to the function,
//!   `<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>`; the API's harmony
//!   reader hands each call to the parser in one form ([`parse::harmony_call`]);
//! - [`ToolFormat::Generic`] (Gemma, SmolLM2 and any template that does not print tools): one JSON
//!   object `{"tool_calls": [{"name": "f", "arguments": {...}}]}`, taught by a system-prompt
//!   paragraph listing the tools, with earlier calls and results written into the messages as JSON
//!   (llama.cpp's "generic" handling, in shoal's own words).
//!
//! Parsing a model's output back into calls is [`parse`] (finished text) and [`stream`]
//! (incremental, for streamed answers); an answer the token budget cut inside a call is read by
//! [`cut`] into the calls it finished and the one it was writing.

pub mod cut;
pub mod parse;
pub mod stream;

use serde_json::{Value, json};
use shoal_model::chat::{ChatMessage, ChatTemplate, ToolCaps};

use crate::error::GuideError;

/// One function a model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionTool {
    pub name: String,
    pub description: Option<String>,
    /// JSON schema of the arguments object (an empty parameter list, `{}`, when the client gave none).
    pub parameters: Value,
}

impl FunctionTool {
    /// A tool from its parts; checks the name (what every API requires of one).
    pub fn new(
        name: impl Into<String>,
        description: Option<String>,
        parameters: Option<Value>,
    ) -> Result<Self, GuideError> {
        let name = name.into();
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
        if !valid {
            return Err(GuideError::Tool {
                message: format!(
                    "function name '{name}' must be 1 to 64 characters of a-z, A-Z, 0-9, '_', '-', '.'"
                ),
            });
        }
        let parameters = match parameters {
            // OpenAI: "omitting parameters defines a function with an empty parameter list" — so its
            // arguments are `{}`, never a free-form object a small model can ramble in.
            None | Some(Value::Null) => {
                json!({"type": "object", "properties": {}, "additionalProperties": false})
            }
            Some(p @ Value::Object(_)) => p,
            Some(_) => {
                return Err(GuideError::ToolSchema {
                    name,
                    message: "parameters must be a JSON schema object".into(),
                });
            }
        };
        Ok(Self {
            name,
            description,
            parameters,
        })
    }

    /// OpenAI's definition: `{"type": "function", "function": {"name", "description", "parameters"}}`,
    /// as llama.cpp gives it to chat templates.
    pub fn openai_json(&self) -> Value {
        // llama.cpp hands templates every tool with a description, empty where the client gave none.
        json!({"type": "function", "function": {
            "name": self.name,
            "description": self.description.as_deref().unwrap_or(""),
            "parameters": self.parameters,
        }})
    }
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// Tools are not shown and the output is not parsed for calls.
    None,
    /// The model decides; calls are parsed out of what it writes.
    #[default]
    Auto,
    /// The model must call one (or more) of the tools.
    Required,
    /// The model must call this function.
    Function(String),
}

/// How a model family writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3,
    MistralJson,
    MistralArgs,
    Harmony,
    Generic,
}

impl ToolFormat {
    /// The format of the model whose chat template is `template` (none: generic).
    pub fn detect(template: Option<&ChatTemplate>) -> Self {
        let Some(template) = template else {
            return ToolFormat::Generic;
        };
        let caps = template.tool_caps();
        let src = template.source();
        if !caps.tool_calls {
            return ToolFormat::Generic;
        }
        if template.writes_channels() {
            ToolFormat::Harmony
        } else if src.contains("[TOOL_CALLS]") {
            if src.contains("[ARGS]") {
                ToolFormat::MistralArgs
            } else {
                ToolFormat::MistralJson
            }
        } else if src.contains("<tool_call>") && !src.contains("<function=") {
            ToolFormat::Hermes
        } else if src.contains("<|python_tag|>")
            || (src.contains("<|start_header_id|>") && src.contains("\"parameters\""))
        {
            ToolFormat::Llama3
        } else {
            ToolFormat::Generic
        }
    }

    /// The key a call's arguments go under.
    pub fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3 => "parameters",
            _ => "arguments",
        }
    }

    /// Mistral's templates refuse call ids that are not 9 alphanumeric characters.
    pub fn short_ids(self) -> bool {
        matches!(self, ToolFormat::MistralJson | ToolFormat::MistralArgs)
    }
}

/// The conversation for the template, and the `tools` to hand it.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    pub messages: Vec<ChatMessage>,
    /// Empty when the template is not given tools (none offered, `tool_choice: none`, or a template
    /// that cannot print them: then the system prompt describes them).
    pub tools: Vec<Value>,
}

/// Readies `messages` for a template with `caps`: the tools go to the template where it prints them,
/// else into a system-prompt paragraph in the generic format; earlier calls and results are written
/// as generic JSON where the template cannot print them.
pub fn prepare_messages(
    mut messages: Vec<ChatMessage>,
    tools: &[FunctionTool],
    choice: &ToolChoice,
    caps: ToolCaps,
) -> Prepared {
    if !caps.tool_calls {
        messages = polyfill_history(messages);
    }
    let offered = !tools.is_empty() && *choice != ToolChoice::None;
    if !offered {
        return Prepared {
            messages,
            tools: Vec::new(),
        };
    }
    if caps.tools && caps.tool_calls {
        return Prepared {
            messages,
            tools: tools.iter().map(FunctionTool::openai_json).collect(),
        };
    }
    let paragraph = generic_instructions(tools, choice);
    match messages.first_mut() {
        Some(first) if first.role == "system" || first.role == "developer" => {
            first.content = if first.content.is_empty() {
                paragraph
            } else {
                format!("{}\n\n{paragraph}", first.content)
            };
        }
        _ => messages.insert(0, ChatMessage::new("system", paragraph)),
    }
    Prepared {
        messages,
        tools: Vec::new(),
    }
}

/// The system-prompt paragraph that teaches the generic format.
fn generic_instructions(tools: &[FunctionTool], choice: &ToolChoice) -> String {
    let listed: Vec<Value> = tools
        .iter()
        .map(|t| {
            let mut entry = serde_json::Map::new();
            entry.insert("name".into(), Value::from(t.name.as_str()));
            if let Some(d) = &t.description {
                entry.insert("description".into(), Value::from(d.as_str()));
            }
            entry.insert("parameters".into(), t.parameters.clone());
            Value::Object(entry)
        })
        .collect();
    let list = serde_json::to_string_pretty(&listed).unwrap_or_default();
    let form = r#"{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}"#;
    let when = match choice {
        ToolChoice::Required => "You must call at least one tool now.".to_string(),
        ToolChoice::Function(name) => format!("You must call the tool \"{name}\" now."),
        ToolChoice::Auto | ToolChoice::None => {
            "If a tool helps, call it; otherwise answer the user directly in plain text.".into()
        }
    };
    format!(
        "You can call the following tools (their arguments follow the JSON schema under \"parameters\"):\n\
{list}\n\n\
To call tools, reply with only a JSON object of this form and nothing else:\n\
{form}\n\
{when}"
    )
}

/// Writes assistant calls and tool results as generic JSON text, for templates that cannot print
/// them: calls become the assistant's content, results user turns (consecutive ones merged).
fn polyfill_history(messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len());
    let mut last_was_result = false;
    for m in messages {
        if !m.tool_calls.is_empty() {
            let calls: Vec<Value> = m
                .tool_calls
                .iter()
                .map(|c| json!({"name": c.name, "arguments": parse::arguments_value(&c.arguments)}))
                .collect();
            let text = json!({ "tool_calls": calls }).to_string();
            let content = if m.content.is_empty() {
                text
            } else {
                format!("{}\n{text}", m.content)
            };
            out.push(ChatMessage::new(m.role, content));
            last_was_result = false;
        } else if m.role == "tool" {
            let mut result = serde_json::Map::new();
            if let Some(name) = &m.name {
                result.insert("name".into(), Value::from(name.as_str()));
            }
            if let Some(id) = &m.tool_call_id {
                result.insert("tool_call_id".into(), Value::from(id.as_str()));
            }
            result.insert("content".into(), Value::from(m.content.as_str()));
            let text = json!({ "tool_response": result }).to_string();
            match out.last_mut() {
                Some(prev) if last_was_result => {
                    prev.content.push('\n');
                    prev.content.push_str(&text);
                }
                _ => out.push(ChatMessage::new("user", text)),
            }
            last_was_result = true;
        } else {
            out.push(m);
            last_was_result = false;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_model::chat::ToolCall;

    fn weather() -> FunctionTool {
        FunctionTool::new(
            "get_weather",
            Some("Weather of a city".into()),
            Some(json!({"type": "object", "properties": {"city": {"type": "string"}}})),
        )
        .expect("valid tool")
    }

    #[test]
    fn tool_names_are_checked() {
        assert!(FunctionTool::new("", None, None).is_err());
        assert!(FunctionTool::new("has space", None, None).is_err());
        let bad = FunctionTool::new("f", None, Some(json!("x"))).expect_err("not a schema");
        assert_eq!(bad.param(), Some("tools"));
        let t = FunctionTool::new("f", None, None).expect("ok");
        assert_eq!(
            t.parameters,
            json!({"type": "object", "properties": {}, "additionalProperties": false})
        );
    }

    #[test]
    fn a_template_without_tools_gets_a_system_paragraph_and_json_history() {
        let history = vec![
            ChatMessage::new("user", "Weather in Paris?"),
            ChatMessage::assistant_tool_calls(
                "",
                vec![ToolCall {
                    id: "call_1".into(),
                    name: "get_weather".into(),
                    arguments: r#"{"city": "Paris"}"#.into(),
                }],
            ),
            ChatMessage::tool_result("call_1", "get_weather", "18 C"),
            ChatMessage::tool_result("call_2", "get_weather", "19 C"),
        ];
        let p = prepare_messages(
            history,
            &[weather()],
            &ToolChoice::Auto,
            ToolCaps::default(),
        );
        assert!(p.tools.is_empty());
        assert_eq!(p.messages[0].role, "system");
        assert!(p.messages[0].content.contains("\"get_weather\""));
        assert!(
            p.messages[0]
                .content
                .contains(r#"{"tool_calls": [{"name": "<tool name>""#)
        );
        assert_eq!(
            p.messages[2].content,
            r#"{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}"#
        );
        assert_eq!(p.messages[3].role, "user");
        assert_eq!(
            p.messages[3].content,
            "{\"tool_response\":{\"name\":\"get_weather\",\"tool_call_id\":\"call_1\",\"content\":\"18 C\"}}\n\
{\"tool_response\":{\"name\":\"get_weather\",\"tool_call_id\":\"call_2\",\"content\":\"19 C\"}}"
        );
        assert_eq!(p.messages.len(), 4);
    }

    #[test]
    fn a_template_with_tools_gets_them_and_none_hides_them() {
        let caps = ToolCaps {
            tools: true,
            tool_calls: true,
            object_arguments: true,
        };
        let msgs = vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
        ];
        let p = prepare_messages(msgs.clone(), &[weather()], &ToolChoice::Required, caps);
        assert_eq!(p.messages, msgs);
        assert_eq!(p.tools[0]["function"]["name"], "get_weather");
        let p = prepare_messages(msgs.clone(), &[weather()], &ToolChoice::None, caps);
        assert!(p.tools.is_empty());
        assert_eq!(p.messages, msgs);
        // Generic: the paragraph joins the existing system message.
        let p = prepare_messages(
            msgs,
            &[weather()],
            &ToolChoice::Function("get_weather".into()),
            ToolCaps::default(),
        );
        assert!(
            p.messages[0]
                .content
                .starts_with("Be brief.\n\nYou can call")
        );
        assert!(
            p.messages[0]
                .content
                .ends_with("You must call the tool \"get_weather\" now.")
        );
    }
}
