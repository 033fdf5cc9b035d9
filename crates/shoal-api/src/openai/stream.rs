//! OpenAI's streams for chat and completions: the events of a request's `n` choices (one
//! [`LiveRequest`] each) merged as they come into one SSE body of chunks, each choice's chunks carrying
//! its `index`, shaped by a [`ChunkFormat`] from each event's [`Outcome`] ([`crate::generate`]).
//!
//! Order: each choice's opening chunk (chat: the `role` delta), then token chunks as the engine sends
//! them, a `finish_reason` chunk per choice as each ends, then — once every choice ended — the usage
//! chunk if the client asked (`stream_options.include_usage`: the prompt counted once, the completions
//! summed) and `data: [DONE]`. An engine error midway ends the stream with an error event; a request
//! cancelled through `POST /v1/cancel/{id}` with a `cancelled` error event and `[DONE]` (OpenAI has no
//! `cancelled` finish reason). Dropping the body (the client left) drops every choice's stream, and the
//! engine frees the sequences at its next step; nothing here spawns a task.
//!
//! With `stream_options.include_progress` (shoal's own), each step of the prompt's prefill until the
//! first token is an SSE comment `: prefill {"done":N,"total":M}` (read from the request's
//! [`shoal_engine::RequestStream::prefill`]); SSE clients skip comments, and without the option the
//! stream is exactly as before.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::task::Poll;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use shoal_engine::{Event, FinishReason, Prefill, Usage};
use tokio::sync::watch;

use crate::cancel::LiveRequest;
use crate::error::ApiError;
use crate::generate::{self, Outcome, SampledToken, total_usage};
use crate::sse::error_json;

/// How chat or completions shape their chunks; `index` is the choice's. Each method returns a
/// serialized chunk, or `None` to send nothing for this event.
pub trait ChunkFormat: Send + 'static {
    /// Sent before choice `index`'s first token (chat: the `role` delta).
    fn opening(&mut self, index: u32) -> Option<String>;
    /// One token of choice `index`; its text may be empty while a character or a possible stop
    /// sequence is incomplete.
    fn token(&mut self, index: u32, token: SampledToken) -> Option<String>;
    /// The chunk carrying choice `index`'s `finish_reason` (never `Cancelled`).
    fn finish(&mut self, index: u32, reason: FinishReason) -> String;
    /// The usage chunk (`choices: []`) sent when the client asked for `include_usage`.
    fn usage(&mut self, usage: Usage) -> String;
}

/// The SSE response of a running request's choices (in `index` order).
pub fn sse_response<F: ChunkFormat>(
    choices: Vec<LiveRequest>,
    format: F,
    (include_usage, include_progress): (bool, bool),
) -> Response {
    Sse::new(event_stream(
        choices,
        format,
        include_usage,
        include_progress,
    ))
    .keep_alive(KeepAlive::default())
    .into_response()
}

struct State<F> {
    choices: Vec<LiveRequest>,
    /// The usage of each choice that ended.
    ended: Vec<Option<Usage>>,
    format: F,
    include_usage: bool,
    /// The prompt's progress, watched until the first token when the client asked for it.
    progress: Option<watch::Receiver<Prefill>>,
    /// A progress comment to send before anything else.
    comment: Option<String>,
    /// The choice polled first next time (so a fast choice cannot starve the others).
    next: usize,
    finished: bool,
    queue: VecDeque<String>,
}

fn event_stream<F: ChunkFormat>(
    mut choices: Vec<LiveRequest>,
    mut format: F,
    include_usage: bool,
    include_progress: bool,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static {
    let queue = (0..choices.len() as u32)
        .filter_map(|i| format.opening(i))
        .collect();
    let progress = choices
        .first_mut()
        .filter(|_| include_progress)
        .map(|c| c.stream().prefill());
    let state = State {
        ended: vec![None; choices.len()],
        progress,
        comment: None,
        choices,
        format,
        include_usage,
        next: 0,
        finished: false,
        queue,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(text) = st.comment.take() {
                return Some((Ok(SseEvent::default().comment(text)), st));
            }
            if let Some(data) = st.queue.pop_front() {
                return Some((Ok(SseEvent::default().data(data)), st));
            }
            if st.finished {
                return None;
            }
            let Some(mut progress) = st.progress.take() else {
                let (index, event) = st.next_event().await;
                st.handle(index, event);
                continue;
            };
            tokio::select! {
                biased;
                (index, event) = st.next_event() => {
                    if !matches!(event, Some(Event::Token { .. })) {
                        st.progress = Some(progress);
                    } else if progress.has_changed().unwrap_or(false) {
                        // The first token ends the prefill: its last chunk's progress goes first,
                        // none after it.
                        st.comment = Some(progress_comment(*progress.borrow_and_update()));
                    }
                    st.handle(index, event);
                }
                changed = progress.changed() => {
                    if changed.is_ok() {
                        st.comment = Some(progress_comment(*progress.borrow_and_update()));
                        st.progress = Some(progress);
                    }
                }
            }
        }
    })
}

/// The SSE comment text of a prefill progress.
fn progress_comment(p: Prefill) -> String {
    format!("prefill {{\"done\":{},\"total\":{}}}", p.done, p.total)
}

impl<F: ChunkFormat> State<F> {
    /// The next event of any choice still running, and whose.
    async fn next_event(&mut self) -> (usize, Option<Event>) {
        let n = self.choices.len();
        let start = self.next;
        let (choices, ended) = (&mut self.choices, &self.ended);
        let (i, event) = futures::future::poll_fn(|cx| {
            for k in 0..n {
                let i = (start + k) % n;
                if ended[i].is_some() {
                    continue;
                }
                if let Poll::Ready(event) = choices[i].stream().poll_next(cx) {
                    return Poll::Ready((i, event));
                }
            }
            Poll::Pending
        })
        .await;
        self.next = (i + 1) % n.max(1);
        (i, event)
    }

    /// Queues what one event of choice `i` turns into.
    fn handle(&mut self, i: usize, event: Option<Event>) {
        let index = i as u32;
        match generate::outcome(event, &self.choices[i]) {
            Outcome::Token(token) => self.queue.extend(self.format.token(index, token)),
            Outcome::Finished(finish) => {
                self.queue
                    .push_back(self.format.finish(index, finish.reason));
                self.ended[i] = Some(finish.usage);
                if self.ended.iter().all(Option::is_some) {
                    if self.include_usage {
                        let usage = total_usage(self.ended.iter().flatten().copied());
                        self.queue.push_back(self.format.usage(usage));
                    }
                    self.queue.push_back("[DONE]".to_string());
                    self.finished = true;
                }
            }
            Outcome::Cancelled => self.cancelled(),
            Outcome::Failed(err) => self.fail(&err),
        }
    }

    /// The end of a stream that failed: an error event, nothing after.
    fn fail(&mut self, err: &ApiError) {
        self.queue.push_back(error_json(err));
        self.finished = true;
    }

    /// The end of a stream cancelled by id: an error event saying so, then `[DONE]`.
    fn cancelled(&mut self) {
        self.queue.push_back(error_json(&ApiError::Cancelled));
        self.queue.push_back("[DONE]".to_string());
        self.finished = true;
    }
}
