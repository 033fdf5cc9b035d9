//! Server-sent events: turns a request's engine events into an SSE body.
//!
//! [`stream_response`] drives one request's [`LiveRequest`] (and through it the `RequestStream`) and
//! asks a [`StreamFormat`] what to send for each [`Outcome`] of its engine events
//! ([`crate::generate`]): the opening, each token, the end, a failure midway, a cancellation by id. Each answer is a list of [`Frame`]s, `data:` payloads with an
//! optional `event:` name. When the client goes away, axum drops the response body, which drops this
//! stream and with it the `RequestStream`, and the engine cancels the sequence at its next step.
//! Nothing here spawns a task, so nothing keeps a request alive behind the client's back.
//!
//! Anthropic's named events are [`crate::anthropic`]'s own [`StreamFormat`], the Responses API's
//! [`crate::openai::responses`]'. OpenAI's chat and completions chunks, whose `n` choices merge into
//! one stream, are [`crate::openai::stream`]'s; [`to_json`] and [`error_json`] serve all of them.

use std::collections::VecDeque;
use std::convert::Infallible;

use crate::cancel::LiveRequest;
use crate::error::ApiError;
use crate::generate::{self, Finish, Outcome};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Serialize;

/// One server-sent event: its `data:` payload and, for APIs that name their events, its `event:` name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub name: Option<&'static str>,
    pub data: String,
}

impl Frame {
    /// An unnamed event (`data: ...`).
    pub fn data(data: String) -> Self {
        Frame { name: None, data }
    }

    /// A named event (`event: NAME` then `data: ...`).
    pub fn named(name: &'static str, data: String) -> Self {
        Frame {
            name: Some(name),
            data,
        }
    }
}

/// How one API writes a request's stream. Each method returns the events to send, possibly none.
pub trait StreamFormat: Send + 'static {
    /// Sent before the first token.
    fn opening(&mut self) -> Vec<Frame>;
    /// One sampled token; `text` may be empty while a character or a possible stop sequence is incomplete.
    fn token(&mut self, text: &str, logprob: f32) -> Vec<Frame>;
    /// Generation ended (never `Cancelled`: see [`StreamFormat::cancelled`]); the stream ends after
    /// these events.
    fn finish(&mut self, finish: Finish) -> Vec<Frame>;
    /// The request failed midway; the stream ends after these events.
    fn error(&mut self, err: &ApiError) -> Vec<Frame>;
    /// The request was cancelled through `POST /v1/cancel/{id}`; the stream ends after these events.
    fn cancelled(&mut self) -> Vec<Frame>;
}

/// Serializes a chunk. Our response types always serialize; should one ever fail, the client gets an
/// error event rather than a broken stream.
pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| {
        tracing::error!("failed to serialize a response chunk: {e}");
        error_json(&ApiError::Internal(e.to_string()))
    })
}

/// The `{"error": {...}}` payload of an error event.
pub(crate) fn error_json(err: &ApiError) -> String {
    serde_json::to_string(&err.body()).unwrap_or_else(|_| {
        r#"{"error":{"message":"internal error","type":"server_error"}}"#.to_string()
    })
}

/// The SSE response for a running request, written by `format`.
pub fn stream_response<F: StreamFormat>(stream: LiveRequest, format: F) -> Response {
    Sse::new(event_stream(stream, format))
        .keep_alive(KeepAlive::default())
        .into_response()
}

struct State<F> {
    stream: LiveRequest,
    format: F,
    opened: bool,
    finished: bool,
    queue: VecDeque<Frame>,
}

/// The SSE events of one request, as `format` writes them.
pub fn event_stream<F: StreamFormat>(
    stream: LiveRequest,
    format: F,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static {
    let state = State {
        stream,
        format,
        opened: false,
        finished: false,
        queue: VecDeque::new(),
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(frame) = st.queue.pop_front() {
                return Some((Ok(sse_event(frame)), st));
            }
            if st.finished {
                return None;
            }
            if !st.opened {
                st.opened = true;
                let frames = st.format.opening();
                st.queue.extend(frames);
                continue;
            }
            st.step().await;
        }
    })
}

impl<F: StreamFormat> State<F> {
    /// Waits for the next outcome and queues what it turns into.
    async fn step(&mut self) {
        let frames = match generate::next(&mut self.stream).await {
            Outcome::Token(token) => self.format.token(&token.text, token.logprob),
            Outcome::Finished(finish) => {
                self.finished = true;
                self.format.finish(finish)
            }
            Outcome::Cancelled => {
                self.finished = true;
                self.format.cancelled()
            }
            Outcome::Failed(err) => {
                self.finished = true;
                self.format.error(&err)
            }
        };
        self.queue.extend(frames);
    }
}

fn sse_event(frame: Frame) -> SseEvent {
    let event = SseEvent::default().data(frame.data);
    match frame.name {
        Some(name) => event.event(name),
        None => event,
    }
}
