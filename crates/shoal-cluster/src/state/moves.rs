//! Moving an instance to a better placement without dropping a request (coordinator only).
//!
//! Every few seconds the coordinator solves the placement of each automatically placed instance again on
//! the current members, links and measured speeds ([`ClusterState::plan_moves`]). A placement predicted
//! faster by [`MOVE_MARGIN`] is started as a new instance next to the old one (a [`Move`] in the table);
//! the old one keeps serving while the new one loads. When the new one is ready, the old one drains
//! ([`crate::proto::InstanceTable::draining`]: its driver stops taking requests, those in flight
//! finish) and leaves the table once its driver reports it idle, or after [`DRAIN_LIMIT`]. A new
//! instance that fails is dropped and the old one stays ([`ClusterState::advance_moves`]). Pinned
//! instances never move: the user's pins win.

use shoal_ids::InstanceId;
use std::time::{Duration, Instant};

use super::{ClusterState, InstanceState};
use crate::proto::{InstanceRecord, Move, PlaceRequest};

/// A move is made only when the new placement is predicted at least this much faster (fraction of the
/// time per token, for the instance's goal: one stream's, or the aggregate's): measurements wobble, and
/// a move costs a load.
pub const MOVE_MARGIN: f64 = 0.15;
/// A draining instance leaves the table after this long even if requests still run on it (they end
/// with an error).
pub const DRAIN_LIMIT: Duration = Duration::from_secs(300);
/// Without a load report from its driver (an older node), a draining instance leaves after this long.
pub const DRAIN_UNREPORTED: Duration = Duration::from_secs(30);

/// When the coordinator started draining an instance, and its driver's facts `seq` at that moment (a
/// load report is trusted only when it is newer).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DrainStart {
    at: Instant,
    driver_seq: u64,
}

impl ClusterState {
    /// Records that `id` was placed automatically (the coordinator may move it later).
    pub(crate) fn mark_movable(&mut self, id: &InstanceId) {
        if !self.table.movable.iter().any(|m| m == id) {
            self.table.movable.push(*id);
        }
    }

    /// Whether instance `id` is draining (taking no new requests).
    pub fn is_draining(&self, id: &InstanceId) -> bool {
        self.table.draining.iter().any(|d| d == id)
    }

    /// Solves the placement of every movable, ready instance again and starts a move where a placement
    /// is predicted faster by [`MOVE_MARGIN`] (one move per model at a time). True when the table changed.
    pub fn plan_moves(&mut self, mut new_id: impl FnMut() -> InstanceId) -> bool {
        if !self.is_coordinator() {
            return false;
        }
        let view = self.view();
        let mut started = Vec::new();
        for inst in &view.instances {
            let rec = &inst.record;
            let busy = self.table.moves.iter().any(|m| {
                [&m.old, &m.new].iter().any(|id| {
                    self.table
                        .instances
                        .iter()
                        .any(|i| &i.id == *id && i.model == rec.model)
                })
            });
            if busy
                || inst.status != InstanceState::Ready
                || !self.table.movable.contains(&rec.id)
                || self.is_draining(&rec.id)
                || started
                    .iter()
                    .any(|(r, _): &(InstanceRecord, _)| r.model == rec.model)
            {
                continue;
            }
            let goal = rec.prediction.goal;
            let Some(now_tok_s) = self.goal_tok_s_now(rec) else {
                continue;
            };
            let req = PlaceRequest {
                goal: Some(goal),
                ..PlaceRequest::of(rec.model.clone())
            };
            let Ok(previews) = self.previews(&req) else {
                continue;
            };
            let Some(best) = previews.into_iter().next() else {
                continue;
            };
            let best_tok_s = best.prediction.goal_tok_s();
            if best.stages != rec.stages && best_tok_s * (1.0 - MOVE_MARGIN) > now_tok_s {
                tracing::info!(
                    instance = %rec.id, model = %rec.model, goal = goal.name(),
                    now_tok_s, predicted_tok_s = best_tok_s,
                    "moving an instance to a placement predicted faster"
                );
                started.push((rec.clone(), best));
            }
        }
        if started.is_empty() {
            return false;
        }
        for (old, best) in started {
            let id = new_id();
            let record = InstanceRecord::placed(id, old.model.clone(), best);
            self.table.instances.push(record);
            self.table.movable.push(id);
            self.table.moves.push(Move {
                old: old.id,
                new: id,
            });
        }
        self.table.version += 1;
        true
    }

