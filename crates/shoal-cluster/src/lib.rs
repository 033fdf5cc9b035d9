//! # shoal-cluster — who is in the cluster and what each node has
//!
//! Membership only: no model code, no activations (those live in `shoal-pipeline`).
//!
//! - [`identity`]: the node key in `--state-dir` (a restarted node is the same node) and the cluster key
//!   (libp2p private network: nodes with another key cannot connect).
//! - [`keyring`]: the cluster key's epochs — `shoal remove` rotates it, the remaining members agree on
//!   the new key over their connections, a member that was away is let in with an earlier key by its
//!   identity and handed the new one (`node::keys`, `node::pnet`; decision 021).
//! - [`node`]: the libp2p swarm task (TCP + pnet + noise + yamux; ping for failure detection, mDNS and
//!   static peers for discovery, JSON request-response for control messages) and its [`ClusterHandle`],
//!   which also hands out libp2p streams to the data plane of `shoal-pipeline`. The task keeps one
//!   entry per other node (its addresses, live link, measurements) and answers the handle's commands.
//! - [`state`]: the plain [`state::ClusterState`] the task owns — members, their [`facts::NodeFacts`],
//!   links, the coordinator (smallest member id) and the instance table it alone changes; its
//!   [`state::ClusterView`] (`GET /state`) gives each instance a typed [`state::InstanceState`].
//! - [`facts`]: what a node publishes about itself (memory and its pressure, cores, measured compute,
//!   models, links, instance load state).
//! - [`sysload`]: CPU load, temperature and power of this machine (published with the memory facts).
//! - [`compute`]: a node's measured compute ([`facts::ComputeFacts`]) converted into the planner's
//!   speeds for one model.
//! - [`proto`]: control messages and the instance table.
//! - [`relay_proof`]: the mark a node puts on an HTTP request it sends on to another member
//!   ([`relay_proof::RelayKey`], from the cluster key), which a client cannot make.
//! - [`doctor`]: `shoal doctor`'s measurements of each peer's link (pings, loss, bandwidth each way, path
//!   MTU, clock offset) over the cluster's connections, run by `ClusterHandle::doctor`.
//! - Errors: [`ClusterError`] (one `error_type()` label per variant), with [`PlaceError`] for requests
//!   that cannot be placed and [`IdentityProblem`] for key files.
//!
//! Flow: each node publishes its own facts; every change of membership or facts reaches the coordinator,
//! which places instances (`shoal-placement`) and broadcasts the instance table; every node's
//! [`Snapshot`] watch channel carries the result to its runtime and API. Membership changes and
//! re-placements are counted through the `metrics` facade where they happen
//! (`shoal_membership_changes_total`, `shoal_instance_replacements_total`).

mod clock;
pub mod compute;
pub mod doctor;
mod error;
pub mod facts;
pub mod identity;
pub mod invite;
pub mod keyring;
pub mod node;
pub mod proto;
pub mod relay_proof;
pub mod state;
pub mod sysload;

pub use error::{ClusterError, IdentityProblem, PlaceError};
pub use libp2p::Multiaddr;
pub use node::{
    ClusterConfig, ClusterHandle, Snapshot, StateJson, Traffic, node_id, parse_peer, start,
    tcp_socket,
};
pub use node::{PathBook, PathId, PathLease, PathStream, PathStreamError, Paths};
pub use proto::{InstanceRecord, InstanceTable, Move, PlaceRequest};
pub use shoal_ids::{IdError, InstanceId, ModelId, NodeId};
pub use shoal_placement::Placement;
