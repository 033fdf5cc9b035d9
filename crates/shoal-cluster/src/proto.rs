//! Control-plane messages (JSON over libp2p request-response) and the instance table they carry.
//!
//! Each request names its reply: [`ControlMsg::Facts`] and [`ControlMsg::Table`] → [`ControlReply::Ack`];
//! [`ControlMsg::Place`] → [`ControlReply::Placed`] (one instance) or [`ControlReply::PlacedReplicas`]
//! (when the request names `replicas`); [`ControlMsg::Remove`] → [`ControlReply::Removed`].

use serde::{Deserialize, Serialize};
use shoal_ids::{InstanceId, ModelId, NodeId};
/// What a placement is chosen for (re-exported: it is part of [`PlaceRequest`]).
pub use shoal_placement::Goal;
use shoal_placement::{Placement, Prediction, Stage};

use crate::ClusterError;
use crate::facts::NodeFacts;

/// libp2p protocol name of the control messages.
pub const CONTROL_PROTOCOL: &str = "/shoal/control/1";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ControlMsg {
    /// The sender's own facts (periodic and on change).
    Facts(Box<NodeFacts>),
    /// The coordinator's instance table (on change, and periodically so late joiners converge).
    Table(InstanceTable),
    /// Asks the coordinator to place an instance.
    Place(PlaceRequest),
    /// Asks the coordinator to remove instance `id`.
    Remove { id: InstanceId },
    /// The sender's members and their addresses, so every node connects to every other (full mesh).
    Members(Vec<(NodeId, Vec<String>)>),
    /// The sender's cluster key ring ([`crate::keyring`]): on every new connection and after a
    /// rotation; the higher key is adopted.
    Rekey(Box<crate::keyring::KeyOffer>),
}

// One reply per control request (rare, small beside the connection's costs): not worth boxing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ControlReply {
    Ack,
    Placed(Result<InstanceRecord, Refusal>),
    /// The answer to a [`PlaceRequest`] with `replicas`: every instance placed, or none.
    PlacedReplicas(Result<Vec<InstanceRecord>, Refusal>),
    /// `Ok(false)`: no such instance.
    Removed(Result<bool, Refusal>),
}

/// Why the coordinator refused a request: the text of its error (a plain JSON string on the wire).
/// The asking node turns it into [`ClusterError::Refused`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Refusal {
    pub message: String,
}

impl From<ClusterError> for Refusal {
    fn from(err: ClusterError) -> Self {
        Refusal {
            message: err.to_string(),
        }
    }
}

impl From<Refusal> for ClusterError {
    fn from(refusal: Refusal) -> Self {
        ClusterError::Refused {
            message: refusal.message,
        }
    }
}

/// What a client asks for when creating an instance (the body of `POST /instance`, and the query of
/// `GET /instance/previews`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlaceRequest {
    pub model: ModelId,
    /// Use exactly these nodes (in this order when `layers` is given).
    #[serde(default)]
    pub nodes: Option<Vec<NodeId>>,
    /// Layer count per node, in stage order (manual split).
    #[serde(default)]
    pub layers: Option<Vec<usize>>,
    /// Upper bound on the number of stages.
    #[serde(default)]
    pub max_stages: Option<usize>,
    /// Tokens of KV cache to reserve per layer on each node (default: 4096 or the context length).
    #[serde(default)]
    pub kv_reserve_tokens: Option<usize>,
    /// Instances of the model to place, on disjoint node sets (default 1). With `nodes`, the replicas
    /// are chosen among those nodes; `layers` is refused with more than one. All or nothing: when fewer
    /// fit, nothing is placed and the error says how many did. Left out on the wire when absent, so a
    /// request without it reads the same to nodes that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<usize>,
    /// What the placement is chosen for: `latency` (one stream's tokens per second, the default) or
    /// `throughput` (tokens per second over many streams). Left out on the wire when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goal: Option<Goal>,
    /// Whether every layer is split over several nodes at once, by tensors (decision 024): `true` —
    /// one stage computed by a tensor-parallel group of all of `nodes`, the first of them rank 0;
    /// `false` — no group is considered; absent — the planner offers groups beside single nodes,
    /// pipelines and replicas, and picks one only when it is predicted faster. Left out on the wire
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_parallel: Option<bool>,
}

impl PlaceRequest {
    /// One instance of `model`, placed automatically (every other field at its default).
    pub fn of(model: ModelId) -> Self {
        PlaceRequest {
            model,
            nodes: None,
            layers: None,
            max_stages: None,
            kv_reserve_tokens: None,
            replicas: None,
            goal: None,
            tensor_parallel: None,
        }
    }
}

