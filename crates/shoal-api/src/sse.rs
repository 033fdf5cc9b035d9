//! Server-sent events: turns a request's engine events into an SSE body.
//!
//! [`event_stream`] owns the request's [`LiveRequest`] (and through it the `RequestStream`): when the client goes away, axum drops the response body,
//! which drops this stream and with it the `RequestStream`, and the engine cancels the sequence at its
//! next step. Nothing here spawns a task, so nothing keeps a request alive behind the client's back.
//!
//! The wire format is OpenAI's: one `data: {json}` event per chunk, a final `data: [DONE]`, and on an
//! engine error midway (a `timeout` running out included) a `data: {"error": {...}}` event after which the
//! stream simply ends. A request cancelled through `POST /v1/cancel/{id}` ends with an error event of type
//! `cancelled` followed by `data: [DONE]` (OpenAI has no `cancelled` finish reason, so clients would not
//! understand one).

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Serialize;
use shoal_engine::{Event, FinishReason, Usage};

use crate::cancel::LiveRequest;
use crate::error::ApiError;

/// How one API shapes its stream chunks. Each method returns a serialized chunk, or `None` to send
/// nothing for this event.
pub trait ChunkFormat: Send + 'static {
    /// Sent before the first token (chat: the `role` delta).
    fn opening(&mut self) -> Option<String>;
    /// One sampled token; `text` may be empty while a character or a possible stop sequence is incomplete.
    fn token(&mut self, text: &str, logprob: f32) -> Option<String>;
    /// The chunk carrying `finish_reason` (never called with `Cancelled`).
    fn finish(&mut self, reason: FinishReason) -> String;
    /// The usage chunk (`choices: []`) sent when the client asked for `include_usage`.
    fn usage(&mut self, usage: Usage) -> String;
}

/// Serializes a chunk. Our response types always serialize; should one ever fail, the client gets an
/// error event rather than a broken stream.
pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| {
        tracing::error!("failed to serialize a response chunk: {e}");
        error_json(&ApiError::Internal(e.to_string()))
    })
}

fn error_json(err: &ApiError) -> String {
    serde_json::to_string(&err.body()).unwrap_or_else(|_| {
        r#"{"error":{"message":"internal error","type":"server_error"}}"#.to_string()
    })
}

/// The SSE response for a running request.
pub fn sse_response<F: ChunkFormat>(
    stream: LiveRequest,
    format: F,
    include_usage: bool,
) -> Response {
    Sse::new(event_stream(stream, format, include_usage))
        .keep_alive(KeepAlive::default())
        .into_response()
}

struct State<F> {
    stream: LiveRequest,
    format: F,
    include_usage: bool,
    opened: bool,
    finished: bool,
    queue: VecDeque<SseEvent>,
}

/// The SSE events of one request, ending with `[DONE]` (or an error event).
pub fn event_stream<F: ChunkFormat>(
    stream: LiveRequest,
    format: F,
    include_usage: bool,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static {
    let state = State {
        stream,
        format,
        include_usage,
        opened: false,
        finished: false,
        queue: VecDeque::new(),
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(event) = st.queue.pop_front() {
                return Some((Ok(event), st));
            }
            if st.finished {
                return None;
            }
            if !st.opened {
                st.opened = true;
                if let Some(chunk) = st.format.opening() {
                    st.queue.push_back(data(chunk));
                }
                continue;
            }
            st.step().await;
        }
    })
}

impl<F: ChunkFormat> State<F> {
    /// Waits for the next engine event and queues what it turns into.
    async fn step(&mut self) {
        match self.stream.stream().next().await {
            Some(Event::Token { text, logprob, .. }) => {
                if let Some(chunk) = self.format.token(&text, logprob) {
                    self.queue.push_back(data(chunk));
                }
            }
            Some(Event::Done {
                finish_reason: FinishReason::Cancelled,
                ..
            }) => {
                // We still hold the stream, so the request was cancelled by id.
                self.cancelled();
            }
            Some(Event::Done {
                finish_reason,
                usage,
                ..
            }) => {
                self.queue
                    .push_back(data(self.format.finish(finish_reason)));
                if self.include_usage {
                    self.queue.push_back(data(self.format.usage(usage)));
                }
                self.queue.push_back(data("[DONE]".to_string()));
                self.finished = true;
            }
            Some(Event::Error(err)) => {
                tracing::warn!(request = self.stream.id(), error = %err, "generation failed midway");
                self.queue.push_back(data(error_json(&ApiError::from(err))));
                self.finished = true;
            }
            // A request cancelled while still queued is dropped from the queue without a final event.
            None if self.stream.cancelled_by_id() => self.cancelled(),
            None => {
                let err = ApiError::Internal(
                    "the engine closed the request's stream without finishing".into(),
                );
                tracing::error!(request = self.stream.id(), "{err}");
                self.queue.push_back(data(error_json(&err)));
                self.finished = true;
            }
        }
    }
}

impl<F> State<F> {
    /// The end of a stream cancelled by id: an error event saying so, then `[DONE]`.
    fn cancelled(&mut self) {
        tracing::debug!(request = self.stream.id(), "stream cancelled by id");
        self.queue.push_back(data(error_json(&ApiError::Cancelled)));
        self.queue.push_back(data("[DONE]".to_string()));
        self.finished = true;
    }
}

fn data(payload: String) -> SseEvent {
    SseEvent::default().data(payload)
}
