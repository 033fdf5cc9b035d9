//! Answering a submitted request the Ollama way: [`Run`] reads the request's outcomes
//! ([`crate::generate::Outcome`]) and times them,
//! [`Answer`] shapes chat or generate objects, and [`respond`] sends either NDJSON lines
//! (`application/x-ndjson`: one object per token, then the last one with `done: true`, `done_reason` and
//! the measurements) or, with `stream: false`, one object holding the whole text.
//!
//! The NDJSON body owns the [`LiveRequest`]: when the client goes away axum drops the body, the
//! `RequestStream` is dropped and the engine cancels the sequence at its next step; nothing is spawned.
//! An engine error midway ends the stream with an `{"error": "…"}` line (what Ollama clients raise).
//!
//! Measurements (nanoseconds, measured here): `total_duration` from the handler's start to the end;
//! `load_duration` from the start until the request was queued (model lookup, template, tokenization;
//! shoal keeps models loaded, so no weights are read); `prompt_eval_duration` from queueing to the first
//! token (waiting for a slot, prefill and the first sample); `eval_duration` from the first token to the
//! end; `prompt_eval_count` / `eval_count` from the engine's usage.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use shoal_engine::request::TopLogprob;
use shoal_guide::{CutToolCall, ToolCallOut, ToolCallParser, ToolCallStream, ToolEvent};

use super::tools::ollama_call;
use super::types::{
    ChatResponse, Ending, GenerateResponse, Logprob, MessageOut, Metrics, OllamaToolCall,
    TokenLogprob,
};
use super::{Error, now_rfc3339};
use crate::cancel::LiveRequest;
use crate::error::ApiError;
use crate::generate::reasoning::{self, Parts, Splitter};
use crate::generate::{self, Outcome};

/// A running request and its clock.
pub struct Run {
    request: LiveRequest,
    started: Instant,
    queued: Instant,
    first_token: Option<Instant>,
}

/// What the next outcome means to an Ollama answer: its text, or its end with the measurements.
pub enum Step {
    Token {
        text: String,
        logprob: f32,
        top: Vec<TopLogprob>,
    },
    Done {
        reason: &'static str,
        metrics: Metrics,
    },
    Failed(Error),
}

impl Run {
    /// `started`: when the handler began; the request was queued just now.
    pub fn new(request: LiveRequest, started: Instant) -> Self {
        Run {
            request,
            started,
            queued: Instant::now(),
            first_token: None,
        }
    }

    pub async fn next(&mut self) -> Step {
        match generate::next(&mut self.request).await {
            Outcome::Token(token) => {
                self.first_token.get_or_insert_with(Instant::now);
                Step::Token {
                    text: token.text,
                    logprob: token.logprob,
                    top: token.top,
                }
            }
            Outcome::Finished(finish) => {
                let now = Instant::now();
                let first = self.first_token.unwrap_or(now);
                let usage = finish.usage;
                Step::Done {
                    reason: finish.reason.as_str(),
                    metrics: Metrics {
                        total_duration: nanos(now - self.started),
                        load_duration: nanos(self.queued - self.started),
                        prompt_eval_count: usage.prompt_tokens,
                        prompt_eval_duration: nanos(first.saturating_duration_since(self.queued)),
                        eval_count: usage.completion_tokens,
                        eval_duration: nanos(now.saturating_duration_since(first)),
                    },
                }
            }
            Outcome::Cancelled => Step::Failed(Error(ApiError::Cancelled)),
            Outcome::Failed(err) => Step::Failed(Error(err)),
        }
    }
}

