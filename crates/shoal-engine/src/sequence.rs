//! [`Sequence`]: a request the engine thread runs, with its tokens, sampler state, detokenizer, stop
//! matcher and the events it streams to its client — or, for an embedding, what it pooled so far.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use shoal_model::tokenizer::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use crate::admission::Admission;
use crate::draft::{DraftSource, NgramDraft, Speculator};
use crate::draft_model::{DraftModel, ModelDraft};
use crate::embed::EmbedState;
use crate::error::EngineError;
use crate::logits::{LogitsProcessor, TokenMask};
use crate::mtp_draft::{Mtp, MtpDraft};
use crate::request::{Event, FinishReason, Prefill, Speculation, TopLogprob, Usage};
use crate::sampler::Sampler;
use crate::stage::{Pick, Pool};
use crate::stats::Finished;
use crate::stop::StopMatcher;

/// A sequence owned by the engine thread.
pub(crate) struct Sequence {
    pub(crate) id: u64,
    /// Prompt then generated tokens.
    pub(crate) tokens: Vec<u32>,
    pub(crate) prompt_len: usize,
    /// Tokens whose KV is computed on every stage.
    pub(crate) computed: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub(crate) cached: usize,
    pub(crate) sampler: Sampler,
    max_new: usize,
    decoder: StreamDecoder,
    stop: StopMatcher,
    /// The stop sequence that ended the sequence, once one did.
    matched_stop: Option<String>,
    processor: Option<Box<dyn LogitsProcessor>>,
    /// What the processor allows for the next token, once asked ([`Sequence::refresh_mask`]).
    mask: Option<TokenMask>,
    /// Whether `mask` answers for the next token (asked since the last token was taken).
    mask_ready: bool,
    /// Set for an embedding: its prompt is all it computes.
    embed: Option<EmbedState>,
    tx: UnboundedSender<Event>,
    /// Where the prompt's progress goes (`None` for a choice forked from another's prompt).
    prefill: Option<tokio::sync::watch::Sender<Prefill>>,
    cancel: Arc<AtomicBool>,
    ignore_eos: bool,
    deadline: Option<Instant>,
    timeout_ms: u64,
    /// When its request was queued, and when its first token was sampled.
    pub(crate) queued: Instant,
    first_token: Option<Instant>,
    /// When its latest token was delivered (the engine's inter-token latency is measured from it).
    pub(crate) last_token: Option<Instant>,
    /// No other sequence ran in the engine since it was admitted: its decode rate is one stream's.
    pub(crate) alone: bool,
    /// The engine's warm-up: its KV is never kept as a cached prefix.
    pub(crate) warm_up: bool,
    /// Its request's span (`request{id=…}`): the parent of every log line about it.
    pub(crate) span: tracing::Span,
    /// What its request asked of speculative decoding (`None`: the engine's default), until
    /// [`Sequence::init_speculation`].
    asked_speculation: Option<Speculation>,
    /// Speculative decoding's draft source and adapted draft length (`None`: off).
    pub(crate) spec: Option<Speculator>,
    /// The drafted tokens of its pass being computed, and what its constraint allows after each.
    pub(crate) draft: Vec<u32>,
    pub(crate) draft_masks: Vec<Option<TokenMask>>,
    /// KV positions the stages hold past `computed` for the drafted tokens in flight.
    pub(crate) spec_held: usize,
}

