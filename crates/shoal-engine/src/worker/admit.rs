//! A sequence's life outside the step: admission within the KV budget (preempted sequences first,
//! then the further choices of running requests, then waiting requests in order), prefix reuse, forks
//! (a request's choices share its prompt's prefill), and the ends — finished (KV kept as a cached
//! prefix when worth it), failed, cancelled, timed out or preempted.

use std::time::Instant;

use super::{Fork, Worker};
use crate::error::EngineError;
use crate::request::FinishReason;
use crate::sequence::Sequence;
use crate::stage::{KvOp, kv_all, kv_all_lossy};
use crate::stats::Finished;

impl Worker {
    /// Frees cancelled requests and fails those past their deadline.
    pub(super) fn drop_cancelled(&mut self) {
        let now = Instant::now();
        let before = self.waiting.len();
        self.waiting.retain(|a| a.still_wanted(now));
        self.counters.dequeued(before - self.waiting.len());
        let before = self.preempted.len();
        self.preempted.retain(|s| {
            let timed_out = s.timed_out(now);
            if timed_out {
                s.send_error(s.timeout_error());
            } else if s.is_cancelled() {
                s.send_done(FinishReason::Cancelled);
            }
            !(timed_out || s.is_cancelled())
        });
        self.counters.ended(before - self.preempted.len());
        self.forks.retain(|f| {
            let s = &f.seq;
            if s.timed_out(now) {
                s.send_error(s.timeout_error());
            } else if s.is_cancelled() {
                s.send_done(FinishReason::Cancelled);
            }
            !(s.timed_out(now) || s.is_cancelled())
        });
        let mut i = 0;
        while i < self.running.len() {
            let seq = &self.running[i];
            if seq.is_cancelled() {
                self.finish(i, FinishReason::Cancelled);
            } else if seq.timed_out(now) {
                let error = seq.timeout_error();
                self.fail(i, error);
            } else {
                i += 1;
            }
        }
    }

    /// Admits what fits ([`Worker::admit_waiting`]); when that puts a sequence beside others, none of
    /// them runs alone any more (their decode rates are no longer one stream's).
    pub(super) fn admit(&mut self) {
        let before = self.running.len();
        self.admit_waiting();
        if self.running.len() > before && self.running.len() > 1 {
            for s in &mut self.running {
                s.alone = false;
            }
        }
    }

    /// Admits preempted sequences, then forks, then waiting requests, while they fit.
    fn admit_waiting(&mut self) {
        // Preempted sequences first, in order; each recomputes all its tokens.
        while self.running.len() < self.config.max_running {
            let Some(need) = self.preempted.front().map(|s| s.tokens.len()) else {
                break;
            };
            if !self.make_room(need) {
                return;
            }
            if let Some(seq) = self.preempted.pop_front() {
                self.running.push(seq);
            }
        }
        if !self.admit_forks() {
            return;
        }
        while self.running.len() < self.config.max_running {
            // A generation needs room for its first token too; an embedding only for its input.
            let Some(need) = self
                .waiting
                .front()
                .map(|a| a.tokens.len() + usize::from(a.embed.is_none()))
            else {
                break;
            };
            if need > self.kv.max_tokens() {
                if let Some(a) = self.waiting.pop_front() {
                    self.counters.dequeued(1);
                    let error = EngineError::PromptTooLong {
                        prompt_tokens: a.tokens.len(),
                        context_length: self.kv.max_tokens() - usize::from(a.embed.is_none()),
                    };
                    a.refuse(error);
                }
                continue;
            }
            // First come, first served: a request that does not fit yet waits, and so do those behind it.
            if !self.make_room(need) {
                break;
            }
            let Some(a) = self.waiting.pop_front() else {
                break;
            };
            self.counters.dequeued(1);
            let mut a = a;
            let parent = a.id;
            for s in std::mem::take(&mut a.siblings) {
                let seed = self.next_seed();
                if let Some(seq) = self.start(a.sibling(s), seed) {
                    self.forks.push(Fork { parent, seq });
                }
            }
            let seed = self.next_seed();
            if !a.warm_up {
                self.meters.admitted(a.tokens.len());
            }
            let Some(seq) = self.start(a, seed) else {
                continue;
            };
            self.running.push(seq);
            self.reuse_prefix();
            self.counters.started();
            // Its choices may start at once when the prompt came from the prefix cache.
            self.admit_forks();
        }
    }

    /// The sequence of admitted request `a`; `None` when a continuation cannot take up the tokens it
    /// had (its constraint refuses them): its stream has the error.
    fn start(&self, a: crate::admission::Admission, seed: u64) -> Option<Sequence> {
        let mut seq = Sequence::start(a, self.context_length, seed);
        let draft_model = self.config.draft_model.as_ref();
        seq.init_speculation(self.config.speculative, draft_model, self.mtp.as_ref());
        match seq.catch_up(&self.tokenizer) {
            Ok(()) => Some(seq),
            Err(error) => {
                seq.send_error(error);
                None
            }
        }
    }

    /// A fresh fallback seed for a sequence whose request names none.
    fn next_seed(&mut self) -> u64 {
        self.seed_counter = self.seed_counter.wrapping_add(0x9E37_79B9);
        self.seed_counter
    }

