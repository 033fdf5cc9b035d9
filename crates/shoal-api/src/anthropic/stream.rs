//! Anthropic's streaming events: [`MessageEvents`] is the [`StreamFormat`] that writes a request's
//! engine events as Anthropic's named SSE events, in Anthropic's order:
//!
//! `message_start` (the message with empty content and the prompt's `input_tokens`),
//! `content_block_start` (an empty text block), `ping`, one `content_block_delta` (`text_delta`) per
//! piece of text, `content_block_stop`, `message_delta` (`stop_reason`, `stop_sequence` and the final
//! usage) and `message_stop`. A failure midway is an `error` event in Anthropic's error shape, after
//! which the stream ends. [`crate::sse`] drives the request and owns its stream, so a client that goes
//! away cancels the generation.
//!
//! Where tools are offered the text goes through shoal-guide's [`ToolCallStream`] first, and blocks
//! open as the answer shows what it is: `ping` follows `message_start`, a text block opens with the
//! first text, and each call is a `tool_use` block (`content_block_start` with empty `input`, one
//! `input_json_delta` with the whole arguments, `content_block_stop`) at the next index. An answer with
//! neither text nor calls still has its (empty) text block, as without tools.

use serde::Serialize;
use serde_json::json;
use shoal_engine::FinishReason;
use shoal_guide::{ToolCallStream, ToolEvent};

use super::types::{ContentOut, MessageOut, UsageOut};
use super::{MESSAGE_TYPE, ROLE, stop_reason};
use crate::dialect::anthropic::Error;
use crate::error::ApiError;
use crate::generate::Finish;
use crate::generate::reasoning::{self, Parts, Splitter};
use crate::sse::{Frame, StreamFormat, to_json};

/// What the `data` of one SSE event of a streamed message carries, as the OpenAPI document states it: an
/// event, or the error that ends the stream.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = anthropic::StreamData)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum StreamData {
    Event(StreamEvent),
    Error(crate::dialect::anthropic::ErrorBody),
}

/// One streaming event; its `type` is also the SSE event name.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = anthropic::StreamEvent)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    MessageStart {
        message: MessageOut,
    },
    ContentBlockStart {
        index: usize,
        content_block: ContentOut,
    },
    Ping,
    ContentBlockDelta {
        index: usize,
        delta: Delta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: MessageDelta,
        usage: UsageOut,
    },
    MessageStop,
}

impl StreamEvent {
    /// The SSE event name (the same as the payload's `type`).
    pub fn name(&self) -> &'static str {
        match self {
            StreamEvent::MessageStart { .. } => "message_start",
            StreamEvent::ContentBlockStart { .. } => "content_block_start",
            StreamEvent::Ping => "ping",
            StreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            StreamEvent::ContentBlockStop { .. } => "content_block_stop",
            StreamEvent::MessageDelta { .. } => "message_delta",
            StreamEvent::MessageStop => "message_stop",
        }
    }

    fn frame(self) -> Frame {
        Frame::named(self.name(), to_json(&self))
    }
}

/// A change to a content block.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = anthropic::Delta)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Delta {
    TextDelta { text: String },
    InputJsonDelta { partial_json: String },
    ThinkingDelta { thinking: String },
    SignatureDelta { signature: String },
}

/// The end of the message: why it stopped.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = anthropic::MessageDelta)]
pub struct MessageDelta {
    #[schema(schema_with = super::types::schema::stop_reason)]
    pub stop_reason: &'static str,
    pub stop_sequence: Option<String>,
}

/// Writes one request's stream.
pub struct MessageEvents {
    /// The message as `message_start` shows it (empty content, no stop reason yet).
    start: Option<MessageOut>,
    max_tokens: u32,
    /// Splits calls out of the text where tools were offered.
    tools: Option<ToolCallStream>,
    /// Index of the next content block.
    next_block: usize,
    /// The text block being written, if one is open.
    open_text: Option<usize>,
    /// Splits the model's thoughts from its answer where it may think.
    reasoning: Option<Splitter>,
    /// The thinking block being written, if one is open.
    open_thinking: Option<usize>,
    /// Whether a call was sent.
    called: bool,
}

