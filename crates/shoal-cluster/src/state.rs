//! The cluster as one node sees it: a plain struct, changed by the network task and tested without any
//! network. Membership = this node + every connected peer whose facts arrived. The coordinator is the
//! member with the smallest id; only it changes the instance table (placements, removals, re-placement
//! when a member leaves), and every node adopts the coordinator's table, keeping the instances the
//! coordinator has not heard of yet (`merge`: tables from different coordinators meet without losing one).
//!
//! The planner's view ([`ClusterState::topology`]) prices each node for the model at hand from its
//! measured compute (`crate::compute`) and offers it the memory the table's instances leave on it
//! (`budget`: weights and KV of every model a node hosts); a placement that does not fit says which
//! instances it would have to evict ([`ClusterState::name_evictions`]).

use shoal_ids::{InstanceId, NodeId};
use std::collections::BTreeMap;

use serde::Serialize;
use shoal_placement::{Constraints, Link, ModelCard, Placement, Topology};

use crate::ClusterError;
use crate::error::PlaceError;
use crate::facts::{InstanceLoad, InstanceStatus, NodeFacts};
use crate::proto::{InstanceRecord, InstanceTable, PlaceRequest};

/// KV tokens reserved per layer when a request does not say (bounded by the model's context).
pub const DEFAULT_KV_RESERVE_TOKENS: usize = 4096;

#[derive(Debug, Clone)]
pub struct ClusterState {
    me: NodeFacts,
    /// Connected peers; `None` until their first facts arrive.
    peers: BTreeMap<NodeId, Option<NodeFacts>>,
    table: InstanceTable,
    /// When this node, as coordinator, began draining each draining instance.
    drain_starts: BTreeMap<InstanceId, moves::DrainStart>,
}

/// What `GET /state` returns under `cluster`: the same on every member once facts have propagated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterView {
    pub coordinator: NodeId,
    pub nodes: Vec<NodeFacts>,
    pub links: Vec<Link>,
    pub instances: Vec<InstanceView>,
    pub table_version: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceView {
    #[serde(flatten)]
    pub record: InstanceRecord,
    pub status: InstanceState,
    /// Load state of each stage, in stage order.
    pub stage_status: Vec<InstanceStatus>,
    /// What the planner predicted for it.
    pub predicted: Predicted,
    /// What its driver measures (queue, requests finished, recent one-stream decode rate and time to
    /// first token); `None` until the driver publishes it (the instance is ready) and after it stops.
    pub measured: Option<InstanceLoad>,
}

/// The planner's figures for a placed instance, shown next to what its driver measures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Predicted {
    /// One stream's decode rate, tokens per second (`1e6 / predicted_token_latency_us`); `None` when
    /// the record has no usable latency.
    pub decode_tok_s: Option<f64>,
}

impl Predicted {
    /// The figures of `record`.
    pub fn of(record: &InstanceRecord) -> Self {
        let rate = 1e6 / record.predicted_token_latency_us;
        Predicted {
            decode_tok_s: (rate.is_finite() && rate > 0.0).then_some(rate),
        }
    }
}

impl InstanceView {
    pub fn is_ready(&self) -> bool {
        self.status == InstanceState::Ready
    }

    pub fn is_failed(&self) -> bool {
        self.status == InstanceState::Failed
    }

    pub fn is_loading(&self) -> bool {
        self.status == InstanceState::Loading
    }

    /// Why it failed, as a sentence naming each failed stage, e.g. `stage 1 (layers 15-30 on node
    /// 12D3KooW…) failed: out of memory`; `None` when no stage failed.
    pub fn failure(&self) -> Option<String> {
        let failed: Vec<String> = self
            .stage_status
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                InstanceStatus::Failed { error } => Some(match self.record.stages.get(i) {
                    Some(st) => format!(
                        "stage {i} (layers {}-{} on node {}) failed: {error}",
                        st.start, st.end, st.node
                    ),
                    None => format!("stage {i} failed: {error}"),
                }),
                _ => None,
            })
            .collect();
        (!failed.is_empty()).then(|| failed.join("; "))
    }
}

