//! Answers cut off by the token budget inside a tool call ([`cut_calls`]), and the arguments of a cut
//! call as far as they parse ([`arguments_so_far`]).
//!
//! A forced call (or a call the model chose) that runs out of tokens ends as unfinished JSON in the
//! family's format: `<tool_call>\n{"name":"f","arguments":{"city":"Par`. [`super::parse::parse`] finds
//! no call in it, so without this the answer would come back as text holding shoal's format. Here the
//! text is read the way it was written — a scan of JSON that may stop anywhere — into the calls it
//! completed and the one it was writing: its name, when the name's string was closed, and its
//! arguments exactly as written so far. APIs report that call as incomplete (OpenAI: the partial
//! `tool_calls` entry with `finish_reason: "length"`; Anthropic: a `tool_use` block whose `input` is
//! [`arguments_so_far`], with `stop_reason: "max_tokens"`).

use serde_json::Value;

use super::ToolFormat;
use super::parse::{
    HARMONY_CALL, HARMONY_MESSAGE, HERMES_CLOSE, HERMES_OPEN, MISTRAL_ARGS, MISTRAL_CALLS,
    PYTHON_TAG, ParsedCall,
};

/// A call the answer was writing when the token budget ran out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CutCall {
    /// The function's name, when its string was finished.
    pub name: Option<String>,
    /// The arguments as written so far (JSON text, usually unfinished; empty before they started).
    pub arguments: String,
}

/// An answer cut inside its calls: the text before them, the calls it finished, and the one it was
/// writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutCalls {
    pub content: String,
    pub calls: Vec<ParsedCall>,
    pub cut: CutCall,
}

/// Reads `text`, an answer that ended at its token budget, as calls in `format` cut short; `None`
/// when it is not inside a call (plain text, or calls that all finished).
pub fn cut_calls(format: ToolFormat, text: &str) -> Option<CutCalls> {
    match format {
        ToolFormat::Hermes => hermes(text),
        ToolFormat::Llama3 => {
            let (content, body) = match text.find(PYTHON_TAG) {
                Some(at) => (&text[..at], &text[at + PYTHON_TAG.len()..]),
                None if text.trim_start().starts_with('{') => ("", text),
                None => return None,
            };
            json_cut(content, body, &[], text.contains(PYTHON_TAG))
        }
        ToolFormat::MistralJson => {
            let at = text.find(MISTRAL_CALLS)?;
            json_cut(
                &text[..at],
                &text[at + MISTRAL_CALLS.len()..],
                &[None],
                true,
            )
        }
        ToolFormat::MistralArgs => mistral_args(text),
        ToolFormat::Harmony => harmony(text),
        ToolFormat::Generic => {
            let body = text.trim_start();
            let body = match body.strip_prefix("```") {
                Some(fenced) => fenced.strip_prefix("json").unwrap_or(fenced),
                None => body,
            };
            // The finished-answer parser takes a call only when the whole answer is the object, so
            // prose before a `{"tool_calls": …` block is text, cut or not.
            if !body.trim_start().starts_with('{') {
                return None;
            }
            let compact: String = body
                .chars()
                .filter(|c| !c.is_whitespace())
                .take(14)
                .collect();
            let entered = compact.starts_with("{\"tool_calls\"");
            json_cut("", body, &[Some("tool_calls"), None], entered)
        }
    }
}

/// Hermes: the last `<tool_call>` block never closed; the blocks before it are finished calls.
fn hermes(text: &str) -> Option<CutCalls> {
    let open = text.rfind(HERMES_OPEN)?;
    let body = &text[open + HERMES_OPEN.len()..];
    if body.contains(HERMES_CLOSE) {
        return None;
    }
    let before = super::parse::parse(ToolFormat::Hermes, &text[..open]);
    // None when the unclosed block's JSON is whole: a call, as the whole-text parse forgives it.
    let mut cut = json_cut("", body.trim_start(), &[], true)?;
    cut.content = before.content.trim().to_owned();
    cut.calls = before.calls;
    Some(cut)
}

