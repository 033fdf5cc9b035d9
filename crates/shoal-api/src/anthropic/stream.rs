//! Anthropic's streaming events: [`MessageEvents`] is the [`StreamFormat`] that writes a request's
//! engine events as Anthropic's named SSE events, in Anthropic's order:
//!
//! `message_start` (the message with empty content and the prompt's `input_tokens`),
//! `content_block_start` (an empty text block), `ping`, one `content_block_delta` (`text_delta`) per
//! piece of text, `content_block_stop`, `message_delta` (`stop_reason`, `stop_sequence` and the final
//! usage) and `message_stop`. A failure midway is an `error` event in Anthropic's error shape, after
//! which the stream ends. [`crate::sse`] drives the request and owns its stream, so a client that goes
//! away cancels the generation.

use serde::Serialize;

use super::error::Error;
use super::types::{ContentOut, MessageOut, UsageOut};
use super::{MESSAGE_TYPE, ROLE, stop_reason};
use crate::error::ApiError;
use crate::sse::{Finish, Frame, StreamFormat, to_json};

/// One streaming event; its `type` is also the SSE event name.
#[derive(Debug, Serialize)]
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
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Delta {
    TextDelta { text: String },
}

/// The end of the message: why it stopped.
#[derive(Debug, Serialize)]
pub struct MessageDelta {
    pub stop_reason: &'static str,
    pub stop_sequence: Option<String>,
}

/// Writes one request's stream.
pub struct MessageEvents {
    /// The message as `message_start` shows it (empty content, no stop reason yet).
    start: Option<MessageOut>,
    max_tokens: u32,
}

impl MessageEvents {
    /// `prompt_tokens` is the prompt's length, reported as `input_tokens` until the final usage (which
    /// splits off the tokens read from the prefix cache) arrives with `message_delta`.
    pub fn new(id: String, model: String, prompt_tokens: usize, max_tokens: u32) -> Self {
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
        }
    }
}

/// The one text block's index.
const TEXT_BLOCK: usize = 0;

impl StreamFormat for MessageEvents {
    fn opening(&mut self) -> Vec<Frame> {
        let Some(message) = self.start.take() else {
            return Vec::new();
        };
        vec![
            StreamEvent::MessageStart { message }.frame(),
            StreamEvent::ContentBlockStart {
                index: TEXT_BLOCK,
                content_block: ContentOut::Text {
                    text: String::new(),
                },
            }
            .frame(),
            StreamEvent::Ping.frame(),
        ]
    }

    fn token(&mut self, text: &str, _logprob: f32) -> Vec<Frame> {
        if text.is_empty() {
            return Vec::new();
        }
        vec![
            StreamEvent::ContentBlockDelta {
                index: TEXT_BLOCK,
                delta: Delta::TextDelta {
                    text: text.to_string(),
                },
            }
            .frame(),
        ]
    }

    fn finish(&mut self, finish: Finish) -> Vec<Frame> {
        let usage = UsageOut::from(finish.usage);
        let delta = MessageDelta {
            stop_reason: stop_reason(
                finish.reason,
                finish.stop_sequence.is_some(),
                usage.output_tokens,
                self.max_tokens,
            ),
            stop_sequence: finish.stop_sequence,
        };
        vec![
            StreamEvent::ContentBlockStop { index: TEXT_BLOCK }.frame(),
            StreamEvent::MessageDelta { delta, usage }.frame(),
            StreamEvent::MessageStop.frame(),
        ]
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
