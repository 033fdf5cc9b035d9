//! Tool calls as chat templates see them: [`ToolCall`] (what an assistant message carries), the
//! message mapping a template reads ([`MessageValue`], with `tool_calls`, `tool_call_id` and `name`
//! where the message has them), and [`ToolCaps`], what a template does with tools, found by probing
//! it as llama.cpp does (render a conversation with a tool and a tool call, see what came out).
//!
//! A tool call's `arguments` are JSON text (OpenAI's shape). Templates that print
//! `tool_call.arguments | tojson` want an object (Qwen 2.5, Llama 3.1, Hermes), others concatenate a
//! string; [`ToolCaps::object_arguments`] says which, and [`MessageValue`] hands the template an
//! object parsed from the text where it wants one (text that is no JSON stays text), as llama.cpp's
//! `func_args_not_string` does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use minijinja::Value;
use minijinja::value::{Enumerator, Object, ObjectRepr};
use serde::{Deserialize, Serialize};

use super::ChatMessage;

/// One function call made by an assistant turn.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's id, which the `tool` message answering it names (`tool_call_id`).
    pub id: String,
    /// The function called.
    pub name: String,
    /// The arguments as JSON text (normally an object).
    pub arguments: String,
}

/// What a chat template does with tools (llama.cpp's capability probes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolCaps {
    /// It prints the `tools` it is given (their names appear in the prompt).
    pub tools: bool,
    /// It prints an assistant message's `tool_calls`.
    pub tool_calls: bool,
    /// It wants each call's `arguments` as an object (it serializes them itself).
    pub object_arguments: bool,
}

/// Names the probes look for in the rendered text; unlikely in any template.
const PROBE_TOOL: &str = "shoal_probe_tool";
const PROBE_CALL: &str = "shoal_probe_call";
const PROBE_VALUE: &str = "shoal_probe_value";

impl ToolCaps {
    /// Probes a template through `render(messages, tools, object_arguments)` (errors count as "not
    /// supported").
    pub(super) fn probe<E>(
        render: impl Fn(&[ChatMessage], &[serde_json::Value], bool) -> Result<String, E>,
    ) -> Self {
        let tools = [serde_json::json!({
            "type": "function",
            "function": {
                "name": PROBE_TOOL,
                "description": "Tool description",
                "parameters": {
                    "type": "object",
                    "properties": {"arg": {"type": "string", "description": "Arg description"}},
                    "required": ["arg"],
                },
            },
        })];
        let object = format!("{{\"arg\": \"{PROBE_VALUE}\"}}");
        let conversation = [
            ChatMessage::new("user", "User message"),
            ChatMessage::assistant_tool_calls(
                "",
                vec![ToolCall {
                    id: "call00001".into(),
                    name: PROBE_CALL.into(),
                    arguments: object,
                }],
            ),
            ChatMessage::tool_result("call00001", PROBE_CALL, "Tool response"),
            ChatMessage::new("assistant", "The tool response was 'tool response'"),
            ChatMessage::new("user", "User message"),
        ];
        let mut caps = ToolCaps::default();
        // Tools alone, with a plain conversation.
        if let Ok(out) = render(&[ChatMessage::new("user", "User message")], &tools, false) {
            caps.tools = out.contains(PROBE_TOOL);
        }
        // A call whose arguments are an object the template must serialize itself, then as text.
        let calls = |object_arguments: bool| render(&conversation, &tools, object_arguments).ok();
        if let Some(out) = calls(true) {
            // The call's name and its argument's value made it into the text, serialized as JSON.
            if out.contains(PROBE_CALL) && out.contains(&format!("\"{PROBE_VALUE}\"")) {
                caps.tool_calls = true;
                caps.object_arguments = true;
                return caps;
            }
        }
        if let Some(out) = calls(false) {
            caps.tool_calls = out.contains(PROBE_CALL);
        }
        caps
    }
}

/// One message as the template sees it: a mapping with `role` and `content`, in that order, then
/// `name`, `tool_call_id`, `tool_calls` and `reasoning_content` (and, for gpt-oss's channel
/// templates, `thinking`) where the message has them. Reading `content` sets `content_read` (for the
/// system-role probe).
#[derive(Debug)]
struct MessageValue {
    role: Value,
    content: Value,
    name: Option<Value>,
    tool_call_id: Option<Value>,
    tool_calls: Option<Value>,
    reasoning: Option<Value>,
    /// The thoughts are also `thinking` (gpt-oss's name).
    thinking: bool,
    content_read: Option<Arc<AtomicBool>>,
}