    /// Starts the further choices whose first choice has computed its prompt but the last token: each
    /// from a copy of that KV, so a prompt is prefilled once for all its choices; each then runs the
    /// prompt's last token itself, for logits of its own. A choice whose first one is gone (finished or
    /// failed) starts like any request, from the prefix cache. False when KV memory ran short.
    fn admit_forks(&mut self) -> bool {
        let mut i = 0;
        while i < self.forks.len() && self.running.len() < self.config.max_running {
            let parent = self.forks[i].parent;
            let seq = &self.forks[i].seq;
            let from = match self.running.iter().find(|s| s.id == parent) {
                Some(p) if p.computed + 1 >= seq.prompt_len => Some(seq.prompt_len - 1),
                Some(_) => None,
                None if self.preempted.iter().any(|s| s.id == parent) => None,
                None => Some(0),
            };
            let Some(len) = from else {
                i += 1;
                continue;
            };
            if !self.make_room(seq.prompt_len + 1) {
                return false;
            }
            let mut seq = self.forks.swap_remove(i).seq;
            let copied = len > 0
                && match kv_all(
                    &mut self.stages,
                    KvOp::Fork {
                        seq_id: parent,
                        into: seq.id,
                        len,
                    },
                ) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(parent: &seq.span, "forking a choice failed, prefilling it in full: {e}");
                        kv_all_lossy(&mut self.stages, KvOp::Release { seq_id: seq.id });
                        false
                    }
                };
            if copied {
                seq.computed = len;
                seq.cached = len;
                self.running.push(seq);
            } else {
                self.running.push(seq);
                self.reuse_prefix();
            }
            self.counters.started();
        }
        true
    }

    /// Starts the newest running sequence from the longest cached prefix of its prompt, if any (not an
    /// embedding: it needs every token's states).
    fn reuse_prefix(&mut self) {
        let Some(seq) = self.running.last_mut() else {
            return;
        };
        if seq.is_embedding() {
            return;
        }
        let Some((prefix_id, n)) = self.prefix.lookup(&seq.tokens[..seq.prompt_len]) else {
            if !seq.warm_up {
                self.meters.prefix_lookup(0);
            }
            return;
        };
        let id = seq.id;
        let loaded = kv_all(
            &mut self.stages,
            KvOp::Start {
                prefix_id,
                seq_id: id,
                len: n,
            },
        );
        match loaded {
            Ok(()) => {
                seq.computed = n;
                seq.cached = n;
                if !seq.warm_up {
                    self.meters.prefix_lookup(n);
                }
            }
            Err(e) => {
                // Not fatal: compute the prompt from scratch.
                tracing::warn!(parent: &seq.span, "prefix reuse failed, prefilling in full: {e}");
                kv_all_lossy(&mut self.stages, KvOp::Release { seq_id: id });
            }
        }
    }

    /// Removes sequence `i`, keeps its KV in the prefix cache when worth it (else frees it everywhere)
    /// and sends its final event.
    pub(super) fn finish(&mut self, i: usize, reason: FinishReason) {
        let seq = self.running.swap_remove(i);
        let offer = match reason {
            // An embedding's KV is never kept: embeddings must not crowd out prompts worth caching.
            _ if seq.is_embedding() => Default::default(),
            // The warm-up's made-up prompt must not be reused for a real one.
            _ if seq.warm_up => Default::default(),
            FinishReason::Cancelled => Default::default(),
            _ => self.prefix.insert(&seq.tokens[..seq.computed]),
        };
        self.meters.evicted(offer.evict.len());
        for id in offer.evict {
            kv_all_lossy(&mut self.stages, KvOp::DropPrefix { prefix_id: id });
        }
        let kept = offer.store.is_some_and(|pid| {
            let r = kv_all(
                &mut self.stages,
                KvOp::Retain {
                    seq_id: seq.id,
                    prefix_id: pid,
                    len: seq.computed,
                },
            );
            if let Err(e) = &r {
                tracing::warn!(parent: &seq.span, "cannot keep the prefix of sequence {}: {e}", seq.id);
                kv_all_lossy(&mut self.stages, KvOp::DropPrefix { prefix_id: pid });
            }
            r.is_ok()
        });
        if !kept {
            kv_all_lossy(&mut self.stages, KvOp::Release { seq_id: seq.id });
        }
        self.counters.ended(1);
        if reason != FinishReason::Cancelled {
            self.counters.finished(seq.measured());
        }
        if !seq.warm_up {
            self.meters.ended(seq.queued, Some(reason));
        }
        seq.send_done(reason);
    }

    /// Removes embedding `i` whose last chunk landed, frees its KV everywhere and sends its vector.
    pub(super) fn finish_embedding(&mut self, i: usize) {
        let mut seq = self.running.swap_remove(i);
        kv_all_lossy(&mut self.stages, KvOp::Release { seq_id: seq.id });
        self.counters.ended(1);
        self.counters.finished(Finished::default());
        self.meters.embedded(seq.queued);
        seq.send_embedding();
    }

    /// Removes sequence `i`, frees its KV everywhere and sends `error` as its final event.
    pub(super) fn fail(&mut self, i: usize, error: EngineError) {
        let seq = self.running.swap_remove(i);
        tracing::warn!(parent: &seq.span, kind = error.error_type(), "request failed: {error}");
        kv_all_lossy(&mut self.stages, KvOp::Release { seq_id: seq.id });
        self.counters.ended(1);
        if !seq.warm_up {
            self.meters.ended(seq.queued, None);
        }
        seq.send_error(error);
    }

    /// Drops the KV of the newest running sequence so older ones can go on; it resumes (recomputing
    /// its KV, which gives the same values) when there is room again.
    pub(super) fn preempt_newest(&mut self) {
        let Some(mut seq) = self.running.pop() else {
            return;
        };
        kv_all_lossy(&mut self.stages, KvOp::Release { seq_id: seq.id });
        self.meters.preempted();
        seq.forget_kv();
        // It waits for others to make room: its decode rate is not one stream's.
        seq.alone = false;
        self.preempted.push_front(seq);
    }
}
