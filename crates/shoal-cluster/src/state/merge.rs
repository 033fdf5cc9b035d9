//! Instance tables meeting: how a node takes a table from a peer without losing an instance.
//!
//! Only the coordinator changes the table ([`InstanceTable`]), but tables from different coordinators
//! meet: a node that placed its own instance as its own coordinator joins a cluster, a node with a
//! smaller id joins and becomes coordinator, two clusters join. Versions count one coordinator's
//! changes, so they cannot say whether a table that lacks an instance removed it or never knew it.
//! The table's `removed` list can: every instance a coordinator takes out is remembered there
//! ([`ClusterState::forget_instance`], the last [`REMEMBERED_REMOVALS`]), and it travels with the table.
//!
//! So the instances of two tables are their union less every removed one ([`ClusterState::take_unknown`]),
//! on both sides:
//! - a member adopts a coordinator's table (as new as its own or newer: an older one may be a stale
//!   message) and keeps the instances the coordinator has not heard of, then offers its table back;
//! - the coordinator merges a member's table of any version, and sends the result to everyone.
//!
//! With `movable`, `moves` and `draining`, the table that knew an instance first says how it goes.
//!
//! One exception to "removed stays removed": an instance placed again because a node left carries its
//! [`Lineage`](crate::proto::Lineage). When a partition heals, each side may have placed the same instance
//! again on the members it saw (a node cut off alone places the whole model on itself), or kept it
//! while the other side replaced it; the removal a side made by re-placing is then no user's wish.
//! Instances of one origin are rivals and one is kept ([`rank`]): a live one (every stage on a member)
//! first, then the one still driven by the origin's driver (its clients talk to that node), else the
//! latest re-placement, else the smallest id. A removed instance comes back only to be weighed so, and
//! only when it is live (a stale table's instance on a node that left stays removed). The others are
//! removed like any instance, so the decision spreads with the table and both sides reach it alone. A
//! member never drops the coordinator's instance for one of its own: its view may lag (a rival's
//! node not a member yet in its eyes); it offers its table back and the coordinator decides.

use super::ClusterState;
use crate::proto::{InstanceRecord, InstanceTable};
use shoal_ids::{InstanceId, NodeId};
use std::cmp::Reverse;

/// How instances of one origin compare (the smallest is kept): live first (every stage on a member),
/// then driven by the origin's driver, then the latest re-placement, then the smallest id.
fn rank(i: &InstanceRecord, members: &[NodeId]) -> (bool, bool, Reverse<u32>, InstanceId) {
    let live = i
        .stages
        .iter()
        .all(|s| s.nodes().all(|n| members.contains(n)));
    (
        !live,
        i.driver() != i.first_driver(),
        Reverse(i.generation()),
        i.id,
    )
}

/// How many removed instance ids a table remembers (the oldest are forgotten first). A table that
/// missed more removals than this could bring one back; every table crosses the cluster each second,
/// and a removal is a user's request, a move or a lost node.
pub const REMEMBERED_REMOVALS: usize = 128;

impl ClusterState {
    /// A table from `from`. Members adopt the coordinator's table, keeping the instances it has not heard
    /// of; one older than theirs is not adopted (a late message, or a new coordinator with an older
    /// table). The coordinator merges a member's table. True when this node should send its table to
    /// everyone: the coordinator's changed, or a member holds what the coordinator lacks.
    pub fn on_table(&mut self, from: &str, table: InstanceTable) -> bool {
        if from == self.coordinator() {
            if table.version < self.table.version {
                return true;
            }
            let ours = std::mem::replace(&mut self.table, table);
            // The coordinator's instances stay whatever this node's view says of their rivals: it may
            // lag (a peer's facts not here yet) and would tear down a stage the coordinator keeps.
            let keep: Vec<InstanceId> = self.table.instances.iter().map(|i| i.id).collect();
            return self.take_unknown_keeping(ours, &keep);
        }
        if !self.is_coordinator() {
            return false;
        }
        let version = table.version;
        let changed = self.take_unknown(table);
        if changed || version > self.table.version {
            self.table.version = version.max(self.table.version) + 1;
            return true;
        }
        false
    }

