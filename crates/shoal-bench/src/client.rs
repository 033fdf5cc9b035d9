//! One timed streaming completion against the server under test: when it was sent, when each token
//! arrived, and what the server says it counted.
//!
//! A token is a streamed chunk with text and no finish reason; the server's `usage` is read from the
//! last chunk (`stream_options.include_usage`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::error::BenchError;
use crate::sse::{SseReader, parse_chunk, post_json};

/// How long one request may take before the run fails.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// One streamed request: when it was sent, when each token arrived, and the server's usage.
pub(crate) struct Timed {
    pub sent: Instant,
    pub tokens: Vec<Instant>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

/// Counts each stream's tokens so far; wakes whoever waits for them.
#[derive(Default)]
pub(crate) struct Progress {
    tokens: Vec<AtomicUsize>,
    changed: tokio::sync::Notify,
}

impl Progress {
    pub fn new(streams: usize) -> Arc<Self> {
        Arc::new(Self {
            tokens: (0..streams).map(|_| AtomicUsize::new(0)).collect(),
            changed: tokio::sync::Notify::new(),
        })
    }

    /// Waits until every stream has at least `n` tokens.
    pub async fn all_reach(&self, n: usize) {
        loop {
            let woken = self.changed.notified();
            if self.tokens.iter().all(|t| t.load(Ordering::Acquire) >= n) {
                return;
            }
            woken.await;
        }
    }

    fn add_token(&self, stream: usize) {
        self.tokens[stream].fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
    }
}

/// The server under test and what every request to it carries.
pub(crate) struct Target<'a> {
    pub client: reqwest::Client,
    /// `.../v1/completions`.
    pub url: String,
    pub model: &'a str,
    /// Merged into every request body (`--extra`).
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Target<'_> {
    /// A greedy streaming completion of exactly `max_tokens` tokens; each token counts towards
    /// `progress`'s stream, if given.
    pub async fn stream(
        &self,
        prompt: String,
        max_tokens: usize,
        progress: Option<(&Progress, usize)>,
    ) -> Result<Timed, BenchError> {
        let mut body = serde_json::json!({
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": true,
            "ignore_eos": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(obj) = body.as_object_mut() {
            obj.extend(self.extra.clone());
        }
        let sent = Instant::now();
        let req = self.client.post(&self.url).timeout(REQUEST_TIMEOUT);
        let mut events = SseReader::new(post_json(req, &self.url, &body).await?);
        let mut timed = Timed {
            sent,
            tokens: Vec::new(),
            prompt_tokens: None,
            completion_tokens: None,
        };
        while let Some(payloads) = events.next_chunk().await? {
            let now = Instant::now();
            for data in payloads {
                if data == "[DONE]" {
                    continue;
                }
                let v = parse_chunk(&data)?;
                if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                    timed.prompt_tokens = u["prompt_tokens"].as_u64();
                    timed.completion_tokens = u["completion_tokens"].as_u64();
                }
                for c in v["choices"].as_array().into_iter().flatten() {
                    if c["finish_reason"].is_null() && c["text"].is_string() {
                        timed.tokens.push(now);
                        if let Some((p, i)) = progress {
                            p.add_token(i);
                        }
                    }
                }
            }
        }
        Ok(timed)
    }
}
