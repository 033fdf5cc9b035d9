//! gpt-oss's answers in OpenAI's harmony format, read into reasoning, content and tool calls.
//!
//! A harmony answer is a run of messages, each a header and a body:
//! `<|channel|>analysis<|message|>…thoughts…<|end|><|start|>assistant<|channel|>final<|message|>…answer…`
//! (the prompt ends with `<|start|>assistant`, so the first header has no `<|start|>`). The header names
//! the message's channel and, for a tool call, its recipient — written after the channel
//! (`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}`) or after the role
//! (` to=functions.NAME<|channel|>commentary json<|message|>{…}`). The body runs to the next special
//! token; `<|return|>` and `<|call|>` end generation, so the engine never shows them.
//!
//! What each message becomes ([`Reader`]):
//! - `analysis` (the model's thoughts): reasoning;
//! - `final`, and `commentary` without a recipient (a preamble the model writes to the user): content;
//! - a message with a recipient (other than `assistant`): a tool call, given to the tool-call parser as
//!   content in one fixed form, [`shoal_guide::tools::parse::harmony_call`]'s
//!   (`<|start|>assistant to=functions.NAME<|message|>ARGS`), whatever header form the model wrote —
//!   or dropped when the request offered no tools (llama.cpp drops such unsolicited calls too).
//!
//! No special token reaches the content or the reasoning: headers are read, never given out. An answer
//! that does not start with a header (a model that ignores the format) is content, special tokens
//! still read as message boundaries. The prompt may open an analysis message itself (a continued
//! answer); then the answer starts inside the thoughts ([`prompt_opens_analysis`]).

use shoal_guide::tools::parse::harmony_call;

use super::reasoning::Parts;

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";
const CALL: &str = "<|call|>";
const RETURN: &str = "<|return|>";
const CONSTRAIN: &str = "<|constrain|>";
/// Special tokens that end a message's body.
const ENDS_BODY: [&str; 5] = [END, CALL, RETURN, START, CHANNEL];

/// What a message's body is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    /// A tool call; its opener was given to the content already.
    Call,
    /// A call the request offered no tools for.
    Drop,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// The answer's first text: a header, or (if it does not look like one) content.
    First,
    /// Reading a header up to `<|message|>`.
    Header,
    Body(Body),
}

/// The streaming reader of one harmony answer.
#[derive(Debug, Clone)]
pub struct Reader {
    state: State,
    held: String,
    /// Whether call messages go to the tool-call parser (tools were offered) or are dropped.
    calls: bool,
}

impl Reader {
    /// A reader of an answer whose prompt left an analysis message open (`analysis`) or ended with
    /// `<|start|>assistant`; `calls`: the request offered tools.
    pub fn new(analysis: bool, calls: bool) -> Self {
        Self {
            state: if analysis {
                State::Body(Body::Reasoning)
            } else {
                State::First
            },
            held: String::new(),
            calls,
        }
    }

    /// Whether the text read so far is inside an analysis message.
    pub fn in_analysis(&self) -> bool {
        self.state == State::Body(Body::Reasoning)
    }

    /// Whether a message other than analysis (the final answer, a call) has begun.
    pub fn answering(&self) -> bool {
        matches!(&self.state, State::Body(b) if *b != Body::Reasoning)
    }

