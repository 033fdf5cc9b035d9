//! A stage split over a tensor-parallel group (issue 31, decision 024), as one member's
//! [`LocalStage`](crate::stage::LocalStage) sees it: its [`GroupLink`] to the other members.
//!
//! Every member holds a share of the stage's layers (`shoal_model::split::Share`) and its heads' KV.
//! Rank 0 is where the stage's input arrives: before it computes a batch it sends the batch's input
//! to every other member ([`GroupLink::send_batch`]), and every KV operation it applies it sends on
//! too ([`GroupLink::send_kv`]), so each member's caches follow the same sequences. Twice a layer
//! every member's partial sums are made whole ([`GroupLink::reduce`]). The other members' links send
//! nothing; they receive what rank 0 sent and compute their share (`shoal-pipeline` runs them). The
//! link lives in `shoal-pipeline` (lanes); this crate only calls it.
//!
//! On a last stage whose output head is split by vocabulary ([`merge_head`]), every member first
//! sends each logits row's best entry of its own rows and their log-normalizer (three numbers); when
//! every request of the batch samples greedily with nothing changing the logits (no mask, penalties
//! or alternatives asked), rank 0 picks from those alone — the same token the whole row gives, ties
//! to the lower id — and no row of logits crosses the lanes. Otherwise rank 0 says so in the same
//! exchange and the members add their rows into whole ones (zeros elsewhere: exact). A chunk that
//! verifies drafted tokens (speculative decoding) has a row per drafted token and one more on every
//! member (rank 0 sends the counts with the batch); greedy, its picks are kept up to the first that
//! is not the draft's, so greedy verification needs no whole row either.

use std::ops::Range;

use shoal_model::{HostMatrix, StageOutput};

use crate::batch::{ChunkSpec, KvOp, Outputs, Pick, StageData};
use crate::error::EngineError;
use crate::sampler::{argmax, log_normalizer};

/// A KV change rank 0 applied that the other members apply too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupKv {
    Op(KvOp),
    /// `LocalStage::rewind`: `seq_id` keeps exactly its first `len` tokens.
    Rewind {
        seq_id: u64,
        len: usize,
    },
    /// `LocalStage::clear`: every sequence and prefix freed.
    Clear,
}

/// One member's connection to the rest of its tensor-parallel group.
pub trait GroupLink: Send {
    /// This member's rank (0: the one the stage's input reaches).
    fn rank(&self) -> usize;
    /// How many members the group has.
    fn members(&self) -> usize;
    /// Tokens of KV the other members set aside, the least of them (`None`: not known): a group's
    /// stage never holds more than its smallest member can.
    fn kv_token_capacity(&self) -> Option<usize>;
    /// Rank 0: sends `batch`'s `input` (token ids or hidden states) to the other members before it
    /// computes its share, with where each chunk starts in its sequence (`starts`, what rank 0's cache
    /// holds: a member whose cache disagrees has fallen out of step) and, when a chunk verifies
    /// drafted tokens, each chunk's logits rows (`rows`, as `DecoderStage::run_rows` takes them: the
    /// members compute their share of the head for the same rows); other ranks: nothing.
    fn send_batch(
        &mut self,
        batch: &[ChunkSpec],
        starts: &[usize],
        rows: Option<&[usize]>,
        input: &StageData,
    ) -> Result<(), EngineError>;
    /// Rank 0: sends a KV change it applied to the other members; other ranks: nothing.
    fn send_kv(&mut self, change: GroupKv) -> Result<(), EngineError>;
    /// Makes `partial` (`rows × dim`, this member's partial sums) the sum of every member's, added
    /// in rank order (every member gets the same bits).
    fn reduce(&mut self, partial: &mut [f32]) -> Result<(), EngineError>;
}

/// What a split head's logits became: whole rows, or (rank 0, every request greedy) the picks.
pub(crate) enum Merged {
    Logits(StageOutput),
    Picks(Outputs),
}

/// Numbers a member sends per logits row: its best logit, that entry's id, its rows' log-normalizer.
const SUMMARY: usize = 3;

/// Makes a split head's output whole on every member: `out` holds this member's logits of its rows
/// `mine` (of `vocab`), a row per chunk that wants logits (several for one that verifies a draft). Every member calls it with the same
/// rows; `whole_rows` matters on rank 0 only: the batch's requests need whole logit rows (else rank 0
/// picks greedily from the members' best entries).
pub(crate) fn merge_head(
    link: &mut dyn GroupLink,
    out: StageOutput,
    mine: Range<usize>,
    vocab: usize,
    whole_rows: bool,
) -> Result<Merged, EngineError> {
    let (shard, pooled) = (out.main, out.pooled);
    let rows = shard.rows();
    if rows == 0 {
        let main = HostMatrix::new(0, vocab, Vec::new()).map_err(crate::seqkv::internal)?;
        return Ok(Merged::Logits(StageOutput { main, pooled }));
    }
    let (n, rank) = (link.members(), link.rank());
    let width = n * SUMMARY + 1;
    let mut summary = vec![0f32; rows * width];
    for (i, row) in summary.chunks_exact_mut(width).enumerate() {
        let slot = &mut row[rank * SUMMARY..(rank + 1) * SUMMARY];
        match shard.row(i) {
            Some(logits) if !logits.is_empty() => {
                let best = argmax(logits) as usize;
                slot.copy_from_slice(&[
                    logits[best],
                    (mine.start + best) as f32,
                    log_normalizer(logits),
                ]);
            }
            _ => slot.copy_from_slice(&[f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY]),
        }
    }
    if rank == 0 && whole_rows {
        summary[n * SUMMARY] = 1.0;
    }
    link.reduce(&mut summary)?;
    if summary[n * SUMMARY] != 0.0 {
        // This member's rows in place, zeros elsewhere: the all-reduce adds the others'.
        let mut whole = vec![0f32; rows * vocab];
        if !mine.is_empty() {
            for (i, dst) in whole.chunks_exact_mut(vocab).enumerate() {
                if let Some(src) = shard.row(i) {
                    dst[mine.clone()].copy_from_slice(src);
                }
            }
        }
        link.reduce(&mut whole)?;
        let main = HostMatrix::new(rows, vocab, whole).map_err(crate::seqkv::internal)?;
        return Ok(Merged::Logits(StageOutput { main, pooled }));
    }
    let picks = summary
        .chunks_exact(width)
        .map(|row| pick_of(&row[..n * SUMMARY]))
        .collect();
    Ok(Merged::Picks(Outputs { picks, pooled }))
}

/// The greedy pick of one logits row from every member's (best, id, log-normalizer): the largest
/// best, the lower id on ties (members' rows ascend by rank), its log-probability against the whole
/// row's normalizer.
fn pick_of(members: &[f32]) -> Pick {
    let mut best: Option<(f32, u32)> = None;
    let mut norms = Vec::with_capacity(members.len() / SUMMARY);
    for m in members.chunks_exact(SUMMARY) {
        let (value, id, norm) = (m[0], m[1] as u32, m[2]);
        if norm == f32::NEG_INFINITY {
            continue;
        }
        norms.push(f64::from(norm));
        if best.is_none_or(|(v, i)| value > v || (value == v && id < i)) {
            best = Some((value, id));
        }
    }
    let top = norms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let normalizer = top + norms.iter().map(|v| (v - top).exp()).sum::<f64>().ln();
    let (value, id) = best.unwrap_or((f32::NEG_INFINITY, 0));
    Pick {
        id,
        logprob: value - normalizer as f32,
        top: Vec::new(),
    }
}
