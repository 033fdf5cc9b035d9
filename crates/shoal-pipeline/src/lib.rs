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
//! - [`dataplane`]: stage-to-stage streams carrying `shoal-wire` frames, set up over the cluster's
//!   authenticated libp2p connections and moved to direct, encrypted TCP connections (lanes):
//!   [`dataplane::RemoteChain`] is the driver's `shoal_engine::stage::Stage` for every stage on other
//!   nodes; [`dataplane::serve_stages`] runs the stages this node hosts.
//!
//! - [`PipelineError`]: what goes wrong on the way (structured, labelled by `error_type()`); it becomes
//!   an `EngineError` (`StageLost` or `Internal`) once, where a [`dataplane::RemoteChain`] answers the
//!   engine, and an instance's published `Failed` status keeps its message.
//!
//! Data flow of one step of a 3-stage instance: the driver (stage 0's node) runs its layers into a
//! `shoal_model::HostMatrix`, encodes it straight into an `Activations` frame and sends it after a
//! `Sample` frame (the sampling parameters, sampler state and constraint mask of each sequence wanting a
//! token) to stage 1; stage 1 decodes the frame into a `HostMatrix`, computes in it and passes both
//! frames on to stage 2; stage 2 computes logits, samples their rows in place with the owner's sampler
//! state within each mask (the top alternatives too, when asked) and sends a `Tokens` frame straight
//! back to the driver — after a `Pooled` frame with the pooled final states of the chunks that asked
//! (embeddings). The driver forks a request's further choices from its first one's prompt KV with a
//! `Prefix` frame every stage applies. There the token stream's reader task puts the frame on
//! the one channel the engine thread waits on (a task watching the cluster membership puts "node left"
//! on it too), and the engine streams the tokens to the clients.

pub mod dataplane;
pub mod error;
pub mod runtime;

pub use error::PipelineError;
pub use runtime::{
    FetchRequest, FetchState, LaneConfig, ModelFetcher, ModelLocator, RuntimeConfig, model_card,
    start,
};