/// Harmony, in [`super::parse::harmony_call`]'s form: the last call is cut when its arguments are not
/// whole JSON; its name is known once its header was finished (`<|message|>` written).
fn harmony(text: &str) -> Option<CutCalls> {
    let open = text.rfind(HARMONY_CALL)?;
    let segment = &text[open + HARMONY_CALL.len()..];
    let cut = match segment.split_once(HARMONY_MESSAGE) {
        Some((name, args)) => {
            if serde_json::from_str::<Value>(args.trim()).is_ok() {
                return None;
            }
            CutCall {
                name: Some(name.to_owned()),
                arguments: minified(args.trim_start()),
            }
        }
        None => CutCall::default(),
    };
    let before = super::parse::parse(ToolFormat::Harmony, &text[..open]);
    Some(CutCalls {
        content: before.content.trim().to_owned(),
        calls: before.calls,
        cut,
    })
}

/// Mistral Small: `[TOOL_CALLS]name[ARGS]{...` per call; the last one is cut.
fn mistral_args(text: &str) -> Option<CutCalls> {
    let at = text.find(MISTRAL_CALLS)?;
    let segments: Vec<&str> = text[at + MISTRAL_CALLS.len()..]
        .split(MISTRAL_CALLS)
        .collect();
    let (last, done) = segments.split_last()?;
    let mut calls = Vec::new();
    for segment in done {
        let (name, args) = segment.split_once(MISTRAL_ARGS)?;
        calls.push(ParsedCall {
            name: name.trim().to_owned(),
            arguments: args.trim().to_owned(),
        });
    }
    let cut = match last.split_once(MISTRAL_ARGS) {
        Some((name, args)) => {
            let args = args.trim_start();
            if serde_json::from_str::<Value>(args).is_ok() {
                return None;
            }
            CutCall {
                name: Some(name.trim().to_owned()),
                arguments: minified(args),
            }
        }
        None => CutCall::default(),
    };
    Some(CutCalls {
        content: text[..at].trim().to_owned(),
        calls,
        cut,
    })
}

/// Calls as JSON objects at `path` (see [`scan`]) in `body`, cut somewhere; `None` unless the last
/// call object is unfinished, or none started yet where the text `entered` its calls already.
fn json_cut(content: &str, body: &str, path: &[Option<&str>], entered: bool) -> Option<CutCalls> {
    let found = scan(body, path);
    let Some((last, done)) = found.split_last() else {
        return entered.then(|| CutCalls {
            content: content.trim().to_owned(),
            calls: Vec::new(),
            cut: CutCall::default(),
        });
    };
    if last.closed {
        return None;
    }
    let calls = done
        .iter()
        .filter_map(|c| {
            let name = c.name.clone()?;
            let arguments = match serde_json::from_str::<Value>(&body[c.arguments.clone()?]) {
                Ok(v) => v.to_string(),
                Err(_) => return None,
            };
            Some(ParsedCall { name, arguments })
        })
        .collect();
    let arguments = last
        .arguments
        .clone()
        .map(|r| minified(&body[r]))
        .unwrap_or_default();
    Some(CutCalls {
        content: content.trim().to_owned(),
        calls,
        cut: CutCall {
            name: last.name.clone(),
            arguments,
        },
    })
}

/// JSON text (possibly unfinished) without whitespace outside its strings: the way a finished call's
/// arguments are written (serde's compact form), so a cut call's arguments are the beginning of what
/// the whole call's would have been.
fn minified(text: &str) -> String {
    let (mut in_string, mut escaped) = (false, false);
    text.chars()
        .filter(|&c| {
            match (in_string, escaped, c) {
                (true, true, _) => escaped = false,
                (true, false, '\\') => escaped = true,
                (_, false, '"') => in_string = !in_string,
                (false, _, c) if c.is_whitespace() => return false,
                _ => {}
            }
            true
        })
        .collect()
}

/// One call object a scan found.
#[derive(Debug, Default)]
struct Found {
    /// The `name` string, once closed.
    name: Option<String>,
    /// Where the `arguments` (or `parameters`) value lies: to its end, or to the end of the text.
    arguments: Option<std::ops::Range<usize>>,
    closed: bool,
}

