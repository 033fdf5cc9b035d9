//! Splitting a finished output into content and tool calls, per [`ToolFormat`] ([`parse`]), and the
//! ids calls get ([`CallIds`]).
//!
//! Parsing is lenient the way llama.cpp's is: a block that does not parse as a call stays in the
//! content (nothing the model wrote is dropped), a missing closing tag at the end of the output is
//! forgiven, `arguments` may be an object or JSON text, and `name` plus either `arguments` or
//! `parameters` make a call in every format.

use serde_json::Value;

use super::ToolFormat;

pub(crate) const HERMES_OPEN: &str = "<tool_call>";
pub(crate) const HERMES_CLOSE: &str = "</tool_call>";
pub(crate) const PYTHON_TAG: &str = "<|python_tag|>";
pub(crate) const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
pub(crate) const MISTRAL_ARGS: &str = "[ARGS]";
/// What opens a harmony call in the form [`harmony_call`] writes.
pub(crate) const HARMONY_CALL: &str = "<|start|>assistant to=functions.";
/// What ends a harmony header.
pub(crate) const HARMONY_MESSAGE: &str = "<|message|>";

/// One call found in an output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// An output split into what the user reads and the calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parsed {
    /// Text outside the calls (trimmed when there are calls).
    pub content: String,
    pub calls: Vec<ParsedCall>,
}

/// The opening of a call to `name` in the one form harmony calls reach the parser in (gpt-oss: the
/// API's harmony reader writes every call message so, whichever header form the model wrote); its
/// arguments follow, and the next call's opening or the end of the answer ends them.
pub fn harmony_call(name: &str) -> String {
    format!("{HARMONY_CALL}{name}{HARMONY_MESSAGE}")
}

/// A call's `arguments` text as a JSON value: parsed where it is JSON, else the text as a string.
pub fn arguments_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// Splits `text` (a whole output) into content and the calls written in `format`.
pub fn parse(format: ToolFormat, text: &str) -> Parsed {
    let mut parsed = match format {
        ToolFormat::Hermes => hermes(text),
        ToolFormat::Llama3 => llama3(text),
        ToolFormat::MistralJson => mistral_json(text),
        ToolFormat::MistralArgs => mistral_args(text),
        ToolFormat::Generic => generic(text),
        ToolFormat::Harmony => harmony(text),
    };
    if !parsed.calls.is_empty() {
        parsed.content = parsed.content.trim().to_owned();
    }
    parsed
}

/// A call from `{"name": ..., "arguments" | "parameters": ...}`.
pub(crate) fn call_from_json(value: &Value) -> Option<ParsedCall> {
    let obj = value.as_object()?;
    let name = obj.get("name")?.as_str()?;
    if name.is_empty() {
        return None;
    }
    let args = obj.get("arguments").or_else(|| obj.get("parameters"));
    let arguments = match args {
        None | Some(Value::Null) => "{}".to_owned(),
        // Arguments given as JSON text are kept as written, if they are JSON.
        Some(Value::String(s)) if serde_json::from_str::<Value>(s).is_ok() => s.clone(),
        Some(v) => v.to_string(),
    };
    Some(ParsedCall {
        name: name.to_owned(),
        arguments,
    })
}

/// The JSON values at the start of `text`, one after another (whitespace and `;` between them), and
/// the byte offset where they end.
fn json_values(text: &str) -> (Vec<Value>, usize) {
    let mut values = Vec::new();
    let mut at = 0;
    loop {
        let rest = &text[at..];
        let skipped = rest.len()
            - rest
                .trim_start_matches(|c: char| c.is_whitespace() || c == ';')
                .len();
        let mut stream = serde_json::Deserializer::from_str(&rest[skipped..]).into_iter::<Value>();
        match stream.next() {
            Some(Ok(v)) => {
                at += skipped + stream.byte_offset();
                values.push(v);
            }
            _ => return (values, at),
        }
    }
}

fn hermes(text: &str) -> Parsed {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(HERMES_OPEN) {
        content.push_str(&rest[..start]);
        let after = &rest[start + HERMES_OPEN.len()..];
        let (body, next) = match after.find(HERMES_CLOSE) {
            Some(end) => (&after[..end], &after[end + HERMES_CLOSE.len()..]),
            None => (after, ""),
        };
        match serde_json::from_str::<Value>(body.trim())
            .ok()
            .as_ref()
            .and_then(call_from_json)
        {
            Some(call) => calls.push(call),
            None => content.push_str(&rest[start..rest.len() - next.len()]),
        }
        rest = next;
    }
    content.push_str(rest);
    Parsed { content, calls }
}

