//! The Responses API's event stream for one request: every event is named by its `type` and carries a
//! rising `sequence_number`:
//! `response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, then `response.output_text.delta` per piece of text, then
//! `response.output_text.done`, `response.content_part.done`, `response.output_item.done` and
//! `response.completed` (or `response.incomplete` when the token budget ran out). A failure midway is an
//! `error` event followed by `response.failed`.

use serde_json::{Value, json};

use super::{Shell, output_text};
use crate::error::ApiError;
use crate::sse::{Finish, Frame, StreamFormat, to_json};

/// Writes one response's events.
pub struct ResponseEvents {
    shell: Shell,
    text: String,
    seq: u64,
}

impl ResponseEvents {
    pub fn new(shell: Shell) -> Self {
        ResponseEvents {
            shell,
            text: String::new(),
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

    fn item_ref(&self) -> Value {
        json!({ "item_id": self.shell.message_id(), "output_index": 0, "content_index": 0 })
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
        let item = self.shell.message("", "in_progress");
        let mut part = self.item_ref();
        part["part"] = output_text("");
        vec![
            self.event("response.created", json!({ "response": response })),
            self.event("response.in_progress", json!({ "response": response })),
            self.event(
                "response.output_item.added",
                json!({ "output_index": 0, "item": item }),
            ),
            self.event("response.content_part.added", part),
        ]
    }

    fn token(&mut self, text: &str, _logprob: f32) -> Vec<Frame> {
        if text.is_empty() {
            return Vec::new();
        }
        self.text.push_str(text);
        let mut body = self.item_ref();
        body["delta"] = json!(text);
        body["logprobs"] = json!([]);
        vec![self.event("response.output_text.delta", body)]
    }

    fn finish(&mut self, finish: Finish) -> Vec<Frame> {
        let response = self.shell.finished(&self.text, finish.reason, finish.usage);
        let status = response.status;
        let item = response.output.first().cloned().unwrap_or_default();
        let mut text_done = self.item_ref();
        text_done["text"] = json!(self.text);
        text_done["logprobs"] = json!([]);
        let mut part_done = self.item_ref();
        part_done["part"] = output_text(&self.text);
        let last = if status == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        let response = serde_json::to_value(response).unwrap_or_default();
        vec![
            self.event("response.output_text.done", text_done),
            self.event("response.content_part.done", part_done),
            self.event(
                "response.output_item.done",
                json!({ "output_index": 0, "item": item }),
            ),
            self.event(last, json!({ "response": response })),
        ]
    }

    fn error(&mut self, err: &ApiError) -> Vec<Frame> {
        self.failed(err)
    }

    fn cancelled(&mut self) -> Vec<Frame> {
        self.failed(&ApiError::Cancelled)
    }
}
