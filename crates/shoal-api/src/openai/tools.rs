//! OpenAI chat's `tools`, `tool_choice`, `parallel_tool_calls` and `response_format`, turned into
//! shoal-guide's API-neutral [`ChatGuidance`]; messages that carry `tool_calls` or answer one
//! (role `tool`) into [`ChatMessage`]s; and the calls found in an answer back into OpenAI's shape
//! ([`ToolCallJson`], whole or as stream deltas).
//!
//! Every problem is a 400 naming the field (`tools[1].function.name`, `tool_choice`,
//! `response_format`, `messages[2].tool_calls[0]`); [`guide_error`] maps shoal-guide's errors the
//! same way, for every API module that uses it.

use serde::Serialize;
use serde_json::Value;
use shoal_engine::ChatMessage;
use shoal_guide::{
    ChatGuidance, FunctionTool, GuideError, ResponseFormat, ToolCall, ToolCallOut, ToolChoice,
};

use super::types::{ChatRequest, ToolCallIn, ToolIn};
use crate::error::ApiError;

/// A shoal-guide error as the API answers it: 400 naming the field, or 500 for our own fault.
pub fn guide_error(e: GuideError) -> ApiError {
    match e.param() {
        Some(param) => ApiError::invalid(param, e.to_string()),
        None => ApiError::Internal(e.to_string()),
    }
}

/// The request's tools and answer format (taken out of `req`).
pub fn guidance(req: &mut ChatRequest) -> Result<ChatGuidance, ApiError> {
    let tools = req
        .tools
        .take()
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, t)| function_tool(i, t))
        .collect::<Result<Vec<_>, _>>()?;
    let tool_choice = match req.tool_choice.take() {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(choice) => tool_choice(&choice)?,
    };
    let response_format = match req.response_format.take() {
        None | Some(Value::Null) => ResponseFormat::Text,
        Some(format) => response_format(&format)?,
    };
    Ok(ChatGuidance {
        tools,
        tool_choice,
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        response_format,
    })
}

fn function_tool(index: usize, tool: ToolIn) -> Result<FunctionTool, ApiError> {
    if tool.kind != "function" {
        return Err(ApiError::invalid(
            format!("tools[{index}].type"),
            format!(
                "tools of type '{}' are not supported; only 'function' is",
                tool.kind
            ),
        ));
    }
    let f = tool.function;
    function(
        &format!("tools[{index}].function"),
        f.name,
        f.description,
        f.parameters,
    )
}

/// A function tool; a bad name or parameter schema is a 400 naming `{param}.name` / `{param}.parameters`.
pub fn function(
    param: &str,
    name: String,
    description: Option<String>,
    parameters: Option<Value>,
) -> Result<FunctionTool, ApiError> {
    FunctionTool::new(name, description, parameters).map_err(|e| match e {
        GuideError::Tool { message } => ApiError::invalid(format!("{param}.name"), message),
        GuideError::ToolSchema { message, .. } => {
            ApiError::invalid(format!("{param}.parameters"), message)
        }
        other => guide_error(other),
    })
}