/// Calls as consecutive JSON objects making up all of `body`; `None` when anything else is there.
fn json_calls(body: &str) -> Option<Vec<ParsedCall>> {
    let (values, end) = json_values(body);
    if values.is_empty() || !body[end..].trim().is_empty() {
        return None;
    }
    values.iter().map(call_from_json).collect()
}

fn llama3(text: &str) -> Parsed {
    let (before, body) = match text.find(PYTHON_TAG) {
        Some(at) => (&text[..at], &text[at + PYTHON_TAG.len()..]),
        None if text.trim_start().starts_with('{') => ("", text),
        None => return content_only(text),
    };
    match json_calls(body) {
        Some(calls) => Parsed {
            content: before.to_owned(),
            calls,
        },
        None => content_only(text),
    }
}

fn mistral_json(text: &str) -> Parsed {
    let Some(at) = text.find(MISTRAL_CALLS) else {
        return content_only(text);
    };
    let body = text[at + MISTRAL_CALLS.len()..].trim_start();
    let (values, end) = json_values(body);
    let calls = match values.as_slice() {
        [Value::Array(items)] if body[end..].trim().is_empty() => {
            items.iter().map(call_from_json).collect::<Option<Vec<_>>>()
        }
        _ => None,
    };
    match calls {
        Some(calls) if !calls.is_empty() => Parsed {
            content: text[..at].to_owned(),
            calls,
        },
        _ => content_only(text),
    }
}

fn mistral_args(text: &str) -> Parsed {
    let Some(at) = text.find(MISTRAL_CALLS) else {
        return content_only(text);
    };
    let mut calls = Vec::new();
    for segment in text[at + MISTRAL_CALLS.len()..].split(MISTRAL_CALLS) {
        let Some((name, args)) = segment.split_once(MISTRAL_ARGS) else {
            return content_only(text);
        };
        let (values, end) = json_values(args);
        let call = match values.as_slice() {
            [v] if args[end..].trim().is_empty() && !name.trim().is_empty() => ParsedCall {
                name: name.trim().to_owned(),
                arguments: v.to_string(),
            },
            _ => return content_only(text),
        };
        calls.push(call);
    }
    Parsed {
        content: text[..at].to_owned(),
        calls,
    }
}

/// Harmony calls in [`harmony_call`]'s form: each opening, the name, `<|message|>`, the arguments. A
/// call whose arguments are not JSON leaves its arguments in the content (its markers never).
fn harmony(text: &str) -> Parsed {
    let mut segments = text.split(HARMONY_CALL);
    let mut content = segments.next().unwrap_or_default().to_owned();
    let mut calls = Vec::new();
    for segment in segments {
        let (name, args) = segment.split_once(HARMONY_MESSAGE).unwrap_or(("", segment));
        let args = args.trim();
        match serde_json::from_str::<Value>(args) {
            // Written compact, as every format's calls are (and a cut call's arguments so far).
            Ok(value) if !name.is_empty() => calls.push(ParsedCall {
                name: name.to_owned(),
                arguments: value.to_string(),
            }),
            _ => content.push_str(args),
        }
    }
    Parsed { content, calls }
}

fn generic(text: &str) -> Parsed {
    let mut body = text.trim();
    if let Some(fenced) = body.strip_prefix("```") {
        let fenced = fenced.strip_prefix("json").unwrap_or(fenced);
        body = fenced.strip_suffix("```").unwrap_or(fenced).trim();
    }
    let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(body) else {
        return content_only(text);
    };
    let calls = match (obj.get("tool_calls"), obj.get("tool_call")) {
        (Some(Value::Array(items)), _) => {
            items.iter().map(call_from_json).collect::<Option<Vec<_>>>()
        }
        (None, Some(one)) => call_from_json(one).map(|c| vec![c]),
        _ => None,
    };
    match calls {
        Some(calls) if !calls.is_empty() => Parsed {
            content: String::new(),
            calls,
        },
        _ => content_only(text),
    }
}

fn content_only(text: &str) -> Parsed {
    Parsed {
        content: text.to_owned(),
        calls: Vec::new(),
    }
}

/// Ids for the calls of one answer, derived from a per-request seed (the request id): `call_` and
/// 24 letters or digits, or 9 alphanumerics where the family's template insists ([`ToolFormat::short_ids`]).
#[derive(Debug, Clone, Copy)]
pub struct CallIds {
    seed: u64,
    short: bool,
}

const ALPHANUMERIC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

impl CallIds {
    pub fn new(seed: u64, format: ToolFormat) -> Self {
        Self {
            seed,
            short: format.short_ids(),
        }
    }

