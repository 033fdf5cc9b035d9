//! A node's memory budget across every model it hosts, and what a placement that does not fit would
//! have to evict.
//!
//! [`ClusterState::mem_offered`] is what [`ClusterState::topology`] gives the planner as a node's
//! `mem_available` for a new instance:
//!
//! `min(available − pending, total − hosted − reserve)`
//!
//! - `hosted`: the bytes every stage the instance table puts on the node needs at full size — its
//!   weights, first/last extras and KV reserve ([`ModelCard::stage_bytes`], with the KV tokens the node
//!   published for that instance in `kv_capacity`, else [`DEFAULT_KV_RESERVE_TOKENS`] bounded by the
//!   context), whatever the instance's model and state (loading, ready or draining);
//! - `pending`: the weights (no KV) of those stages that are not loaded yet (the node does not report
//!   them `ready`);
//! - `reserve`: a tenth of `total`, between 256 MiB and 2 GiB, for the OS and other programs.
//!
//! A stage whose record puts its first layers on the node's GPU counts those layers (weights and KV
//! reserve) in [`Hosted::gpu`] instead, which [`ClusterState::topology`] takes off the device memory the
//! node's GPU offers.
//!
//! Why both terms, and no double count: a stage's weights are read into the process's own memory
//! (not mapped from the file), so once loaded they are already missing from the OS's `available`; the
//! first term takes off only what has yet to arrive. The KV cache is allocated as requests come, so
//! `available` does not see a hosted instance's KV reserve until it is used; the second term counts
//! every hosted stage at its full size against `total`. The minimum of the two never subtracts a
//! loaded stage twice. Not covered: a KV reserve promised but not yet used while other programs have
//! since taken memory (the first term does not see the promise).
//!
//! When a request does not fit, [`ClusterState::name_evictions`] looks for the fewest instances
//! whose removal would let it fit (largest first, then dropping any not needed) and turns the error
//! into [`PlaceError::NeedsEviction`], which names them.

use shoal_ids::InstanceId;
use shoal_placement::ModelCard;

use super::{ClusterState, DEFAULT_KV_RESERVE_TOKENS};
use crate::error::PlaceError;
use crate::facts::{InstanceStatus, NodeFacts};
use crate::proto::{InstanceRecord, PlaceRequest};

/// Bytes kept free for the OS and other programs on a node of `total` bytes.
pub fn os_reserve(total: u64) -> u64 {
    (total / 10).clamp(256 << 20, 2 << 30)
}

/// What the table's instances take on one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hosted {
    /// Full size of every stage on the node (weights, extras, KV reserve).
    pub bytes: u64,
    /// Weights of the stages not loaded yet.
    pub pending: u64,
    /// Full size of the layers those stages put on the node's GPU (counted there, not in `bytes`).
    pub gpu: u64,
}

impl ClusterState {
    /// The card of `model` from any member that has it.
    pub fn card_of(&self, model: &str) -> Option<&ModelCard> {
        self.member_facts()
            .into_iter()
            .find_map(|f| f.models.iter().find(|m| m.id == model))
    }

    /// What the instances of the table take on node `node` (see the module docs). An instance whose
    /// model no member describes any more counts nothing (its size is unknown).
    pub fn hosted(&self, node: &str) -> Hosted {
        let facts = self.facts_of(node);
        let mut out = Hosted::default();
        for inst in &self.table.instances {
            let kv = facts.and_then(|f| f.kv_capacity.get(&inst.id).copied());
            let loaded = facts
                .and_then(|f| f.instances.get(&inst.id))
                .is_some_and(|st| *st == InstanceStatus::Ready);
            for s in self
                .stage_sizes(inst, kv)
                .into_iter()
                .filter(|s| s.0 == node)
            {
                out.bytes = out.bytes.saturating_add(s.1);
                out.gpu = out.gpu.saturating_add(s.3);
                if !loaded {
                    out.pending = out.pending.saturating_add(s.2);
                }
            }
        }
        out
    }

