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

use super::ClusterState;
use crate::proto::{InstanceRecord, InstanceTable};
use shoal_ids::InstanceId;

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
            return self.take_unknown(ours);
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
    pub(crate) fn take_unknown(&mut self, other: InstanceTable) -> bool {
        let mut changed = false;
        for id in &other.removed {
            if self.table.instances.iter().any(|i| &i.id == id) {
                self.forget_instance(id);
                changed = true;
            }
        }
        let known = |t: &InstanceTable, id: &InstanceId| {
            t.instances.iter().any(|i| i.id == *id) || t.removed.iter().any(|r| r == id)
        };
        let new: Vec<InstanceRecord> = other
            .instances
            .into_iter()
            .filter(|i| !known(&self.table, &i.id))
            .collect();
        if new.is_empty() {
            return changed;
        }
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
        true
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