/// `"none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}` (chat) or
/// `{"type": "function", "name": ...}` (Responses).
pub fn tool_choice(choice: &Value) -> Result<ToolChoice, ApiError> {
    let bad = || {
        ApiError::invalid(
            "tool_choice",
            "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}",
        )
    };
    match choice {
        Value::String(s) => match s.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            _ => Err(bad()),
        },
        Value::Object(obj) if obj.get("type").and_then(Value::as_str) == Some("function") => obj
            .get("function")
            .and_then(|f| f.get("name"))
            .or_else(|| obj.get("name"))
            .and_then(Value::as_str)
            .map(|name| ToolChoice::Function(name.to_owned()))
            .ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// `{"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema", "strict"}}`.
fn response_format(format: &Value) -> Result<ResponseFormat, ApiError> {
    let invalid = |message: &str| ApiError::invalid("response_format", message);
    let kind = format.get("type").and_then(Value::as_str).ok_or_else(|| {
        invalid("response_format needs a 'type': 'text', 'json_object' or 'json_schema'")
    })?;
    match kind {
        "text" => Ok(ResponseFormat::Text),
        "json_object" => Ok(ResponseFormat::JsonObject),
        "json_schema" => {
            let spec = format.get("json_schema").ok_or_else(|| {
                invalid("response_format of type 'json_schema' needs a 'json_schema' object")
            })?;
            json_schema("response_format", spec)
        }
        other => Err(invalid(&format!(
            "response_format type '{other}' is not supported; use 'text', 'json_object' or 'json_schema'"
        ))),
    }
}

/// `{"name", "schema", "strict"}` (chat's `response_format.json_schema`, Responses' `text.format`) as a
/// constraint; `param` names the field in errors.
pub fn json_schema(param: &str, spec: &Value) -> Result<ResponseFormat, ApiError> {
    let Some(spec) = spec.as_object() else {
        return Err(ApiError::invalid(
            param,
            "a json_schema format must be an object with 'name', 'schema' and 'strict'",
        ));
    };
    let name = spec
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("response")
        .to_owned();
    // OpenAI allows a missing schema (any JSON); shoal reads it as any object.
    let schema = match spec.get("schema") {
        None | Some(Value::Null) => serde_json::json!({"type": "object"}),
        Some(schema @ Value::Object(_)) => schema.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                param,
                "the json_schema's 'schema' must be a JSON schema object",
            ));
        }
    };
    let strict = spec.get("strict").and_then(Value::as_bool).unwrap_or(false);
    Ok(ResponseFormat::JsonSchema {
        name,
        schema,
        strict,
    })
}

/// An assistant message's `tool_calls` as the chat template's [`ToolCall`]s.
pub fn tool_calls(index: usize, calls: Vec<ToolCallIn>) -> Result<Vec<ToolCall>, ApiError> {
    calls
        .into_iter()
        .enumerate()
        .map(|(j, c)| {
            let param = format!("messages[{index}].tool_calls[{j}]");
            if c.kind.as_deref().is_some_and(|k| k != "function") {
                return Err(ApiError::invalid(
                    format!("{param}.type"),
                    "only tool calls of type 'function' are supported",
                ));
            }
            let arguments = match c.function.arguments {
                None | Some(Value::Null) => "{}".to_owned(),
                Some(Value::String(s)) => s,
                Some(other) => other.to_string(),
            };
            Ok(ToolCall {
                id: c.id.unwrap_or_default(),
                name: c.function.name,
                arguments,
            })
        })
        .collect()
}

/// A `tool` message: its result text, the call it answers, and that call's function name (OpenAI
/// does not send it; found among the earlier assistant calls).
pub fn tool_result(
    index: usize,
    content: String,
    tool_call_id: Option<String>,
    name: Option<String>,
    earlier: &[ChatMessage],
) -> Result<ChatMessage, ApiError> {
    let Some(id) = tool_call_id else {
        return Err(ApiError::invalid(
            format!("messages[{index}].tool_call_id"),
            "a message of role 'tool' needs the tool_call_id it answers",
        ));
    };
    let name = name
        .or_else(|| {
            earlier
                .iter()
                .rev()
                .flat_map(|m| &m.tool_calls)
                .find(|c| c.id == id)
                .map(|c| c.name.clone())
        })
        .unwrap_or_default();
    Ok(ChatMessage::tool_result(id, name, content))
}

/// A call as OpenAI writes it in a message, and (with `index`) in a stream delta.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ToolCallJson {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCallJson,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct FunctionCallJson {
    pub name: String,
    pub arguments: String,
}

impl ToolCallJson {
    pub fn new(call: ToolCallOut, index: Option<usize>) -> Self {
        Self {
            index,
            id: call.id,
            kind: "function",
            function: FunctionCallJson {
                name: call.name,
                arguments: call.arguments,
            },
        }
    }

    /// The call the token budget cut: its name (empty when not written whole yet) and its arguments
    /// as written so far.
    pub fn cut(call: shoal_guide::CutToolCall, index: Option<usize>) -> Self {
        Self::new(
            ToolCallOut {
                id: call.id,
                name: call.name.unwrap_or_default(),
                arguments: call.arguments,
            },
            index,
        )
    }
}