    /// The id of the `index`-th call.
    pub fn id(&self, index: usize) -> String {
        let mut state = self.seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let len = if self.short { 9 } else { 24 };
        let mut id = String::with_capacity(len + 5);
        if !self.short {
            id.push_str("call_");
        }
        for _ in 0..len {
            state = splitmix64(state);
            id.push(ALPHANUMERIC[(state % ALPHANUMERIC.len() as u64) as usize] as char);
        }
        id
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn hermes_blocks_become_calls_and_the_rest_content() {
        let out = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}\n</tool_call>";
        let p = parse(ToolFormat::Hermes, out);
        assert_eq!(p.content, "Let me check.");
        assert_eq!(
            p.calls,
            vec![
                call("get_weather", r#"{"city":"Paris"}"#),
                call("get_time", r#"{"tz": "CET"}"#)
            ]
        );
        // An unclosed last block is still a call; a broken one stays text.
        let p = parse(
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}",
        );
        assert_eq!(p.calls, vec![call("f", "{}")]);
        let broken = "<tool_call>\n{\"name\": \"f\", \"argu</tool_call>";
        assert_eq!(parse(ToolFormat::Hermes, broken), content_only(broken));
        assert_eq!(
            parse(ToolFormat::Hermes, "Just text."),
            content_only("Just text.")
        );
    }

    #[test]
    fn llama3_json_and_python_tag() {
        let p = parse(
            ToolFormat::Llama3,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
        );
        assert_eq!(p.calls, vec![call("get_weather", r#"{"city":"Oslo"}"#)]);
        assert_eq!(p.content, "");
        let p = parse(
            ToolFormat::Llama3,
            "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}",
        );
        assert_eq!(p.calls, vec![call("a", "{}"), call("b", r#"{"x":1}"#)]);
        // JSON that is not a call, or trailing prose, is content.
        let text = "{\"answer\": 42}";
        assert_eq!(parse(ToolFormat::Llama3, text), content_only(text));
        let text = "{\"name\": \"a\", \"parameters\": {}} and more";
        assert_eq!(parse(ToolFormat::Llama3, text), content_only(text));
    }

    #[test]
    fn harmony_calls_in_their_one_form() {
        let text = format!(
            "Checking.{}{{\"city\": \"Paris\"}}{}{{}}",
            harmony_call("get_weather"),
            harmony_call("now")
        );
        let p = parse(ToolFormat::Harmony, &text);
        assert_eq!(p.content, "Checking.");
        assert_eq!(
            p.calls,
            vec![
                call("get_weather", "{\"city\":\"Paris\"}"),
                call("now", "{}")
            ]
        );
        // Arguments that are not JSON stay in the content, the markers never.
        let text = format!("{}not json", harmony_call("f"));
        let p = parse(ToolFormat::Harmony, &text);
        assert_eq!((p.content.as_str(), p.calls.len()), ("not json", 0));
        assert_eq!(parse(ToolFormat::Harmony, "56").content, "56");
    }

    #[test]
    fn mistral_both_styles() {
        let p = parse(
            ToolFormat::MistralJson,
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}, \"id\": \"abcDEF123\"}]",
        );
        assert_eq!(p.calls, vec![call("get_weather", r#"{"city":"Rome"}"#)]);
        let p = parse(
            ToolFormat::MistralArgs,
            "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]get_time[ARGS]{}",
        );
        assert_eq!(p.content, "Sure.");
        assert_eq!(
            p.calls,
            vec![
                call("get_weather", r#"{"city":"Rome"}"#),
                call("get_time", "{}")
            ]
        );
        let text = "[TOOL_CALLS][{\"name\": ";
        assert_eq!(parse(ToolFormat::MistralJson, text), content_only(text));
    }

    #[test]
    fn generic_object_fenced_or_plain() {
        let p = parse(
            ToolFormat::Generic,
            "```json\n{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}]}\n```",
        );
        assert_eq!(p.calls, vec![call("f", r#"{"q":"x"}"#)]);
        let p = parse(
            ToolFormat::Generic,
            " {\"tool_call\": {\"name\": \"g\", \"arguments\": {}}}",
        );
        assert_eq!(p.calls, vec![call("g", "{}")]);
        for text in ["{\"answer\": 1}", "Hello!", "{\"tool_calls\": []}"] {
            assert_eq!(parse(ToolFormat::Generic, text), content_only(text));
        }
    }

    #[test]
    fn ids_are_stable_per_seed_and_shaped_per_family() {
        let ids = CallIds::new(7, ToolFormat::Hermes);
        let a = ids.id(0);
        assert!(a.starts_with("call_") && a.len() == 29, "{a}");
        assert_eq!(a, CallIds::new(7, ToolFormat::Hermes).id(0));
        assert_ne!(a, ids.id(1));
        assert_ne!(a, CallIds::new(8, ToolFormat::Hermes).id(0));
        let short = CallIds::new(7, ToolFormat::MistralJson).id(0);
        assert!(short.len() == 9 && short.chars().all(|c| c.is_ascii_alphanumeric()));
    }
}
