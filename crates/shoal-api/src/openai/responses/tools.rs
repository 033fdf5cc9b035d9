//! The Responses API's tools and output format, in shoal-guide's API-neutral terms: function `tools`
//! (flat: `{type: "function", name, description, parameters, strict}`), `tool_choice`, `text.format`
//! (`text`, `json_object`, `json_schema` with `name` / `schema` / `strict` beside `type`), and the
//! `function_call` / `function_call_output` items of a conversation as chat messages with tool calls
//! and tool results. Every problem is a 400 naming the field.

use serde_json::{Value, json};
use shoal_engine::ChatMessage;
use shoal_guide::{
    ChatGuidance, CutToolCall, FunctionTool, ResponseFormat, ToolCall, ToolCallOut, ToolChoice,
};

use super::types::ResponsesRequest;
use crate::error::ApiError;

/// The request's tools, tool choice and output format.
pub fn guidance(req: &ResponsesRequest) -> Result<ChatGuidance, ApiError> {
    let tools = req
        .tools
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, t)| function_tool(i, t))
        .collect::<Result<Vec<_>, _>>()?;
    let tool_choice = match &req.tool_choice {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(choice) => crate::openai::tools::tool_choice(choice)?,
    };
    let response_format = match req.text.as_ref().and_then(|t| t.format.as_ref()) {
        None | Some(Value::Null) => ResponseFormat::Text,
        Some(format) => text_format(format)?,
    };
    Ok(ChatGuidance {
        tools,
        tool_choice,
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        response_format,
    })
}

fn function_tool(index: usize, tool: &Value) -> Result<FunctionTool, ApiError> {
    let kind = tool.get("type").and_then(Value::as_str).unwrap_or("");
    if kind != "function" {
        return Err(ApiError::invalid(
            format!("tools[{index}].type"),
            format!("tools of type '{kind}' are not supported; only 'function' is"),
        ));
    }
    let name = tool.get("name").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            format!("tools[{index}].name"),
            "a function tool needs a name",
        )
    })?;
    let description = tool
        .get("description")
        .and_then(Value::as_str)
        .map(String::from);
    let parameters = tool.get("parameters").filter(|p| !p.is_null()).cloned();
    crate::openai::tools::function(
        &format!("tools[{index}]"),
        name.to_string(),
        description,
        parameters,
    )
}

/// `text.format`.
fn text_format(format: &Value) -> Result<ResponseFormat, ApiError> {
    let invalid = |message: String| ApiError::invalid("text.format", message);
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => crate::openai::tools::json_schema("text.format", format),
        Some(other) => Err(invalid(format!(
            "text.format type '{other}' is not supported; use 'text', 'json_object' or 'json_schema'"
        ))),
        None => Err(invalid(
            "text.format needs a 'type': 'text', 'json_object' or 'json_schema'".into(),
        )),
    }
}

/// A `function_call` input item, added to the assistant turn it belongs to (the previous message when
/// that is the assistant's, else a new one).
pub fn push_function_call(
    messages: &mut Vec<ChatMessage>,
    param: &str,
    item: &Value,
) -> Result<(), ApiError> {
    let field = |name: &str| {
        item.get(name).and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid(
                format!("{param}.{name}"),
                format!("a function_call item needs '{name}'"),
            )
        })
    };
    let call = ToolCall {
        id: field("call_id")?.to_string(),
        name: field("name")?.to_string(),
        arguments: field("arguments")?.to_string(),
    };
    match messages.last_mut() {
        Some(last) if last.role == "assistant" => last.tool_calls.push(call),
        _ => messages.push(ChatMessage::assistant_tool_calls("", vec![call])),
    }
    Ok(())
}

/// A `function_call_output` input item as a tool message answering the call it names.
pub fn function_call_output(
    messages: &[ChatMessage],
    param: &str,
    item: &Value,
) -> Result<ChatMessage, ApiError> {
    let call_id = item.get("call_id").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            format!("{param}.call_id"),
            "a function_call_output item needs 'call_id'",
        )
    })?;
    let output = match item.get("output") {
        Some(Value::String(s)) => s.clone(),
        Some(other) if !other.is_null() => other.to_string(),
        _ => {
            return Err(ApiError::invalid(
                format!("{param}.output"),
                "a function_call_output item needs 'output'",
            ));
        }
    };
    let name = messages
        .iter()
        .flat_map(|m| &m.tool_calls)
        .find(|c| c.id == call_id)
        .map(|c| c.name.clone())
        .ok_or_else(|| {
            ApiError::invalid(
                format!("{param}.call_id"),
                format!("no function_call item before this one has call_id '{call_id}'"),
            )
        })?;
    Ok(ChatMessage::tool_result(call_id, name, output))
}

/// The output item of one call.
pub fn function_call_item(call: &ToolCallOut) -> Value {
    json!({
        "type": "function_call",
        "id": format!("fc_{}", call.id.trim_start_matches("call_")),
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    })
}

/// The output item of the call the token budget cut: `status: "incomplete"`, its name (empty when
/// not written whole yet) and its arguments as written so far.
pub fn cut_call_item(call: &CutToolCall) -> Value {
    let mut item = function_call_item(&ToolCallOut {
        id: call.id.clone(),
        name: call.name.clone().unwrap_or_default(),
        arguments: call.arguments.clone(),
    });
    item["status"] = json!("incomplete");
    item
}