impl MessageEvents {
    /// `prompt_tokens` is the prompt's length, reported as `input_tokens` until the final usage (which
    /// splits off the tokens read from the prefix cache) arrives with `message_delta`. `tools` parses
    /// calls out of the answer where tools were offered.
    pub fn new(
        id: String,
        model: String,
        prompt_tokens: usize,
        max_tokens: u32,
        tools: Option<ToolCallStream>,
        reasoning: Option<Splitter>,
    ) -> Self {
        let start = MessageOut {
            id,
            kind: MESSAGE_TYPE,
            role: ROLE,
            model,
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: UsageOut {
                input_tokens: u32::try_from(prompt_tokens).unwrap_or(u32::MAX),
                output_tokens: 0,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 0,
            },
        };
        MessageEvents {
            start: Some(start),
            max_tokens,
            tools,
            next_block: 0,
            open_text: None,
            reasoning,
            open_thinking: None,
            called: false,
        }
    }

    /// A piece of the model's thoughts: into the thinking block, opened first (it is the first block).
    fn thinking(&mut self, thinking: String, frames: &mut Vec<Frame>) {
        if thinking.is_empty() {
            return;
        }
        let index = match self.open_thinking {
            Some(index) => index,
            None => {
                let index = self.next_block;
                self.next_block += 1;
                self.open_thinking = Some(index);
                frames.push(
                    StreamEvent::ContentBlockStart {
                        index,
                        content_block: ContentOut::Thinking {
                            thinking: String::new(),
                            signature: String::new(),
                        },
                    }
                    .frame(),
                );
                index
            }
        };
        frames.push(
            StreamEvent::ContentBlockDelta {
                index,
                delta: Delta::ThinkingDelta { thinking },
            }
            .frame(),
        );
    }

    /// Closes the thinking block, if one is open: its (empty) signature, then its stop.
    fn close_thinking(&mut self, frames: &mut Vec<Frame>) {
        if let Some(index) = self.open_thinking.take() {
            frames.extend([
                StreamEvent::ContentBlockDelta {
                    index,
                    delta: Delta::SignatureDelta {
                        signature: String::new(),
                    },
                }
                .frame(),
                StreamEvent::ContentBlockStop { index }.frame(),
            ]);
        }
    }

    /// The frames of one piece of the answer: its thoughts, then its content (through the tool parser
    /// where tools were offered).
    fn parts(&mut self, parts: Parts) -> Vec<Frame> {
        let mut frames = Vec::new();
        self.thinking(parts.reasoning, &mut frames);
        if parts.content.is_empty() {
            return frames;
        }
        if let Some(tools) = &mut self.tools {
            let events = tools.push(&parts.content);
            frames.extend(self.tool_events(events));
        } else {
            self.text(parts.content, &mut frames);
        }
        frames
    }

    /// Opens a text block: its `content_block_start`.
    fn open_text(&mut self) -> Frame {
        let index = self.next_block;
        self.next_block += 1;
        self.open_text = Some(index);
        StreamEvent::ContentBlockStart {
            index,
            content_block: ContentOut::Text {
                text: String::new(),
            },
        }
        .frame()
    }

    /// Closes the open text block, if any.
    fn close_text(&mut self, frames: &mut Vec<Frame>) {
        if let Some(index) = self.open_text.take() {
            frames.push(StreamEvent::ContentBlockStop { index }.frame());
        }
    }

    fn text(&mut self, text: String, frames: &mut Vec<Frame>) {
        if text.is_empty() {
            return;
        }
        self.close_thinking(frames);
        let index = match self.open_text {
            Some(index) => index,
            None => {
                frames.push(self.open_text());
                self.next_block - 1
            }
        };
        frames.push(
            StreamEvent::ContentBlockDelta {
                index,
                delta: Delta::TextDelta { text },
            }
            .frame(),
        );
    }

    /// The blocks of the tool parser's events.
    fn tool_events(&mut self, events: Vec<ToolEvent>) -> Vec<Frame> {
        let mut frames = Vec::new();
        for event in events {
            match event {
                ToolEvent::Content(text) => self.text(text, &mut frames),
                ToolEvent::Call {
                    id,
                    name,
                    arguments,
                    ..
                } => {
                    self.close_thinking(&mut frames);
                    self.close_text(&mut frames);
                    self.called = true;
                    let content_block = ContentOut::ToolUse {
                        id,
                        name,
                        input: json!({}),
                    };
                    self.tool_use_block(content_block, arguments, &mut frames);
                }
                ToolEvent::Cut {
                    index,
                    id,
                    name,
                    arguments,
                } => {
                    self.close_thinking(&mut frames);
                    self.close_text(&mut frames);
                    let cut = shoal_guide::CutToolCall {
                        index,
                        id: id.clone(),
                        name: name.clone(),
                        arguments,
                    };
                    let input = cut.input().to_string();
                    let content_block = ContentOut::ToolUse {
                        id,
                        name: name.unwrap_or_default(),
                        input: json!({}),
                    };
                    self.tool_use_block(content_block, input, &mut frames);
                }
            }
        }
        frames
    }