/// A duration in whole nanoseconds, as Ollama reports them.
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Which object an answer is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/api/chat`: `message: {role, content}`.
    Chat,
    /// `/api/generate`: `response`.
    Generate,
}

/// Shapes the objects of one answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub kind: Kind,
    pub model: String,
    /// Whether each object carries its tokens' log-probabilities.
    pub logprobs: bool,
    /// Splits tool calls out of the text where tools were offered (chat only).
    pub tools: Option<ToolCallParser>,
    /// Present when the answer may hold the model's thoughts: their syntax ([`crate::generate::Started::reasoning`]).
    pub reasoning: Option<reasoning::Syntax>,
}

impl Answer {
    /// One object: a piece of text and the calls completed with it (`end: None`), or the last object.
    pub fn object(
        &self,
        text: String,
        thinking: String,
        calls: Vec<OllamaToolCall>,
        end: Option<Ending>,
        logprobs: Vec<Logprob>,
    ) -> String {
        let logprobs = self.logprobs.then_some(logprobs);
        let (model, created_at, done) = (self.model.clone(), now_rfc3339(), end.is_some());
        match self.kind {
            Kind::Chat => to_json(&ChatResponse {
                model,
                created_at,
                message: MessageOut {
                    role: "assistant",
                    content: text,
                    thinking: (!thinking.is_empty()).then_some(thinking),
                    tool_calls: (!calls.is_empty()).then_some(calls),
                },
                done,
                end,
                logprobs,
            }),
            Kind::Generate => to_json(&GenerateResponse {
                model,
                created_at,
                response: text,
                thinking: (!thinking.is_empty()).then_some(thinking),
                done,
                end,
                logprobs,
            }),
        }
    }
}

/// Serializes an answer object; should one ever fail, the client gets an error object instead.
pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| {
        tracing::error!("failed to serialize an Ollama answer: {e}");
        Error(ApiError::Internal(e.to_string())).line().to_string()
    })
}

fn logprob(text: &str, logprob: f32, top: Vec<TopLogprob>) -> Logprob {
    Logprob {
        token: text.to_string(),
        logprob,
        bytes: text.as_bytes().to_vec(),
        top_logprobs: top
            .into_iter()
            .map(|t| TokenLogprob {
                token: String::from_utf8_lossy(&t.bytes).into_owned(),
                logprob: t.logprob,
                bytes: t.bytes,
            })
            .collect(),
    }
}

/// The answer to a running request: NDJSON lines or, with `stream` false, one object.
pub async fn respond(run: Run, answer: Answer, stream: bool) -> Response {
    if stream {
        return ndjson_response(lines(run, answer));
    }
    match collect(run, &answer).await {
        Ok(body) => json_response(body),
        Err(e) => e.into_response(),
    }
}

/// Reads the whole answer into one object.
async fn collect(mut run: Run, answer: &Answer) -> Result<String, Error> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    loop {
        match run.next().await {
            Step::Token {
                text: piece,
                logprob: lp,
                top,
            } => {
                if answer.logprobs {
                    logprobs.push(logprob(&piece, lp, top));
                }
                text.push_str(&piece);
            }
            Step::Done { reason, metrics } => {
                let end = Ending {
                    done_reason: reason,
                    metrics: Some(metrics),
                };
                let parts = reasoning::answer(text, answer.reasoning);
                let (text, calls) = match &answer.tools {
                    Some(parser) => split_calls(parser, parts.content, reason == "length"),
                    None => (parts.content, Vec::new()),
                };
                return Ok(answer.object(text, parts.reasoning, calls, Some(end), logprobs));
            }
            Step::Failed(e) => return Err(e),
        }
    }
}

/// A finished answer's text without the calls it makes, and the calls (none: the text as it is).
/// `cut_off`: the budget ran out, so a call it was writing is the last call, its arguments as far as
/// they parse.
fn split_calls(
    parser: &ToolCallParser,
    text: String,
    cut_off: bool,
) -> (String, Vec<OllamaToolCall>) {
    let parsed = parser.parse_ended(&text, cut_off);
    if parsed.calls.is_empty() && parsed.cut.is_none() {
        return (text, Vec::new());
    }
    let mut calls: Vec<OllamaToolCall> = parsed
        .calls
        .into_iter()
        .enumerate()
        .map(|(i, c)| ollama_call(i, c))
        .collect();
    calls.extend(parsed.cut.map(cut_call));
    (parsed.content, calls)
}

/// The call the budget cut, as Ollama writes calls: its arguments as far as they parse.
fn cut_call(call: CutToolCall) -> OllamaToolCall {
    let arguments = call.input().to_string();
    ollama_call(
        call.index,
        ToolCallOut {
            id: call.id,
            name: call.name.unwrap_or_default(),
            arguments,
        },
    )
}

/// Text and complete calls out of streamed tool-parser events.
fn from_events(events: Vec<ToolEvent>) -> (String, Vec<OllamaToolCall>) {
    let mut text = String::new();
    let mut calls = Vec::new();
    for event in events {
        match event {
            ToolEvent::Content(piece) => text.push_str(&piece),
            ToolEvent::Call {
                index,
                id,
                name,
                arguments,
            } => calls.push(ollama_call(
                index,
                ToolCallOut {
                    id,
                    name,
                    arguments,
                },
            )),
            ToolEvent::Cut {
                index,
                id,
                name,
                arguments,
            } => calls.push(cut_call(CutToolCall {
                index,
                id,
                name,
                arguments,
            })),
        }
    }
    (text, calls)
}

struct Lines {
    run: Run,
    answer: Answer,
    /// Splits calls out of the streamed text where tools were offered.
    tools: Option<ToolCallStream>,
    /// Splits the model's thoughts from its answer where it may think.
    reasoning: Option<Splitter>,
    /// Log-probabilities of tokens whose text has not been sent yet (empty pieces).
    pending: Vec<Logprob>,
    /// Lines ready to send.
    queue: VecDeque<String>,
    finished: bool,
}

impl Lines {
    /// Queues a line for `text`, `thinking` and `calls` unless all are empty.
    fn piece(&mut self, text: String, thinking: String, calls: Vec<OllamaToolCall>) {
        if text.is_empty() && thinking.is_empty() && calls.is_empty() {
            return;
        }
        let logprobs = std::mem::take(&mut self.pending);
        let line = self.answer.object(text, thinking, calls, None, logprobs);
        self.queue.push_back(line + "\n");
    }

    /// Queues the line of one piece of the answer: its thoughts, and its content through the tool
    /// parser where tools were offered.
    fn parts(&mut self, parts: Parts) {
        let (text, calls) = match &mut self.tools {
            Some(stream) => from_events(stream.push(&parts.content)),
            None => (parts.content, Vec::new()),
        };
        self.piece(text, parts.reasoning, calls);
    }

    /// Waits for the next engine event and queues what it turns into.
    async fn advance(&mut self) {
        match self.run.next().await {
            Step::Token {
                text,
                logprob: lp,
                top,
            } => {
                if self.answer.logprobs {
                    self.pending.push(logprob(&text, lp, top));
                }
                let parts = reasoning::piece(self.reasoning.as_mut(), &text);
                self.parts(parts);
            }
            Step::Done { reason, metrics } => {
                if let Some(held) = self.reasoning.as_mut().map(Splitter::finish) {
                    self.parts(held);
                }
                if let Some(stream) = &mut self.tools {
                    let events = match reason {
                        "length" => stream.finish_cut(),
                        _ => stream.finish(),
                    };
                    let (text, calls) = from_events(events);
                    self.piece(text, String::new(), calls);
                }
                let end = Ending {
                    done_reason: reason,
                    metrics: Some(metrics),
                };
                let logprobs = std::mem::take(&mut self.pending);
                let line = self.answer.object(
                    String::new(),
                    String::new(),
                    Vec::new(),
                    Some(end),
                    logprobs,
                );
                self.queue.push_back(line + "\n");
                self.finished = true;
            }
            Step::Failed(e) => {
                self.queue.push_back(e.line().to_string() + "\n");
                self.finished = true;
            }
        }
    }
}

impl LineSource for Lines {
    fn queue(&mut self) -> &mut VecDeque<String> {
        &mut self.queue
    }

    fn finished(&self) -> bool {
        self.finished
    }

    fn step(&mut self) -> impl std::future::Future<Output = ()> + Send {
        self.advance()
    }
}

/// The NDJSON lines of a running request, each ending in `\n`.
fn lines(run: Run, answer: Answer) -> impl futures::Stream<Item = String> + Send + 'static {
    let state = Lines {
        run,
        tools: answer.tools.as_ref().map(ToolCallParser::stream),
        reasoning: answer.reasoning.map(Splitter::new),
        answer,
        pending: Vec::new(),
        queue: VecDeque::new(),
        finished: false,
    };
    drain(state)
}

/// Something that queues NDJSON lines a step at a time until it is finished.
pub(super) trait LineSource: Send + 'static {
    /// Lines ready to send.
    fn queue(&mut self) -> &mut VecDeque<String>;
    /// Nothing more will be queued.
    fn finished(&self) -> bool;
    /// Waits for what comes next and queues its lines.
    fn step(&mut self) -> impl std::future::Future<Output = ()> + Send;
}

/// The lines of `source`, in order, until it is finished and its queue empty.
pub(super) fn drain<S: LineSource>(
    source: S,
) -> impl futures::Stream<Item = String> + Send + 'static {
    futures::stream::unfold(source, |mut st| async move {
        loop {
            if let Some(line) = st.queue().pop_front() {
                return Some((line, st));
            }
            if st.finished() {
                return None;
            }
            st.step().await;
        }
    })
}

/// A 200 NDJSON response whose body is `lines`.
pub fn ndjson_response(lines: impl futures::Stream<Item = String> + Send + 'static) -> Response {
    use futures::StreamExt;
    let body = Body::from_stream(lines.map(|l| Ok::<_, Infallible>(Bytes::from(l))));
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    response
}

/// A 200 JSON response of an already serialized object.
pub fn json_response(body: String) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use shoal_guide::ToolFormat;

    use super::*;

    const CUT: &str =
        "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par";

    #[test]
    fn a_call_cut_by_the_budget_is_the_last_call_with_its_arguments_so_far() {
        let parser = ToolCallParser::new(ToolFormat::Generic, 5);
        let (text, calls) = split_calls(&parser, CUT.to_string(), true);
        assert_eq!(text, "");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].function.name, "get_weather");
        assert_eq!(calls[0].function.arguments, json!({"city": "Par"}));
        // Not cut by the budget: what the model wrote is text.
        let (text, calls) = split_calls(&parser, CUT.to_string(), false);
        assert_eq!((text.as_str(), calls.len()), (CUT, 0));
        // Streamed: the same call at the end.
        let mut stream = parser.stream();
        let mut events = stream.push(CUT);
        events.extend(stream.finish_cut());
        let (text, streamed) = from_events(events);
        assert_eq!(text, "");
        assert_eq!(
            serde_json::to_value(&streamed).ok(),
            serde_json::to_value(calls_cut(&parser)).ok()
        );
    }

    fn calls_cut(parser: &ToolCallParser) -> Vec<OllamaToolCall> {
        split_calls(parser, CUT.to_string(), true).1
    }
}
