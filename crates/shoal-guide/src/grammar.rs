//! The grammars shoal asks llguidance for: a JSON answer ([`ResponseFormat`]) and a forced tool call
//! in a family's format ([`tool_call_lark`]: Lark text with each tool's call embedded as `%json`).
//!
//! Every JSON the model writes under a constraint uses the same options ([`with_json_options`]): fixed
//! separators — `", "` between items and `": "` after keys, as Python's `json.dumps` and the families'
//! own templates write JSON — and no other whitespace outside strings, as xgrammar's
//! `any_whitespace=False` (vLLM's `disable-any-whitespace`) and OpenAI's strict mode leave none. Free
//! runs of whitespace let a small model sampled at temperature 1 spend its budget on blank lines before
//! it closes a call; the single spaces keep the text the model knows (SmolLM2 forced to `{"city":"Paris"`
//! wanders into extra keys where `{"city": "Paris"` closes).

use serde_json::{Value, json};

use crate::error::GuideError;
use crate::tools::{FunctionTool, ToolFormat};

/// What shape the answer must have.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ResponseFormat {
    /// Free text.
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid against `schema`.
    JsonSchema {
        name: String,
        schema: Value,
        /// OpenAI's `strict`: shoal always enforces the schema, so this only travels along.
        strict: bool,
    },
}

/// `schema` with shoal's JSON options (`x-guidance`) unless the schema sets its own.
pub(crate) fn with_json_options(schema: &Value) -> Result<Value, String> {
    let Value::Object(map) = schema else {
        return Err("a JSON schema must be an object".into());
    };
    let mut map = map.clone();
    map.entry("x-guidance").or_insert_with(
        || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
    );
    Ok(Value::Object(map))
}

/// The JSON schema a response format asks for (`None`: free text).
pub(crate) fn response_schema(format: &ResponseFormat) -> Result<Option<Value>, GuideError> {
    let schema = match format {
        ResponseFormat::Text => return Ok(None),
        ResponseFormat::JsonObject => json!({"type": "object"}),
        ResponseFormat::JsonSchema { schema, .. } => schema.clone(),
    };
    with_json_options(&schema)
        .map(Some)
        .map_err(|message| GuideError::Schema { message })
}

/// The schema of one call object: `{"name": <const>, "<args key>": <parameters>}`, nothing else.
fn call_schema(tool: &FunctionTool, arguments_key: &str) -> Value {
    let mut properties = serde_json::Map::new();
    properties.insert("name".into(), json!({"const": tool.name}));
    properties.insert(arguments_key.into(), closed(&tool.parameters));
    json!({
        "type": "object",
        "properties": properties,
        "required": ["name", arguments_key],
        "additionalProperties": false,
    })
}

/// A tool's parameter schema with every object that lists its `properties` but leaves
/// `additionalProperties` unset closed (`false`), as OpenAI's strict mode and xgrammar's require: JSON Schema's default ("any other key
/// too") let a greedy small model add keys — even repeat one — until its budget ran out, and the call
/// came back cut. An object that says `additionalProperties` or has `patternProperties` keeps what it
/// says, one without `properties` stays free-form, and the branches of an `allOf` stay open (closing
/// each would forbid the others' keys) while their properties are closed.
pub(crate) fn closed(schema: &Value) -> Value {
    close(schema, true)
}

fn close(schema: &Value, close_here: bool) -> Value {
    let Value::Object(map) = schema else {
        return schema.clone();
    };
    let mut out = serde_json::Map::with_capacity(map.len() + 1);
    for (key, value) in map {
        let value = match (key.as_str(), value) {
            // Maps of names to schemas.
            ("properties" | "$defs" | "definitions" | "patternProperties", Value::Object(m)) => {
                Value::Object(m.iter().map(|(k, v)| (k.clone(), close(v, true))).collect())
            }
            ("allOf", Value::Array(items)) => {
                Value::Array(items.iter().map(|v| close(v, false)).collect())
            }
            ("anyOf" | "oneOf" | "prefixItems", Value::Array(items)) => {
                Value::Array(items.iter().map(|v| close(v, true)).collect())
            }
            // (`not` and `if` are conditions: closing them would change what they say.)
            ("items" | "additionalProperties" | "then" | "else", v) => close(v, true),
            _ => value.clone(),
        };
        out.insert(key.clone(), value);
    }
    if close_here
        && map.contains_key("properties")
        && !map.contains_key("additionalProperties")
        && !map.contains_key("patternProperties")
        && !map.contains_key("unevaluatedProperties")
    {
        out.insert("additionalProperties".into(), Value::Bool(false));
    }
    Value::Object(out)
}

