//! Ollama's `tools` and `format` through shoal-guide, and tool calls in both directions.
//!
//! - [`guidance`]: `tools` (`[{type: "function", function: {name, description, parameters}}]`, offered
//!   with `tool_choice: auto`, as Ollama has no way to force one) and `format` (`"json"` → any JSON
//!   object, a JSON schema → output that matches it, decoded under llguidance's constraint) become a
//!   [`ChatGuidance`]; [`format_processor`] is the same constraint for `/api/generate`.
//! - [`to_chat_messages`]: an assistant message's `tool_calls` (`{function: {name, arguments: object}}`)
//!   and `tool` messages (`tool_name`, or none) become the template's calls and results. Ollama sends no
//!   call ids, so each call gets `call_<message>_<call>` and a `tool` message answers the earliest
//!   unanswered call (of its `tool_name` when given).
//! - [`ToolCallOut`]s found in an answer become Ollama's `message.tool_calls` ([`ollama_call`]),
//!   `arguments` as a JSON object.
//!
//! Every problem is a 400 naming the field (`tools[1].function.name`, `format`,
//! `messages[2].tool_calls[0].function`); a failure of shoal's own is a 500.

use serde::Deserialize;
use serde_json::Value;
use shoal_engine::{ChatMessage, EngineHandle, LogitsProcessor};
use shoal_guide::{
    ChatGuidance, FunctionTool, GuideError, Guides, ResponseFormat, ToolCall, ToolCallOut,
    ToolChoice,
};

use super::Error;
use super::types::{MessageIn, OllamaFunction, OllamaToolCall};
use crate::error::ApiError;

/// Roles a chat message may have.
const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// A call found in an answer, as Ollama writes it in `message.tool_calls` (`index`: its place in
/// the answer).
pub fn ollama_call(index: usize, call: ToolCallOut) -> OllamaToolCall {
    // The parser hands out JSON text; should it ever not parse, the client still gets it.
    let arguments = serde_json::from_str(&call.arguments).unwrap_or(Value::String(call.arguments));
    OllamaToolCall {
        id: call.id,
        function: OllamaFunction {
            index,
            name: call.name,
            arguments,
        },
    }
}

/// A shoal-guide error as Ollama's API answers it: 400 naming Ollama's field, or 500.
pub fn guide_error(e: GuideError) -> Error {
    let param = match &e {
        // Its own text names OpenAI's `response_format`.
        GuideError::Schema { message } => {
            return ApiError::invalid("format", format!("format: invalid JSON schema: {message}"))
                .into();
        }
        GuideError::ToolSchema { .. } | GuideError::Tool { .. } => "tools",
        GuideError::UnknownTool { .. } | GuideError::NoTools { .. } => "tools",
        GuideError::Vocabulary { .. } | GuideError::Internal { .. } => {
            return Error(ApiError::Internal(e.to_string()));
        }
    };
    Error(ApiError::invalid(param, e.to_string()))
}

#[derive(Deserialize)]
struct ToolIn {
    #[serde(rename = "type")]
    kind: Option<String>,
    function: FunctionIn,
}

#[derive(Deserialize)]
struct FunctionIn {
    name: String,
    description: Option<String>,
    parameters: Option<Value>,
}

/// The request's `tools` and `format`.
pub fn guidance(tools: Vec<Value>, format: Option<&Value>) -> Result<ChatGuidance, Error> {
    let tools = tools
        .into_iter()
        .enumerate()
        .map(|(i, t)| function_tool(i, t))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ChatGuidance {
        tools,
        tool_choice: ToolChoice::Auto,
        parallel_tool_calls: true,
        response_format: response_format(format)?,
    })
}

