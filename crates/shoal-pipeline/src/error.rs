//! [`PipelineError`]: what goes wrong between the stages of a pipeline and while bringing one up, with a
//! stable [`PipelineError::error_type`] label. It becomes an [`EngineError`] once, where it crosses into
//! the engine (a lost stage or an internal fault), and keeps its message where the runtime publishes an
//! instance's status.

use libp2p::PeerId;
use shoal_engine::EngineError;
use shoal_ids::{InstanceId, ModelId, NodeId};
use shoal_model::ModelError;
use shoal_wire::WireError;

/// Errors of the data plane and the instance runtime.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Encoding a frame, or a peer's handshake or frame, failed the wire format's checks.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// A stream read or write failed (or a thread could not start).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The stream closed before the peer's whole handshake arrived.
    #[error("short handshake")]
    ShortHandshake,
    /// Reading from a peer's stream failed.
    #[error("stream from {peer} broke: {source}")]
    StreamBroke {
        peer: PeerId,
        #[source]
        source: std::io::Error,
    },
    /// A peer sent a frame the wire format refuses; its stream is closed.
    #[error("malformed frame from {peer}: {source}")]
    Malformed {
        peer: PeerId,
        #[source]
        source: WireError,
    },
    /// A stream to a peer could not be opened (`what`: which one).
    #[error("opening the {what} to {peer}: {source}")]
    OpenStream {
        what: &'static str,
        peer: PeerId,
        #[source]
        source: libp2p_stream::OpenStreamError,
    },
    /// A data-plane stream could not be opened on the chosen path to a peer.
    #[error("opening the {what} to {peer} on its path: {source}")]
    OpenPath {
        what: &'static str,
        peer: PeerId,
        #[source]
        source: shoal_cluster::PathStreamError,
    },
    /// A lane (a stream's direct connection) could not be set up as both sides agreed.
    #[error("setting up the direct connection with {peer}: {why}")]
    LaneSetup { peer: PeerId, why: String },
    /// A lane record failed to seal or open (altered, replayed, out of order, or too large): the lane
    /// ends.
    #[error("a record on the direct connection with {peer} did not authenticate")]
    LaneSealing { peer: PeerId },
    /// The path a pipeline's streams ran on closed (and moving to another failed, or was not tried).
    #[error("the path to {peer} closed")]
    PathLost { peer: PeerId },
    /// A batch waited this long for its tokens on a path to `peer` that is no longer its preferred one.
    #[error("no tokens for {waited_ms} ms on a path to {peer} that is no longer preferred")]
    PathStalled { peer: PeerId, waited_ms: u64 },
    /// A stage's stream to the next stage, `peer`, runs over an address that is no longer its node's
    /// preferred path to it (a better one came up, or this one degraded): the stage ends its stream so
    /// the pipeline opens again on the preferred path.
    #[error("the path to {peer} is no longer the preferred one: moving to the better path")]
    PathMoved { peer: PeerId },
    /// The data-plane protocol was already being accepted on this node.
    #[error("the data-plane protocol is already accepted on this node: {0}")]
    AcceptStreams(libp2p_stream::AlreadyRegistered),
    /// A node id in the instance table is not a peer id.
    #[error("node id {node}: {source}")]
    BadNodeId {
        node: NodeId,
        #[source]
        source: libp2p::identity::ParseError,
    },
    /// A remote chain was asked for without any stage on another node.
    #[error("a remote chain needs at least one node")]
    NoRemoteStages,

    // ---- a stage on another node was lost (the engine sees `EngineError::StageLost`)
    /// The pipeline broke earlier for this reason; every later call fails the same way.
    #[error("{reason}")]
    Broken { reason: String },
    /// A stream between pipeline neighbours closed (`what`: which one).
    #[error("the {what} closed")]
    StreamClosed { what: &'static str },
    /// A node of the pipeline is no longer a member of the cluster.
    #[error("node {node} left the cluster")]
    NodeLeft { node: NodeId },
    /// The last stage sent no tokens for a batch within the deadline.
    #[error("no tokens from the last stage in time")]
    NoTokensInTime,
    /// The last stage answered for another batch than the oldest in flight.
    #[error("tokens of batch {got} while waiting for {want}")]
    OtherBatch { got: u64, want: u64 },
    /// The last stage answered for other sequences than the batch's.
    #[error("the last stage answered for other sequences")]
    OtherSequences,
    /// A stage reported a failure with an error frame (to the driver).
    #[error("a stage failed ({code}): {message}")]
    StageFailed { code: u16, message: String },

    // ---- a stage refuses what it was sent (reported upstream in an error frame)
    /// The upstream stage reported a failure with an error frame.
    #[error("upstream error {code}: {message}")]
    Upstream { code: u16, message: String },
    /// No stage of this instance is hosted here.
    #[error("no stage of instance {instance:016x} here")]
    NoSuchStage { instance: u64 },
    /// A tensor-parallel group's member was sent what its group does not do.
    #[error("tensor-parallel group: {why}")]
    Group { why: String },
    /// A token stream was opened to a stage that is not the last.
    #[error("tokens come from the last stage only")]
    NotLastStage,
    /// The token route could not take the stage's handshake.
    #[error("token queue full at start")]
    TokenQueueFull,
    /// A stage connected to a stage that does not follow it.
    #[error("stage {from} cannot feed stage {to}")]
    WrongUpstream { from: u16, to: usize },
    /// A batch would take the stage past the KV its node reserved for it (a driver bug: refused, never
    /// allocated).
    #[error(
        "stage {stage} of {instance}: {held} + {tokens} KV tokens exceed the {reserved} this node reserved"
    )]
    KvFull {
        stage: usize,
        instance: InstanceId,
        held: usize,
        tokens: usize,
        reserved: usize,
    },
    /// A chunk's first position is not where this stage's KV for the sequence ends.
    #[error("sequence {seq_id} starts at {start} but this stage holds {held} tokens")]
    StartMismatch {
        seq_id: u64,
        start: u32,
        held: usize,
    },
    /// The last stage got another number of sampling jobs than chunks wanting a token.
    #[error("batch {batch_id} wants {wanted} tokens but has {jobs} sampling jobs")]
    JobsMismatch {
        batch_id: u64,
        wanted: usize,
        jobs: usize,
    },
    /// The stage's layers returned nothing to pass on.
    #[error("stage {stage} produced no output")]
    NoOutput { stage: usize },

    // ---- the driver's own bookkeeping (the engine sees `EngineError::Internal`)
    /// A remote chain was given something other than hidden states.
    #[error("a remote chain takes hidden states")]
    NotHidden,
    /// `complete` was called with no batch in flight.
    #[error("no batch in flight")]
    NothingInFlight,
    /// `complete` was called for another batch than the oldest in flight.
    #[error("batch {ticket} completed out of order (oldest in flight: {oldest})")]
    OutOfOrder { ticket: u64, oldest: u64 },

    // ---- bringing an instance up (published in the instance's status)
    /// The model file is not on this node.
    #[error("model '{model}' is not present on this node")]
    ModelMissing { model: ModelId },
    /// The runtime was started without a KV pool.
    #[error("the runtime has no KV pool")]
    NoKvPool,
    /// This node could not set KV memory aside for a stage.
    #[error(transparent)]
    KvReserve(#[from] shoal_engine::kvpool::NoKvMemory),
    /// The instance left the table while this node loaded its part.
    #[error("removed while loading")]
    RemovedWhileLoading,
    /// Another node's stage of the instance failed to load.
    #[error("the stage on node {node} failed: {error}")]
    StageLoadFailed { node: NodeId, error: String },
    /// Fetching the model (or this stage's part of it) from peers or the internet failed.
    #[error("fetching {model}: {source}")]
    Fetch {
        model: ModelId,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Other stages made no progress (download or load) for too long.
    #[error("the stages on {nodes} made no progress for {seconds} s ({state})")]
    StagesStalled {
        nodes: String,
        seconds: u64,
        state: String,
    },
    /// The driver could not connect to the other stages.
    #[error("connecting the pipeline: {0}")]
    Connect(Box<PipelineError>),
    /// The warm-up request the driver runs before reporting ready failed (a stage, a hop, no KV room).
    #[error("warming up the instance: {0}")]
    WarmUp(EngineError),
    /// A loading task panicked or was cancelled.
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
    /// The model (reading the file, a layer range).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The engine (loading layers, computing a batch, starting the engine).
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl PipelineError {
    /// A short, stable label (for metrics and logs).
    pub fn error_type(&self) -> &'static str {
        match self {
            PipelineError::Wire(_) => "wire",
            PipelineError::Io(_) => "io",
            PipelineError::ShortHandshake => "short_handshake",
            PipelineError::StreamBroke { .. } => "stream_broke",
            PipelineError::Malformed { .. } => "malformed_frame",
            PipelineError::OpenStream { .. } => "open_stream",
            PipelineError::OpenPath { .. } => "open_path",
            PipelineError::LaneSetup { .. } => "lane_setup",
            PipelineError::LaneSealing { .. } => "lane_sealing",
            PipelineError::PathLost { .. } => "path_lost",
            PipelineError::PathStalled { .. } => "path_stalled",
            PipelineError::PathMoved { .. } => "path_moved",
            PipelineError::AcceptStreams(_) => "accept_streams",
            PipelineError::BadNodeId { .. } => "bad_node_id",
            PipelineError::NoRemoteStages => "no_remote_stages",
            PipelineError::Broken { .. } => "broken",
            PipelineError::StreamClosed { .. } => "stream_closed",
            PipelineError::NodeLeft { .. } => "node_left",
            PipelineError::NoTokensInTime => "no_tokens_in_time",
            PipelineError::OtherBatch { .. } => "other_batch",
            PipelineError::OtherSequences => "other_sequences",
            PipelineError::StageFailed { .. } => "stage_failed",
            PipelineError::Upstream { .. } => "upstream",
            PipelineError::NoSuchStage { .. } => "no_such_stage",
            PipelineError::Group { .. } => "group",
            PipelineError::NotLastStage => "not_last_stage",
            PipelineError::TokenQueueFull => "token_queue_full",
            PipelineError::WrongUpstream { .. } => "wrong_upstream",
            PipelineError::KvFull { .. } => "kv_full",
            PipelineError::StartMismatch { .. } => "start_mismatch",
            PipelineError::JobsMismatch { .. } => "jobs_mismatch",
            PipelineError::NoOutput { .. } => "no_output",
            PipelineError::NotHidden => "not_hidden",
            PipelineError::NothingInFlight => "nothing_in_flight",
            PipelineError::OutOfOrder { .. } => "out_of_order",
            PipelineError::ModelMissing { .. } => "model_missing",
            PipelineError::NoKvPool => "no_kv_pool",
            PipelineError::KvReserve(_) => "kv_reserve",
            PipelineError::RemovedWhileLoading => "removed_while_loading",
            PipelineError::StageLoadFailed { .. } => "stage_load_failed",
            PipelineError::Fetch { .. } => "fetch",
            PipelineError::StagesStalled { .. } => "stages_stalled",
            PipelineError::Connect(_) => "connect",
            PipelineError::WarmUp(_) => "warm_up",
            PipelineError::Join(_) => "join",
            PipelineError::Model(_) => "model",
            PipelineError::Engine(e) => e.error_type(),
        }
    }

    /// This error met on a stream with `peer`: an I/O failure there is that stream breaking (a stage
    /// lost, which a stream can continue past), not a fault of this node. Other errors are unchanged.
    pub(crate) fn on_stream_with(self, peer: PeerId) -> Self {
        match self {
            PipelineError::Io(source) => PipelineError::StreamBroke { peer, source },
            e => e,
        }
    }

    /// Whether this means a stage on another node is gone (its stream, its node, or the stage itself).
    fn is_stage_loss(&self) -> bool {
        matches!(
            self,
            PipelineError::StreamBroke { .. }
                | PipelineError::Malformed { .. }
                | PipelineError::LaneSealing { .. }
                | PipelineError::Broken { .. }
                | PipelineError::StreamClosed { .. }
                | PipelineError::PathLost { .. }
                | PipelineError::PathStalled { .. }
                | PipelineError::PathMoved { .. }
                | PipelineError::OpenPath { .. }
                | PipelineError::NodeLeft { .. }
                | PipelineError::NoTokensInTime
                | PipelineError::OtherBatch { .. }
                | PipelineError::OtherSequences
                | PipelineError::StageFailed { .. }
        )
    }
}

/// Where the data plane crosses into the engine: a lost stage, or an internal fault (the engine's own
/// errors pass through as they are).
impl From<PipelineError> for EngineError {
    fn from(e: PipelineError) -> Self {
        match e {
            PipelineError::Engine(e) => e,
            e if e.is_stage_loss() => EngineError::StageLost(e.to_string()),
            e => EngineError::Internal(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_stages_and_internal_faults_become_their_engine_errors() {
        let lost = EngineError::from(PipelineError::NodeLeft {
            node: "n1".parse().unwrap(),
        });
        assert_eq!(
            lost,
            EngineError::StageLost("node n1 left the cluster".into())
        );
        let failed = EngineError::from(PipelineError::StageFailed {
            code: 500,
            message: "KV tokens exceed the 8 this node reserved".into(),
        });
        assert_eq!(failed.error_type(), "stage_lost");
        assert!(failed.to_string().contains("reserved"), "{failed}");
        let internal = EngineError::from(PipelineError::OutOfOrder {
            ticket: 3,
            oldest: 2,
        });
        assert_eq!(
            internal,
            EngineError::Internal("batch 3 completed out of order (oldest in flight: 2)".into())
        );
        // Regression: the peer's end closing while a chain opened its streams again after a cut path
        // (a 1 s link cut in the lab) read as an internal fault, so no stream was resumed.
        let peer = PeerId::random();
        let eof = || std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        assert_eq!(
            EngineError::from(PipelineError::Io(eof())).error_type(),
            "internal"
        );
        let lost = EngineError::from(PipelineError::Io(eof()).on_stream_with(peer));
        assert_eq!(lost.error_type(), "stage_lost", "{lost}");
        assert!(lost.to_string().contains(&peer.to_string()), "{lost}");
        let refused = PipelineError::NotLastStage.on_stream_with(peer);
        assert!(matches!(refused, PipelineError::NotLastStage));
        // The engine's own errors pass through unchanged.
        let stopped = EngineError::from(PipelineError::Engine(EngineError::Stopped));
        assert_eq!(stopped, EngineError::Stopped);
        assert_eq!(PipelineError::NoKvPool.error_type(), "no_kv_pool");
    }

    #[test]
    fn status_messages_are_the_ones_published_before() {
        let e = PipelineError::Connect(Box::new(PipelineError::NoRemoteStages));
        assert_eq!(
            e.to_string(),
            "connecting the pipeline: a remote chain needs at least one node"
        );
        let e = PipelineError::StageLoadFailed {
            node: "n2".parse().unwrap(),
            error: "no memory".into(),
        };
        assert_eq!(e.to_string(), "the stage on node n2 failed: no memory");
        let e = PipelineError::WarmUp(EngineError::Stopped);
        assert_eq!(e.error_type(), "warm_up");
        assert!(
            e.to_string().starts_with("warming up the instance: "),
            "{e}"
        );
    }
}