/// `%json {...}` for a schema, with shoal's JSON options.
fn json_rule(schema: &Value) -> Result<String, GuideError> {
    let schema = with_json_options(schema).map_err(|message| GuideError::Internal { message })?;
    Ok(format!("%json {schema}"))
}

/// A Lark string literal for `text`.
fn literal(text: &str) -> String {
    Value::from(text).to_string()
}

/// How a grammar writes a fixed piece of text: the control token of that text where the vocabulary
/// has one (`<[id]>`: generated as that one token), else the literal text.
pub(crate) fn fixed(text: &str, control_token: &dyn Fn(&str) -> Option<u32>) -> String {
    match control_token(text) {
        Some(id) => format!("<[{id}]>"),
        None => literal(text),
    }
}

const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";

/// The Lark grammar of a JSON answer (`schema`, shoal's options already in it) as gpt-oss writes one:
/// a message on the final channel.
pub(crate) fn harmony_answer_lark(
    schema: &Value,
    control_token: &dyn Fn(&str) -> Option<u32>,
) -> String {
    format!(
        "start: {} \"final\" {} %json {schema}\n",
        fixed(CHANNEL, control_token),
        fixed(MESSAGE, control_token)
    )
}

/// The Lark grammar of a forced call to one of `tools` in `format`: one call, or one or more when
/// `parallel`. `control_token` maps a marker text to its control-token id, if the vocabulary has one.
pub(crate) fn tool_call_lark(
    format: ToolFormat,
    tools: &[&FunctionTool],
    parallel: bool,
    control_token: &dyn Fn(&str) -> Option<u32>,
) -> Result<String, GuideError> {
    let key = format.arguments_key();
    let alternatives = |f: &dyn Fn(&FunctionTool) -> Result<String, GuideError>| {
        tools
            .iter()
            .map(|t| f(t))
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.join("\n    | "))
    };
    let body = alternatives(&|t| json_rule(&call_schema(t, key)))?;
    let grammar = match format {
        ToolFormat::Hermes => {
            let repeat = if parallel { " (\"\\n\" call)*" } else { "" };
            format!(
                "start: call{repeat}\ncall: {open} \"\\n\" body \"\\n\" {close}\nbody: {body}\n",
                open = fixed("<tool_call>", control_token),
                close = fixed("</tool_call>", control_token),
            )
        }
        // Llama 3.1's template prints one call per turn: one call, whatever `parallel` says.
        ToolFormat::Llama3 => format!("start: body\nbody: {body}\n"),
        ToolFormat::MistralJson => {
            let repeat = if parallel { " (\", \" body)*" } else { "" };
            format!(
                "start: {tc} \"[\" body{repeat} \"]\"\nbody: {body}\n",
                tc = fixed("[TOOL_CALLS]", control_token)
            )
        }
        ToolFormat::MistralArgs => {
            let tc = fixed("[TOOL_CALLS]", control_token);
            let args = fixed("[ARGS]", control_token);
            let calls = alternatives(&|t| {
                Ok(format!(
                    "{tc} {} {args} {}",
                    literal(&t.name),
                    json_rule(&closed(&t.parameters))?
                ))
            })?;
            let repeat = if parallel { "+" } else { "" };
            format!("start: call{repeat}\ncall: {calls}\n")
        }
        // gpt-oss writes one call per turn: a commentary message addressed to the function.
        ToolFormat::Harmony => {
            let (channel, message) = (fixed(CHANNEL, control_token), fixed(MESSAGE, control_token));
            let constrain = fixed("<|constrain|>", control_token);
            let calls = alternatives(&|t| {
                Ok(format!(
                    "{channel} {} {constrain} \"json\" {message} {}",
                    literal(&format!("commentary to=functions.{} ", t.name)),
                    json_rule(&closed(&t.parameters))?
                ))
            })?;
            format!("start: call\ncall: {calls}\n")
        }
        ToolFormat::Generic => {
            let items: Vec<Value> = tools.iter().map(|t| call_schema(t, key)).collect();
            let mut list = json!({"type": "array", "items": {"anyOf": items}, "minItems": 1});
            if !parallel {
                list["maxItems"] = json!(1);
            }
            let schema = json!({
                "type": "object",
                "properties": {"tool_calls": list},
                "required": ["tool_calls"],
                "additionalProperties": false,
            });
            format!("start: {}\n", json_rule(&schema)?)
        }
    };
    Ok(grammar)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> FunctionTool {
        FunctionTool::new(name, None, Some(json!({"type": "object"}))).expect("valid")
    }

    #[test]
    fn markers_are_control_tokens_where_the_vocabulary_has_them() {
        let a = tool("a");
        let none = |_: &str| None;
        let g = tool_call_lark(ToolFormat::Hermes, &[&a], false, &none).expect("builds");
        assert!(
            g.starts_with(
                "start: call\ncall: \"<tool_call>\" \"\\n\" body \"\\n\" \"</tool_call>\"\n"
            ),
            "{g}"
        );
        let tc = |t: &str| (t == "[TOOL_CALLS]").then_some(5);
        let g = tool_call_lark(ToolFormat::MistralJson, &[&a], true, &tc).expect("builds");
        assert!(
            g.starts_with("start: <[5]> \"[\" body (\", \" body)* \"]\""),
            "{g}"
        );
    }

    #[test]
    fn harmony_calls_and_answers_are_messages_on_their_channels() {
        let a = tool("get_weather");
        let specials = |t: &str| match t {
            "<|channel|>" => Some(1),
            "<|constrain|>" => Some(2),
            "<|message|>" => Some(3),
            _ => None,
        };
        let g = tool_call_lark(ToolFormat::Harmony, &[&a], true, &specials).expect("builds");
        assert!(
            g.starts_with(
                "start: call\ncall: <[1]> \"commentary to=functions.get_weather \" <[2]> \"json\" <[3]> %json {"
            ),
            "{g}"
        );
        let g = harmony_answer_lark(&json!({"type": "object"}), &specials);
        assert_eq!(
            g,
            "start: <[1]> \"final\" <[3]> %json {\"type\":\"object\"}\n"
        );
    }

    #[test]
    fn tool_objects_that_list_their_properties_are_closed_unless_they_say_otherwise() {
        let schema = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
                "tags": {"type": "array", "items": {"properties": {"k": {"type": "string"}}}},
                "extra": {"type": "object", "additionalProperties": true, "properties": {}},
                "free": {"type": "object"},
                "both": {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
            },
            "required": ["city"],
        });
        let c = closed(&schema);
        assert_eq!(c["additionalProperties"], false);
        assert_eq!(c["properties"]["where"]["additionalProperties"], false);
        assert_eq!(
            c["properties"]["tags"]["items"]["additionalProperties"],
            false
        );
        assert_eq!(c["properties"]["extra"]["additionalProperties"], true);
        assert_eq!(c["properties"]["free"], json!({"type": "object"}));
        assert!(
            c["properties"]["both"]["allOf"][0]
                .get("additionalProperties")
                .is_none()
        );
        assert_eq!(c["required"], json!(["city"]));
        // The call's grammar holds the closed arguments.
        let t = FunctionTool::new("w", None, Some(schema)).expect("valid");
        let none = |_: &str| None;
        let g = tool_call_lark(ToolFormat::Hermes, &[&t], false, &none).expect("builds");
        // The call object, its arguments, `where` and the items of `tags`.
        assert_eq!(
            g.matches(r#""additionalProperties":false"#).count(),
            4,
            "{g}"
        );
    }

    #[test]
    fn schemas_must_be_objects() {
        let err = response_schema(&ResponseFormat::JsonSchema {
            name: "x".into(),
            schema: json!(true),
            strict: false,
        })
        .expect_err("refused");
        assert_eq!(err.param(), Some("response_format"));
        let s = response_schema(&ResponseFormat::JsonObject)
            .expect("ok")
            .expect("some");
        assert_eq!(s["type"], "object");
        assert!(s.get("x-guidance").is_some());
        assert_eq!(response_schema(&ResponseFormat::Text).expect("ok"), None);
    }
}