fn function_tool(index: usize, tool: Value) -> Result<FunctionTool, Error> {
    let param = format!("tools[{index}]");
    let tool: ToolIn = serde_json::from_value(tool).map_err(|e| {
        ApiError::invalid(
            param.clone(),
            format!("{param}: expected {{\"type\": \"function\", \"function\": {{\"name\", \"description\", \"parameters\"}}}}: {e}"),
        )
    })?;
    if tool.kind.as_deref().is_some_and(|k| k != "function") {
        return Err(ApiError::invalid(
            format!("{param}.type"),
            format!("{param}.type: only tools of type 'function' are supported"),
        )
        .into());
    }
    let f = tool.function;
    FunctionTool::new(f.name, f.description, f.parameters).map_err(|e| match e {
        GuideError::Tool { message } => {
            ApiError::invalid(format!("{param}.function.name"), message).into()
        }
        GuideError::ToolSchema { message, .. } => {
            ApiError::invalid(format!("{param}.function.parameters"), message).into()
        }
        other => guide_error(other),
    })
}

/// `format`: absent, `null` or `""` → free text; `"json"` → a JSON object; an object → that schema.
pub fn response_format(format: Option<&Value>) -> Result<ResponseFormat, Error> {
    match format {
        None | Some(Value::Null) => Ok(ResponseFormat::Text),
        Some(Value::String(s)) if s.is_empty() => Ok(ResponseFormat::Text),
        Some(Value::String(s)) if s == "json" => Ok(ResponseFormat::JsonObject),
        Some(schema @ Value::Object(_)) => Ok(ResponseFormat::JsonSchema {
            name: "format".into(),
            schema: schema.clone(),
            strict: true,
        }),
        Some(other) => Err(ApiError::invalid(
            "format",
            format!("format must be \"json\" or a JSON schema object, got {other}"),
        )
        .into()),
    }
}

/// The constraint of a `format` on its own (for `/api/generate`), built off the async workers the first
/// time a model needs one.
pub async fn format_processor(
    guides: &Guides,
    engine: &EngineHandle,
    format: &ResponseFormat,
) -> Result<Option<Box<dyn LogitsProcessor>>, Error> {
    if *format == ResponseFormat::Text {
        return Ok(None);
    }
    let (guides, tokenizer, format) = (guides.clone(), engine.tokenizer().clone(), format.clone());
    let processor = tokio::task::spawn_blocking(move || {
        guides.for_tokenizer(&tokenizer)?.response_format(&format)
    })
    .await
    .map_err(|e| {
        Error(ApiError::Internal(format!(
            "preparing the format failed: {e}"
        )))
    })?
    .map_err(guide_error)?;
    Ok(processor.map(|p| Box::new(p) as Box<dyn LogitsProcessor>))
}

#[derive(Deserialize)]
struct CallIn {
    id: Option<String>,
    function: CallFunctionIn,
}

#[derive(Deserialize)]
struct CallFunctionIn {
    name: String,
    #[serde(default)]
    arguments: Value,
}

/// The request's messages for the chat template, tool calls and results included.
pub fn to_chat_messages(messages: Vec<MessageIn>) -> Result<Vec<ChatMessage>, Error> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len());
    let mut unanswered: Vec<(String, String)> = Vec::new();
    for (i, m) in messages.into_iter().enumerate() {
        check_message(i, &m)?;
        let content = m.content.unwrap_or_default();
        let reasoning = m
            .thinking
            .filter(|t| !t.is_empty() && m.role == "assistant");
        let mut message = match m.role.as_str() {
            "assistant" if m.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) => {
                let calls = tool_calls(i, m.tool_calls.unwrap_or_default())?;
                unanswered.extend(calls.iter().map(|c| (c.id.clone(), c.name.clone())));
                ChatMessage::assistant_tool_calls(content, calls)
            }
            "tool" => {
                let at = match &m.tool_name {
                    Some(name) => unanswered.iter().position(|(_, n)| n == name),
                    None => (!unanswered.is_empty()).then_some(0),
                };
                let (id, name) = match at {
                    Some(at) => unanswered.remove(at),
                    None => (format!("call_{i}"), m.tool_name.unwrap_or_default()),
                };
                ChatMessage::tool_result(id, name, content)
            }
            role => ChatMessage::new(role, content),
        };
        message.reasoning = reasoning;
        out.push(message);
    }
    Ok(out)
}

