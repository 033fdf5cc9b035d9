//! # shoal-pipeline — moving activations between nodes and running model instances
//!
//! `shoal-cluster` says who is in the cluster and what each node has and runs (the instance table);
//! this crate makes the instances that use this node run:
//!
//! - [`runtime`]: follows the instance table. For each instance using this node: stage 0 → load its
//!   layers, wait for the other stages, connect a [`dataplane::RemoteChain`] and start an engine
//!   (registered in `shoal_engine::Engines` for the API); any other stage → load its layers and host them
//!   ([`dataplane::Hosts`]). Load state goes into this node's facts. [`model_card`] reads what placement
//!   needs about a model file.
//! - [`dataplane`]: stage-to-stage streams carrying `shoal-wire` frames over the cluster's authenticated
//!   libp2p connections: [`dataplane::RemoteChain`] is the driver's `shoal_engine::stage::Stage` for every
//!   stage on other nodes; [`dataplane::serve_stages`] runs the stages this node hosts.
//!
//! Data flow of one step of a 3-stage instance: the driver (stage 0's node) runs its layers, sends a
//! `Sample` and an `Activations` frame to stage 1; stage 1 computes and passes both on to stage 2; stage 2
//! computes logits, samples with the owner's sampler state and sends a `Tokens` frame straight back to the
//! driver, whose engine streams the tokens to the clients.

pub mod dataplane;
pub mod error;
pub mod runtime;

pub use error::PipelineError;
pub use runtime::{ModelLocator, RuntimeConfig, model_card, start};