    /// Takes from `other` the removals of instances this table holds (they leave) and the instances it
    /// neither knows nor removed, with what `other` says about them (movable, a move they are part of,
    /// draining). True when this table's instances changed. A removal of an instance this table does
    /// not hold is not copied: the lists would trade their oldest entries back and forth forever.
    /// Rivals (instances of one origin, on either side) are not removals: one is kept ([`rank`]).
    pub(crate) fn take_unknown(&mut self, other: InstanceTable) -> bool {
        self.take_unknown_keeping(other, &[])
    }

    /// [`Self::take_unknown`], never dropping the instances `keep` names for a rival.
    fn take_unknown_keeping(&mut self, other: InstanceTable, keep: &[InstanceId]) -> bool {
        let before: Vec<InstanceId> = self.table.instances.iter().map(|i| i.id).collect();
        let members: Vec<NodeId> = self.members().into_iter().cloned().collect();
        let live = |i: &InstanceRecord| {
            i.stages
                .iter()
                .all(|s| s.nodes().all(|n| members.contains(n)))
        };
        // A rival of `i` in `t`: another instance of the same origin (live or not as this node sees
        // it now: a table can arrive before its sender's facts; [`rank`] weighs liveness).
        let rival_in = |t: &InstanceTable, i: &InstanceRecord| {
            t.instances
                .iter()
                .any(|j| j.id != i.id && j.origin() == i.origin())
        };
        for id in &other.removed {
            let Some(ours) = self.table.instances.iter().find(|i| &i.id == id) else {
                continue;
            };
            if !rival_in(&other, ours) {
                self.forget_instance(id);
            }
        }
        let known = |t: &InstanceTable, i: &InstanceRecord| {
            t.instances.iter().any(|j| j.id == i.id)
                || (t.removed.contains(&i.id) && !(live(i) && rival_in(t, i)))
        };
        let new: Vec<InstanceRecord> = other
            .instances
            .into_iter()
            .filter(|i| !known(&self.table, i))
            .collect();
        self.table
            .removed
            .retain(|r| !new.iter().any(|i| i.id == *r));
        let is_new = |id: &InstanceId| new.iter().any(|i| i.id == *id);
        for id in other.movable.iter().filter(|id| is_new(id)) {
            self.mark_movable(id);
        }
        for id in other.draining.iter().filter(|id| is_new(id)) {
            if !self.is_draining(id) {
                self.table.draining.push(*id);
            }
        }
        for m in other.moves {
            if (is_new(&m.old) || is_new(&m.new)) && !self.table.moves.contains(&m) {
                self.table.moves.push(m);
            }
        }
        self.table.instances.extend(new);
        self.drop_rivals(&members, keep);
        let after = self.table.instances.iter().map(|i| i.id);
        after.ne(before.iter().copied())
    }

    /// Keeps one of each set of instances of one origin ([`rank`]).
    fn drop_rivals(&mut self, members: &[NodeId], keep: &[InstanceId]) {
        let ranked = |i: &InstanceRecord| rank(i, members);
        let losers: Vec<InstanceId> = self
            .table
            .instances
            .iter()
            .filter(|i| !keep.contains(&i.id))
            .filter(|i| {
                self.table
                    .instances
                    .iter()
                    .any(|j| j.id != i.id && j.origin() == i.origin() && ranked(j) < ranked(i))
            })
            .map(|i| i.id)
            .collect();
        for id in &losers {
            tracing::info!(instance = %id, "a rival placement of the same instance is kept instead (tables met after a partition)");
            self.forget_instance(id);
        }
    }

    /// Takes instance `id` out of the table, with its bookkeeping (movable, moves, draining), and
    /// remembers the removal so that no merge brings it back. Bumping the version is the caller's.
    pub(crate) fn forget_instance(&mut self, id: &InstanceId) {
        let t = &mut self.table;
        t.instances.retain(|i| i.id != *id);
        t.movable.retain(|m| m != id);
        t.draining.retain(|d| d != id);
        t.moves.retain(|m| m.old != *id && m.new != *id);
        self.drain_starts.remove(id);
        if !t.removed.iter().any(|r| r == id) {
            t.removed.push(*id);
        }
        let excess = t.removed.len().saturating_sub(REMEMBERED_REMOVALS);
        t.removed.drain(..excess);
    }
}

#[cfg(test)]
mod tests;