    /// The parts of the next piece of text.
    pub fn push(&mut self, text: &str) -> Parts {
        let mut out = Parts::default();
        self.held.push_str(text);
        loop {
            match &self.state {
                State::First => {
                    let start = self.held.trim_start();
                    let header = |p: &str| p.starts_with(start) || start.starts_with(p);
                    if start.is_empty() {
                        return out;
                    }
                    if ["<|", "to="].iter().any(|p| header(p)) {
                        if start.len() < 3 {
                            // Could still be either: wait for more.
                            return out;
                        }
                        self.state = State::Header;
                    } else {
                        self.state = State::Body(Body::Content);
                    }
                }
                State::Header => {
                    let Some(at) = self.held.find(MESSAGE) else {
                        return out;
                    };
                    let header = self.held[..at].to_owned();
                    self.held.drain(..at + MESSAGE.len());
                    self.state = State::Body(self.open(&header, &mut out));
                }
                State::Body(body) => {
                    let body = body.clone();
                    match first_of(&self.held, &ENDS_BODY) {
                        Some((at, tag)) => {
                            let rest = self.held.split_off(at);
                            give(&body, &std::mem::take(&mut self.held), &mut out);
                            // `<|start|>` and `<|channel|>` begin the next header; the rest end this body.
                            self.held = match tag {
                                START | CHANNEL => rest,
                                _ => rest[tag.len()..].to_owned(),
                            };
                            self.state = State::Header;
                        }
                        None => {
                            let keep = held_tag(&self.held);
                            let ready = self.held.len() - keep;
                            give(&body, &self.held[..ready], &mut out);
                            self.held.drain(..ready);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// What is still held when the answer ended. A header cut before its `<|message|>` that named a
    /// recipient, or a commentary header cut before it could, still opens a call (the tool-call parser
    /// reads it as a call cut short: a forced call's name is known).
    pub fn finish(&mut self) -> Parts {
        let mut out = Parts::default();
        let held = std::mem::take(&mut self.held);
        match &self.state {
            State::First => out.content = held,
            State::Header => {
                let header = Header::read(&held);
                // A recipient, or a commentary channel cut before one could be written.
                let commentary = header
                    .channel
                    .as_deref()
                    .is_some_and(|c| !c.is_empty() && "commentary".starts_with(c));
                let call = match &header.recipient {
                    Some(to) => to != "assistant",
                    None => commentary,
                };
                if self.calls && call {
                    let to = header.recipient.unwrap_or_default();
                    let name = to.strip_prefix("functions.").unwrap_or(&to);
                    let mut text = harmony_call(name);
                    // The name is whole only when something followed it.
                    if !header.after_recipient {
                        text.truncate(text.len() - MESSAGE.len());
                    }
                    out.content = text;
                }
            }
            State::Body(body) => give(body, &held, &mut out),
        }
        out
    }

    /// Reads a header and says what its body is (a call's opener goes to the content now).
    fn open(&self, header: &str, out: &mut Parts) -> Body {
        let header = Header::read(header);
        match header.recipient {
            Some(to) if to != "assistant" => {
                if !self.calls {
                    return Body::Drop;
                }
                let name = to.strip_prefix("functions.").unwrap_or(&to);
                out.content.push_str(&harmony_call(name));
                Body::Call
            }
            _ => match header.channel.as_deref() {
                Some("analysis") => Body::Reasoning,
                _ => Body::Content,
            },
        }
    }
}

/// Gives `text` out as what `body` is.
fn give(body: &Body, text: &str, out: &mut Parts) {
    match body {
        Body::Reasoning => out.reasoning.push_str(text),
        Body::Content | Body::Call => out.content.push_str(text),
        Body::Drop => {}
    }
}

/// The first of `tags` in `text` (the earliest; its offset and which).
fn first_of(text: &str, tags: &[&'static str]) -> Option<(usize, &'static str)> {
    tags.iter()
        .filter_map(|t| text.find(t).map(|at| (at, *t)))
        .min()
}

/// The length of the end of `text` that may still grow into a special token ending a body.
fn held_tag(text: &str) -> usize {
    (1..=CHANNEL.len())
        .rev()
        .find(|&n| {
            text.len() >= n
                && text.is_char_boundary(text.len() - n)
                && ENDS_BODY
                    .iter()
                    .any(|t| t.starts_with(&text[text.len() - n..]))
        })
        .unwrap_or(0)
}

/// What a header says.
#[derive(Debug, Default)]
struct Header {
    channel: Option<String>,
    /// `to=` (`functions.NAME`, `assistant`, a built-in tool).
    recipient: Option<String>,
    /// Whether anything followed the recipient (its name is whole).
    after_recipient: bool,
}

impl Header {
    /// Reads `<|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json` and its other
    /// orders; words it does not know (the role, `json`) are skipped.
    fn read(text: &str) -> Self {
        let mut header = Header::default();
        let text = text.replace(CONSTRAIN, " ");
        let text = text.replace(START, " ");
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let word_end = |s: &str| {
                s.find(|c: char| c.is_whitespace() || c == '<')
                    .unwrap_or(s.len())
            };
            if let Some(after) = rest.strip_prefix(CHANNEL) {
                let end = word_end(after);
                header.channel = Some(after[..end].to_owned());
                rest = &after[end..];
            } else if let Some(after) = rest.strip_prefix("to=") {
                let end = word_end(after);
                header.recipient = Some(after[..end].to_owned());
                header.after_recipient = end < after.len();
                rest = &after[end..];
            } else {
                let skip = rest.chars().next().map_or(1, char::len_utf8);
                let end = match rest.starts_with(|c: char| c.is_whitespace() || c == '<') {
                    true => skip,
                    false => word_end(rest).max(skip),
                };
                rest = &rest[end..];
            }
        }
        header
    }
}

/// Whether a rendered prompt leaves an analysis message open: its last header is the analysis
/// channel's and no special token closes that message.
pub fn prompt_opens_analysis(prompt: &str) -> bool {
    let Some(at) = prompt.rfind(MESSAGE) else {
        return false;
    };
    let body = &prompt[at + MESSAGE.len()..];
    if ENDS_BODY.iter().any(|t| body.contains(t)) {
        return false;
    }
    let head = &prompt[..at];
    let from = head.rfind(START).unwrap_or(0);
    Header::read(&head[from..]).channel.as_deref() == Some("analysis")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::reasoning::{Syntax, check};

    fn parts(reasoning: &str, content: &str) -> Parts {
        Parts {
            reasoning: reasoning.into(),
            content: content.into(),
        }
    }

    fn streamed_agrees(text: &str, analysis: bool, calls: bool) -> Parts {
        check::streamed_agrees(text, Syntax::Harmony { analysis, calls })
    }

    #[test]
    fn analysis_is_reasoning_and_final_is_content() {
        let text = "<|channel|>analysis<|message|>User asks 7*8. That is 56.<|end|>\
<|start|>assistant<|channel|>final<|message|>7 × 8 = **56**.";
        assert_eq!(
            streamed_agrees(text, false, false),
            parts("User asks 7*8. That is 56.", "7 × 8 = **56**.")
        );
        // A preamble on the commentary channel is for the user too.
        let text = "<|channel|>commentary<|message|>Let me check.<|end|>\
<|start|>assistant<|channel|>final<|message|>Done.";
        assert_eq!(
            streamed_agrees(text, false, false),
            parts("", "Let me check.Done.")
        );
    }

    #[test]
    fn calls_take_one_form_whichever_header_the_model_wrote() {
        let call = "<|start|>assistant to=functions.get_weather<|message|>{\"city\":\"Paris\"}";
        for text in [
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary \
to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather\
<|channel|>commentary json<|message|>{\"city\":\"Paris\"}",
        ] {
            assert_eq!(
                streamed_agrees(text, false, true),
                parts("Need weather.", call)
            );
            // Without tools offered, the call is dropped, never shown.
            assert_eq!(
                streamed_agrees(text, false, false),
                parts("Need weather.", "")
            );
        }
        // The prompt's own `<|start|>assistant` makes the first header start with the recipient.
        let text =
            " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Paris\"}";
        assert_eq!(streamed_agrees(text, false, true), parts("", call));
    }

    #[test]
    fn a_call_cut_in_its_header_still_opens_the_call() {
        let text = "<|channel|>commentary to=functions.get_weather <|constr";
        assert_eq!(
            streamed_agrees(text, false, true),
            parts("", "<|start|>assistant to=functions.get_weather<|message|>")
        );
        let text = "<|channel|>commentary to=functions.get_wea";
        assert_eq!(
            streamed_agrees(text, false, true),
            parts("", "<|start|>assistant to=functions.get_wea")
        );
        let text = "<|channel|>comment";
        assert_eq!(
            streamed_agrees(text, false, true),
            parts("", "<|start|>assistant to=functions.")
        );
        // An analysis header cut short is nothing yet.
        assert_eq!(
            streamed_agrees("<|channel|>analys", false, true),
            parts("", "")
        );
    }

    #[test]
    fn answers_outside_the_format_are_content_without_special_tokens() {
        assert_eq!(
            streamed_agrees("Hello there", false, false),
            parts("", "Hello there")
        );
        assert_eq!(
            streamed_agrees("{\"a\": 1}", false, false),
            parts("", "{\"a\": 1}")
        );
        assert_eq!(
            streamed_agrees(
                "Hi<|end|><|start|>assistant<|channel|>final<|message|>!",
                false,
                false
            ),
            parts("", "Hi!")
        );
        // Cut inside the thoughts: all reasoning, a special token's beginning included.
        assert_eq!(
            streamed_agrees("<|channel|>analysis<|message|>Think <|en", false, false),
            parts("Think <|en", "")
        );
    }

    #[test]
    fn a_prompt_that_opened_the_analysis_starts_in_the_thoughts() {
        assert!(prompt_opens_analysis(
            "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>analysis<|message|>"
        ));
        assert!(!prompt_opens_analysis(
            "<|start|>user<|message|>Hi<|end|><|start|>assistant"
        ));
        assert!(!prompt_opens_analysis(
            "<|start|>assistant<|channel|>analysis<|message|>x<|end|><|start|>assistant"
        ));
        let text = "so 56.<|end|><|start|>assistant<|channel|>final<|message|>56";
        assert_eq!(streamed_agrees(text, true, false), parts("so 56.", "56"));
    }
}