impl Sequence {
    /// Starts admitted request `a` with room for `context_length` tokens in all, its sampler seeded
    /// with `seed` unless the request names a seed. A continuation ([`Admission::generated`]) counts its
    /// last tokens as generated; [`Sequence::catch_up`] then brings the rest of its state past them.
    pub(crate) fn start(a: Admission, context_length: usize, seed: u64) -> Self {
        let timeout_ms = a.timeout_ms();
        // At least one token of prompt (the handle refuses an empty one).
        let generated = a.generated.min(a.tokens.len().saturating_sub(1));
        let prompt_len = a.tokens.len() - generated;
        let room = context_length.saturating_sub(prompt_len);
        let request = a.request;
        let max_new = request
            .max_tokens
            .map_or(room, |m| (m.get() as usize).min(room));
        Self {
            id: a.id,
            prompt_len,
            tokens: a.tokens,
            computed: 0,
            cached: 0,
            sampler: Sampler::new(request.sampling, seed),
            max_new,
            decoder: StreamDecoder::new(),
            stop: StopMatcher::new(request.stop),
            matched_stop: None,
            processor: request.logits_processor,
            mask: None,
            mask_ready: false,
            embed: a.embed.map(EmbedState::new),
            tx: a.tx,
            prefill: a.prefill,
            cancel: a.cancel,
            ignore_eos: request.ignore_eos,
            deadline: a.deadline,
            timeout_ms,
            queued: a.queued,
            first_token: None,
            last_token: None,
            alone: true,
            warm_up: a.warm_up,
            span: a.span,
            asked_speculation: request.speculative,
            spec: None,
            draft: Vec::new(),
            draft_masks: Vec::new(),
            spec_held: 0,
        }
    }

    /// Turns speculative decoding on as its request asked, else as `default` says (never for an
    /// embedding).
    /// A draft model's drafts need `draft_model` (the engine's), the model's own multi-token
    /// prediction `mtp` (the engine's); without it that method drafts nothing.
    pub(crate) fn init_speculation(
        &mut self,
        default: Speculation,
        draft_model: Option<&Arc<DraftModel>>,
        mtp: Option<&Mtp>,
    ) {
        let chosen = self.asked_speculation.unwrap_or(default);
        let source: Box<dyn DraftSource> = match (chosen, draft_model, mtp) {
            _ if self.is_embedding() => return self.spec = None,
            (Speculation::Off, ..)
            | (Speculation::Draft { .. }, None, _)
            | (Speculation::Mtp { .. }, _, None) => return self.spec = None,
            (Speculation::Ngram { .. }, ..) => Box::new(NgramDraft::default()),
            (Speculation::Draft { .. }, Some(m), _) => Box::new(ModelDraft::new(m.clone())),
            (Speculation::Mtp { .. }, _, Some(m)) => Box::new(MtpDraft::new(self.id, m.clone())),
        };
        self.spec = Some(Speculator::new(source, chosen.max_draft()));
    }

    /// Tokens a pass may draft for this sequence: one token always comes past the draft, and both
    /// must fit its token budget and the context.
    pub(crate) fn draft_room(&self, context_length: usize) -> usize {
        let left = self.max_new.saturating_sub(self.generated());
        let ctx = context_length.saturating_sub(self.tokens.len());
        left.min(ctx).saturating_sub(1)
    }

    /// Cuts `draft` at the first token its constraint would not allow, and says what the
    /// constraint allows after each token kept (asked of a copy of its processor: the sequence's own
    /// takes only the tokens that are verified). Unconstrained: the draft whole, no masks.
    pub(crate) fn check_draft(&self, mut draft: Vec<u32>) -> (Vec<u32>, Vec<Option<TokenMask>>) {
        let Some(p) = &self.processor else {
            return (draft, Vec::new());
        };
        let mut p = p.clone_box();
        let mut history = self.tokens.clone();
        let mut masks = Vec::with_capacity(draft.len());
        let mut mask = self.mask.clone();
        for (i, &t) in draft.iter().enumerate() {
            let allowed = mask.as_ref().is_none_or(|m| m.allows(t));
            if !allowed || p.accept(t).is_err() {
                draft.truncate(i);
                break;
            }
            history.push(t);
            match p.allowed(&history) {
                Ok(m) if !m.as_ref().is_some_and(TokenMask::allows_none) => {
                    masks.push(m.clone());
                    mask = m;
                }
                // Nothing may follow: the drafted token is not verified either.
                _ => {
                    draft.truncate(i);
                    break;
                }
            }
        }
        masks.truncate(draft.len());
        (draft, masks)
    }

