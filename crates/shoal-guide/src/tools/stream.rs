//! [`ToolCallStream`]: tool-call parsing while an answer streams.
//!
//! Text goes out as [`ToolEvent::Content`] until a call's opener appears (`<tool_call>`,
//! `[TOOL_CALLS]`, `<|python_tag|>`, harmony's `<|start|>assistant to=functions.`, or — for the formats whose calls are bare JSON — a `{` as the
//! first thing written). Text that might be the start of an opener is held back until it is clear.
//! From the opener on everything is buffered: a Hermes block is emitted as a [`ToolEvent::Call`] as
//! soon as it closes, the other formats' calls when the stream ends ([`ToolCallStream::finish`]),
//! parsed by the same [`parse`] as a finished answer. Text after an opener that turns out not to
//! be a call is sent as content at the end, so nothing the model wrote is lost.

use super::ToolFormat;
use super::cut::cut_calls;
use super::parse::{
    CallIds, HARMONY_CALL, HERMES_CLOSE, HERMES_OPEN, MISTRAL_CALLS, PYTHON_TAG, ParsedCall, parse,
};

/// What the stream yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    /// Text for the user.
    Content(String),
    /// One complete call.
    Call {
        index: usize,
        id: String,
        name: String,
        /// The arguments as JSON text.
        arguments: String,
    },
    /// The call the answer was writing when its token budget ran out (only from
    /// [`ToolCallStream::finish_cut`]); always the last event.
    Cut {
        index: usize,
        id: String,
        /// The function's name, when it was written whole.
        name: Option<String>,
        /// The arguments as written so far (unfinished JSON text).
        arguments: String,
    },
}

/// Incremental tool-call parser for one answer.
#[derive(Debug, Clone)]
pub struct ToolCallStream {
    format: ToolFormat,
    ids: CallIds,
    /// Content not sent yet (a possible opener's beginning).
    held: String,
    /// Everything from the opener on; `None` while still in content.
    calls_text: Option<String>,
    /// Calls already emitted (Hermes emits them as they close).
    emitted: usize,
    /// Whether any non-whitespace content went out (a bare-JSON call must come first).
    wrote_content: bool,
    /// The one function a forced call can name: a call cut before its name was written whole still
    /// names it.
    forced: Option<String>,
}

impl ToolCallStream {
    pub fn new(format: ToolFormat, ids: CallIds) -> Self {
        Self {
            format,
            ids,
            held: String::new(),
            calls_text: None,
            emitted: 0,
            wrote_content: false,
            forced: None,
        }
    }

    /// The same stream for an answer forced to call `name` (see [`ToolCallStream::finish_cut`]).
    pub fn forcing(mut self, name: Option<String>) -> Self {
        self.forced = name;
        self
    }

    /// Whether any call was emitted so far.
    pub fn saw_calls(&self) -> bool {
        self.emitted > 0
    }