/// An open container while scanning.
struct Open {
    object: bool,
    /// The key whose value comes (or is being written) next, in an object.
    key: Option<String>,
    /// Whether the next string in this object is a key.
    want_key: bool,
}

/// The call objects at `path` in JSON text that may stop anywhere: objects at depth `path.len() + 1`
/// whose enclosing containers are, outermost first, an object writing the value of that key
/// (`Some(key)`) or an array (`None`). Strings are skipped with their escapes.
fn scan(text: &str, path: &[Option<&str>]) -> Vec<Found> {
    let depth = path.len() + 1;
    let bytes = text.as_bytes();
    let mut stack: Vec<Open> = Vec::new();
    let mut found: Vec<Found> = Vec::new();
    let mut args_start: Option<usize> = None;
    let on_path = |stack: &[Open]| {
        stack.len() == depth - 1
            && stack.iter().zip(path).all(|(open, want)| match want {
                None => !open.object,
                Some(key) => open.object && open.key.as_deref() == Some(*key),
            })
    };
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'"' {
            let mut j = i + 1;
            let mut closed = false;
            while j < bytes.len() {
                match bytes[j] {
                    b'\\' => j += 2,
                    b'"' => {
                        closed = true;
                        break;
                    }
                    _ => j += 1,
                }
            }
            let string = if closed {
                serde_json::from_str::<String>(&text[i..=j]).ok()
            } else {
                None
            };
            let at_call = stack.len() == depth;
            if let Some(top) = stack.last_mut().filter(|top| top.object) {
                if top.want_key {
                    top.key = string;
                    top.want_key = false;
                } else if at_call
                    && top.key.as_deref() == Some("name")
                    && let Some(call) = found.last_mut()
                {
                    call.name = string;
                }
            }
            i = j + 1;
            continue;
        }
        // The end of the call's arguments value: the `,` or `}` after it in the call object.
        if stack.len() == depth
            && matches!(c, b',' | b'}')
            && let Some(start) = args_start.take()
            && let Some(call) = found.last_mut()
        {
            call.arguments = Some(start..i);
        }
        match c {
            b'{' | b'[' => {
                if c == b'{' && on_path(&stack) {
                    found.push(Found::default());
                }
                stack.push(Open {
                    object: c == b'{',
                    key: None,
                    want_key: c == b'{',
                });
            }
            b'}' | b']' => {
                stack.pop();
                if c == b'}'
                    && on_path(&stack)
                    && let Some(call) = found.last_mut()
                {
                    call.closed = true;
                }
            }
            b',' => {
                if let Some(top) = stack.last_mut().filter(|top| top.object) {
                    top.want_key = true;
                }
            }
            b':' if stack.len() == depth
                && stack.last().is_some_and(|top| {
                    matches!(top.key.as_deref(), Some("arguments" | "parameters"))
                }) =>
            {
                args_start = Some(i + 1);
            }
            _ => {}
        }
        i += 1;
    }
    if let (Some(start), Some(call)) = (args_start, found.last_mut()) {
        call.arguments = Some(start..text.len());
    }
    for call in &mut found {
        if let Some(r) = call.arguments.clone() {
            let value = &text[r.clone()];
            let offset = r.start + (value.len() - value.trim_start().len());
            call.arguments = Some(offset..offset + value.trim().len());
        }
    }
    found
}