    /// Brings the per-token state past the generated tokens a continuation starts with (as its request
    /// stood at the break: text decoded and matched against the stop sequences, constraint and sampler
    /// past them), sending nothing:
    /// the client has had their text already, all but what a possible stop sequence or an unfinished
    /// character still holds back, which stays held here as it was.
    pub(crate) fn catch_up(&mut self, tokenizer: &Tokenizer) -> Result<(), EngineError> {
        for i in self.prompt_len..self.tokens.len() {
            let id = self.tokens[i];
            if let Some(p) = self.processor.as_mut() {
                p.accept(id)
                    .map_err(|e| EngineError::Internal(e.to_string()))?;
            }
            self.sampler.replay(id);
            let text = self.decoder.push(tokenizer, id);
            let _already_sent = self.stop.feed(&text);
        }
        Ok(())
    }

    /// What the sequence measured, as it ends now: its time to first token, and its decode rate when
    /// it ran alone and decoded at least two tokens.
    pub(crate) fn measured(&self) -> Finished {
        let Some(first) = self.first_token else {
            return Finished::default();
        };
        let decoded = self.generated().saturating_sub(1);
        let took = first.elapsed().as_secs_f64();
        Finished {
            ttft: Some(first.saturating_duration_since(self.queued)),
            decode_tok_s: (self.alone && decoded >= 2 && took > 0.0).then(|| decoded as f64 / took),
        }
    }

    /// Publishes how much of the prompt is computed, after a prefill chunk landed (a decode step has
    /// nothing to say).
    pub(crate) fn report_prefill(&self) {
        if let Some(p) = &self.prefill
            && self.computed <= self.prompt_len
        {
            p.send_replace(Prefill {
                done: self.computed as u32,
                total: self.prompt_len as u32,
            });
        }
    }

    pub(crate) fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Tokens not yet computed on the stages (the rest of the prompt, or the one token to decode).
    pub(crate) fn pending(&self) -> usize {
        self.tokens.len() - self.computed
    }

    /// Prompt fully computed: each step feeds one token.
    pub(crate) fn decoding(&self) -> bool {
        self.pending() <= 1
    }

