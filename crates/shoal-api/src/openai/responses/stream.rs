//! The Responses API's event stream for one request: every event is named by its `type` and carries a
//! rising `sequence_number`. `response.created` and `response.in_progress` open it; text opens the
//! message item (`response.output_item.added`, `response.content_part.added`) and goes out as
//! `response.output_text.delta`s; each tool call the parser finds is its own `function_call` item
//! (`output_item.added`, `function_call_arguments.delta` / `.done`, `output_item.done`); at the end the
//! message item is closed (`output_text.done`, `content_part.done`, `output_item.done`) and
//! `response.completed` (or `response.incomplete` when the token budget ran out) carries the whole
//! response. A failure midway is an `error` event followed by `response.failed`.

use serde_json::{Value, json};
use shoal_engine::FinishReason;
use shoal_guide::{CutToolCall, ToolCallOut, ToolCallStream, ToolEvent};

use super::{Shell, finish_status, output_text, tools};
use crate::error::ApiError;
use crate::generate::Finish;
use crate::generate::reasoning::{self, Parts, Splitter};
use crate::sse::{Frame, StreamFormat, to_json};

/// Writes one response's events.
pub struct ResponseEvents {
    shell: Shell,
    /// Splits the text into content and calls when tools were offered.
    parser: Option<ToolCallStream>,
    /// The message's text so far.
    text: String,
    /// Output index of the message item once it is open.
    message_index: Option<usize>,
    /// The finished items of the calls, in order.
    calls: Vec<Value>,
    /// Splits the model's thoughts from its answer where it may think.
    splitter: Option<Splitter>,
    /// The thoughts so far.
    reasoning: String,
    /// Output index of the reasoning item once it is open, and whether it is still open.
    reasoning_index: Option<(usize, bool)>,
    /// Output items opened so far.
    items: usize,
    seq: u64,
}

impl ResponseEvents {
    pub fn new(shell: Shell, parser: Option<ToolCallStream>, splitter: Option<Splitter>) -> Self {
        ResponseEvents {
            shell,
            parser,
            text: String::new(),
            message_index: None,
            calls: Vec::new(),
            splitter,
            reasoning: String::new(),
            reasoning_index: None,
            items: 0,
            seq: 0,
        }
    }

    /// One event: `body` gets its `type` and `sequence_number`.
    fn event(&mut self, kind: &'static str, mut body: Value) -> Frame {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        Frame::named(kind, to_json(&body))
    }

    fn text_ref(&self, index: usize) -> Value {
        json!({ "item_id": self.shell.message_id(), "output_index": index, "content_index": 0 })
    }

    /// A piece of the model's thoughts: opens the reasoning item first if needed.
    fn thinking(&mut self, text: &str, frames: &mut Vec<Frame>) {
        if text.is_empty() {
            return;
        }
        let index = match self.reasoning_index {
            Some((i, _)) => i,
            None => {
                let i = self.items;
                self.items += 1;
                self.reasoning_index = Some((i, true));
                let item = self.shell.reasoning("", "in_progress");
                frames.push(self.event(
                    "response.output_item.added",
                    json!({ "output_index": i, "item": item }),
                ));
                i
            }
        };
        self.reasoning.push_str(text);
        let body = json!({ "item_id": self.shell.reasoning_id(), "output_index": index,
            "content_index": 0, "delta": text });
        frames.push(self.event("response.reasoning_text.delta", body));
    }

    /// Closes the reasoning item, if one is open.
    fn close_thinking(&mut self, frames: &mut Vec<Frame>) {
        let Some((index, true)) = self.reasoning_index else {
            return;
        };
        self.reasoning_index = Some((index, false));
        let body = json!({ "item_id": self.shell.reasoning_id(), "output_index": index,
            "content_index": 0, "text": self.reasoning });
        frames.push(self.event("response.reasoning_text.done", body));
        let item = self.shell.reasoning(&self.reasoning, "completed");
        frames.push(self.event(
            "response.output_item.done",
            json!({ "output_index": index, "item": item }),
        ));
    }

    /// One piece of the answer: its thoughts, then its content (through the tool parser where tools
    /// were offered).
    fn parts(&mut self, parts: Parts, frames: &mut Vec<Frame>) {
        self.thinking(&parts.reasoning, frames);
        if parts.content.is_empty() {
            return;
        }
        match self.parser.as_mut().map(|p| p.push(&parts.content)) {
            Some(events) => self.parsed(events, frames),
            None => self.content(&parts.content, frames),
        }
    }

    /// Text for the user: opens the message item first if needed.
    fn content(&mut self, text: &str, frames: &mut Vec<Frame>) {
        if text.is_empty() {
            return;
        }
        self.close_thinking(frames);
        let index = match self.message_index {
            Some(i) => i,
            None => {
                let i = self.open_message(frames);
                self.message_index = Some(i);
                i
            }
        };
        self.text.push_str(text);
        let mut body = self.text_ref(index);
        body["delta"] = json!(text);
        body["logprobs"] = json!([]);
        frames.push(self.event("response.output_text.delta", body));
    }

    fn open_message(&mut self, frames: &mut Vec<Frame>) -> usize {
        let index = self.items;
        self.items += 1;
        let item = self.shell.message("", "in_progress");
        frames.push(self.event(
            "response.output_item.added",
            json!({ "output_index": index, "item": item }),
        ));
        let mut part = self.text_ref(index);
        part["part"] = output_text("");
        frames.push(self.event("response.content_part.added", part));
        index
    }

    /// One complete call: its own item, opened, filled and closed.
    fn call(&mut self, call: ToolCallOut, frames: &mut Vec<Frame>) {
        self.call_item(
            tools::function_call_item(&call),
            &call.arguments,
            true,
            frames,
        );
    }

