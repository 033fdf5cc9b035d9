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

use crate::batch::{ChunkSpec, KvOp, StageData};
use crate::error::EngineError;

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
    /// Rank 0: sends `batch`'s `input` (token ids or hidden states) to the other members before it
    /// computes its share, with where each chunk starts in its sequence (`starts`, what rank 0's cache
    /// holds: a member whose cache disagrees has fallen out of step); other ranks: nothing.
    fn send_batch(
        &mut self,
        batch: &[ChunkSpec],
        starts: &[usize],
        input: &StageData,
    ) -> Result<(), EngineError>;
    /// Rank 0: sends a KV change it applied to the other members; other ranks: nothing.
    fn send_kv(&mut self, change: GroupKv) -> Result<(), EngineError>;
    /// Makes `partial` (`rows × dim`, this member's partial sums) the sum of every member's, added
    /// in rank order (every member gets the same bits).
    fn reduce(&mut self, partial: &mut [f32]) -> Result<(), EngineError>;
}