    fn openers(&self) -> &'static [&'static str] {
        match self.format {
            ToolFormat::Hermes => &[HERMES_OPEN],
            ToolFormat::Llama3 => &[PYTHON_TAG],
            ToolFormat::MistralJson | ToolFormat::MistralArgs => &[MISTRAL_CALLS],
            ToolFormat::Harmony => &[HARMONY_CALL],
            ToolFormat::Generic => &[],
        }
    }

    /// Whether a `{` as the first thing written opens calls.
    fn bare_json(&self) -> bool {
        matches!(self.format, ToolFormat::Llama3 | ToolFormat::Generic)
    }

    /// Feeds the next piece of text.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        let mut events = Vec::new();
        if let Some(calls) = &mut self.calls_text {
            calls.push_str(text);
            self.closed_calls(&mut events);
            return events;
        }
        self.held.push_str(text);
        if self.bare_json() && !self.wrote_content {
            let start = self.held.trim_start();
            let generic = self.format == ToolFormat::Generic;
            if start.starts_with('{') || generic && start.starts_with("```") {
                self.calls_text = Some(std::mem::take(&mut self.held));
                return events;
            }
            // Only whitespace so far, or the start of a code fence: wait for more.
            if start.is_empty() || generic && "```".starts_with(start) {
                return events;
            }
        }
        let openers = self.openers();
        if let Some((at, _)) = openers
            .iter()
            .filter_map(|o| self.held.find(o).map(|at| (at, *o)))
            .min()
        {
            let rest = self.held.split_off(at);
            let before = std::mem::take(&mut self.held);
            self.send_content(before, &mut events);
            self.calls_text = Some(rest);
            self.closed_calls(&mut events);
            return events;
        }
        // Hold back the longest tail that could still grow into an opener.
        let keep = openers
            .iter()
            .map(|o| partial_suffix(&self.held, o))
            .max()
            .unwrap_or(0);
        let ready = self.held.len() - keep;
        let tail = self.held.split_off(ready);
        let ready = std::mem::replace(&mut self.held, tail);
        self.send_content(ready, &mut events);
        events
    }

    /// Ends the stream: what is still held or buffered goes out as content and calls.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut events = Vec::new();
        let held = std::mem::take(&mut self.held);
        self.send_content(held, &mut events);
        if let Some(calls_text) = self.calls_text.take() {
            let parsed = parse(self.format, &calls_text);
            if parsed.calls.is_empty() {
                self.send_content(calls_text, &mut events);
            } else {
                if !parsed.content.is_empty() {
                    self.send_content(parsed.content, &mut events);
                }
                for call in parsed.calls.into_iter().skip(self.emitted) {
                    self.emit(call, &mut events);
                }
            }
        }
        events
    }

    /// Ends a stream whose answer ran out of tokens: as [`ToolCallStream::finish`], except that a call
    /// cut short is a [`ToolEvent::Cut`] (after the calls it finished) rather than text.
    pub fn finish_cut(&mut self) -> Vec<ToolEvent> {
        let Some(cut) = self
            .calls_text
            .as_deref()
            .and_then(|text| cut_calls(self.format, text))
        else {
            return self.finish();
        };
        self.calls_text = None;
        let mut events = Vec::new();
        let held = std::mem::take(&mut self.held);
        self.send_content(held, &mut events);
        if !cut.content.trim().is_empty() {
            self.send_content(cut.content, &mut events);
        }
        for call in cut.calls.into_iter().skip(self.emitted) {
            self.emit(call, &mut events);
        }
        events.push(ToolEvent::Cut {
            index: self.emitted,
            id: self.ids.id(self.emitted),
            name: cut.cut.name.or_else(|| self.forced.clone()),
            arguments: cut.cut.arguments,
        });
        events
    }

    /// Hermes: emits the blocks that have closed since the last call.
    fn closed_calls(&mut self, events: &mut Vec<ToolEvent>) {
        if self.format != ToolFormat::Hermes {
            return;
        }
        let Some(text) = &self.calls_text else {
            return;
        };
        let Some(end) = text.rfind(HERMES_CLOSE) else {
            return;
        };
        let closed = parse(self.format, &text[..end + HERMES_CLOSE.len()]);
        for call in closed.calls.into_iter().skip(self.emitted) {
            self.emit(call, events);
        }
    }

    fn emit(&mut self, call: ParsedCall, events: &mut Vec<ToolEvent>) {
        events.push(ToolEvent::Call {
            index: self.emitted,
            id: self.ids.id(self.emitted),
            name: call.name,
            arguments: call.arguments,
        });
        self.emitted += 1;
    }

    fn send_content(&mut self, text: String, events: &mut Vec<ToolEvent>) {
        if text.is_empty() {
            return;
        }
        if !text.trim().is_empty() {
            self.wrote_content = true;
        }
        events.push(ToolEvent::Content(text));
    }
}