    /// The goal's rate the planner predicts for `rec`'s stages on today's members, links and speeds.
    fn goal_tok_s_now(&self, rec: &InstanceRecord) -> Option<f64> {
        let (topology, card) = self.topology(&rec.model, true);
        let goal = rec.prediction.goal;
        let prompt = rec.prediction.prompt_tokens.max(1);
        shoal_placement::forecast(&topology, &card?, &rec.stages, goal, prompt)
            .map(|p| p.goal_tok_s())
    }

    /// Moves forward: a new instance that is ready sends its old one draining; a new one that failed is
    /// dropped; a drained (or overdue) old one leaves the table; bookkeeping of instances gone is swept.
    /// True when the table changed.
    pub fn advance_moves(&mut self, now: Instant) -> bool {
        if !self.is_coordinator() {
            return false;
        }
        let before = self.table.clone();
        let view = self.view();
        let status = |id: &InstanceId| {
            view.instances
                .iter()
                .find(|i| i.record.id == *id)
                .map(|i| i.status)
        };
        for m in self.table.moves.clone() {
            match (status(&m.old), status(&m.new)) {
                (Some(_), Some(InstanceState::Ready)) if !self.is_draining(&m.old) => {
                    tracing::info!(old = %m.old, new = %m.new, "new placement ready: the old instance drains");
                    self.table.draining.push(m.old);
                }
                (_, Some(InstanceState::Failed)) => {
                    tracing::warn!(old = %m.old, new = %m.new, "the new placement failed to load: keeping the old one");
                    self.forget_instance(&m.new);
                }
                _ => {}
            }
        }
        for id in self.table.draining.clone() {
            if self.drained(&id, now) {
                tracing::info!(instance = %id, "drained: removed");
                self.forget_instance(&id);
            }
        }
        let present = |id: &InstanceId, t: &[InstanceRecord]| t.iter().any(|i| &i.id == id);
        let instances = self.table.instances.clone();
        self.table.draining.retain(|id| present(id, &instances));
        self.table.movable.retain(|id| present(id, &instances));
        self.table
            .moves
            .retain(|m| present(&m.old, &instances) && present(&m.new, &instances));
        self.drain_starts
            .retain(|id, _| instances.iter().any(|i| &i.id == id));
        if self.table != before {
            self.table.version = before.version + 1;
            true
        } else {
            false
        }
    }

    /// Whether draining instance `id` may leave: its driver reported it idle after draining began, or it
    /// has drained long enough.
    fn drained(&mut self, id: &InstanceId, now: Instant) -> bool {
        let Some(driver) = self
            .table
            .instances
            .iter()
            .find(|i| i.id == *id)
            .and_then(|i| i.driver().cloned())
        else {
            return true;
        };
        let facts = self.facts_of(&driver).cloned();
        let seq = facts.as_ref().map_or(0, |f| f.seq);
        let start = *self.drain_starts.entry(*id).or_insert(DrainStart {
            at: now,
            driver_seq: seq,
        });
        let waited = now.saturating_duration_since(start.at);
        if waited >= DRAIN_LIMIT {
            tracing::warn!(instance = %id, "drain took too long: its remaining requests end");
            return true;
        }
        match facts.as_ref().and_then(|f| f.load.get(id)) {
            Some(load) => {
                reported_after(seq, start.driver_seq) && load.running == 0 && load.queued == 0
            }
            None => waited >= DRAIN_UNREPORTED,
        }
    }
}

/// A report in facts `seq` was made after the facts seen at `start_seq` (two publications later, so the
/// driver had heard of the drain when it made it).
fn reported_after(seq: u64, start_seq: u64) -> bool {
    seq >= start_seq + 2
}

#[cfg(test)]
mod tests;
