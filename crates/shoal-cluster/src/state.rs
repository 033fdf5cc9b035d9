//! The cluster as one node sees it: a plain struct, changed by the network task and tested without any
//! network. Membership = this node + every connected peer whose facts arrived. The coordinator is the
//! member with the smallest id; only it changes the instance table (placements, removals, re-placement
//! when a member leaves), and every node adopts the coordinator's table.

use std::collections::BTreeMap;

use serde::Serialize;
use shoal_placement::{Constraints, Link, ModelCard, NodeInfo, Placement, Topology};

use crate::ClusterError;
use crate::error::PlaceError;
use crate::facts::{InstanceStatus, NodeFacts};
use crate::proto::{InstanceRecord, InstanceTable, PlaceRequest};

/// KV tokens reserved per layer when a request does not say (bounded by the model's context).
pub const DEFAULT_KV_RESERVE_TOKENS: usize = 4096;

#[derive(Debug, Clone)]
pub struct ClusterState {
    me: NodeFacts,
    /// Connected peers; `None` until their first facts arrive.
    peers: BTreeMap<String, Option<NodeFacts>>,
    table: InstanceTable,
}

/// What `GET /state` returns under `cluster`: the same on every member once facts have propagated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterView {
    pub coordinator: String,
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
}

/// Load state of an instance as a whole, from its stages' [`InstanceStatus`]: `ready` when every stage
/// is loaded, `failed` when one failed, else `loading` (a JSON string in `GET /state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    Loading,
    Ready,
    Failed,
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
        self.peers.entry(id.to_owned()).or_insert(None);
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
    pub fn members(&self) -> Vec<&str> {
        let mut ids: Vec<&str> = self
            .peers
            .iter()
            .filter(|(_, f)| f.is_some())
            .map(|(id, _)| id.as_str())
            .chain(std::iter::once(self.me.id.as_str()))
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

    pub fn coordinator(&self) -> &str {
        self.members().first().copied().unwrap_or(&self.me.id)
    }

    pub fn is_coordinator(&self) -> bool {
        self.coordinator() == self.me.id
    }

    /// A table from `from`. Members adopt the coordinator's table unless theirs is newer (a node with a
    /// smaller id just joined and became coordinator with an older or empty table); the coordinator
    /// merges a newer one (two clusters joining: keep every instance). True when this node should send
    /// its table to everyone: the coordinator's changed, or a member holds a newer one to merge.
    pub fn on_table(&mut self, from: &str, table: InstanceTable) -> bool {
        if from == self.coordinator() {
            if table.version < self.table.version {
                return true;
            }
            if self.table != table {
                self.table = table;
            }
            return false;
        }
        if !self.is_coordinator() || table.version <= self.table.version {
            return false;
        }
        for inst in table.instances {
            if !self.table.instances.iter().any(|i| i.id == inst.id) {
                self.table.instances.push(inst);
            }
        }
        self.table.version = table.version.max(self.table.version) + 1;
        true
    }

    /// The planner's view of the members that have `model`, with the links they measured.
    pub fn topology(&self, model: &str) -> (Topology, Option<ModelCard>) {
        let members = self.member_facts();
        let with_model: Vec<&NodeFacts> = members
            .iter()
            .copied()
            .filter(|f| f.models.iter().any(|m| m.id == model))
            .collect();
        let card = with_model
            .iter()
            .find_map(|f| f.models.iter().find(|m| m.id == model).cloned());
        let nodes = with_model
            .iter()
            .map(|f| NodeInfo {
                id: f.id.clone(),
                mem_available: f.memory.available,
                speed: f.speed,
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
        let mut out: BTreeMap<(String, String), Link> = BTreeMap::new();
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

    /// Candidate placements for `req` on the current members, best first.
    pub fn previews(&self, req: &PlaceRequest) -> Result<Vec<Placement>, PlaceError> {
        let (topology, card) = self.topology(&req.model);
        let card = card.ok_or_else(|| PlaceError::UnknownModel {
            model: req.model.clone(),
        })?;
        let constraints = constraints(req, &card)?;
        Ok(shoal_placement::plan(&topology, &card, &constraints)?)
    }

    /// Changing the table is the coordinator's job alone.
    fn check_coordinator(&self) -> Result<(), ClusterError> {
        if self.is_coordinator() {
            Ok(())
        } else {
            Err(ClusterError::NotCoordinator {
                coordinator: self.coordinator().to_string(),
            })
        }
    }

    /// Places `req` as instance `id` and adds it to the table (coordinator only).
    pub fn place(
        &mut self,
        req: &PlaceRequest,
        id: String,
    ) -> Result<InstanceRecord, ClusterError> {
        self.check_coordinator()?;
        let best = self
            .previews(req)?
            .into_iter()
            .next()
            .ok_or(PlaceError::NoCandidate)?;
        let record = InstanceRecord {
            id,
            model: req.model.clone(),
            stages: best.stages,
            predicted_token_latency_us: best.predicted_token_latency_us,
            explanation: best.explanation,
        };
        self.table.instances.push(record.clone());
        self.table.version += 1;
        Ok(record)
    }

    /// Removes instance `id` (coordinator only); false when there is none.
    pub fn remove(&mut self, id: &str) -> Result<bool, ClusterError> {
        self.check_coordinator()?;
        let before = self.table.instances.len();
        self.table.instances.retain(|i| i.id != id);
        let removed = self.table.instances.len() != before;
        if removed {
            self.table.version += 1;
        }
        Ok(removed)
    }

    /// Coordinator duty after membership changes: every instance that uses a node that left is placed
    /// again on the members (automatically, under a fresh id from `new_id`), or dropped if it no longer
    /// fits. True when the table changed.
    pub fn reconcile(&mut self, mut new_id: impl FnMut() -> String) -> bool {
        if !self.is_coordinator() {
            return false;
        }
        let members: Vec<String> = self.members().into_iter().map(String::from).collect();
        let broken: Vec<InstanceRecord> = self
            .table
            .instances
            .iter()
            .filter(|i| i.stages.iter().any(|s| !members.contains(&s.node)))
            .cloned()
            .collect();
        if broken.is_empty() {
            return false;
        }
        for old in broken {
            self.table.instances.retain(|i| i.id != old.id);
            let req = PlaceRequest {
                model: old.model.clone(),
                ..PlaceRequest::default()
            };
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
                    self.table.instances.push(InstanceRecord {
                        id: new_id(),
                        model: old.model,
                        stages: best.stages.clone(),
                        predicted_token_latency_us: best.predicted_token_latency_us,
                        explanation: best.explanation.clone(),
                    });
                }
                Ok(_) | Err(_) => {
                    tracing::warn!(old = %old.id, model = %old.model, "instance dropped: it no longer fits on the members");
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
                InstanceView {
                    record: r.clone(),
                    status: InstanceState::of(&stage_status),
                    stage_status,
                }
            })
            .collect();
        ClusterView {
            coordinator: self.coordinator().to_string(),
            nodes: self.member_facts().into_iter().cloned().collect(),
            links: self.links(),
            instances,
            table_version: self.table.version,
        }
    }
}

/// Planner constraints for a request.
pub fn constraints(req: &PlaceRequest, card: &ModelCard) -> Result<Constraints, PlaceError> {
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{LinkFacts, MemoryFacts};
    use shoal_placement::LinkKind;

    fn card() -> ModelCard {
        ModelCard {
            id: "m".into(),
            n_layers: 30,
            layer_bytes: 2_000_000,
            embed_bytes: 10_000_000,
            head_bytes: 10_000_000,
            kv_bytes_per_token_per_layer: 1536,
            context_length: 8192,
            hidden_bytes_per_token: 1152,
            tied_embeddings: false,
        }
    }

    fn facts(id: &str, seq: u64) -> NodeFacts {
        NodeFacts {
            id: id.into(),
            name: id.into(),
            api_url: None,
            addrs: vec![],
            memory: MemoryFacts {
                total: 8 << 30,
                available: 4 << 30,
                pressure: 0.5,
            },
            cpu_cores: 2,
            accelerator: "cpu".into(),
            backend: "cpu".into(),
            speed: 5000.0,
            models: vec![card()],
            links: vec![],
            instances: BTreeMap::new(),
            kv_capacity: BTreeMap::new(),
            seq,
            started: 1,
        }
    }

    fn link(peer: &str) -> LinkFacts {
        LinkFacts {
            peer: peer.into(),
            kind: LinkKind::Ethernet,
            rtt_us: None,
            bandwidth_bps: None,
            tx_bytes_per_s: 0.0,
            rx_bytes_per_s: 0.0,
            tx_bytes: 0,
            rx_bytes: 0,
        }
    }

    /// `me` and `peers`, every pair linked.
    fn cluster(me: &str, peers: &[&str]) -> ClusterState {
        let all: Vec<&str> = std::iter::once(me).chain(peers.iter().copied()).collect();
        let linked = |id: &str, seq| {
            let mut f = facts(id, seq);
            f.links = all.iter().filter(|x| **x != id).map(|x| link(x)).collect();
            f
        };
        let mut s = ClusterState::new(linked(me, 1));
        for p in peers {
            s.peer_connected(p);
            s.on_facts(linked(p, 1));
        }
        s
    }

    fn manual(nodes: &[&str], layers: &[usize]) -> PlaceRequest {
        PlaceRequest {
            model: "m".into(),
            nodes: Some(nodes.iter().map(|s| String::from(*s)).collect()),
            layers: Some(layers.to_vec()),
            ..PlaceRequest::default()
        }
    }

    #[test]
    fn members_need_facts_and_the_smallest_id_coordinates() {
        let mut s = ClusterState::new(facts("b", 1));
        s.peer_connected("a");
        assert_eq!(
            s.members(),
            ["b"],
            "a connection without facts is not a member"
        );
        assert!(s.is_coordinator());
        assert!(s.on_facts(facts("a", 1)), "first facts = joined");
        assert_eq!(s.members(), ["a", "b"]);
        assert_eq!(s.coordinator(), "a");
        assert!(!s.on_facts(facts("a", 2)));
        assert!(s.peer_gone("a"));
        assert!(s.is_coordinator());
        assert!(
            !s.on_facts(facts("a", 3)),
            "facts of a gone peer are ignored"
        );
        assert_eq!(s.members(), ["b"]);
    }

    #[test]
    fn older_facts_never_replace_newer_ones_but_a_restart_does() {
        let mut s = cluster("a", &["b"]);
        s.on_facts(facts("b", 5));
        s.on_facts(facts("b", 3));
        assert_eq!(s.facts_of("b").unwrap().seq, 5);
        let mut restarted = facts("b", 1);
        restarted.started = 2;
        s.on_facts(restarted);
        assert_eq!(s.facts_of("b").unwrap().seq, 1);
    }

    #[test]
    fn manual_placement_and_removal_bump_the_version() {
        let mut s = cluster("a", &["b", "c"]);
        let r = s
            .place(&manual(&["a", "b", "c"], &[10, 10, 10]), "i1".into())
            .unwrap();
        let got: Vec<(&str, usize, usize)> = r
            .stages
            .iter()
            .map(|x| (x.node.as_str(), x.start, x.end))
            .collect();
        assert_eq!(got, [("a", 0, 10), ("b", 10, 20), ("c", 20, 30)]);
        assert_eq!(r.driver(), Some("a"));
        assert_eq!(s.table().version, 1);
        assert!(s.remove("i1").unwrap());
        assert!(!s.remove("i1").unwrap());
        assert_eq!(s.table().version, 2);
    }

    #[test]
    fn only_the_coordinator_places() {
        let mut s = cluster("b", &["a"]);
        let err = s
            .place(&manual(&["a", "b"], &[15, 15]), "x".into())
            .unwrap_err();
        assert!(
            matches!(&err, ClusterError::NotCoordinator { coordinator } if coordinator == "a"),
            "{err}"
        );
        assert!(err.to_string().contains("a is the coordinator"), "{err}");
    }

    #[test]
    fn bad_manual_requests_are_explained() {
        let s = cluster("a", &["b"]);
        let mut req = manual(&["a", "b"], &[10]);
        let err = s.previews(&req).unwrap_err();
        assert_eq!(
            err,
            PlaceError::LayerCounts {
                counts: 1,
                nodes: 2
            }
        );
        assert!(err.to_string().contains("1 counts for 2 nodes"));
        req.nodes = None;
        let err = s.previews(&req).unwrap_err();
        assert_eq!(err, PlaceError::LayersWithoutNodes);
        assert!(err.to_string().contains("needs 'nodes'"));
        let unknown = PlaceRequest {
            model: "nope".into(),
            ..PlaceRequest::default()
        };
        let err = s.previews(&unknown).unwrap_err();
        assert!(matches!(err, PlaceError::UnknownModel { .. }));
        assert!(err.to_string().contains("no member has model"));
    }

    #[test]
    fn a_node_leaving_re_places_its_instances_on_the_rest() {
        let mut s = cluster("a", &["b", "c"]);
        s.place(&manual(&["a", "b", "c"], &[10, 10, 10]), "i1".into())
            .unwrap();
        assert!(
            !s.reconcile(|| unreachable!()),
            "nothing to do while all are members"
        );
        s.peer_gone("c");
        assert!(s.reconcile(|| "i2".into()));
        let t = s.table();
        assert_eq!(t.instances.len(), 1);
        let inst = &t.instances[0];
        assert_eq!(inst.id, "i2");
        assert_eq!(
            inst.driver(),
            Some("a"),
            "the old driver keeps the instance"
        );
        assert!(inst.stages.iter().all(|st| st.node != "c"));
        assert_eq!(inst.stages.last().unwrap().end, 30);
    }

    #[test]
    fn members_adopt_the_coordinators_table_and_the_coordinator_merges_newer_ones() {
        let mut member = cluster("b", &["a"]);
        let table = InstanceTable {
            version: 7,
            instances: vec![],
        };
        assert!(!member.on_table("a", table.clone()));
        assert_eq!(member.table().version, 7);
        assert!(
            !member.on_table("c", InstanceTable::default()),
            "not from the coordinator"
        );
        assert_eq!(member.table().version, 7);
        // A new coordinator with an older table is not adopted: the member offers its own instead.
        assert!(member.on_table("a", InstanceTable::default()));
        assert_eq!(member.table().version, 7);

        let mut coord = cluster("a", &["b"]);
        coord.place(&manual(&["a"], &[30]), "mine".into()).unwrap();
        let mut theirs = InstanceTable {
            version: 4,
            instances: vec![],
        };
        theirs.instances.push(InstanceRecord {
            id: "theirs".into(),
            model: "m".into(),
            stages: vec![],
            predicted_token_latency_us: 0.0,
            explanation: String::new(),
        });
        assert!(coord.on_table("b", theirs));
        let ids: Vec<&str> = coord
            .table()
            .instances
            .iter()
            .map(|i| i.id.as_str())
            .collect();
        assert_eq!(ids, ["mine", "theirs"]);
        assert_eq!(coord.table().version, 5);
    }

    #[test]
    fn links_are_one_per_pair_and_only_between_members() {
        let mut s = cluster("a", &["b"]);
        let link = |peer: &str, rtt| LinkFacts {
            rtt_us: Some(rtt),
            ..link(peer)
        };
        s.me_mut().links = vec![link("b", 100.0), link("ghost", 1.0)];
        let mut b = facts("b", 2);
        b.links = vec![link("a", 300.0)];
        s.on_facts(b);
        let links = s.links();
        assert_eq!(links.len(), 1);
        assert_eq!((links[0].a.as_str(), links[0].b.as_str()), ("a", "b"));
        assert_eq!(
            links[0].rtt_us,
            Some(100.0),
            "the smaller id's measurement wins"
        );
    }

    #[test]
    fn view_reports_instance_status_from_each_stage_node() {
        let mut s = cluster("a", &["b"]);
        s.place(&manual(&["a", "b"], &[15, 15]), "i".into())
            .unwrap();
        assert_eq!(s.view().instances[0].status, InstanceState::Loading);
        assert!(s.view().instances[0].is_loading());
        s.me_mut()
            .instances
            .insert("i".into(), InstanceStatus::Ready);
        let mut b = facts("b", 2);
        b.instances.insert("i".into(), InstanceStatus::Ready);
        s.on_facts(b);
        assert_eq!(s.view().instances[0].status, InstanceState::Ready);
        assert!(s.view().instances[0].is_ready());
        let mut b = facts("b", 3);
        b.instances.insert(
            "i".into(),
            InstanceStatus::Failed {
                error: "oom".into(),
            },
        );
        s.on_facts(b);
        assert_eq!(s.view().instances[0].status, InstanceState::Failed);
        assert!(s.view().instances[0].is_failed());
        let json = serde_json::to_value(&s.view().instances[0]).unwrap();
        assert_eq!(json["status"], "failed", "a plain string in GET /state");
        assert_eq!(json["stage_status"][0]["state"], "ready");
        assert_eq!(s.view().instances_of("m").count(), 1);
        assert_eq!(s.view().instances_of("other").count(), 0);
    }
}