    pub(crate) fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_len as u32,
            completion_tokens: self.generated() as u32,
            // A continuation's cached prefix may reach into what it had generated.
            cached_tokens: self.cached.min(self.prompt_len) as u32,
        }
    }

    /// The client cancelled the request or went away.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.tx.is_closed()
    }

    pub(crate) fn timed_out(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    /// The error a sequence past its deadline ends with.
    pub(crate) fn timeout_error(&self) -> EngineError {
        EngineError::Timeout {
            after_ms: self.timeout_ms,
        }
    }

    /// Forgets the sequence's KV (it was released on every stage): it resumes by recomputing all its
    /// tokens, which gives the same values.
    pub(crate) fn forget_kv(&mut self) {
        self.computed = 0;
        self.cached = 0;
        self.spec_held = 0;
        if let Some(e) = self.embed.as_mut() {
            e.reset();
        }
    }

    /// Whether this is an embedding (no token is generated; its KV is never kept).
    pub(crate) fn is_embedding(&self) -> bool {
        self.embed.is_some()
    }

    /// What the last stage returns of the next `n` tokens' states: pooled rows for an embedding.
    pub(crate) fn chunk_pool(&self, n: usize) -> Pool {
        self.embed.as_ref().map_or(Pool::None, |e| {
            e.chunk_pool(self.computed, n, self.tokens.len())
        })
    }

    /// Takes a pooled row the last stage returned for this embedding.
    pub(crate) fn add_pooled(&mut self, row: &[f32]) {
        if let Some(e) = self.embed.as_mut() {
            e.add(row);
        }
    }

    /// Sends the embedding's vector, then `Done` with its token count.
    pub(crate) fn send_embedding(&mut self) {
        if let Some(e) = self.embed.as_mut() {
            e.send();
        }
        self.send_done(FinishReason::Stop);
    }

    /// Whether the request constrains its tokens (has a logits processor).
    pub(crate) fn constrained(&self) -> bool {
        self.processor.is_some()
    }

    /// Asks the request's logits processor (if any) which tokens may come next, once per token: the
    /// answer stays valid until a token is taken. Errs when the constraint fails or allows nothing.
    pub(crate) fn refresh_mask(&mut self) -> Result<(), EngineError> {
        let Some(p) = self.processor.as_mut() else {
            return Ok(());
        };
        if self.mask_ready {
            return Ok(());
        }
        let mask = p
            .allowed(&self.tokens)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        if mask.as_ref().is_some_and(TokenMask::allows_none) {
            return Err(EngineError::Internal(
                "constrained decoding allows no next token".into(),
            ));
        }
        self.mask = mask;
        self.mask_ready = true;
        Ok(())
    }

    /// The tokens allowed next (after [`Sequence::refresh_mask`]); `None`: any.
    pub(crate) fn mask(&self) -> Option<&TokenMask> {
        self.mask.as_ref()
    }

    /// Appends the token `pick` picked for this sequence and streams its text; returns why the sequence
    /// ends, if it does (an error when its constraint refuses the token).
    /// `verified`: the pick came from a pass verifying a draft (its sampler took two draws).
    pub(crate) fn push(
        &mut self,
        pick: Pick,
        verified: bool,
        tokenizer: &Tokenizer,
        context_length: usize,
    ) -> Result<Option<FinishReason>, EngineError> {
        let (id, logprob) = (pick.id, pick.logprob);
        if let Some(p) = self.processor.as_mut() {
            p.accept(id)
                .map_err(|e| EngineError::Internal(e.to_string()))?;
            self.mask_ready = false;
            self.mask = None;
        }
        if self.first_token.is_none() {
            self.first_token = Some(Instant::now());
        }
        // Sampling happened on a copy of this state (possibly on another node): catch up.
        if verified {
            self.sampler.replay_verified(id);
        } else {
            self.sampler.replay(id);
        }
        self.tokens.push(id);
        let eog = !self.ignore_eos && tokenizer.is_eog(id);
        // The end-of-generation token's own text is never shown.
        let text = if eog {
            String::new()
        } else {
            self.decoder.push(tokenizer, id)
        };
        let fed = self.stop.feed(&text);
        let stopped = fed.stop.is_some();
        let reason = if stopped || eog {
            Some(FinishReason::Stop)
        } else if self.generated() >= self.max_new || self.tokens.len() >= context_length {
            Some(FinishReason::Length)
        } else {
            None
        };
        let mut emit = fed.emit;
        if reason.is_some() && !stopped {
            // Ending for another reason than a stop sequence: held-back text is real output.
            emit.push_str(&self.stop.flush());
            emit.push_str(&self.decoder.finish());
        }
        let top_logprobs = pick
            .top
            .into_iter()
            .map(|(id, logprob)| TopLogprob {
                id,
                logprob,
                bytes: tokenizer.token_bytes(id).to_vec(),
            })
            .collect();
        let _ = self.tx.send(Event::Token {
            id,
            text: emit,
            logprob,
            top_logprobs,
        });
        self.matched_stop = fed.stop;
        Ok(reason)
    }

    /// Sends the final `Done` event (naming the stop sequence that ended it, if one did).
    pub(crate) fn send_done(&self, reason: FinishReason) {
        let stop_sequence = match reason {
            FinishReason::Stop => self.matched_stop.clone(),
            _ => None,
        };
        let _ = self.tx.send(Event::Done {
            finish_reason: reason,
            usage: self.usage(),
            stop_sequence,
        });
    }

    /// Sends the final `Error` event.
    pub(crate) fn send_error(&self, error: EngineError) {
        let _ = self.tx.send(Event::Error(error));
    }
}
