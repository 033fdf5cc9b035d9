//! Anthropic's tools through shoal-guide: `tools`, `tool_choice` and `output_config.format` become the
//! API-neutral [`ChatGuidance`] ([`guidance`]); the calls found in an answer become `tool_use` content
//! blocks ([`content`]).
//!
//! `tool_choice` maps onto shoal-guide's choices: `auto` → [`ToolChoice::Auto`] (the model decides,
//! its output is parsed for calls), `any` → [`ToolChoice::Required`] and `tool` →
//! [`ToolChoice::Function`] (decoding is constrained so the call is valid JSON for the tool's
//! `input_schema`), `none` → [`ToolChoice::None`] (tools not shown); `disable_parallel_tool_use` keeps a
//! forced call to one. Every problem is a 400 naming the field (`tools[1].name`, `tool_choice.name`,
//! `output_config.format`); [`guide_error`] maps shoal-guide's errors onto Anthropic's field names.

use serde_json::Value;
use shoal_guide::{
    ChatGuidance, CutToolCall, FunctionTool, GuideError, ResponseFormat, ToolCallOut,
    ToolCallParser, ToolChoice,
};

use super::types::{ContentOut, ToolChoiceIn, ToolIn};
use crate::error::ApiError;

/// A shoal-guide error as this API names its fields: 400 naming the field, 500 for our own fault.
pub fn guide_error(e: GuideError) -> ApiError {
    match e.param() {
        Some("response_format") => ApiError::invalid("output_config.format", e.to_string()),
        Some(param) => ApiError::invalid(param, e.to_string()),
        None => ApiError::Internal(e.to_string()),
    }
}

/// The request's tools, tool choice and output format.
pub fn guidance(
    tools: Option<Vec<Value>>,
    tool_choice: Option<ToolChoiceIn>,
    format: Option<Value>,
) -> Result<ChatGuidance, ApiError> {
    let tools = tools
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, t)| function_tool(i, t))
        .collect::<Result<Vec<_>, _>>()?;
    let (tool_choice, parallel_tool_calls) = match tool_choice {
        None => (ToolChoice::Auto, true),
        Some(choice) => choice_of(choice)?,
    };
    if tools.is_empty() && matches!(tool_choice, ToolChoice::Required | ToolChoice::Function(_)) {
        return Err(ApiError::invalid(
            "tool_choice",
            "tool_choice 'any' or 'tool' needs at least one tool in tools",
        ));
    }
    let response_format = match format {
        None | Some(Value::Null) => ResponseFormat::Text,
        Some(format) => output_format(format)?,
    };
    Ok(ChatGuidance {
        tools,
        tool_choice,
        parallel_tool_calls,
        response_format,
    })
}

fn function_tool(index: usize, tool: Value) -> Result<FunctionTool, ApiError> {
    let param = format!("tools[{index}]");
    let tool: ToolIn = serde_json::from_value(tool)
        .map_err(|e| ApiError::invalid(param.clone(), format!("invalid tool: {e}")))?;
    if let Some(kind) = tool.kind.as_deref().filter(|k| *k != "custom") {
        return Err(ApiError::invalid(
            format!("{param}.type"),
            format!(
                "Anthropic's built-in tool '{kind}' is not offered by this server; define custom tools with an input_schema"
            ),
        ));
    }
    let Some(schema) = tool.input_schema else {
        return Err(ApiError::invalid(
            format!("{param}.input_schema"),
            "Field required",
        ));
    };
    FunctionTool::new(tool.name, tool.description, Some(schema)).map_err(|e| match e {
        GuideError::Tool { message } => ApiError::invalid(format!("{param}.name"), message),
        GuideError::ToolSchema { message, .. } => {
            ApiError::invalid(format!("{param}.input_schema"), message)
        }
        other => guide_error(other),
    })
}

/// The choice and whether a forced call may be several calls.
fn choice_of(choice: ToolChoiceIn) -> Result<(ToolChoice, bool), ApiError> {
    let parallel = !choice.disable_parallel_tool_use.unwrap_or(false);
    let chosen = match choice.kind.as_str() {
        "auto" => ToolChoice::Auto,
        "any" => ToolChoice::Required,
        "none" => ToolChoice::None,
        "tool" => match choice.name {
            Some(name) => ToolChoice::Function(name),
            None => return Err(ApiError::invalid("tool_choice.name", "Field required")),
        },
        other => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                format!("unknown tool_choice type '{other}'; expected auto, any, tool or none"),
            ));
        }
    };
    Ok((chosen, parallel))
}

/// `output_config.format`: `{"type": "json_schema", "schema": {...}}`.
fn output_format(format: Value) -> Result<ResponseFormat, ApiError> {
    const PARAM: &str = "output_config.format";
    let kind = format.get("type").and_then(Value::as_str);
    if kind != Some("json_schema") {
        return Err(ApiError::invalid(
            PARAM,
            "the only output format is {\"type\": \"json_schema\", \"schema\": {...}}",
        ));
    }
    match format.get("schema") {
        Some(schema @ Value::Object(_)) => Ok(ResponseFormat::JsonSchema {
            name: "output".into(),
            schema: schema.clone(),
            strict: true,
        }),
        _ => Err(ApiError::invalid(
            format!("{PARAM}.schema"),
            "a JSON schema object is required",
        )),
    }
}