/// Roles and images, refused by name.
fn check_message(index: usize, m: &MessageIn) -> Result<(), Error> {
    if !ROLES.contains(&m.role.as_str()) {
        return Err(ApiError::invalid(
            format!("messages[{index}].role"),
            format!(
                "messages[{index}].role must be one of system, user, assistant, tool; got '{}'",
                m.role
            ),
        )
        .into());
    }
    if m.images.as_ref().is_some_and(|i| !i.is_empty()) {
        return Err(ApiError::invalid(
            format!("messages[{index}].images"),
            format!(
                "messages[{index}].images: images are not supported (shoal serves text models)"
            ),
        )
        .into());
    }
    Ok(())
}

/// An assistant message's `tool_calls` as the template's [`ToolCall`]s.
fn tool_calls(index: usize, calls: Vec<Value>) -> Result<Vec<ToolCall>, Error> {
    calls
        .into_iter()
        .enumerate()
        .map(|(j, c)| {
            let param = format!("messages[{index}].tool_calls[{j}]");
            let c: CallIn = serde_json::from_value(c).map_err(|e| {
                ApiError::invalid(
                    param.clone(),
                    format!("{param}: expected {{\"function\": {{\"name\", \"arguments\"}}}}: {e}"),
                )
            })?;
            let arguments = match c.function.arguments {
                Value::Null => "{}".to_owned(),
                Value::String(s) => s,
                other => other.to_string(),
            };
            Ok(ToolCall {
                id: c.id.unwrap_or_else(|| format!("call_{index}_{j}")),
                name: c.function.name,
                arguments,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(v: Value) -> MessageIn {
        serde_json::from_value(v).expect("message")
    }

    #[test]
    fn tool_results_answer_the_calls_in_order() {
        let messages = vec![
            msg(json!({"role": "user", "content": "weather?"})),
            msg(json!({"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "temp", "arguments": {"city": "Paris"}}},
                {"function": {"name": "rain", "arguments": {"city": "Paris"}}}]})),
            msg(json!({"role": "tool", "content": "dry", "tool_name": "rain"})),
            msg(json!({"role": "tool", "content": "21"})),
        ];
        let out = to_chat_messages(messages).expect("converted");
        assert_eq!(out[1].tool_calls[0].id, "call_1_0");
        assert_eq!(out[1].tool_calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(out[2].tool_call_id.as_deref(), Some("call_1_1"));
        assert_eq!(out[2].name.as_deref(), Some("rain"));
        assert_eq!(out[3].tool_call_id.as_deref(), Some("call_1_0"));
        assert_eq!(out[3].name.as_deref(), Some("temp"));
    }

    #[test]
    fn bad_tools_and_formats_are_named() {
        let e = guidance(vec![json!({"function": {"name": "bad name"}})], None).expect_err("bad");
        assert!(e.message().starts_with("tools[0].function.name"), "{e:?}");
        let e = guidance(vec![json!({"type": "function"})], None).expect_err("bad");
        assert!(e.message().starts_with("tools[0]"), "{e:?}");
        assert!(response_format(Some(&json!(5))).is_err_and(|e| e.message().starts_with("format")));
        assert_eq!(
            response_format(Some(&json!("json"))).ok(),
            Some(ResponseFormat::JsonObject)
        );
        assert_eq!(
            response_format(Some(&json!(""))).ok(),
            Some(ResponseFormat::Text)
        );
        let bad = msg(json!({"role": "assistant", "tool_calls": [{"name": "x"}]}));
        let e = to_chat_messages(vec![bad]).expect_err("bad call");
        assert!(
            e.message().starts_with("messages[0].tool_calls[0]"),
            "{e:?}"
        );
    }
}