    /// The call the token budget cut: its item opened, its arguments as written so far, and closed
    /// as `incomplete` (no `function_call_arguments.done`: they never were).
    fn cut_call(&mut self, call: CutToolCall, frames: &mut Vec<Frame>) {
        self.call_item(tools::cut_call_item(&call), &call.arguments, false, frames);
    }

    /// A call's item: added (in progress, no arguments), its `arguments` as one delta (`.done` too
    /// when `finished`), and `done` as the closed item.
    fn call_item(&mut self, done: Value, arguments: &str, finished: bool, frames: &mut Vec<Frame>) {
        self.close_thinking(frames);
        let index = self.items;
        self.items += 1;
        let mut added = done.clone();
        added["status"] = json!("in_progress");
        added["arguments"] = json!("");
        let item_id = done["id"].clone();
        frames.push(self.event(
            "response.output_item.added",
            json!({ "output_index": index, "item": added }),
        ));
        if finished || !arguments.is_empty() {
            frames.push(self.event(
                "response.function_call_arguments.delta",
                json!({ "item_id": item_id, "output_index": index, "delta": arguments }),
            ));
        }
        if finished {
            frames.push(self.event(
                "response.function_call_arguments.done",
                json!({ "item_id": item_id, "output_index": index, "arguments": arguments }),
            ));
        }
        frames.push(self.event(
            "response.output_item.done",
            json!({ "output_index": index, "item": done }),
        ));
        self.calls.push(done);
    }

    fn parsed(&mut self, events: Vec<ToolEvent>, frames: &mut Vec<Frame>) {
        for ev in events {
            match ev {
                ToolEvent::Content(text) => self.content(&text, frames),
                ToolEvent::Call {
                    id,
                    name,
                    arguments,
                    ..
                } => self.call(
                    ToolCallOut {
                        id,
                        name,
                        arguments,
                    },
                    frames,
                ),
                ToolEvent::Cut {
                    index,
                    id,
                    name,
                    arguments,
                } => self.cut_call(
                    CutToolCall {
                        index,
                        id,
                        name,
                        arguments,
                    },
                    frames,
                ),
            }
        }
    }

    fn failed(&mut self, err: &ApiError) -> Vec<Frame> {
        let body = err.body();
        let code = body.error.code.unwrap_or(body.error.kind);
        let error = self.event(
            "error",
            json!({ "code": code, "message": body.error.message, "param": body.error.param }),
        );
        let mut response = serde_json::to_value(self.shell.in_progress()).unwrap_or_default();
        response["status"] = json!("failed");
        response["error"] = json!({ "code": code, "message": body.error.message });
        let failed = self.event("response.failed", json!({ "response": response }));
        vec![error, failed]
    }
}

impl StreamFormat for ResponseEvents {
    fn opening(&mut self) -> Vec<Frame> {
        let response = serde_json::to_value(self.shell.in_progress()).unwrap_or_default();
        vec![
            self.event("response.created", json!({ "response": response })),
            self.event("response.in_progress", json!({ "response": response })),
        ]
    }

    fn token(&mut self, text: &str, _logprob: f32) -> Vec<Frame> {
        let mut frames = Vec::new();
        let parts = reasoning::piece(self.splitter.as_mut(), text);
        self.parts(parts, &mut frames);
        frames
    }

    fn finish(&mut self, finish: Finish) -> Vec<Frame> {
        let mut frames = Vec::new();
        if let Some(held) = self.splitter.as_mut().map(Splitter::finish) {
            self.parts(held, &mut frames);
        }
        self.close_thinking(&mut frames);
        let cut_off = finish.reason == FinishReason::Length;
        let ending = |p: &mut ToolCallStream| match cut_off {
            true => p.finish_cut(),
            false => p.finish(),
        };
        if let Some(events) = self.parser.as_mut().map(ending) {
            self.parsed(events, &mut frames);
        }
        // An answer with neither text nor calls still has its (empty) message, as the non-streamed one.
        if self.message_index.is_none() && self.calls.is_empty() && self.reasoning.is_empty() {
            self.message_index = Some(self.open_message(&mut frames));
        }
        // The output in the order the items were opened.
        let mut calls = self.calls.iter().cloned();
        let output: Vec<Value> = (0..self.items)
            .filter_map(|i| {
                if Some(i) == self.message_index {
                    Some(self.shell.message(&self.text, finish_status(finish.reason)))
                } else if Some(i) == self.reasoning_index.map(|(r, _)| r) {
                    Some(self.shell.reasoning(&self.reasoning, "completed"))
                } else {
                    calls.next()
                }
            })
            .collect();
        let response = self.shell.ended(output, finish.reason, finish.usage);
        if let Some(index) = self.message_index {
            let status = finish_status(finish.reason);
            let mut text_done = self.text_ref(index);
            text_done["text"] = json!(self.text);
            text_done["logprobs"] = json!([]);
            let mut part_done = self.text_ref(index);
            part_done["part"] = output_text(&self.text);
            let item = self.shell.message(&self.text, status);
            frames.push(self.event("response.output_text.done", text_done));
            frames.push(self.event("response.content_part.done", part_done));
            frames.push(self.event(
                "response.output_item.done",
                json!({ "output_index": index, "item": item }),
            ));
        }
        let last = if response.status == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        let response = serde_json::to_value(response).unwrap_or_default();
        frames.push(self.event(last, json!({ "response": response })));
        frames
    }

    fn error(&mut self, err: &ApiError) -> Vec<Frame> {
        self.failed(err)
    }

    fn cancelled(&mut self) -> Vec<Frame> {
        self.failed(&ApiError::Cancelled)
    }
}