/// An answer's content blocks and whether it called tools: the calls as `tool_use` blocks after the
/// text; without calls (or without tools) the whole text is one text block. `cut_off`: the answer ran
/// out of tokens, so a call it was writing is a last `tool_use` block whose `input` is its arguments
/// as far as they parse ([`shoal_guide::CutToolCall::input`]; `{}` before any), never text.
pub fn content(
    text: String,
    parser: Option<&ToolCallParser>,
    cut_off: bool,
) -> (Vec<ContentOut>, bool) {
    let Some(parser) = parser else {
        return (vec![ContentOut::Text { text }], false);
    };
    let parsed = parser.parse_ended(&text, cut_off);
    if parsed.calls.is_empty() && parsed.cut.is_none() {
        return (vec![ContentOut::Text { text }], false);
    }
    let called = !parsed.calls.is_empty();
    let mut blocks = Vec::with_capacity(parsed.calls.len() + 2);
    if !parsed.content.is_empty() {
        blocks.push(ContentOut::Text {
            text: parsed.content,
        });
    }
    blocks.extend(parsed.calls.into_iter().map(tool_use));
    blocks.extend(parsed.cut.map(cut_tool_use));
    (blocks, called)
}

/// A call as a `tool_use` block (its arguments as the JSON value `input`).
pub fn tool_use(call: ToolCallOut) -> ContentOut {
    ContentOut::ToolUse {
        id: call.id,
        name: call.name,
        input: shoal_guide::tools::parse::arguments_value(&call.arguments),
    }
}

/// The call the token budget cut as a `tool_use` block: its name (empty when not written whole yet),
/// its arguments as far as they parse.
pub fn cut_tool_use(call: CutToolCall) -> ContentOut {
    ContentOut::ToolUse {
        input: call.input(),
        id: call.id,
        name: call.name.unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::anthropic::param_of;

    fn choice(kind: &str, name: Option<&str>, no_parallel: Option<bool>) -> Option<ToolChoiceIn> {
        Some(ToolChoiceIn {
            kind: kind.into(),
            name: name.map(str::to_string),
            disable_parallel_tool_use: no_parallel,
        })
    }

    fn weather() -> Value {
        json!({"name": "get_weather", "description": "Weather of a city",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}})
    }

    #[test]
    fn tool_choices_map_onto_the_guides() {
        let g = guidance(
            Some(vec![weather()]),
            choice("tool", Some("get_weather"), Some(true)),
            None,
        )
        .expect("valid");
        assert_eq!(g.tool_choice, ToolChoice::Function("get_weather".into()));
        assert!(!g.parallel_tool_calls);
        assert_eq!(g.tools[0].name, "get_weather");
        assert_eq!(g.tools[0].description.as_deref(), Some("Weather of a city"));
        let g = guidance(Some(vec![weather()]), choice("any", None, None), None).expect("valid");
        assert_eq!(
            (g.tool_choice, g.parallel_tool_calls),
            (ToolChoice::Required, true)
        );
        let g = guidance(Some(vec![weather()]), None, None).expect("valid");
        assert_eq!(g.tool_choice, ToolChoice::Auto);
        let g = guidance(None, choice("none", None, None), None).expect("valid");
        assert_eq!(g.tool_choice, ToolChoice::None);
    }

    #[test]
    fn bad_tools_and_choices_are_named() {
        type Case = (Option<Vec<Value>>, Option<ToolChoiceIn>, &'static str);
        let cases: Vec<Case> = vec![
            (
                Some(vec![json!({"name": "f"})]),
                None,
                "tools[0].input_schema",
            ),
            (
                Some(vec![
                    weather(),
                    json!({"name": "bad name", "input_schema": {}}),
                ]),
                None,
                "tools[1].name",
            ),
            (
                Some(vec![
                    json!({"type": "web_search_20250305", "name": "web_search"}),
                ]),
                None,
                "tools[0].type",
            ),
            (Some(vec![json!({"name": 3})]), None, "tools[0]"),
            (
                Some(vec![json!({"name": "f", "input_schema": "x"})]),
                None,
                "tools[0].input_schema",
            ),
            (
                Some(vec![weather()]),
                choice("tool", None, None),
                "tool_choice.name",
            ),
            (
                Some(vec![weather()]),
                choice("sometimes", None, None),
                "tool_choice.type",
            ),
            (None, choice("any", None, None), "tool_choice"),
        ];
        for (tools, choice, want) in cases {
            let err = guidance(tools, choice, None).expect_err(want);
            assert_eq!(param_of(err).as_deref(), Some(want));
        }
    }

    #[test]
    fn output_formats() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let g = guidance(
            None,
            None,
            Some(json!({"type": "json_schema", "schema": schema})),
        )
        .expect("valid");
        assert!(
            matches!(g.response_format, ResponseFormat::JsonSchema { schema: s, .. } if s == schema)
        );
        let err = guidance(None, None, Some(json!({"type": "xml"}))).expect_err("xml");
        assert_eq!(param_of(err).as_deref(), Some("output_config.format"));
        let err =
            guidance(None, None, Some(json!({"type": "json_schema"}))).expect_err("no schema");
        assert_eq!(
            param_of(err).as_deref(),
            Some("output_config.format.schema")
        );
        let err = guide_error(GuideError::Schema {
            message: "bad".into(),
        });
        assert_eq!(param_of(err).as_deref(), Some("output_config.format"));
    }

    #[test]
    fn calls_become_tool_use_blocks() {
        let call = ToolCallOut {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city": "Paris"}"#.into(),
        };
        assert_eq!(
            tool_use(call),
            ContentOut::ToolUse {
                id: "call_1".into(),
                name: "get_weather".into(),
                input: json!({"city": "Paris"}),
            }
        );
        let (blocks, called) = content("plain".into(), None, false);
        assert_eq!(
            (blocks, called),
            (
                vec![ContentOut::Text {
                    text: "plain".into()
                }],
                false
            )
        );
    }
}