    /// One `tool_use` block at the next index: opened, its input as one `input_json_delta`, closed.
    fn tool_use_block(
        &mut self,
        content_block: ContentOut,
        input: String,
        frames: &mut Vec<Frame>,
    ) {
        let index = self.next_block;
        self.next_block += 1;
        frames.extend([
            StreamEvent::ContentBlockStart {
                index,
                content_block,
            }
            .frame(),
            StreamEvent::ContentBlockDelta {
                index,
                delta: Delta::InputJsonDelta {
                    partial_json: input,
                },
            }
            .frame(),
            StreamEvent::ContentBlockStop { index }.frame(),
        ]);
    }
}

impl StreamFormat for MessageEvents {
    fn opening(&mut self) -> Vec<Frame> {
        let Some(message) = self.start.take() else {
            return Vec::new();
        };
        let mut frames = vec![StreamEvent::MessageStart { message }.frame()];
        // Without tools or thoughts the text block opens at once; otherwise with what comes first.
        if self.tools.is_none() && self.reasoning.is_none() {
            frames.push(self.open_text());
        }
        frames.push(StreamEvent::Ping.frame());
        frames
    }

    fn token(&mut self, text: &str, _logprob: f32) -> Vec<Frame> {
        let parts = reasoning::piece(self.reasoning.as_mut(), text);
        self.parts(parts)
    }

    fn finish(&mut self, finish: Finish) -> Vec<Frame> {
        let held = self.reasoning.as_mut().map(Splitter::finish);
        let mut frames = held.map(|p| self.parts(p)).unwrap_or_default();
        frames.extend(match &mut self.tools {
            // Cut by the budget inside a call: a last tool_use block, not text.
            Some(tools) if finish.reason == FinishReason::Length => {
                let events = tools.finish_cut();
                self.tool_events(events)
            }
            Some(tools) => {
                let events = tools.finish();
                self.tool_events(events)
            }
            None => Vec::new(),
        });
        self.close_thinking(&mut frames);
        if self.next_block == 0 {
            frames.push(self.open_text());
        }
        self.close_text(&mut frames);
        let usage = UsageOut::from(finish.usage);
        let delta = MessageDelta {
            stop_reason: stop_reason(
                finish.reason,
                finish.stop_sequence.is_some(),
                self.called,
                usage.output_tokens,
                self.max_tokens,
            ),
            stop_sequence: finish.stop_sequence,
        };
        frames.extend([
            StreamEvent::MessageDelta { delta, usage }.frame(),
            StreamEvent::MessageStop.frame(),
        ]);
        frames
    }

    fn error(&mut self, err: &ApiError) -> Vec<Frame> {
        vec![error_frame(err)]
    }

    fn cancelled(&mut self) -> Vec<Frame> {
        vec![error_frame(&ApiError::Cancelled)]
    }
}

/// An `error` event in Anthropic's shape.
fn error_frame(err: &ApiError) -> Frame {
    Frame::named("error", to_json(&Error(err.clone()).body()))
}

#[cfg(test)]
mod tests {
    use serde_json::Value;
    use shoal_engine::Usage;
    use shoal_guide::{ToolCallParser, ToolFormat};

    use super::*;

    fn events(frames: Vec<Frame>) -> Vec<(&'static str, Value)> {
        frames
            .into_iter()
            .map(|f| {
                let name = f.name.expect("every Anthropic event is named");
                let data: Value = serde_json::from_str(&f.data).expect("JSON");
                (name, data)
            })
            .collect()
    }