/// Load state of an instance as a whole, from its stages' [`InstanceStatus`]: `ready` when every stage
/// is loaded, `failed` when one failed, else `loading` (a JSON string in `GET /state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    Loading,
    Ready,
    Failed,
    /// Replaced by a better placement: takes no new requests, finishes those in flight.
    Draining,
}

impl InstanceState {
    pub fn of(stages: &[InstanceStatus]) -> Self {
        if stages
            .iter()
            .any(|s| matches!(s, InstanceStatus::Failed { .. }))
        {
            InstanceState::Failed
        } else if stages.iter().all(|s| *s == InstanceStatus::Ready) {
            InstanceState::Ready
        } else {
            InstanceState::Loading
        }
    }
}

impl ClusterView {
    /// The instances of `model`, in table order.
    pub fn instances_of<'a>(&'a self, model: &'a str) -> impl Iterator<Item = &'a InstanceView> {
        self.instances
            .iter()
            .filter(move |i| i.record.model == model)
    }
}

impl ClusterState {
    pub fn new(me: NodeFacts) -> Self {
        Self {
            me,
            peers: BTreeMap::new(),
            table: InstanceTable::default(),
            drain_starts: BTreeMap::new(),
        }
    }

    pub fn me(&self) -> &NodeFacts {
        &self.me
    }

    pub fn me_mut(&mut self) -> &mut NodeFacts {
        &mut self.me
    }

    pub fn table(&self) -> &InstanceTable {
        &self.table
    }

    pub fn peer_connected(&mut self, id: &str) {
        self.peers
            .entry(NodeId::parse(id).expect("a connected peer's id"))
            .or_insert(None);
    }

    /// Forgets a peer whose last connection closed; true if it was a member.
    pub fn peer_gone(&mut self, id: &str) -> bool {
        self.peers.remove(id).flatten().is_some()
    }

    pub fn is_connected(&self, id: &str) -> bool {
        self.peers.contains_key(id)
    }

    /// Stores a connected peer's facts if newer than what we have; true when it just became a member.
    pub fn on_facts(&mut self, facts: NodeFacts) -> bool {
        let Some(slot) = self.peers.get_mut(&facts.id) else {
            return false; // not connected (a late message from a closed connection)
        };
        let joined = slot.is_none();
        let newer = slot
            .as_ref()
            .is_none_or(|f| facts.seq > f.seq || facts.started != f.started);
        if newer {
            *slot = Some(facts);
        }
        joined
    }

    /// Ids of all members, sorted (this node included).
    pub fn members(&self) -> Vec<&NodeId> {
        let mut ids: Vec<&NodeId> = self
            .peers
            .iter()
            .filter(|(_, f)| f.is_some())
            .map(|(id, _)| id)
            .chain(std::iter::once(&self.me.id))
            .collect();
        ids.sort_unstable();
        ids
    }

