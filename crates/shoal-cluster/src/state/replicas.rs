//! Replicas: several instances of one model on disjoint node sets, so they share the traffic
//! (`PlaceRequest.replicas`, PRD 3.2).
//!
//! [`ClusterState::replica_previews`] plans them one after the other: the planner's best placement on the
//! members no earlier replica uses (the planner's own fallback to members lacking the model included).
//! [`ClusterState::place_replicas`] adds them to the table in one change. All or nothing: when fewer fit
//! than were asked for, nothing is placed and [`PlaceError::TooFewReplicas`] says how many did and why
//! the next one did not (a client that wants what fits asks again with that number).

use std::collections::BTreeSet;

use shoal_placement::Placement;

use super::ClusterState;
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
        let pool = req.nodes.clone();
        let one = PlaceRequest {
            nodes: None,
            replicas: None,
            ..req.clone()
        };
        let mut used: BTreeSet<String> = BTreeSet::new();
        let mut out: Vec<Placement> = Vec::with_capacity(asked);
        while out.len() < asked {
            let keep = |id: &str| {
                !used.contains(id) && pool.as_ref().is_none_or(|p| p.iter().any(|n| n == id))
            };
            let next = self
                .previews_among(&one, &keep)
                .and_then(|p| p.into_iter().next().ok_or(PlaceError::NoCandidate));
            match next {
                Ok(best) => {
                    used.extend(best.stages.iter().map(|s| s.node.clone()));
                    out.push(best);
                }
                Err(reason) => {
                    return Err(PlaceError::TooFewReplicas {
                        model: req.model.clone(),
                        asked,
                        fit: out.len(),
                        reason: Box::new(reason),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Places every replica of `req` (coordinator only) in one change of the table, each under an id
    /// from `new_id`.
    pub fn place_replicas(
        &mut self,
        req: &PlaceRequest,
        mut new_id: impl FnMut() -> String,
    ) -> Result<Vec<InstanceRecord>, ClusterError> {
        self.check_coordinator()?;
        let records: Vec<InstanceRecord> = self
            .replica_previews(req)?
            .into_iter()
            .map(|p| InstanceRecord {
                id: new_id(),
                model: req.model.clone(),
                stages: p.stages,
                predicted_token_latency_us: p.predicted_token_latency_us,
                explanation: p.explanation,
            })
            .collect();
        self.table.instances.extend(records.iter().cloned());
        self.table.version += 1;
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tests::cluster;

    fn replicas(n: usize) -> PlaceRequest {
        PlaceRequest {
            model: "m".into(),
            replicas: Some(n),
            ..PlaceRequest::default()
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
                format!("r{n}")
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
        let ids: Vec<&str> = s.table().instances.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["r1", "r2", "r3"]);
    }

    #[test]
    fn too_many_replicas_place_nothing_and_say_how_many_fit() {
        let mut s = cluster("a", &["b"]);
        let err = s.place_replicas(&replicas(3), || "x".into()).unwrap_err();
        let ClusterError::Place(PlaceError::TooFewReplicas {
            asked, fit, model, ..
        }) = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!((*asked, *fit, model.as_str()), (3, 2, "m"));
        assert!(
            err.to_string().starts_with("only 2 of 3 replicas of 'm' fit"),
            "{err}"
        );
        assert!(s.table().instances.is_empty(), "all or nothing");
    }

    #[test]
    fn nodes_bound_the_pool_and_bad_combinations_are_refused() {
        let s = cluster("a", &["b", "c"]);
        let mut req = replicas(2);
        req.nodes = Some(vec!["b".into(), "c".into()]);
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
    fn a_replica_request_reads_the_same_as_before_without_replicas() {
        let plain = PlaceRequest {
            model: "m".into(),
            ..PlaceRequest::default()
        };
        let json = serde_json::to_string(&plain).unwrap();
        assert!(!json.contains("replicas"), "{json}");
        let back: PlaceRequest = serde_json::from_str(r#"{"model":"m","replicas":2}"#).unwrap();
        assert_eq!(back.replicas, Some(2));
    }
}