/// A placed model: its pipeline stages, in order. The first stage's node runs the request scheduler.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstanceRecord {
    pub id: InstanceId,
    pub model: ModelId,
    pub stages: Vec<Stage>,
    pub predicted_token_latency_us: f64,
    pub explanation: String,
    /// The planner's figures for these stages when they were chosen (one stream, batches, TTFT, per
    /// stage and hop); `/state` shows them next to what the driver measures.
    #[serde(default)]
    pub prediction: Prediction,
    /// Set when the coordinator placed this instance again because a node of an earlier one left:
    /// what it continues (see [`Lineage`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Lineage>,
}

/// What a re-placed instance continues: the instance first placed (before any re-placement), that
/// one's driver, and how many re-placements lie between. Two live instances of one origin come from a
/// partition (each side placed the instance again on the members it saw) or from a stale table; when
/// tables meet, one is kept (`state::merge`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Lineage {
    pub origin: InstanceId,
    pub driver: NodeId,
    pub generation: u32,
}

impl InstanceRecord {
    /// The record of instance `id` of `model` placed as `placement` says.
    pub fn placed(id: InstanceId, model: ModelId, placement: Placement) -> Self {
        InstanceRecord {
            id,
            model,
            stages: placement.stages,
            predicted_token_latency_us: placement.predicted_token_latency_us,
            explanation: placement.explanation,
            prediction: placement.prediction,
            lineage: None,
        }
    }

    /// Instance `id` placed as `placement` says to take over from `old`, whose node left.
    pub fn replacing(id: InstanceId, old: &InstanceRecord, placement: Placement) -> Self {
        let lineage = old.first_driver().map(|driver| Lineage {
            origin: old.origin(),
            driver: driver.clone(),
            generation: old.generation() + 1,
        });
        InstanceRecord {
            lineage,
            ..InstanceRecord::placed(id, old.model.clone(), placement)
        }
    }

    /// The instance this one continues (itself when it was placed, not re-placed).
    pub fn origin(&self) -> InstanceId {
        self.lineage.as_ref().map_or(self.id, |l| l.origin)
    }

    /// The driver of [`Self::origin`]: the node whose API the origin's clients talk to.
    pub fn first_driver(&self) -> Option<&NodeId> {
        self.lineage
            .as_ref()
            .map(|l| &l.driver)
            .or_else(|| self.driver())
    }

    /// Re-placements between the origin and this instance.
    pub fn generation(&self) -> u32 {
        self.lineage.as_ref().map_or(0, |l| l.generation)
    }

    /// The node that owns the instance's requests (runs the scheduler and stage 0).
    pub fn driver(&self) -> Option<&NodeId> {
        self.stages.first().map(|s| &s.node)
    }

    /// Whether `node` computes any of the instance's stages (a stage's node or a member of its
    /// tensor-parallel group).
    pub fn uses(&self, node: &str) -> bool {
        self.stages.iter().any(|s| s.nodes().any(|n| n == node))
    }
}

/// An instance being replaced: `new` was placed to take over from `old` (see `state::moves`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    pub old: InstanceId,
    pub new: InstanceId,
}

/// Every instance of the cluster. Only the coordinator changes it; `version` grows with each change.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstanceTable {
    pub version: u64,
    pub instances: Vec<InstanceRecord>,
    /// Instances placed automatically (no pinned nodes or layers): the coordinator may move them to a
    /// placement predicted faster.
    #[serde(default)]
    pub movable: Vec<InstanceId>,
    /// Moves in progress: each `new` instance takes over from its `old` one once ready.
    #[serde(default)]
    pub moves: Vec<Move>,
    /// Instances that take no new requests: those in flight finish, then the instance leaves the table.
    #[serde(default)]
    pub draining: Vec<InstanceId>,
    /// Ids of the instances coordinators removed, oldest first (the last
    /// `state::REMEMBERED_REMOVALS`): what tells a removed instance from one a table never knew when
    /// tables merge (`state::merge`).
    #[serde(default)]
    pub removed: Vec<InstanceId>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_a_plain_string_on_the_wire() {
        let reply = ControlReply::Removed(Err(Refusal::from(ClusterError::NotCoordinator {
            coordinator: "a".parse().unwrap(),
        })));
        let json = serde_json::to_string(&reply).unwrap();
        assert_eq!(json, r#"{"Removed":{"Err":"a is the coordinator"}}"#);
        let back: ControlReply =
            serde_json::from_str(r#"{"Placed":{"Err":"no placement"}}"#).unwrap();
        let ControlReply::Placed(Err(refusal)) = back else {
            panic!("{back:?}")
        };
        let err = ClusterError::from(refusal);
        assert!(matches!(err, ClusterError::Refused { .. }));
        assert_eq!(err.to_string(), "no placement");
    }
}
