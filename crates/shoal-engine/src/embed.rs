//! Embeddings: [`EngineHandle::embed`] turns each input of an [`EmbedRequest`] into one vector — the
//! model's final hidden states after the output norm, pooled as the model's [`Pooling`] says (the mean
//! over the input's tokens for a decoder LLM) and L2-normalized, as llama.cpp's embedding mode with
//! `--pooling mean` gives.
//!
//! Flow: the handle tokenizes every input ([`EngineHandle::embed_tokens`]: special tokens parsed,
//! BOS/EOS as the GGUF asks, like llama.cpp's server), then queues them a few at a time as embedding
//! sequences ([`EmbedJob`] on the admission). The engine thread prefills such a sequence in chunks like
//! any prompt — so it batches with decodes and never stalls them beyond a prefill chunk — asking the
//! last stage for the pooled rows of each chunk ([`Pool`] on the chunk) instead of logits, even on
//! another node. [`EmbedState`] adds them up; once the last chunk lands the sequence's KV is released
//! (never kept as a cached prefix, and no cached prefix is used: every token's state is needed) and the
//! vector goes back on the job's channel, followed by `Done` with the input's token count.

use std::time::Instant;

use shoal_model::Pooling;
use tokio::sync::oneshot;

use crate::admission::EmbedJob;
use crate::error::EngineError;
use crate::handle::{EngineHandle, RequestStream};
use crate::request::{EmbedRequest, Embeddings, Event, FinishReason};
use crate::stage::Pool;

/// Inputs one request may hold, whichever API it came through (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// Inputs of one request queued at once: enough to fill the engine's batches, few enough that a
/// request with thousands of inputs does not flood the queue.
const WINDOW: usize = 16;

/// What an embedding sequence has pooled so far.
pub(crate) struct EmbedState {
    pooling: Pooling,
    /// The sum of the rows so far (mean), or the row kept (first / last); empty before the first.
    acc: Vec<f32>,
    reply: Option<oneshot::Sender<Vec<f32>>>,
}

impl EmbedState {
    pub(crate) fn new(job: EmbedJob) -> Self {
        Self {
            pooling: job.pooling,
            acc: Vec::new(),
            reply: Some(job.reply),
        }
    }

    /// What to ask the last stage for the chunk of `len` tokens at `start` of a `total`-token input.
    pub(crate) fn chunk_pool(&self, start: usize, len: usize, total: usize) -> Pool {
        match self.pooling {
            Pooling::Mean | Pooling::Rank => Pool::Sum,
            Pooling::Last if start + len == total => Pool::Last,
            Pooling::Cls if start == 0 => Pool::First,
            Pooling::Last | Pooling::Cls => Pool::None,
        }
    }

    /// Takes the pooled row of one chunk.
    pub(crate) fn add(&mut self, row: &[f32]) {
        if self.acc.is_empty() || self.pooling != Pooling::Mean {
            self.acc = row.to_vec();
        } else {
            for (a, r) in self.acc.iter_mut().zip(row) {
                *a += r;
            }
        }
    }

    /// Forgets what was pooled (the sequence is computed again from its first token).
    pub(crate) fn reset(&mut self) {
        self.acc.clear();
    }

    /// Sends the vector, L2-normalized (the mean's division by the token count cancels out).
    pub(crate) fn send(&mut self) {
        let mut v = std::mem::take(&mut self.acc);
        normalize(&mut v);
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(v);
        }
    }
}

/// Scales `v` to unit length (llama.cpp's `embd_normalize = 2`); a zero vector stays zero.
pub fn normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    let scale = if norm > 0.0 { (1.0 / norm) as f32 } else { 0.0 };
    for x in v {
        *x *= scale;
    }
}

