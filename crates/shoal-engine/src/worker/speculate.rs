//! Speculative decoding in the engine step: [`Worker::draft`] gives each decoding sequence that
//! speculates a draft ([`crate::draft`]) within the step's KV room — checked against its constraint —
//! so its chunk feeds its last token and the drafted ones; [`Worker::settle_draft`] takes the verified
//! pass back: the KV of the rejected positions rewound on every stage ([`KvOp::Rewind`]), the
//! sequence's draft length adapted, the metrics counted. [`Worker::record_step`] (a step computed
//! here) and [`Worker::record_flight`] (a batch through stages on other nodes, its hops included)
//! measure what a drafted token adds to a pass against a plain step, which caps the drafts
//! ([`crate::draft::Adapt::next_k`]): on a pipeline a pass's hops make drafted tokens cheap.

use super::Worker;
use super::step::{Drafts, Plan};
use crate::error::EngineError;
use crate::stage::{ChunkSpec, KvOp, Pick, kv_all};
use crate::verify;

/// Weight of a new observation of a drafted token's cost.
const COST_WEIGHT: f64 = 0.2;
/// One step in this many does not draft (it measures a plain step), once one was measured...
const REMEASURE_EVERY: usize = 64;
/// ... and until then.
const REMEASURE_UNKNOWN: usize = 8;
/// Plain steps are measured apart by how many sequences they decode (1, 2, 3–4, 5–8, … 33+): a
/// drafted token's cost is what it adds to a step of as many decodes, not to one measured alone
/// while many decode now (or the reverse).
pub(super) const DECODE_BUCKETS: usize = 7;

/// The bucket of a step of `decodes` decoding sequences.
pub(super) fn decode_bucket(decodes: usize) -> usize {
    (usize::BITS - decodes.saturating_sub(1).leading_zeros()).min(DECODE_BUCKETS as u32 - 1)
        as usize
}

impl Worker {
    /// Drafts tokens for the sequences of `plan` that speculate and whose chunk ends at their last
    /// token (a decode, or a prompt's last chunk), within the `free` KV tokens of the step and its
    /// token budget, and lengthens their chunks by them.
    pub(super) fn draft(&mut self, plan: &mut Plan, free: usize) {
        if !self.verifies || !plan.iter().any(|&(i, _)| self.running[i].spec.is_some()) {
            return;
        }
        // Now and then a step without drafts, so a plain step's time — what a drafted token's cost is
        // measured against — is known (one step in 8 until it is) and stays current (one in 64) even
        // when every step could draft.
        let decodes = plan
            .iter()
            .filter(|&&(i, n)| n == 1 && self.running[i].pending() == 1)
            .count();
        let bucket = decode_bucket(decodes);
        let every = match self.plain_step_secs[bucket] {
            None => REMEASURE_UNKNOWN,
            Some(_) => REMEASURE_EVERY,
        };
        self.steps_since_plain = self.steps_since_plain.wrapping_add(1);
        if self.steps_since_plain % every == 1 {
            return;
        }
        let planned: usize = plan.iter().map(|&(_, n)| n).sum();
        let mut left = free
            .min(self.config.max_batch_tokens)
            .saturating_sub(planned);
        let cost = self.draft_cost(bucket);
        for (i, n) in plan.iter_mut() {
            let seq = &mut self.running[*i];
            // A decode, or a prompt's last chunk: what comes after it is drafted.
            if *n != seq.pending() || seq.spec.is_none() {
                continue;
            }
            let room = seq.draft_room(self.context_length).min(left);
            let Some(spec) = seq.spec.as_mut() else {
                continue;
            };
            let proposed = spec.propose(&seq.tokens, room, cost);
            let (draft, masks) = seq.check_draft(proposed);
            left -= draft.len();
            *n += draft.len();
            seq.draft = draft;
            seq.draft_masks = masks;
        }
    }