    pub fn member_facts(&self) -> Vec<&NodeFacts> {
        let mut v: Vec<&NodeFacts> = self
            .peers
            .values()
            .flatten()
            .chain(std::iter::once(&self.me))
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    pub fn facts_of(&self, id: &str) -> Option<&NodeFacts> {
        if id == self.me.id {
            Some(&self.me)
        } else {
            self.peers.get(id).and_then(Option::as_ref)
        }
    }

    pub fn coordinator(&self) -> &NodeId {
        self.members().first().copied().unwrap_or(&self.me.id)
    }

    pub fn is_coordinator(&self) -> bool {
        *self.coordinator() == self.me.id
    }

    /// The planner's view of the members (those that have `model`, or all of them with `all`), with the
    /// links they measured, and the model's card from any member that has it. A node's speeds are its
    /// measured compute converted for this model ([`crate::compute::speeds`]); its memory is what it
    /// offers beside the instances the table already puts on it ([`ClusterState::mem_offered`]).
    pub fn topology(&self, model: &str, all: bool) -> (Topology, Option<ModelCard>) {
        let members = self.member_facts();
        let has = |f: &NodeFacts| f.models.iter().any(|m| m.id == model);
        let card = members
            .iter()
            .find_map(|f| f.models.iter().find(|m| m.id == model).cloned());
        let nodes = members
            .iter()
            .filter(|f| all || has(f))
            .map(|f| {
                let mut n = crate::compute::node_info(f, card.as_ref(), self.mem_offered(f));
                if let Some(g) = n.gpu.as_mut() {
                    // What the table's instances already put on it.
                    g.mem_available = g.mem_available.saturating_sub(self.hosted(&f.id).gpu);
                }
                n
            })
            .collect();
        (
            Topology {
                nodes,
                links: self.links(),
            },
            card,
        )
    }

    /// Links between members, one per pair, from the facts of the pair's smaller id (or the other side
    /// when that one has not measured it).
    pub fn links(&self) -> Vec<Link> {
        let members = self.member_facts();
        let mut out: BTreeMap<(NodeId, NodeId), Link> = BTreeMap::new();
        for f in &members {
            for l in &f.links {
                if self.facts_of(&l.peer).is_none() {
                    continue;
                }
                let key = if f.id < l.peer {
                    (f.id.clone(), l.peer.clone())
                } else {
                    (l.peer.clone(), f.id.clone())
                };
                let owner_is_smaller = f.id < l.peer;
                if out.contains_key(&key) && !owner_is_smaller {
                    continue;
                }
                out.insert(
                    key.clone(),
                    Link {
                        a: key.0,
                        b: key.1,
                        kind: l.kind,
                        rtt_us: l.rtt_us,
                        bandwidth_bps: l.bandwidth_bps,
                    },
                );
            }
        }
        out.into_values().collect()
    }

    /// Candidate placements for `req` on the current members, best first. The members that have the model
    /// come first: one that lacks it (and would fetch it from its peers or the internet) is used when it is
    /// pinned, or when the model does not fit on those that have it.
    pub fn previews(&self, req: &PlaceRequest) -> Result<Vec<Placement>, PlaceError> {
        self.previews_among(req, &|_| true)
    }

    /// [`Self::previews`] on the members `keep` accepts (the others are left out of the topology).
    pub(crate) fn previews_among(
        &self,
        req: &PlaceRequest,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Placement>, PlaceError> {
        let (mut holders, card) = self.topology(&req.model, false);
        holders.nodes.retain(|n| keep(&n.id));
        let card = card.ok_or_else(|| PlaceError::UnknownModel {
            model: req.model.clone(),
        })?;
        let constraints = constraints(req, &card)?;
        let plan = |topology: &Topology| -> Result<Vec<Placement>, PlaceError> {
            let all = shoal_placement::plan(topology, &card, &constraints)?;
            groups_as_asked(req, &card, all)
        };
        let pins_a_lacking_node = req.nodes.as_ref().is_some_and(|nodes| {
            nodes
                .iter()
                .any(|n| !holders.nodes.iter().any(|h| &h.id == n))
        });
        let everyone = || {
            let mut all = self.topology(&req.model, true).0;
            all.nodes.retain(|n| keep(&n.id));
            all
        };
        if pins_a_lacking_node {
            return plan(&everyone());
        }
        match plan(&holders) {
            Ok(p) => Ok(p),
            Err(first) => {
                let all = everyone();
                if all.nodes.len() == holders.nodes.len() {
                    return Err(first);
                }
                plan(&all).map_err(|_| first)
            }
        }
    }

    /// Changing the table is the coordinator's job alone.
    fn check_coordinator(&self) -> Result<(), ClusterError> {
        if self.is_coordinator() {
            Ok(())
        } else {
            Err(ClusterError::NotCoordinator {
                coordinator: self.coordinator().clone(),
            })
        }
    }

    /// Places `req` as instance `id` and adds it to the table (coordinator only).
    pub fn place(
        &mut self,
        req: &PlaceRequest,
        id: InstanceId,
    ) -> Result<InstanceRecord, ClusterError> {
        self.check_coordinator()?;
        let best = self
            .previews(req)
            .map_err(|e| self.name_evictions(req, e))?
            .into_iter()
            .next()
            .ok_or(PlaceError::NoCandidate)?;
        let record = InstanceRecord::placed(id, req.model.clone(), best);
        self.table.instances.push(record.clone());
        if req.nodes.is_none() && req.layers.is_none() {
            self.mark_movable(&record.id);
        }
        self.table.version += 1;
        Ok(record)
    }

    /// Removes instance `id` (coordinator only); false when there is none.
    pub fn remove(&mut self, id: &InstanceId) -> Result<bool, ClusterError> {
        self.check_coordinator()?;
        let removed = self.table.instances.iter().any(|i| i.id == *id);
        if removed {
            self.forget_instance(id);
            self.table.version += 1;
        }
        Ok(removed)
    }

    /// Coordinator duty after membership changes: every instance that uses a node that left is placed
    /// again on the members (automatically, under a fresh id from `new_id`), or dropped if it no longer
    /// fits. True when the table changed.
    pub fn reconcile(&mut self, mut new_id: impl FnMut() -> InstanceId) -> bool {
        if !self.is_coordinator() {
            return false;
        }
        let members: Vec<NodeId> = self.members().into_iter().cloned().collect();
        let broken: Vec<InstanceRecord> = self
            .table
            .instances
            .iter()
            .filter(|i| {
                i.stages
                    .iter()
                    .any(|s| s.nodes().any(|n| !members.contains(n)))
            })
            .cloned()
            .collect();
        if broken.is_empty() {
            return false;
        }
        for old in broken {
            self.forget_instance(&old.id);
            let req = PlaceRequest::of(old.model.clone());
            match self.previews(&req) {
                Ok(p) if !p.is_empty() => {
                    // Keep the old driver when it is still here: clients talk to its API.
                    let best = p
                        .iter()
                        .find(|c| {
                            c.stages.first().map(|s| &s.node) == old.stages.first().map(|s| &s.node)
                        })
                        .unwrap_or(&p[0]);
                    tracing::info!(old = %old.id, model = %old.model, "re-placing an instance whose node left");
                    metrics::counter!("shoal_instance_replacements_total", "model" => old.model.to_string(), "outcome" => "placed").increment(1);
                    let id = new_id();
                    self.mark_movable(&id);
                    let record = InstanceRecord::replacing(id, &old, best.clone());
                    self.table.instances.push(record);
                }
                Ok(_) | Err(_) => {
                    tracing::warn!(old = %old.id, model = %old.model, "instance dropped: it no longer fits on the members");
                    metrics::counter!("shoal_instance_replacements_total", "model" => old.model.to_string(), "outcome" => "dropped").increment(1);
                }
            }
        }
        self.table.version += 1;
        true
    }

    /// The view `GET /state` shows.
    pub fn view(&self) -> ClusterView {
        let instances = self
            .table
            .instances
            .iter()
            .map(|r| {
                let stage_status: Vec<InstanceStatus> = r
                    .stages
                    .iter()
                    .map(|s| {
                        self.facts_of(&s.node)
                            .and_then(|f| f.instances.get(&r.id).cloned())
                            .unwrap_or(InstanceStatus::Loading)
                    })
                    .collect();
                let status = if self.is_draining(&r.id) {
                    InstanceState::Draining
                } else {
                    InstanceState::of(&stage_status)
                };
                let measured = r
                    .driver()
                    .and_then(|d| self.facts_of(d))
                    .and_then(|f| f.load.get(&r.id).cloned());
                InstanceView {
                    record: r.clone(),
                    status,
                    stage_status,
                    predicted: Predicted::of(r),
                    measured,
                }
            })
            .collect();
        ClusterView {
            coordinator: self.coordinator().clone(),
            nodes: self.member_facts().into_iter().cloned().collect(),
            links: self.links(),
            instances,
            table_version: self.table.version,
        }
    }
}

/// Planner constraints for a request.
/// The planner's candidates as `req.tensor_parallel` asks: only the tensor-parallel group of all of
/// `req.nodes` (its rank 0 first when it was offered that way), none, or all of them as ranked.
fn groups_as_asked(
    req: &PlaceRequest,
    card: &ModelCard,
    all: Vec<Placement>,
) -> Result<Vec<Placement>, PlaceError> {
    let is_group = |p: &Placement| p.stages.iter().any(|s| s.group.is_some());
    match req.tensor_parallel {
        None => Ok(all),
        Some(false) => {
            let rest: Vec<Placement> = all.into_iter().filter(|p| !is_group(p)).collect();
            if rest.is_empty() {
                return Err(PlaceError::NoCandidate);
            }
            Ok(rest)
        }
        Some(true) => {
            let nodes = req.nodes.as_deref().unwrap_or_default();
            let whole = |p: &Placement| {
                p.stages.len() == 1 && {
                    let mut got: Vec<&NodeId> = p.stages[0].nodes().collect();
                    let mut want: Vec<&NodeId> = nodes.iter().collect();
                    got.sort();
                    want.sort();
                    got == want
                }
            };
            let mut groups: Vec<Placement> = all.into_iter().filter(whole).collect();
            // The request's first node as rank 0 where the planner offered that order.
            groups.sort_by_key(|p| p.stages[0].node != nodes[0]);
            if groups.is_empty() {
                return Err(PlaceError::NoGroup {
                    model: card.id.clone(),
                    nodes: nodes.len(),
                    max_group: card.max_group.min(shoal_placement::MAX_GROUP),
                    why: "the planner found no group of these nodes that fits their memory".into(),
                });
            }
            Ok(groups)
        }
    }
}

pub fn constraints(req: &PlaceRequest, card: &ModelCard) -> Result<Constraints, PlaceError> {
    if req.tensor_parallel == Some(true) {
        if req.layers.is_some() {
            return Err(PlaceError::GroupWithLayers);
        }
        let n = req.nodes.as_ref().map_or(0, Vec::len);
        if n < 2 {
            return Err(PlaceError::GroupWithoutNodes);
        }
        if n > card.max_group.min(shoal_placement::MAX_GROUP) {
            return Err(PlaceError::NoGroup {
                model: card.id.clone(),
                nodes: n,
                max_group: card.max_group.min(shoal_placement::MAX_GROUP),
                why: "its heads, feed-forward columns or experts do not cut that many ways".into(),
            });
        }
    }
    let kv = req
        .kv_reserve_tokens
        .unwrap_or(DEFAULT_KV_RESERVE_TOKENS.min(card.context_length));
    let layer_counts = match (&req.layers, &req.nodes) {
        (Some(counts), Some(nodes)) => {
            if counts.len() != nodes.len() {
                return Err(PlaceError::LayerCounts {
                    counts: counts.len(),
                    nodes: nodes.len(),
                });
            }
            Some(nodes.iter().cloned().zip(counts.iter().copied()).collect())
        }
        (Some(_), None) => return Err(PlaceError::LayersWithoutNodes),
        (None, _) => None,
    };
    Ok(Constraints {
        pinned_nodes: req.nodes.clone(),
        keep_order: req.layers.is_some(),
        layer_counts,
        kv_reserve_tokens: kv,
        max_stages: req.max_stages,
        goal: req.goal.unwrap_or_default(),
        ..Constraints::default()
    })
}

mod merge;
mod moves;
mod replicas;

pub use merge::REMEMBERED_REMOVALS;

pub use moves::{DRAIN_LIMIT, MOVE_MARGIN};
mod budget;
pub use budget::{Hosted, os_reserve};
#[cfg(test)]
mod tests;

#[cfg(test)]
mod failure_sentences {
    use super::*;

    #[test]
    fn a_failed_instance_reads_as_a_sentence_naming_each_failed_stage() {
        let stage =
            |node: &str, start, end| shoal_placement::Stage::cpu(node.parse().unwrap(), start, end);
        let view = InstanceView {
            record: InstanceRecord {
                id: InstanceId::derived_from("i1"),
                model: "m".parse().unwrap(),
                stages: vec![stage("a", 0, 15), stage("b", 15, 30)],
                predicted_token_latency_us: 1000.0,
                explanation: String::new(),
                prediction: Default::default(),
                lineage: None,
            },
            status: InstanceState::Failed,
            stage_status: vec![
                InstanceStatus::Ready,
                InstanceStatus::Failed {
                    error: "not enough memory for layers 15-30".into(),
                },
            ],
            predicted: Predicted { decode_tok_s: None },
            measured: None,
        };
        assert_eq!(
            view.failure().as_deref(),
            Some("stage 1 (layers 15-30 on node b) failed: not enough memory for layers 15-30")
        );
        let ready = InstanceView {
            stage_status: vec![InstanceStatus::Ready; 2],
            status: InstanceState::Ready,
            ..view
        };
        assert_eq!(ready.failure(), None);
    }
}
