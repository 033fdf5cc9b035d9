//! Errors of the planner, with the numbers an operator needs to act on them.

use shoal_ids::{ModelId, NodeId};

/// Why no placement could be produced.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlacementError {
    #[error("model {model} has no layers")]
    EmptyModel { model: ModelId },
    #[error("the topology has no nodes")]
    NoNodes,
    #[error("node {node} is invalid: {reason}")]
    InvalidNode { node: NodeId, reason: String },
    #[error("node {node} appears more than once in {field}")]
    DuplicateNode { node: NodeId, field: &'static str },
    #[error("unknown node {node} in {field}")]
    UnknownNode { node: NodeId, field: &'static str },
    #[error("layer counts sum to {sum} but the model has {n_layers} layers")]
    LayerCountSum { sum: usize, n_layers: usize },
    #[error("node {node} was given 0 layers; every stage needs at least one")]
    ZeroLayers { node: NodeId },
    #[error("{requested} stages requested but at most {max} allowed")]
    TooManyStages { requested: usize, max: usize },
    #[error("invalid constraints: {reason}")]
    InvalidConstraints { reason: String },
    #[error("model does not fit: needs {needed} bytes, {available} bytes usable")]
    DoesNotFit { needed: u64, available: u64 },
    #[error("node {node} cannot hold its stage: needs {needed} bytes, has {available}")]
    NodeDoesNotFit {
        node: NodeId,
        needed: u64,
        available: u64,
    },
    #[error("no link between {a} and {b}, which would be adjacent stages")]
    NoLink { a: NodeId, b: NodeId },
    #[error(
        "enough memory, but no ordering of linked nodes among {} holds the model",
        shoal_ids::join(nodes, ", ")
    )]
    NoRoute { nodes: Vec<NodeId> },
}

impl PlacementError {
    /// A short stable label for metrics.
    pub fn error_type(&self) -> &'static str {
        match self {
            PlacementError::EmptyModel { .. } => "empty_model",
            PlacementError::NoNodes => "no_nodes",
            PlacementError::InvalidNode { .. } => "invalid_node",
            PlacementError::DuplicateNode { .. } => "duplicate_node",
            PlacementError::UnknownNode { .. } => "unknown_node",
            PlacementError::LayerCountSum { .. } => "layer_count_sum",
            PlacementError::ZeroLayers { .. } => "zero_layers",
            PlacementError::TooManyStages { .. } => "too_many_stages",
            PlacementError::InvalidConstraints { .. } => "invalid_constraints",
            PlacementError::DoesNotFit { .. } => "does_not_fit",
            PlacementError::NodeDoesNotFit { .. } => "node_does_not_fit",
            PlacementError::NoLink { .. } => "no_link",
            PlacementError::NoRoute { .. } => "no_route",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_route_names_the_nodes_as_a_list_not_debug_output() {
        let e = PlacementError::NoRoute {
            nodes: vec!["mac".parse().unwrap(), "pc".parse().unwrap()],
        };
        assert_eq!(
            e.to_string(),
            "enough memory, but no ordering of linked nodes among mac, pc holds the model"
        );
    }
}