    /// What one drafted token adds to a pass, over the time of a plain step of as many decodes
    /// (`bucket`), once both are measured.
    fn draft_cost(&self, bucket: usize) -> Option<f64> {
        let (token, step) = (self.draft_token_secs?, self.plain_step_secs[bucket]?);
        (step > 0.0).then(|| token / step)
    }

    /// Records a step computed here: `decodes` decoding sequences, `prefill` prompt tokens and
    /// `drafted` drafted tokens in `secs`. Steps with drafts leave the plain step times (which size
    /// prefill chunks) alone.
    pub(super) fn record_step(
        &mut self,
        decodes: usize,
        prefill: usize,
        drafted: usize,
        secs: f64,
    ) {
        if drafted == 0 {
            self.times.record(decodes, prefill, secs);
        }
        self.measure_drafts(decodes, prefill, drafted, secs);
    }

    /// Records a batch that was in flight through stages on other nodes, launched to landed in
    /// `secs`: what a pass costs there includes every hop, which a drafted token does not add to.
    pub(super) fn record_flight(&mut self, batch: &[ChunkSpec], drafts: &Drafts, secs: f64) {
        let drafted: usize = drafts.iter().map(Vec::len).sum();
        let tokens: usize = batch.iter().map(|c| c.len).sum();
        let mut with_logits = drafts.iter();
        let decodes = batch
            .iter()
            .filter(|c| {
                let d = if c.want_logits {
                    with_logits.next().map_or(0, Vec::len)
                } else {
                    0
                };
                c.want_logits && c.len - d == 1
            })
            .count();
        self.measure_drafts(decodes, tokens - drafted - decodes, drafted, secs);
    }

    /// Moving averages of a plain decode step (decodes only) and of what one drafted token adds to
    /// it (steps of decodes and drafts only), in the same terms: local steps, or flights through
    /// other nodes.
    fn measure_drafts(&mut self, decodes: usize, prefill: usize, drafted: usize, secs: f64) {
        if prefill > 0 || decodes == 0 || !(secs.is_finite() && secs > 0.0) {
            return;
        }
        let ema =
            |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + COST_WEIGHT * (new - o)));
        let plain = &mut self.plain_step_secs[decode_bucket(decodes)];
        if drafted == 0 {
            *plain = ema(*plain, secs);
            return;
        }
        let Some(step) = *plain else {
            return;
        };
        let per = (secs - step).max(0.0) / drafted as f64;
        self.draft_token_secs = ema(self.draft_token_secs, per);
    }

    /// Takes back the pass of sequence `i` that verified `draft` and gave `picks`, `pushed` of which
    /// it took (fewer when it ended on one): its valid KV is its tokens up to the last accepted
    /// drafted token it took; the rest is rewound on every stage.
    pub(super) fn settle_draft(
        &mut self,
        i: usize,
        draft: &[u32],
        picks: &[Pick],
        pushed: usize,
    ) -> Result<(), EngineError> {
        let accepted = verify::accepted(draft, picks);
        let seq = &mut self.running[i];
        seq.draft.clear();
        seq.draft_masks.clear();
        if let Some(spec) = seq.spec.as_mut() {
            spec.adapt.record(draft.len(), accepted);
        }
        if !seq.warm_up {
            self.meters.speculated(draft.len(), accepted, pushed);
        }
        self.counters.speculated(draft.len(), accepted);
        // Dropped while in flight (preempted): it recomputes everything anyway.
        if seq.spec_held == 0 {
            return Ok(());
        }
        let held = seq.computed + seq.spec_held;
        seq.spec_held = 0;
        seq.computed += accepted.min(pushed);
        if seq.computed < held {
            let op = KvOp::Rewind {
                seq_id: seq.id,
                len: seq.computed,
            };
            kv_all(&mut self.stages, op)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_steps_are_bucketed_by_powers_of_two_of_decodes() {
        let buckets: Vec<usize> = [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 500]
            .into_iter()
            .map(decode_bucket)
            .collect();
        assert_eq!(buckets, [0, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]);
        assert_eq!(decode_bucket(0), 0);
    }
}
