//! [`ClusterError`]: failures of the cluster layer.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("node identity {path}: {message}")]
    Identity { path: PathBuf, message: String },
    #[error("cluster network: {0}")]
    Network(String),
    #[error("invalid address '{addr}': {message}")]
    Address { addr: String, message: String },
    #[error("no node reachable for the coordinator's decision: {0}")]
    NoCoordinator(String),
    #[error("placement: {0}")]
    Placement(String),
    #[error("{0}")]
    NotFound(String),
    #[error("the cluster task has stopped")]
    Stopped,
}

impl ClusterError {
    /// A short, stable label for metrics and logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            ClusterError::Identity { .. } => "identity",
            ClusterError::Network(_) => "network",
            ClusterError::Address { .. } => "address",
            ClusterError::NoCoordinator(_) => "no_coordinator",
            ClusterError::Placement(_) => "placement",
            ClusterError::NotFound(_) => "not_found",
            ClusterError::Stopped => "stopped",
        }
    }
}