    fn names(events: &[(&'static str, Value)]) -> Vec<&'static str> {
        events.iter().map(|(n, _)| *n).collect()
    }

    fn done(reason: FinishReason, completion_tokens: u32) -> Finish {
        Finish {
            reason,
            usage: Usage {
                prompt_tokens: 20,
                completion_tokens,
                cached_tokens: 8,
            },
            stop_sequence: None,
        }
    }

    #[test]
    fn text_streams_in_anthropics_order_and_errors_are_error_events() {
        let mut m = MessageEvents::new("msg_1".into(), "m".into(), 20, 16, None, None);
        let open = events(m.opening());
        assert_eq!(
            names(&open),
            ["message_start", "content_block_start", "ping"]
        );
        assert_eq!(open[0].1["message"]["usage"]["input_tokens"], 20);
        assert!(m.token("", 0.0).is_empty(), "nothing for an empty piece");
        let delta = events(m.token("Hi", 0.0));
        assert_eq!(
            delta[0].1["delta"],
            serde_json::json!({"type": "text_delta", "text": "Hi"})
        );
        let end = events(m.finish(done(FinishReason::Length, 16)));
        assert_eq!(
            names(&end),
            ["content_block_stop", "message_delta", "message_stop"]
        );
        assert_eq!(end[1].1["delta"]["stop_reason"], "max_tokens");
        // The final usage splits the prompt into computed and cached tokens.
        assert_eq!(end[1].1["usage"]["input_tokens"], 12);
        assert_eq!(end[1].1["usage"]["cache_read_input_tokens"], 8);
        let err = events(m.error(&ApiError::Overloaded));
        assert_eq!(names(&err), ["error"]);
        assert_eq!(err[0].1["type"], "error");
        assert_eq!(err[0].1["error"]["type"], "overloaded_error");
    }

    #[test]
    fn calls_become_tool_use_blocks_after_the_text() {
        let tools = ToolCallParser::new(ToolFormat::Hermes, 3).stream();
        let mut m = MessageEvents::new("msg_2".into(), "m".into(), 20, 64, Some(tools), None);
        assert_eq!(names(&events(m.opening())), ["message_start", "ping"]);
        let mut all = Vec::new();
        for piece in [
            "Let me check.",
            "<tool_call>\n{\"name\": \"get_weather\", ",
            "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        ] {
            all.extend(events(m.token(piece, 0.0)));
        }
        all.extend(events(m.finish(done(FinishReason::Stop, 30))));
        assert_eq!(
            names(&all),
            [
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(all[0].1["content_block"]["type"], "text");
        assert_eq!(all[1].1["delta"]["text"], "Let me check.");
        assert_eq!(all[3].1["index"], 1);
        assert_eq!(all[3].1["content_block"]["type"], "tool_use");
        assert_eq!(all[3].1["content_block"]["name"], "get_weather");
        let json = all[4].1["delta"]["partial_json"].as_str().expect("json");
        assert_eq!(
            serde_json::from_str::<Value>(json).ok(),
            Some(serde_json::json!({"city": "Paris"}))
        );
        assert_eq!(all[6].1["delta"]["stop_reason"], "tool_use");
    }

    #[test]
    fn an_answer_without_text_or_calls_still_has_a_text_block() {
        let tools = ToolCallParser::new(ToolFormat::Hermes, 3).stream();
        let mut m = MessageEvents::new("msg_3".into(), "m".into(), 20, 64, Some(tools), None);
        m.opening();
        let end = events(m.finish(done(FinishReason::Stop, 1)));
        assert_eq!(
            names(&end),
            [
                "content_block_start",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(end[2].1["delta"]["stop_reason"], "end_turn");
    }

    #[test]
    fn thoughts_are_a_thinking_block_before_the_text() {
        let mut m = MessageEvents::new(
            "msg_4".into(),
            "m".into(),
            20,
            64,
            None,
            Some(Splitter::new(reasoning::Syntax::Think { inside: false })),
        );
        assert_eq!(names(&events(m.opening())), ["message_start", "ping"]);
        let mut all = Vec::new();
        for piece in ["<thi", "nk>\nSeven eights", " are 56.\n</th", "ink>\n\n56."] {
            all.extend(events(m.token(piece, 0.0)));
        }
        all.extend(events(m.finish(done(FinishReason::Stop, 12))));
        let thinking: String = all
            .iter()
            .filter(|(_, v)| v["delta"]["type"] == "thinking_delta")
            .map(|(_, v)| v["delta"]["thinking"].as_str().expect("text"))
            .collect();
        assert_eq!(thinking, "Seven eights are 56.");
        assert_eq!(all[0].1["content_block"]["type"], "thinking");
        assert_eq!(all[0].1["index"], 0);
        let signature = all
            .iter()
            .position(|(_, v)| v["delta"]["type"] == "signature_delta");
        let text_start = all
            .iter()
            .position(|(n, v)| *n == "content_block_start" && v["content_block"]["type"] == "text")
            .expect("a text block");
        assert!(signature.expect("a signature") < text_start);
        assert_eq!(all[text_start].1["index"], 1);
        let text: String = all
            .iter()
            .filter(|(_, v)| v["delta"]["type"] == "text_delta")
            .map(|(_, v)| v["delta"]["text"].as_str().expect("text"))
            .collect();
        assert_eq!(text, "56.");
    }
}