/// Length of the longest proper prefix of `opener` that `text` ends with.
fn partial_suffix(text: &str, opener: &str) -> usize {
    (1..opener.len())
        .rev()
        .find(|&n| opener.is_char_boundary(n) && text.ends_with(&opener[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(format: ToolFormat, pieces: &[&str]) -> Vec<ToolEvent> {
        let mut s = ToolCallStream::new(format, CallIds::new(1, format));
        let mut events: Vec<ToolEvent> = pieces.iter().flat_map(|p| s.push(p)).collect();
        events.extend(s.finish());
        events
    }

    fn content(events: &[ToolEvent]) -> String {
        events
            .iter()
            .filter_map(|e| match e {
                ToolEvent::Content(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    fn calls(events: &[ToolEvent]) -> Vec<(usize, String, String)> {
        events
            .iter()
            .filter_map(|e| match e {
                ToolEvent::Call {
                    index,
                    name,
                    arguments,
                    ..
                } => Some((*index, name.clone(), arguments.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn hermes_content_streams_then_each_block_as_it_closes() {
        let mut s = ToolCallStream::new(ToolFormat::Hermes, CallIds::new(1, ToolFormat::Hermes));
        assert_eq!(s.push("Sure"), vec![ToolEvent::Content("Sure".into())]);
        // "<tool" might be an opener: held.
        assert_eq!(s.push(". <tool"), vec![ToolEvent::Content(". ".into())]);
        assert!(s.push("_call>\n{\"name\": \"f\", ").is_empty());
        let ev = s.push("\"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\"");
        assert_eq!(calls(&ev), vec![(0, "f".into(), r#"{"a":1}"#.into())]);
        let ev = s.push(": \"g\", \"arguments\": {}}\n</tool_call>");
        assert_eq!(calls(&ev), vec![(1, "g".into(), "{}".into())]);
        assert!(s.finish().is_empty());
        assert!(s.saw_calls());
    }

    #[test]
    fn harmony_calls_stream_after_the_content_and_a_cut_one_is_cut() {
        let opener = super::super::parse::harmony_call("get_weather");
        let pieces = [
            "Let me check.",
            opener.as_str(),
            "{\"city\": ",
            "\"Paris\"}",
        ];
        let ev = run(ToolFormat::Harmony, &pieces);
        assert_eq!(content(&ev), "Let me check.");
        assert!(
            matches!(&ev[1], ToolEvent::Call { name, arguments, .. }
                if name == "get_weather" && arguments == "{\"city\":\"Paris\"}"),
            "{ev:?}"
        );
        let mut s = ToolCallStream::new(ToolFormat::Harmony, CallIds::new(1, ToolFormat::Harmony));
        s.push(&opener);
        s.push("{\"city\": \"Par");
        let ev = s.finish_cut();
        assert!(
            matches!(ev.as_slice(), [ToolEvent::Cut { name: Some(n), arguments, .. }]
                if n == "get_weather" && arguments == "{\"city\":\"Par"),
            "{ev:?}"
        );
    }

    #[test]
    fn a_false_alarm_is_sent_as_content() {
        let ev = run(ToolFormat::Hermes, &["a <to", "ol> b"]);
        assert_eq!(content(&ev), "a <tool> b");
        assert!(calls(&ev).is_empty());
        let ev = run(ToolFormat::Hermes, &["x <tool_call>not json"]);
        assert_eq!(content(&ev), "x <tool_call>not json");
    }

    #[test]
    fn bare_json_formats_wait_for_the_end() {
        let pieces = [
            "  {\"tool_calls\": [{\"name\": \"f\",",
            " \"arguments\": {\"q\": \"x\"}}]}",
        ];
        let ev = run(ToolFormat::Generic, &pieces);
        assert_eq!(calls(&ev), vec![(0, "f".into(), r#"{"q":"x"}"#.into())]);
        assert_eq!(content(&ev), "");
        let ev = run(ToolFormat::Generic, &["Hello ", "{there}"]);
        assert_eq!(content(&ev), "Hello {there}");
        let ev = run(ToolFormat::Generic, &["{\"answer\": 1}"]);
        assert_eq!(content(&ev), "{\"answer\": 1}");
        let ev = run(
            ToolFormat::Generic,
            &[
                "``",
                "`json\n{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {}}]}\n```",
            ],
        );
        assert_eq!(calls(&ev).len(), 1);
        let ev = run(
            ToolFormat::Llama3,
            &["{\"name\": \"f\", \"parameters\": {\"x\": 2}}"],
        );
        assert_eq!(calls(&ev), vec![(0, "f".into(), r#"{"x":2}"#.into())]);
        let ev = run(
            ToolFormat::MistralJson,
            &[
                "Ok",
                "[TOOL_",
                "CALLS][{\"name\": \"f\", \"arguments\": {}}]",
            ],
        );
        assert_eq!(content(&ev), "Ok");
        assert_eq!(calls(&ev), vec![(0, "f".into(), "{}".into())]);
    }

    /// The streamed calls are the ones the whole-text parse finds, however the text is cut.
    #[test]
    fn streaming_agrees_with_the_whole_parse_at_every_cut() {
        let text = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let whole = parse(ToolFormat::Hermes, text);
        for cut in (1..text.len()).filter(|&c| text.is_char_boundary(c)) {
            let ev = run(ToolFormat::Hermes, &[&text[..cut], &text[cut..]]);
            let got: Vec<ParsedCall> = calls(&ev)
                .into_iter()
                .map(|(_, name, arguments)| ParsedCall { name, arguments })
                .collect();
            assert_eq!(got, whole.calls, "cut at {cut}");
            assert_eq!(content(&ev).trim(), whole.content, "cut at {cut}");
        }
    }

    #[test]
    fn a_call_cut_by_the_budget_ends_the_stream_as_a_cut_call() {
        let text = "On it.<tool_call>\n{\"name\":\"a\",\"arguments\":{}}\n</tool_call>\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Pa";
        for cut in (1..text.len()).step_by(7) {
            let mut s =
                ToolCallStream::new(ToolFormat::Hermes, CallIds::new(1, ToolFormat::Hermes));
            let mut ev = s.push(&text[..cut]);
            ev.extend(s.push(&text[cut..]));
            ev.extend(s.finish_cut());
            assert_eq!(content(&ev), "On it.", "cut at {cut}");
            assert_eq!(
                calls(&ev),
                vec![(0, "a".into(), "{}".into())],
                "cut at {cut}"
            );
            let last = ev.last().expect("events");
            let ToolEvent::Cut {
                index,
                id,
                name,
                arguments,
            } = last
            else {
                panic!("cut at {cut}: {last:?}");
            };
            assert_eq!((*index, name.as_deref()), (1, Some("get_weather")));
            assert_eq!(id, &CallIds::new(1, ToolFormat::Hermes).id(1));
            assert_eq!(arguments, "{\"city\":\"Pa");
        }
        // Text that ran out is text.
        let mut s = ToolCallStream::new(ToolFormat::Generic, CallIds::new(1, ToolFormat::Generic));
        let mut ev = s.push("Hello {\"a\":");
        ev.extend(s.finish_cut());
        assert_eq!(content(&ev), "Hello {\"a\":");
    }
}
