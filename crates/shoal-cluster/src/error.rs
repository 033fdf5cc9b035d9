//! [`ClusterError`]: failures of the cluster layer, each with a stable [`ClusterError::error_type`] label;
//! [`PlaceError`]: why a request cannot be placed on the current members (or not as many replicas as
//! asked); [`IdentityProblem`]: what is wrong with a key file.

use shoal_ids::{InstanceId, ModelId, NodeId};
use std::fmt::Display;
use std::path::PathBuf;

use libp2p::identity::DecodingError;
use shoal_placement::PlacementError;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("node identity {path}: {reason}")]
    Identity {
        path: PathBuf,
        reason: IdentityProblem,
    },
    /// Building the transport, listening, or a listener failing.
    #[error("cluster network: {during}: {message}")]
    Network {
        during: &'static str,
        message: String,
    },
    #[error("cluster network: listening timed out")]
    ListenTimeout,
    #[error("invalid address '{addr}': {message}")]
    Address { addr: String, message: String },
    /// The request cannot be placed on the current members.
    #[error(transparent)]
    Place(#[from] PlaceError),
    /// Only the coordinator changes the instance table, and it is another node (it changed meanwhile).
    #[error("{coordinator} is the coordinator")]
    NotCoordinator { coordinator: NodeId },
    /// The coordinator's id names no peer this node can ask.
    #[error("no node reachable for the coordinator's decision: {coordinator}")]
    NoCoordinator { coordinator: String },
    /// The request to the coordinator failed (timeout, connection closed, …).
    #[error("the coordinator did not answer: {message}")]
    CoordinatorSilent { message: String },
    /// The coordinator answered a request with the reply of another one.
    #[error("unexpected reply {reply}")]
    UnexpectedReply { reply: String },
    /// The coordinator refused the request; `message` is its error as it sent it.
    #[error("{message}")]
    Refused { message: String },
    /// Removing instance `id` failed (never the request's fault).
    #[error("removing instance {id}: {reason}")]
    Remove {
        id: InstanceId,
        reason: Box<ClusterError>,
    },
    #[error("the cluster task has stopped")]
    Stopped,
    /// An invite was not honoured.
    #[error("invite refused: {0}")]
    Invite(#[from] crate::invite::InviteError),
    /// `shoal remove NODE`: no member (or removed node) matches `query`, or more than one does.
    #[error("{message}")]
    NodeNotFound { message: String },
    /// A node cannot remove itself, and a removed node cannot join again.
    #[error("{message}")]
    NodeRefused { message: String },
}

impl ClusterError {
    /// A short, stable label for metrics and logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            ClusterError::Identity { .. } => "identity",
            ClusterError::Network { .. } => "network",
            ClusterError::ListenTimeout => "listen_timeout",
            ClusterError::Address { .. } => "address",
            ClusterError::Place(_) => "placement",
            ClusterError::NotCoordinator { .. } => "not_coordinator",
            ClusterError::NoCoordinator { .. } => "no_coordinator",
            ClusterError::CoordinatorSilent { .. } => "coordinator_silent",
            ClusterError::UnexpectedReply { .. } => "unexpected_reply",
            ClusterError::Refused { .. } => "refused",
            ClusterError::Remove { .. } => "remove",
            ClusterError::Stopped => "stopped",
            ClusterError::Invite(_) => "invite",
            ClusterError::NodeNotFound { .. } => "node_not_found",
            ClusterError::NodeRefused { .. } => "node_refused",
        }
    }

    /// A network failure while doing `during`.
    pub(crate) fn network(during: &'static str, error: &dyn Display) -> Self {
        ClusterError::Network {
            during,
            message: error.to_string(),
        }
    }
}

