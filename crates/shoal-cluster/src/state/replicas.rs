//! Replicas: several instances of one model on disjoint node sets, so they share the traffic
//! (`PlaceRequest.replicas`, PRD 3.2).
//!
//! [`ClusterState::replica_previews`] plans them with the planner's `plan_replicas` (each replica the
//! best on the nodes the earlier ones left; explanations carry "replica i of n" and the group's rate) on
//! the members that have the model, and on every member when those hold fewer — as a single placement
//! falls back to members that would fetch the model. [`ClusterState::place_replicas`] adds them to the
//! table in one change. All or nothing: when fewer fit than were asked for, nothing is placed and
//! [`PlaceError::TooFewReplicas`] says how many did and why the next one did not (a client that wants
//! what fits asks again with that number).

use shoal_ids::InstanceId;
use shoal_placement::{Constraints, ModelCard, Placement, PlacementError, Topology};

use super::{ClusterState, constraints};
use crate::ClusterError;
use crate::error::PlaceError;
use crate::proto::{InstanceRecord, PlaceRequest};

impl ClusterState {
    /// The placements of `req.replicas` (default 1) instances of `req.model`, each on nodes no other one
    /// uses, in the order they were planned (the first on the best nodes). With `nodes`, replicas are
    /// chosen among those nodes (one replica alone keeps `nodes` as its pin).
    pub fn replica_previews(&self, req: &PlaceRequest) -> Result<Vec<Placement>, PlaceError> {
        let asked = req.replicas.unwrap_or(1);
        if asked == 0 {
            return Err(PlaceError::ZeroReplicas);
        }
        if asked == 1 {
            let best = self.previews(req)?.into_iter().next();
            return best.map(|p| vec![p]).ok_or(PlaceError::NoCandidate);
        }
        if req.layers.is_some() {
            return Err(PlaceError::ReplicasWithLayers);
        }
        let (holders, card) = self.topology(&req.model, false);
        let card = card.ok_or_else(|| PlaceError::UnknownModel {
            model: req.model.clone(),
        })?;
        let constraints = constraints(req, &card)?;
        let everyone = self.topology(&req.model, true).0;
        // A node runs one engine per model: one that already drives an instance of this model would
        // add nothing as another replica's driver, and sharing its stages is not disjoint either.
        let (holders, everyone) = (
            self.without_drivers_of(holders, &req.model),
            self.without_drivers_of(everyone, &req.model),
        );
        let mut tries = vec![holders];
        if everyone.nodes.len() > tries[0].nodes.len() {
            tries.push(everyone);
        }
        // The most replicas any topology holds (the members with the model first on a tie).
        let mut most: Option<(Vec<Placement>, Topology)> = None;
        let mut first_error = None;
        for topology in tries {
            match shoal_placement::plan_replicas(&topology, &card, &constraints, asked) {
                Ok(p) if p.len() == asked => return Ok(p),
                Ok(p) if most.as_ref().is_none_or(|(m, _)| p.len() > m.len()) => {
                    most = Some((p, topology));
                }
                Ok(_) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let (fit, reason) = match most {
            Some((placed, topology)) => {
                let reason = why_no_more(&topology, &card, &constraints, &placed);
                (placed.len(), reason)
            }
            None => (0, first_error.unwrap_or(PlacementError::NoNodes)),
        };
        Err(PlaceError::TooFewReplicas {
            model: req.model.clone(),
            asked,
            fit,
            reason: Box::new(PlaceError::Plan(reason)),
        })
    }

    /// Places every replica of `req` (coordinator only) in one change of the table, each under an id
    /// from `new_id`.
    pub fn place_replicas(
        &mut self,
        req: &PlaceRequest,
        mut new_id: impl FnMut() -> InstanceId,
    ) -> Result<Vec<InstanceRecord>, ClusterError> {
        self.check_coordinator()?;
        let records: Vec<InstanceRecord> = self
            .replica_previews(req)?
            .into_iter()
            .map(|p| InstanceRecord::placed(new_id(), req.model.clone(), p))
            .collect();
        self.table.instances.extend(records.iter().cloned());
        self.table.version += 1;
        Ok(records)
    }
}

impl ClusterState {
    /// `topology` without the nodes that drive an instance of `model` already.
    fn without_drivers_of(&self, mut topology: Topology, model: &str) -> Topology {
        let drives = |node: &str| {
            self.table
                .instances
                .iter()
                .filter(|i| i.model == model)
                .any(|i| i.stages.first().is_some_and(|s| s.node == node))
        };
        topology.nodes.retain(|n| !drives(&n.id));
        topology
    }
}

/// Why one more replica does not fit on the nodes of `topology` (within the pool `constraints` pins)
/// that `placed` leaves.
fn why_no_more(
    topology: &Topology,
    card: &ModelCard,
    constraints: &Constraints,
    placed: &[Placement],
) -> PlacementError {
    let pool = constraints.pinned_nodes.as_ref();
    let left = Topology {
        nodes: topology
            .nodes
            .iter()
            .filter(|n| pool.is_none_or(|p| p.contains(&n.id)))
            .filter(|n| {
                !placed
                    .iter()
                    .any(|p| p.stages.iter().any(|s| s.nodes().any(|m| *m == n.id)))
            })
            .cloned()
            .collect(),
        links: topology.links.clone(),
    };
    let each = Constraints {
        pinned_nodes: None,
        keep_order: false,
        ..constraints.clone()
    };
    match shoal_placement::best(&left, card, &each) {
        Err(e) => e,
        Ok(_) => PlacementError::NoNodes, // (cannot happen: the planner would have placed it)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tests::cluster;

    fn replicas(n: usize) -> PlaceRequest {
        PlaceRequest {
            replicas: Some(n),
            ..PlaceRequest::of("m".parse().unwrap())
        }
    }

    fn nodes_of(p: &Placement) -> Vec<&str> {
        p.stages.iter().map(|s| s.node.as_str()).collect()
    }

    #[test]
    fn replicas_go_on_disjoint_nodes_and_enter_the_table_at_once() {
        let mut s = cluster("a", &["b", "c"]);
        let version = s.table().version;
        let mut n = 0;
        let placed = s
            .place_replicas(&replicas(3), || {
                n += 1;
                InstanceId::derived_from(&format!("r{n}"))
            })
            .unwrap();
        assert_eq!(placed.len(), 3);
        let mut nodes: Vec<&str> = placed
            .iter()
            .flat_map(|r| r.stages.iter().map(|s| s.node.as_str()))
            .collect();
        nodes.sort_unstable();
        assert_eq!(nodes, ["a", "b", "c"], "one whole-model replica per node");
        assert_eq!(s.table().version, version + 1, "one change of the table");
        let ids: Vec<InstanceId> = s.table().instances.iter().map(|i| i.id).collect();
        assert_eq!(ids, ["r1", "r2", "r3"].map(InstanceId::derived_from));
    }

    #[test]
    fn replicas_avoid_nodes_that_already_drive_the_model() {
        let mut s = cluster("a", &["b", "c"]);
        let first = s
            .place(
                &PlaceRequest::of("m".parse().unwrap()),
                InstanceId::derived_from("first"),
            )
            .unwrap();
        let driver = first.stages[0].node.clone();
        let placed = s
            .place_replicas(&replicas(2), || InstanceId::derived_from("r"))
            .unwrap();
        for r in &placed {
            assert!(r.stages.iter().all(|st| st.node != driver), "{r:?}");
        }
        let err = s.replica_previews(&replicas(3)).unwrap_err();
        assert!(
            matches!(err, PlaceError::TooFewReplicas { fit: 0, .. }),
            "every node drives one now: {err:?}"
        );
    }

    #[test]
    fn too_many_replicas_place_nothing_and_say_how_many_fit() {
        let mut s = cluster("a", &["b"]);
        let err = s
            .place_replicas(&replicas(3), || InstanceId::derived_from("x"))
            .unwrap_err();
        let ClusterError::Place(PlaceError::TooFewReplicas {
            asked, fit, model, ..
        }) = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!((*asked, *fit, model.as_str()), (3, 2, "m"));
        assert!(
            err.to_string()
                .starts_with("only 2 of 3 replicas of 'm' fit"),
            "{err}"
        );
        assert!(s.table().instances.is_empty(), "all or nothing");
    }

    #[test]
    fn nodes_bound_the_pool_and_bad_combinations_are_refused() {
        let s = cluster("a", &["b", "c"]);
        let mut req = replicas(2);
        req.nodes = Some(vec!["b".parse().unwrap(), "c".parse().unwrap()]);
        let p = s.replica_previews(&req).unwrap();
        let mut used: Vec<&str> = p.iter().flat_map(nodes_of).collect();
        used.sort_unstable();
        assert_eq!(used, ["b", "c"]);

        req.layers = Some(vec![15, 15]);
        assert_eq!(
            s.replica_previews(&req),
            Err(PlaceError::ReplicasWithLayers)
        );
        assert_eq!(
            s.replica_previews(&replicas(0)),
            Err(PlaceError::ZeroReplicas)
        );
        // One replica is a plain placement: the planner's best.
        assert_eq!(
            s.replica_previews(&replicas(1)).unwrap(),
            s.previews(&replicas(1)).unwrap()[..1]
        );
    }

    #[test]
    fn replicas_say_which_they_are_and_fall_back_to_members_without_the_model() {
        let mut s = cluster("a", &["b"]);
        let mut b = s.facts_of("b").unwrap().clone();
        b.models.clear();
        b.seq += 1;
        s.on_facts(b);
        let p = s.replica_previews(&replicas(2)).unwrap();
        assert_eq!(p.len(), 2, "b fetches the model for the second replica");
        assert!(
            p[0].explanation.starts_with("replica 1 of 2"),
            "{}",
            p[0].explanation
        );
        assert!(
            p[1].explanation.starts_with("replica 2 of 2"),
            "{}",
            p[1].explanation
        );
    }

    #[test]
    fn a_replica_request_reads_the_same_as_before_without_replicas() {
        let plain = PlaceRequest::of("m".parse().unwrap());
        let json = serde_json::to_string(&plain).unwrap();
        assert!(!json.contains("replicas"), "{json}");
        let back: PlaceRequest = serde_json::from_str(r#"{"model":"m","replicas":2}"#).unwrap();
        assert_eq!(back.replicas, Some(2));
    }
}