impl EngineHandle {
    /// One vector per input of `request` (in order), and the tokens they took. Dropping the future
    /// cancels what is still running.
    pub async fn embed(&self, request: EmbedRequest) -> Result<Embeddings, EngineError> {
        if request.model != self.info().id {
            return Err(EngineError::ModelNotFound {
                model: request.model,
            });
        }
        if self.pooling() == Pooling::Rank {
            return Err(EngineError::InvalidParam {
                param: "model",
                message: format!(
                    "model '{}' is a reranker: it has no embeddings",
                    request.model
                ),
            });
        }
        if request.inputs.len() > MAX_INPUTS {
            return Err(EngineError::InvalidParam {
                param: "input",
                message: format!(
                    "at most {MAX_INPUTS} inputs per request, got {}",
                    request.inputs.len()
                ),
            });
        }
        // Every input is checked before any is queued.
        let inputs = request
            .inputs
            .iter()
            .map(|p| self.embed_tokens(p, request.truncate))
            .collect::<Result<Vec<_>, _>>()?;
        let prompt_tokens = inputs.iter().map(|t| t.len() as u32).sum();
        let deadline = request.timeout.map(|t| Instant::now() + t);
        let mut queued = std::collections::VecDeque::new();
        let mut inputs = inputs.into_iter();
        let mut vectors = Vec::with_capacity(request.inputs.len());
        loop {
            while queued.len() < WINDOW
                && let Some(tokens) = inputs.next()
            {
                let (reply, vector) = oneshot::channel();
                let job = EmbedJob {
                    pooling: self.pooling(),
                    reply,
                };
                let stream = self.enqueue_embedding(tokens, job, request.timeout, deadline)?;
                queued.push_back((stream, vector));
            }
            let Some((stream, vector)) = queued.pop_front() else {
                break;
            };
            vectors.push(finish(stream, vector).await?);
        }
        Ok(Embeddings {
            vectors,
            prompt_tokens,
        })
    }
}

/// Waits for one embedding sequence's end and its vector.
async fn finish(
    mut stream: RequestStream,
    vector: oneshot::Receiver<Vec<f32>>,
) -> Result<Vec<f32>, EngineError> {
    loop {
        match stream.next().await {
            Some(Event::Done {
                finish_reason: FinishReason::Stop,
                ..
            }) => break,
            Some(Event::Error(e)) => return Err(e),
            Some(Event::Token { .. }) => {}
            Some(Event::Done { .. }) | None => {
                return Err(EngineError::Internal(
                    "an embedding ended without its vector".into(),
                ));
            }
        }
    }
    vector
        .await
        .map_err(|_| EngineError::Internal("an embedding ended without its vector".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalized_vectors_have_unit_length_and_zero_stays_zero() {
        let mut v = vec![3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut z = vec![0.0; 3];
        normalize(&mut z);
        assert_eq!(z, [0.0; 3]);
    }

    fn state(pooling: Pooling) -> EmbedState {
        let (reply, _) = oneshot::channel();
        EmbedState::new(EmbedJob { pooling, reply })
    }

    #[test]
    fn each_pooling_asks_for_its_rows_and_keeps_what_it_should() {
        let mut mean = state(Pooling::Mean);
        assert_eq!(mean.chunk_pool(0, 3, 10), Pool::Sum);
        assert_eq!(mean.chunk_pool(7, 3, 10), Pool::Sum);
        mean.add(&[1.0, 2.0]);
        mean.add(&[3.0, -1.0]);
        assert_eq!(mean.acc, [4.0, 1.0]);
        mean.reset();
        assert!(mean.acc.is_empty());
        let mut last = state(Pooling::Last);
        assert_eq!(last.chunk_pool(0, 3, 10), Pool::None);
        assert_eq!(last.chunk_pool(7, 3, 10), Pool::Last);
        last.add(&[5.0]);
        last.add(&[6.0]);
        assert_eq!(last.acc, [6.0]);
        let cls = state(Pooling::Cls);
        assert_eq!(cls.chunk_pool(0, 3, 10), Pool::First);
        assert_eq!(cls.chunk_pool(3, 7, 10), Pool::None);
    }
}