/// Why a request cannot be placed on the current members.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlaceError {
    #[error("no member has model '{model}'")]
    UnknownModel { model: ModelId },
    #[error("'layers' has {counts} counts for {nodes} nodes")]
    LayerCounts { counts: usize, nodes: usize },
    #[error("'layers' needs 'nodes' (one count per node)")]
    LayersWithoutNodes,
    /// The planner found no placement that satisfies the request.
    #[error(transparent)]
    Plan(#[from] PlacementError),
    /// The planner returned no candidate.
    #[error("no placement")]
    NoCandidate,
    /// `model` does not fit in the memory the instances already placed leave; it would after removing
    /// `instances` (each `id (model)`).
    #[error("'{model}' does not fit beside the instances already placed ({reason}); it would fit after removing {}", instances.join(", "))]
    NeedsEviction {
        model: ModelId,
        instances: Vec<String>,
        reason: Box<PlaceError>,
    },
    /// `tensor_parallel` asks for a group of `nodes`, which must name two or more.
    #[error("'tensor_parallel' needs 'nodes' (two or more: the group, its rank 0 first)")]
    GroupWithoutNodes,
    /// `tensor_parallel` with `layers`: a group holds every layer of its stage.
    #[error(
        "'tensor_parallel' puts every layer on one group of 'nodes'; it cannot be combined with 'layers'"
    )]
    GroupWithLayers,
    /// No tensor-parallel placement of the requested nodes fits (or the model's layers do not split
    /// that many ways).
    #[error(
        "no tensor-parallel group of {nodes} nodes can hold '{model}' (it splits over at most {max_group}; {why})"
    )]
    NoGroup {
        model: ModelId,
        nodes: usize,
        max_group: usize,
        why: String,
    },
    /// `replicas` must be at least 1.
    #[error("'replicas' must be at least 1")]
    ZeroReplicas,
    /// Replicas are placed by the planner: a manual split fits one instance only.
    #[error("'layers' places one instance; it cannot be combined with 'replicas' above 1")]
    ReplicasWithLayers,
    /// Fewer replicas fit on disjoint nodes than were asked for (nothing was placed).
    #[error(
        "only {fit} of {asked} replicas of '{model}' fit on disjoint nodes (the next one: {reason})"
    )]
    TooFewReplicas {
        model: ModelId,
        asked: usize,
        fit: usize,
        reason: Box<PlaceError>,
    },
}

impl PlaceError {
    /// A short, stable label for metrics and logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            PlaceError::UnknownModel { .. } => "unknown_model",
            PlaceError::LayerCounts { .. } => "layer_counts",
            PlaceError::LayersWithoutNodes => "layers_without_nodes",
            PlaceError::GroupWithoutNodes => "group_without_nodes",
            PlaceError::GroupWithLayers => "group_with_layers",
            PlaceError::NoGroup { .. } => "no_group",
            PlaceError::Plan(e) => e.error_type(),
            PlaceError::NoCandidate => "no_candidate",
            PlaceError::NeedsEviction { .. } => "needs_eviction",
            PlaceError::ZeroReplicas => "zero_replicas",
            PlaceError::ReplicasWithLayers => "replicas_with_layers",
            PlaceError::TooFewReplicas { .. } => "too_few_replicas",
        }
    }
}

/// What is wrong with a node key or cluster key file.
#[derive(Debug, thiserror::Error)]
pub enum IdentityProblem {
    #[error("{0}")]
    Io(std::io::Error),
    #[error("not a node key: {0}")]
    NotANodeKey(DecodingError),
    #[error("{0}")]
    Encoding(DecodingError),
    #[error("the cluster key file is empty")]
    EmptyKeyFile,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn place_errors_read_as_before_and_keep_their_labels() {
        let e = ClusterError::from(PlaceError::LayerCounts {
            counts: 1,
            nodes: 2,
        });
        assert_eq!(e.to_string(), "'layers' has 1 counts for 2 nodes");
        assert_eq!(e.error_type(), "placement");
        let e = ClusterError::Refused {
            message: "no member has model 'x'".into(),
        };
        assert_eq!(e.to_string(), "no member has model 'x'");
        let e = ClusterError::Remove {
            id: InstanceId::from_u64(0xab),
            reason: Box::new(ClusterError::Stopped),
        };
        assert_eq!(
            e.to_string(),
            "removing instance 00000000000000ab: the cluster task has stopped"
        );
        assert_eq!(e.error_type(), "remove");
    }
}
