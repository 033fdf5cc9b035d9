//! # shoal-cluster — membership, shared state, and the data plane between pipeline stages
//!
//! - [`identity`]: the node key in `--state-dir` (a restarted node is the same node) and the cluster key
//!   (libp2p private network: nodes with another key cannot connect).
//! - [`node`]: the libp2p swarm task (TCP + pnet + noise + yamux; ping for failure detection, mDNS and
//!   static peers for discovery, JSON request-response for control messages) and its [`ClusterHandle`].
//! - [`state`]: the plain [`state::ClusterState`] the task owns — members, their [`facts::NodeFacts`],
//!   links, the coordinator (smallest member id) and the instance table it alone changes.
//! - [`facts`]: what a node publishes about itself (memory, cores, models, links, instance load state).
//! - [`proto`]: control messages and the instance table.
//! - [`dataplane`]: stage-to-stage streams carrying `shoal-wire` frames: [`dataplane::RemoteChain`] is the
//!   engine's [`shoal_engine::stage::Stage`] for the stages on other nodes; [`dataplane::StageHost`] serves
//!   one stage on this node.
//! - [`runtime`]: turns the instance table into running engines and stage hosts on this node.
//!
//! Data flow of one step of a 3-stage instance: the driver (stage 0's node) runs its layers, sends a
//! `Sample` and an `Activations` frame to stage 1; stage 1 computes and passes both on to stage 2; stage 2
//! computes logits, samples with the owner's sampler state and sends a `Tokens` frame straight back to the
//! driver, whose engine streams the tokens to the clients.

pub mod dataplane;
mod error;
pub mod facts;
pub mod identity;
pub mod node;
pub mod proto;
pub mod runtime;
pub mod state;

pub use error::ClusterError;
pub use node::{ClusterConfig, ClusterHandle, Snapshot, StateJson, parse_peer, start};
pub use proto::{InstanceRecord, InstanceTable, PlaceRequest};
