//! Speculative decoding's verification, where the logits are: a chunk that fed a sequence's last
//! token and `k` drafted tokens comes back from the last stage as `k + 1` logits rows, and
//! [`verify_chunk`] walks them in order — row `i` judges drafted token `i` ([`Sampler::verify_pick`]:
//! greedy by exact match, sampling by the rejection rule that keeps the target's distribution) with
//! the penalties over the tokens before it and the mask of its position — and stops at the first
//! token that is not the draft's. What it returns is every accepted drafted token, then the one
//! token picked past them (a correction, or the bonus from the last row): between 1 and `k + 1`
//! picks. The picks alone say how many were accepted ([`accepted`]), so nothing but token ids has
//! to travel back from a remote last stage. The owner replays its sampler with
//! [`Sampler::replay_verified`] per pick.

use crate::batch::Pick;
use crate::logits::TokenMask;
use crate::sampler::{self, REPETITION_WINDOW, Sampler};

/// One row's pick for a sequence sampled by `sampler`: the raw log-probabilities (the token's and
/// the top alternatives, of the model's logits before the mask, the penalties and the temperature),
/// the mask, then `choose` with `sampler` on the row (`choose` applies the penalties).
pub(crate) fn pick_row(
    sampler: &mut Sampler,
    row: &mut [f32],
    mask: Option<&TokenMask>,
    choose: impl FnOnce(&mut Sampler, &mut [f32]) -> u32,
) -> Pick {
    let normalizer = sampler::log_normalizer(row);
    let top = sampler::top_logprobs(row, sampler.top_logprobs(), normalizer);
    // The penalties change the row in place (the mask never touches the token it lets through).
    let raw = sampler.has_penalties().then(|| row.to_vec());
    if let Some(mask) = mask {
        mask.apply(row);
    }
    let id = choose(sampler, row);
    let logit = raw
        .as_deref()
        .unwrap_or(row)
        .get(id as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    Pick {
        id,
        logprob: logit - normalizer,
        top,
    }
}

/// Verifies `draft` over `rows` (`draft.len() + 1` of them, the positions after the sequence's last
/// token and after each drafted token) for a sequence sampled by `sampler` with `history` so far:
/// `masks[i]` is what the constraint allows at position `i` (empty: unconstrained).
pub fn verify_chunk(
    sampler: &Sampler,
    history: &[u32],
    masks: &[Option<&TokenMask>],
    draft: &[u32],
    rows: Vec<&mut [f32]>,
) -> Vec<Pick> {
    let mut s = sampler.clone();
    // The repetition penalty looks at the last window of tokens only.
    let mut hist = history[history.len().saturating_sub(REPETITION_WINDOW)..].to_vec();
    let mut picks = Vec::with_capacity(rows.len());
    for (i, row) in rows.into_iter().enumerate() {
        let mask = masks.get(i).copied().flatten();
        let d = draft.get(i).copied();
        let pick = pick_row(&mut s, row, mask, |s, row| {
            s.penalize(row, &hist);
            s.verify_pick(row, d)
        });
        let id = pick.id;
        picks.push(pick);
        if Some(id) != d {
            break;
        }
        s.accept(id);
        hist.push(id);
    }
    picks
}

/// How many drafted tokens `picks` (one chunk's, from [`verify_chunk`]) accepted: those equal to
/// the draft before the first that is not.
pub fn accepted(draft: &[u32], picks: &[Pick]) -> usize {
    draft
        .iter()
        .zip(picks)
        .take_while(|(d, p)| **d == p.id)
        .count()
}

/// How many picks one chunk that verified `draft` returned, at the head of `picks` (which may hold
/// later chunks' picks after them).
pub fn chunk_picks(draft: &[u32], picks: &[Pick]) -> usize {
    (accepted(draft, picks) + 1).min(picks.len())
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;