    /// `(node, full bytes, weight bytes)` of each stage of `inst`, with `kv_tokens` of KV reserve per
    /// layer (default: [`DEFAULT_KV_RESERVE_TOKENS`] bounded by the context); none when no member
    /// describes its model.
    fn stage_sizes<'a>(
        &self,
        inst: &'a InstanceRecord,
        kv_tokens: Option<u64>,
    ) -> Vec<(&'a str, u64, u64, u64)> {
        let Some(card) = self.card_of(&inst.model) else {
            return Vec::new();
        };
        let kv = kv_tokens.map_or(DEFAULT_KV_RESERVE_TOKENS.min(card.context_length), |t| {
            usize::try_from(t).unwrap_or(usize::MAX)
        });
        let last = inst.stages.len().saturating_sub(1);
        inst.stages
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let (first, is_last) = (i == 0, i == last);
                // The layers its record puts on the GPU are in device memory (the extras stay
                // counted on the host, as the planner counts them).
                let on_gpu = s.gpu_layers() as u64;
                let gpu = on_gpu.saturating_mul(card.per_layer_bytes(kv));
                let full = card
                    .stage_bytes(s.layers(), first, is_last, kv)
                    .saturating_sub(gpu);
                let weights = card
                    .stage_bytes(s.layers(), first, is_last, 0)
                    .saturating_sub(on_gpu.saturating_mul(card.layer_bytes));
                (s.node.as_str(), full, weights, gpu)
            })
            .collect()
    }

    /// Bytes node `f` offers the planner for a new instance (see the module docs). A node that could
    /// not read its memory (`total` 0) offers what it published as available.
    pub fn mem_offered(&self, f: &NodeFacts) -> u64 {
        let (total, available) = (f.memory.total, f.memory.available);
        if total == 0 {
            return available;
        }
        let h = self.hosted(&f.id);
        let left = total
            .saturating_sub(h.bytes)
            .saturating_sub(os_reserve(total));
        available.saturating_sub(h.pending).min(left)
    }

    /// This state without the instances `ids` (what the cluster would look like had they been
    /// removed): for planning as if they were gone.
    pub fn without_instances(&self, ids: &[InstanceId]) -> Self {
        let mut s = self.clone();
        s.table.instances.retain(|i| !ids.contains(&i.id));
        s
    }

    /// `err` from planning `req`, or, when `req` would fit after removing some instances of the
    /// table, [`PlaceError::NeedsEviction`] naming the fewest this search finds (largest first, then
    /// every one not needed dropped again). Errors that removing every instance would not cure come
    /// back as they are.
    pub fn name_evictions(&self, req: &PlaceRequest, err: PlaceError) -> PlaceError {
        let fits = |ids: &[InstanceId]| self.without_instances(ids).previews(req).is_ok();
        let mut by_size: Vec<(InstanceId, u64)> = self
            .table
            .instances
            .iter()
            .map(|i| {
                let sizes = self.stage_sizes(i, None).into_iter().map(|s| s.1);
                (i.id, sizes.fold(0u64, u64::saturating_add))
            })
            .collect();
        let all: Vec<InstanceId> = by_size.iter().map(|(id, _)| *id).collect();
        if all.is_empty() || !fits(&all) {
            return err;
        }
        by_size.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut evict: Vec<InstanceId> = Vec::new();
        for (id, _) in &by_size {
            evict.push(*id);
            if fits(&evict) {
                break;
            }
        }
        // Smallest first: keep every instance the request fits without.
        for i in (0..evict.len()).rev() {
            let mut fewer = evict.clone();
            fewer.remove(i);
            if fits(&fewer) {
                evict = fewer;
            }
        }
        let instances = evict
            .iter()
            .filter_map(|id| self.table.instances.iter().find(|i| i.id == *id))
            .map(|i| format!("{} ({})", i.id, i.model))
            .collect();
        PlaceError::NeedsEviction {
            model: req.model.clone(),
            instances,
            reason: Box::new(err),
        }
    }
}