impl MessageValue {
    fn new(
        m: &ChatMessage,
        content_read: Option<Arc<AtomicBool>>,
        object_arguments: bool,
        thinking: bool,
    ) -> Self {
        let tool_calls = (!m.tool_calls.is_empty()).then(|| {
            let calls: Vec<serde_json::Value> = m
                .tool_calls
                .iter()
                .map(|c| call_json(c, object_arguments))
                .collect();
            json_value(&serde_json::Value::Array(calls))
        });
        Self {
            role: Value::from(m.role.as_str()),
            content: Value::from(m.content.as_str()),
            name: m.name.as_deref().map(Value::from),
            tool_call_id: m.tool_call_id.as_deref().map(Value::from),
            tool_calls,
            reasoning: m.reasoning.as_deref().map(Value::from),
            thinking,
            content_read,
        }
    }
}

/// A call in OpenAI's message shape, as llama.cpp hands it to templates:
/// `{"type": "function", "function": {"name", "arguments"}, "id"}`.
fn call_json(call: &ToolCall, object_arguments: bool) -> serde_json::Value {
    let arguments = match serde_json::from_str::<serde_json::Value>(&call.arguments) {
        Ok(value) if object_arguments => value,
        _ => serde_json::Value::String(call.arguments.clone()),
    };
    serde_json::json!({
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
        "id": call.id,
    })
}

impl Object for MessageValue {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "role" => Some(self.role.clone()),
            "content" => {
                if let Some(read) = &self.content_read {
                    read.store(true, Ordering::Relaxed);
                }
                Some(self.content.clone())
            }
            "name" => self.name.clone(),
            "tool_call_id" => self.tool_call_id.clone(),
            "tool_calls" => self.tool_calls.clone(),
            "reasoning_content" => self.reasoning.clone(),
            "thinking" if self.thinking => self.reasoning.clone(),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        if self.name.is_none()
            && self.tool_call_id.is_none()
            && self.tool_calls.is_none()
            && self.reasoning.is_none()
        {
            return Enumerator::Str(&["role", "content"]);
        }
        let mut keys = vec![Value::from("role"), Value::from("content")];
        let optional = [
            ("name", self.name.is_some()),
            ("tool_call_id", self.tool_call_id.is_some()),
            ("tool_calls", self.tool_calls.is_some()),
            ("reasoning_content", self.reasoning.is_some()),
            ("thinking", self.thinking && self.reasoning.is_some()),
        ];
        keys.extend(
            optional
                .into_iter()
                .filter(|(_, present)| *present)
                .map(|(k, _)| Value::from(k)),
        );
        Enumerator::Values(keys)
    }
}

/// `messages` as template values; with `first_read`, reading the first message's content sets it.
/// With `object_arguments`, tool calls carry their arguments as objects; with `thinking`, earlier
/// thoughts are `thinking` too (gpt-oss).
pub(super) fn message_values(
    messages: &[ChatMessage],
    first_read: Option<&Arc<AtomicBool>>,
    object_arguments: bool,
    thinking: bool,
) -> Value {
    let values: Vec<Value> = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let read = if i == 0 { first_read.cloned() } else { None };
            Value::from_object(MessageValue::new(m, read, object_arguments, thinking))
        })
        .collect();
    Value::from(values)
}

/// A JSON value as a template value: objects become mappings in their key order, numbers stay
/// integers where they are.
pub(super) fn json_value(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Value::from(i),
            (None, Some(u), _) => Value::from(u),
            (None, None, Some(f)) => Value::from(f),
            (None, None, None) => Value::from(n.to_string()),
        },
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(items) => {
            Value::from(items.iter().map(json_value).collect::<Vec<_>>())
        }
        serde_json::Value::Object(map) => Value::from_object(JsonObject(
            map.iter()
                .map(|(k, v)| (Value::from(k.as_str()), json_value(v)))
                .collect(),
        )),
    }
}

/// A JSON object as a template mapping, keys in the order written.
#[derive(Debug)]
struct JsonObject(Vec<(Value, Value)>);

impl Object for JsonObject {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.0.iter().map(|(k, _)| k.clone()).collect())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

/// A list of JSON values (the `tools`) as a template value.
pub(super) fn json_list(values: &[serde_json::Value]) -> Value {
    Value::from(values.iter().map(json_value).collect::<Vec<_>>())
}