/// The arguments of a cut call as far as they parse: the longest beginning of `text` that, closed
/// (an open string ended, open objects and arrays closed), is JSON — a key without its value and a
/// number or literal cut short are left out. An object; `{}` when nothing parses.
pub fn arguments_so_far(text: &str) -> Value {
    // Where the text may be cut, from the end: at most this many tries.
    const TRIES: usize = 256;
    let mut closers: Vec<u8> = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    // The closing suffix needed after each prefix length.
    let mut suffix_at: Vec<String> = Vec::with_capacity(text.len() + 1);
    let close = |closers: &[u8], in_string: bool| {
        let mut s = String::new();
        if in_string {
            s.push('"');
        }
        s.extend(closers.iter().rev().map(|&c| c as char));
        s
    };
    suffix_at.push(close(&closers, false));
    for &b in text.as_bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'{' => closers.push(b'}'),
                b'[' => closers.push(b']'),
                b'}' | b']' => {
                    closers.pop();
                }
                _ => {}
            }
        }
        // A cut inside an escape would leave a lone backslash.
        let s = if escaped {
            String::from("\u{0}")
        } else {
            close(&closers, in_string)
        };
        suffix_at.push(s);
    }
    for end in (0..=text.len()).rev().take(TRIES) {
        if !text.is_char_boundary(end) || suffix_at[end].starts_with('\u{0}') {
            continue;
        }
        let candidate = format!("{}{}", &text[..end], suffix_at[end]);
        if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(&candidate) {
            return v;
        }
    }
    Value::Object(serde_json::Map::new())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn cut(name: Option<&str>, arguments: &str) -> CutCall {
        CutCall {
            name: name.map(str::to_owned),
            arguments: arguments.to_owned(),
        }
    }

    #[test]
    fn every_format_cut_inside_a_call() {
        let cases = [
            (
                ToolFormat::Hermes,
                "Sure.\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Par",
            ),
            (
                ToolFormat::Llama3,
                "{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Par",
            ),
            (
                ToolFormat::MistralJson,
                "[TOOL_CALLS][{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Par",
            ),
            (
                ToolFormat::MistralArgs,
                "[TOOL_CALLS]get_weather[ARGS]{\"city\":\"Par",
            ),
            (
                ToolFormat::Generic,
                "{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Par",
            ),
        ];
        for (format, text) in cases {
            let got = cut_calls(format, text).unwrap_or_else(|| panic!("{format:?}: a cut call"));
            assert_eq!(
                got.cut,
                cut(Some("get_weather"), "{\"city\":\"Par"),
                "{format:?}"
            );
            assert!(got.calls.is_empty(), "{format:?}");
            assert_eq!(arguments_so_far(&got.cut.arguments), json!({"city": "Par"}));
        }
        let hermes = cut_calls(ToolFormat::Hermes, cases[0].1).expect("cut");
        assert_eq!(hermes.content, "Sure.");
    }

    #[test]
    fn harmony_cut_in_its_arguments_or_its_header() {
        let call = super::super::parse::harmony_call;
        let text = format!("{}{{\"city\": \"Le Ma", call("get_weather"));
        let got = cut_calls(ToolFormat::Harmony, &text).expect("cut");
        assert_eq!(got.cut, cut(Some("get_weather"), "{\"city\":\"Le Ma"));
        assert!(got.calls.is_empty() && got.content.is_empty());
        // A finished call before the cut one, and text before both.
        let text = format!("Hm.{}{{}}{}{{\"a", call("one"), call("two"));
        let got = cut_calls(ToolFormat::Harmony, &text).expect("cut");
        assert_eq!(got.content, "Hm.");
        assert_eq!(got.calls[0].name, "one");
        assert_eq!(got.cut, cut(Some("two"), "{\"a"));
        // Cut before `<|message|>`: the name may be partial, so it is not known.
        let got = cut_calls(
            ToolFormat::Harmony,
            "<|start|>assistant to=functions.get_we",
        )
        .expect("cut");
        assert_eq!(got.cut, cut(None, ""));
        // Whole arguments: not cut.
        assert_eq!(
            cut_calls(ToolFormat::Harmony, &format!("{}{{}}", call("f"))),
            None
        );
        assert_eq!(cut_calls(ToolFormat::Harmony, "plain text"), None);
    }

    #[test]
    fn the_name_is_known_once_its_string_closed() {
        let g = |t: &str| cut_calls(ToolFormat::Generic, t).expect("cut").cut;
        assert_eq!(g("{\"tool_calls\":[{\"name\":\"get_wea"), cut(None, ""));
        assert_eq!(g("{\"tool_calls\":[{\"name\":\"f\""), cut(Some("f"), ""));
        assert_eq!(
            g("{\"tool_calls\":[{\"name\":\"f\",\"arguments\":"),
            cut(Some("f"), "")
        );
        assert_eq!(g("{\"tool_calls\":["), cut(None, ""));
        // Arguments holding a `name` of their own are not the call's name.
        let c = g("{\"tool_calls\":[{\"name\":\"f\",\"arguments\":{\"name\":\"Bob\",\"x\":[1,");
        assert_eq!(c, cut(Some("f"), "{\"name\":\"Bob\",\"x\":[1,"));
        assert_eq!(
            arguments_so_far(&c.arguments),
            json!({"name": "Bob", "x": [1]})
        );
    }

    #[test]
    fn finished_calls_before_the_cut_are_calls() {
        let text = "{\"tool_calls\":[{\"name\":\"a\",\"arguments\":{\"x\":1}},{\"name\":\"b\",\"arguments\":{\"y\":\"z";
        let got = cut_calls(ToolFormat::Generic, text).expect("cut");
        assert_eq!(
            got.calls,
            vec![ParsedCall {
                name: "a".into(),
                arguments: "{\"x\":1}".into()
            }]
        );
        assert_eq!(got.cut, cut(Some("b"), "{\"y\":\"z"));
        let text = "<tool_call>\n{\"name\":\"a\",\"arguments\":{}}\n</tool_call>\n<tool_call>\n{\"name\":\"b\"";
        let got = cut_calls(ToolFormat::Hermes, text).expect("cut");
        assert_eq!(got.calls.len(), 1);
        assert_eq!(got.cut, cut(Some("b"), ""));
    }

    /// Regression (found by the `llm` CLI, conformance): prose followed by a generic call block that the
    /// budget cut was read as a call, dropping the prose; the finished-answer parser reads it as text.
    #[test]
    fn prose_then_a_cut_generic_block_is_text() {
        for text in [
            "Sure, let me check. {\"tool_calls\": [{\"name\": \"get_we",
            "I will call it:\n{\"tool_calls\": [",
        ] {
            assert_eq!(cut_calls(ToolFormat::Generic, text), None, "{text}");
        }
        assert!(cut_calls(ToolFormat::Generic, "{\"tool_calls\": [{\"name\": \"get_we").is_some());
    }

    #[test]
    fn text_and_finished_calls_are_not_cut() {
        assert_eq!(
            cut_calls(ToolFormat::Hermes, "Just text that ran out"),
            None
        );
        assert_eq!(cut_calls(ToolFormat::Generic, "Hello {there"), None);
        let done = "<tool_call>\n{\"name\":\"a\",\"arguments\":{}}\n</tool_call>";
        assert_eq!(cut_calls(ToolFormat::Hermes, done), None);
        // An unclosed block whose JSON is whole is a call the whole-text parse reads.
        assert_eq!(
            cut_calls(
                ToolFormat::Hermes,
                "<tool_call>\n{\"name\":\"a\",\"arguments\":{}}"
            ),
            None
        );
        // Other JSON than calls is the answer's text.
        assert_eq!(cut_calls(ToolFormat::Generic, "{\"answer\":\"4"), None);
    }

    #[test]
    fn cut_arguments_are_written_as_finished_ones_are() {
        let text = "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {\"city\": \"Le Mans\", \"n\": [1, ";
        let got = cut_calls(ToolFormat::Generic, text).expect("cut");
        assert_eq!(got.cut, cut(Some("f"), "{\"city\":\"Le Mans\",\"n\":[1,"));
    }

    #[test]
    fn arguments_parse_as_far_as_they_go() {
        for (text, want) in [
            ("", json!({})),
            ("{", json!({})),
            ("{\"ci", json!({})),
            ("{\"city\":", json!({})),
            ("{\"city\":\"Pa\\", json!({"city": "Pa"})),
            ("{\"n\":12", json!({"n": 12})),
            ("{\"ok\":tr", json!({})),
            ("{\"a\":\"x\",\"b\":tr", json!({"a": "x"})),
            ("{\"a\":{\"b\":[\"c\",\"d", json!({"a": {"b": ["c", "d"]}})),
            ("{\"a\":1}", json!({"a": 1})),
        ] {
            assert_eq!(arguments_so_far(text), want, "{text:?}");
        }
    }
}
