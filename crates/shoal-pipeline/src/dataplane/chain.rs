//! [`RemoteChain`]: the driver's view of the stages on other nodes.
//!
//! Its streams ([`Links`]: activations to the first remote stage, tokens back from the last) run on
//! the preferred path to each of those nodes (`path.rs`). Between steps (no batch in flight) the chain
//! moves them to another path when the node's preferred path changed (the old streams drain first,
//! so nothing is sent twice). When a path in use is cut — its connection closes, or a stream on it
//! breaks, while the node stays a member over another path — it moves at once and sends again what
//! was not confirmed yet ([`Replay`]), so the batches in flight are answered and no request fails.
//! It does the same, once per batch, when a batch has waited [`STALL_CHECK`] for its tokens while a
//! node's preferred path runs over another address (a path degraded under a batch in flight: its
//! bytes may sit in retransmission for far longer than the step).

use shoal_ids::{InstanceId, NodeId};
use std::collections::HashMap;
use std::sync::Arc;

use futures::AsyncReadExt;
use libp2p::PeerId;
use shoal_cluster::{PathBook, PathId, PathLease};
use shoal_engine::error::EngineError;
use shoal_engine::stage::{
    ChunkSpec, KvOp, Launched, Outputs, Pick, Pool, SampleRef, Stage, StageData, StageInfo,
};
use shoal_model::HostMatrix;
use shoal_wire::{
    Activations, DEFAULT_MAX_FRAME_LEN, DType, Frame, Handshake, Pooled, Role, TokenItem,
};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot, watch};

use shoal_cluster::{ClusterHandle, Snapshot};

use crate::error::PipelineError;

use super::path::{Replay, Watch, off_preferred, open_on_path, watch_nodes, watch_paths};
use super::{
    Alarm, BATCH_TIMEOUT, Inlet, Outlet, READ_QUEUE, WRITE_QUEUE, chunk_headers, encode, handshake,
    kv_frame, open_lane, spawn_reader, spawn_writer, wire_node_id,
};

/// Moves to another path while one batch waits for its tokens, at most this many times (a path that
/// keeps breaking fails the batch).
const MAX_FAILOVERS_PER_BATCH: usize = 3;
/// A batch unanswered this long while a node's preferred path runs over another address than the
/// chain's stream moves the chain there (and sends the batch again) instead of waiting out the old
/// path.
const STALL_CHECK: std::time::Duration = std::time::Duration::from_secs(2);
/// The driver's histogram of a batch's wait for its tokens, by `instance_id`.
const WAIT_SECONDS: &str = "shoal_pipeline_wait_seconds";

/// A batch sent and not yet answered: the sequences it owes a token and a pooled row, in batch order.
struct InFlight {
    batch_id: u64,
    sampled: Vec<u64>,
    pooled: Vec<u64>,
    /// When it was sent (its tokens' wait is timed from here).
    sent: std::time::Instant,
}

/// What the chain needs to open its streams again.
struct Route {
    cluster: ClusterHandle,
    instance: InstanceId,
    layers: (usize, usize),
    first: PeerId,
    last: PeerId,
    /// Whether the streams may move to direct connections (lanes).
    lanes: bool,
}

/// The chain's streams and the tasks feeding its event channel, on one path to each node.
struct Links {
    down: Outlet,
    /// What the engine thread waits on, and only this: token frames (read by the engine thread itself
    /// from the token stream's lane, or straight from its reader task on a relay),
    /// [`PipelineError::NodeLeft`] from the task watching the membership and
    /// [`PipelineError::PathLost`] from the one watching the paths (an [`Alarm`]). A relay's channel
    /// is bounded by [`READ_QUEUE`]: the driver reads every batch's tokens before it sends more than
    /// [`RemoteChain::info`]'s depth of batches, so it never fills; a stalled engine thread would make
    /// the reader wait rather than buffer.
    events: Inlet,
    /// The paths the activation and token streams run on.
    down_path: PathId,
    owner_path: PathId,
    /// Kept so the owner stream stays open as long as the links live (and says how tokens come back).
    owner: Outlet,
    /// Dropped with the links, which stops the watches.
    _stop: [oneshot::Sender<()>; 2],
    /// The paths count these streams as this instance's while they live.
    _leases: [PathLease; 2],
}

/// The stages after the driver's own, on other nodes, seen as one [`Stage`].
pub struct RemoteChain {
    links: Links,
    route: Route,
    /// Frames sent since the oldest unanswered batch (sent again on a new path after a cut).
    replay: Replay,
    /// Times the chain moved to another path (tokens of an answered batch may then arrive twice).
    moves: u64,
    /// The runtime the reader runs on, whose timer bounds a wait ([`BATCH_TIMEOUT`]).
    rt: Handle,
    /// Tokens of KV each sequence holds on the remote stages (mirrors what was sent).
    lens: HashMap<u64, usize>,
    next_batch: u64,
    dtype: DType,
    nodes: Vec<NodeId>,
    broken: Option<String>,
    /// Batches sent and not yet answered, oldest first.
    pending: std::collections::VecDeque<InFlight>,
    /// Tokens of KV the remote stages have room for (the least of them), when they said.
    kv_capacity: Option<usize>,
    /// `shoal_pipeline_wait_seconds`: a batch sent → its tokens read back. Less the remote stages'
    /// `shoal_stage_step_seconds`, what is left is the hops' own cost.
    wait_seconds: metrics::Histogram,
    /// Set to true when the chain breaks ([`RemoteChain::on_break`]).
    on_break: Option<watch::Sender<bool>>,
}

impl RemoteChain {
    /// Tells `broke` (true) when the chain breaks: from then on every call fails, so its driver must be
    /// brought up again (the runtime's `mend`).
    pub fn on_break(mut self, broke: watch::Sender<bool>) -> Self {
        self.on_break = Some(broke);
        self
    }

    /// Bounds the KV tokens the engine may hold to what the remote stages reserved.
    pub fn with_kv_capacity(mut self, tokens: Option<usize>) -> Self {
        self.kv_capacity = tokens;
        self
    }

    /// Connects the driver (`stage 0`, this node) to `nodes` (stages 1.., in order) of `instance`.
    pub async fn connect(
        cluster: &ClusterHandle,
        instance: &InstanceId,
        layers: &[(usize, usize)],
        nodes: &[NodeId],
        dtype: DType,
        lanes: bool,
    ) -> Result<Self, PipelineError> {
        let peers: Vec<PeerId> = nodes
            .iter()
            .map(|n| {
                n.parse().map_err(|source| PipelineError::BadNodeId {
                    node: n.clone(),
                    source,
                })
            })
            .collect::<Result<_, _>>()?;
        let (first, last) = match (peers.first(), peers.last()) {
            (Some(f), Some(l)) => (*f, *l),
            _ => return Err(PipelineError::NoRemoteStages),
        };
        let route = Route {
            cluster: cluster.clone(),
            instance: *instance,
            layers: layers.first().copied().unwrap_or((0, 0)),
            first,
            last,
            lanes,
        };
        let links = route.open_bounded(nodes).await?;
        Ok(Self {
            links,
            route,
            replay: Replay::default(),
            moves: 0,
            rt: Handle::current(),
            lens: HashMap::new(),
            next_batch: 1,
            dtype,
            nodes: nodes.to_vec(),
            broken: None,
            kv_capacity: None,
            pending: std::collections::VecDeque::new(),
            wait_seconds: metrics::histogram!(WAIT_SECONDS, "instance_id" => instance.to_string()),
            on_break: None,
        })
    }

    /// The paths the chain's streams run on now: to the first remote stage, and the token stream's.
    pub fn paths(&self) -> (PathId, PathId) {
        (self.links.down_path, self.links.owner_path)
    }

    /// How the chain's streams travel now (activations, tokens): `lane` (a direct connection) or
    /// `relay` (through the cluster connection).
    pub fn transports(&self) -> (&'static str, &'static str) {
        (self.links.down.transport(), self.links.owner.transport())
    }

    /// Marks the pipeline broken by `why` (the first reason is kept for every later call).
    fn lost(&mut self, why: PipelineError) -> PipelineError {
        if self.broken.is_none() {
            tracing::error!(kind = why.error_type(), "pipeline broken: {why}");
            self.broken = Some(why.to_string());
            if let Some(tx) = &self.on_break {
                let _ = tx.send(true);
            }
        }
        why
    }

    fn check_broken(&self) -> Result<(), PipelineError> {
        match &self.broken {
            Some(reason) => Err(PipelineError::Broken {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Queues `bytes` on the stream to the next stage; `false` when that stream is gone.
    fn try_send(&mut self, bytes: Vec<u8>) -> bool {
        self.links.down.send(bytes)
    }

    /// Sends logged frames; a cut path on the way moves the chain and sends everything again.
    fn send_logged(&mut self, frames: Vec<Vec<u8>>) -> Result<(), PipelineError> {
        self.check_broken()?;
        for bytes in frames {
            if !self.try_send(bytes) {
                return self.fail_over(PipelineError::StreamClosed {
                    what: "stream to the next stage",
                });
            }
        }
        Ok(())
    }

    /// Between steps: moves the streams to the preferred paths when those changed (the old streams
    /// drain and close, so nothing is sent twice), or at once with [`Self::fail_over`] when a path in
    /// use closed.
    fn follow_paths(&mut self) -> Result<(), PipelineError> {
        if !self.pending.is_empty() {
            return Ok(());
        }
        let book = self.route.cluster.paths().book();
        let (first, last) = (self.route.first, self.route.last);
        let alive = book.is_alive(&first, self.links.down_path.connection)
            && book.is_alive(&last, self.links.owner_path.connection);
        if !alive {
            return self.fail_over(PipelineError::PathLost { peer: first });
        }
        if self.off_preferred(&book, false).is_none() {
            return Ok(());
        }
        let nodes = self.nodes.clone();
        match self.rt.block_on(self.route.open_bounded(&nodes)) {
            Ok(links) => {
                tracing::info!(
                    instance = %self.route.instance,
                    from = %self.links.down_path.addr,
                    to = %links.down_path.addr,
                    "pipeline streams moved to a better path"
                );
                self.links = links;
                self.moves += 1;
            }
            Err(e) => {
                // The old path still works: stay on it and try again at the next step.
                tracing::warn!(kind = e.error_type(), "moving to a better path failed: {e}");
            }
        }
        Ok(())
    }

    /// A node of the chain's streams whose preferred path in `book` is not the one its stream runs on
    /// (`None`: both streams are on their nodes' preferred paths); with `other_address`, only one
    /// preferred over another address than the stream's (another connection over the same address is
    /// the same network path, no way around a stall).
    fn off_preferred(&self, book: &PathBook, other_address: bool) -> Option<PeerId> {
        [
            (self.route.first, self.links.down_path),
            (self.route.last, self.links.owner_path),
        ]
        .into_iter()
        .find(|(peer, used)| off_preferred(book, peer, used, other_address))
        .map(|(peer, _)| peer)
    }

    /// A path in use was cut (`why`): opens new streams on the paths left and sends again everything
    /// not confirmed; the pipeline breaks only when that is impossible (no path, the node left, or the
    /// new path breaks too).
    fn fail_over(&mut self, why: PipelineError) -> Result<(), PipelineError> {
        self.check_broken()?;
        let frames = match self.replay.frames() {
            Ok(f) => f,
            Err(e) => return Err(self.lost(e)),
        };
        tracing::warn!(
            instance = %self.route.instance,
            kind = why.error_type(),
            "pipeline path lost ({why}): moving to another and sending {} unconfirmed frame(s) again",
            frames.len()
        );
        let nodes = self.nodes.clone();
        for _ in 0..MAX_FAILOVERS_PER_BATCH {
            let cut = [self.links.down_path, self.links.owner_path];
            let links = match self.rt.block_on(self.route.open_after_cut(&nodes, cut)) {
                Ok(l) => l,
                // The node has no path left: what broke the stream is the news.
                Err(PipelineError::PathLost { .. }) => return Err(self.lost(why)),
                Err(e) => return Err(self.lost(e)),
            };
            self.links = links;
            self.moves += 1;
            if frames.iter().cloned().all(|f| self.try_send(f)) {
                return Ok(());
            }
        }
        Err(self.lost(why))
    }

    /// Blocks the engine thread until the tokens of `batch_id` arrive (after its pooled rows, if it
    /// has any), the pipeline breaks (a stream closes with no other path, a stage fails, a stage node
    /// leaves the cluster: each noticed as it happens), or [`BATCH_TIMEOUT`] passes. A cut path moves
    /// the chain to another and the wait goes on; so does (once) a wait past [`STALL_CHECK`] while a
    /// node's preferred path runs over another address.
    fn wait_tokens(
        &mut self,
        batch_id: u64,
    ) -> Result<(Vec<TokenItem>, Option<Pooled>), PipelineError> {
        let start = tokio::time::Instant::now();
        let deadline = start + BATCH_TIMEOUT;
        let mut check = start + STALL_CHECK;
        let mut stall_moved = false;
        let mut pooled = None;
        let mut failovers = 0;
        loop {
            let cut = match self.links.events.recv_by(&self.rt, deadline.min(check)) {
                Ok(Some(Ok(Frame::Tokens { batch_id: b, items }))) if b == batch_id => {
                    return Ok((items, pooled));
                }
                Ok(Some(Ok(Frame::Pooled(p)))) if p.batch_id == batch_id && pooled.is_none() => {
                    pooled = Some(p);
                    continue;
                }
                // Answered before the chain moved, and computed again after it.
                Ok(Some(Ok(Frame::Tokens { batch_id: b, .. })))
                    if self.moves > 0 && b < batch_id =>
                {
                    continue;
                }
                Ok(Some(Ok(Frame::Pooled(p)))) if self.moves > 0 && p.batch_id < batch_id => {
                    continue;
                }
                Ok(Some(Ok(Frame::Pooled(p)))) => {
                    return Err(self.lost(PipelineError::OtherBatch {
                        got: p.batch_id,
                        want: batch_id,
                    }));
                }
                Ok(Some(Ok(Frame::Tokens { batch_id: got, .. }))) => {
                    return Err(self.lost(PipelineError::OtherBatch {
                        got,
                        want: batch_id,
                    }));
                }
                Ok(Some(Ok(Frame::Error { code, message }))) => {
                    return Err(self.lost(PipelineError::StageFailed { code, message }));
                }
                Ok(Some(Ok(_))) => continue,
                Ok(Some(Err(e @ PipelineError::NodeLeft { .. }))) => return Err(self.lost(e)),
                Ok(Some(Err(e))) => e,
                Ok(None) => PipelineError::StreamClosed {
                    what: "token stream from the last stage",
                },
                Err(_) if tokio::time::Instant::now() < deadline => {
                    check = tokio::time::Instant::now() + STALL_CHECK;
                    // Once per batch: a long batch is not computed again each time paths flap.
                    let book = self.route.cluster.paths().book();
                    match self.off_preferred(&book, true).filter(|_| !stall_moved) {
                        Some(peer) => {
                            stall_moved = true;
                            PipelineError::PathStalled {
                                peer,
                                waited_ms: start.elapsed().as_millis() as u64,
                            }
                        }
                        None => continue,
                    }
                }
                Err(_) => return Err(self.lost(PipelineError::NoTokensInTime)),
            };
            failovers += 1;
            if failovers > MAX_FAILOVERS_PER_BATCH {
                return Err(self.lost(cut));
            }
            // Rows of a batch computed again come again.
            pooled = None;
            self.fail_over(cut)?;
        }
    }
}

impl Route {
    /// Opens the chain's streams on the preferred path to each node: the owner stream first (the last
    /// stage must know where tokens go before any batch arrives), then the activation stream.
    async fn open(&self, nodes: &[NodeId]) -> Result<Links, PipelineError> {
        let cluster = &self.cluster;
        let me = wire_node_id(&cluster.id());
        let inst = self.instance.as_u64();
        let traffic = cluster.traffic();
        let mut owner = open_on_path(cluster, self.last, &self.instance, "token stream").await?;
        let mut owner_stream = owner.stream;
        handshake(
            &mut owner_stream,
            &Handshake::new(
                me,
                cluster.cluster_hash(),
                Role::Owner { instance_id: inst },
            ),
        )
        .await
        .map_err(|e| e.on_stream_with(self.last))?;
        let owner_lane = open_lane(
            &mut owner_stream,
            owner.path.addr,
            self.last,
            traffic.clone(),
            self.lanes,
        )
        .await
        .map_err(|e| e.on_stream_with(self.last))?;
        let mut down =
            open_on_path(cluster, self.first, &self.instance, "activation stream").await?;
        let mut down_stream = down.stream;
        let (l0, l1) = self.layers;
        handshake(
            &mut down_stream,
            &Handshake::new(
                me,
                cluster.cluster_hash(),
                Role::Stage {
                    instance_id: inst,
                    stage_index: 0,
                    layer_start: l0 as u32,
                    layer_end: l1 as u32,
                },
            ),
        )
        .await
        .map_err(|e| e.on_stream_with(self.first))?;
        let down_lane = open_lane(
            &mut down_stream,
            down.path.addr,
            self.first,
            traffic.clone(),
            self.lanes,
        )
        .await
        .map_err(|e| e.on_stream_with(self.first))?;
        // On a relay the watches only hold weak senders: the channel closes when the reader ends (the
        // token stream closed), which the engine thread sees at once. On a lane they shut it down.
        let mut relay_events = None;
        for (lane, lease) in [
            (&owner_lane, &mut owner.lease),
            (&down_lane, &mut down.lease),
        ] {
            if lane.is_none() {
                lease.set_relayed();
            }
        }
        let (mut events, owner_out) = match owner_lane {
            Some(lane) => (
                Inlet::Lane(Box::new(lane.reader)),
                Outlet::Lane(lane.writer),
            ),
            None => {
                let (or, ow) = owner_stream.split();
                let (events_tx, events) = mpsc::channel(READ_QUEUE);
                spawn_reader(or, events_tx.clone(), traffic.clone(), self.last);
                // Nothing is sent on the owner stream but the handshake: one slot is enough.
                let (owner_tx, owner_rx) = mpsc::channel(1);
                spawn_writer(ow, owner_rx, traffic.clone(), self.last);
                relay_events = Some(events_tx);
                (Inlet::Relay(events), Outlet::Relay(owner_tx))
            }
        };
        let alarm = match (&relay_events, events.alarm()) {
            (Some(tx), _) => Alarm::Relay(tx.downgrade()),
            (None, Some(a)) => a,
            (None, None) => return Err(PipelineError::NoRemoteStages),
        };
        let (down_out, down_writer) = match down_lane {
            Some(lane) => {
                // A break down the pipeline (a stage's thread ending) closes this lane: the wait for
                // tokens ends at once and the chain moves.
                if let Inlet::Lane(r) = &mut events {
                    r.watch(&lane.writer)?;
                }
                (Outlet::Lane(lane.writer), None)
            }
            None => {
                let (dr, dw) = down_stream.split();
                drop(dr);
                let (down_tx, down_rx) = mpsc::channel(WRITE_QUEUE);
                spawn_writer(dw, down_rx, traffic, self.first);
                (Outlet::Relay(down_tx.clone()), Some(down_tx))
            }
        };
        let (stop_nodes, stop) = oneshot::channel();
        let stage_nodes = nodes.to_vec();
        watch_nodes(
            cluster.subscribe(),
            move |snap: &Arc<Snapshot>| {
                let members = snap.state.members();
                stage_nodes.iter().find(|n| !members.contains(n)).cloned()
            },
            alarm.clone(),
            stop,
        );
        let (stop_paths, stop) = oneshot::channel();
        watch_paths(
            cluster.paths().watch(),
            vec![(self.first, down.path), (self.last, owner.path)],
            down_writer,
            alarm,
            Watch::Cuts,
            stop,
        );
        drop(relay_events);
        tracing::debug!(instance = %self.instance, down = down_out.transport(),
            tokens = owner_out.transport(), "pipeline streams open");
        Ok(Links {
            down: down_out,
            events,
            down_path: down.path,
            owner_path: owner.path,
            owner: owner_out,
            _stop: [stop_nodes, stop_paths],
            _leases: [down.lease, owner.lease],
        })
    }

    /// [`Self::open`], bounded by [`OPEN_TIMEOUT`] (a stream on a dead connection never opens).
    async fn open_bounded(&self, nodes: &[NodeId]) -> Result<Links, PipelineError> {
        tokio::time::timeout(OPEN_TIMEOUT, self.open(nodes))
            .await
            .map_err(|_| PipelineError::PathLost { peer: self.first })?
    }

    /// [`Self::open`] after a cut of the paths `cut`: waits (up to [`CUT_NOTICE`]) until the network
    /// task prefers other paths to both nodes, so the new streams do not land on the cut one again
    /// (after that, the preferred path is tried whatever it is: a stream can break on a sound path).
    async fn open_after_cut(
        &self,
        nodes: &[NodeId],
        cut: [PathId; 2],
    ) -> Result<Links, PipelineError> {
        let deadline = tokio::time::Instant::now() + CUT_NOTICE;
        let paths = self.cluster.paths();
        let mut book = paths.watch();
        loop {
            let (clear, gone) = {
                let b = book.borrow_and_update();
                let preferred = [self.first, self.last].map(|peer| (peer, b.preferred(&peer)));
                // Our own paths still up: the break was further down the pipeline (between two
                // stages, whose node moves its own stream), so the same paths serve again.
                let ours_alive = b.is_alive(&self.first, cut[0].connection)
                    && b.is_alive(&self.last, cut[1].connection);
                let clear = ours_alive
                    || preferred.iter().all(|(_, p)| {
                        p.is_some_and(|p| cut.iter().all(|c| c.connection != p.connection))
                    });
                (clear, preferred.into_iter().find(|(_, p)| p.is_none()))
            };
            // No connection left at all: the node is gone, not a path.
            if let Some((peer, _)) = gone {
                return Err(PipelineError::PathLost { peer });
            }
            if clear {
                break;
            }
            match tokio::time::timeout_at(deadline, book.changed()).await {
                Ok(Ok(())) => {}
                _ => break,
            }
        }
        self.open_bounded(nodes).await
    }
}

/// How long a chain whose path was cut waits for the network task to notice (it drops a silent
/// connection within ~2 s).
const CUT_NOTICE: std::time::Duration = std::time::Duration::from_secs(5);
/// The longest opening the chain's streams (and their handshakes) may take.
const OPEN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl RemoteChain {
    /// Tokens of KV `seq_id` holds on the remote stages (as sent).
    pub fn cached_len(&self, seq_id: u64) -> usize {
        self.lens.get(&seq_id).copied().unwrap_or(0)
    }

    /// Sends a batch's sampling jobs and hidden states to the next stage (on a better path first,
    /// when there is one and nothing is in flight).
    fn send_batch(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<Launched, PipelineError> {
        let StageData::Hidden(h) = input else {
            return Err(PipelineError::NotHidden);
        };
        self.check_broken()?;
        self.follow_paths()?;
        let batch_id = self.next_batch;
        self.next_batch += 1;
        let starts: Vec<usize> = batch.iter().map(|c| self.cached_len(c.seq_id)).collect();
        let rows = shoal_engine::stage::logit_rows(batch, sampling);
        let chunks = chunk_headers(batch, starts, rows.as_deref());
        // The sampling jobs and the hidden states (encoded straight from them) go as one message: one
        // write, one wakeup of the next stage.
        let mut bytes = Vec::new();
        if !sampling.is_empty() {
            let jobs = sampling
                .iter()
                .map(|s| {
                    let mut job = s.sampler.job(s.seq_id, s.history, s.mask);
                    job.draft = s.draft.to_vec();
                    job.draft_masks = s
                        .draft_masks
                        .iter()
                        .map(|m| m.as_ref().map_or_else(Vec::new, |m| m.words().to_vec()))
                        .collect();
                    job
                })
                .collect();
            Frame::Sample { batch_id, jobs }.encode_into(&mut bytes, DEFAULT_MAX_FRAME_LEN)?;
        }
        Activations::encode_f32_into(
            &mut bytes,
            batch_id,
            &chunks,
            h.cols() as u32,
            h.data(),
            self.dtype,
        )?;
        let frames = vec![bytes];
        // Logged before it is sent: a cut while sending sends it again with the rest.
        let starts = chunks
            .iter()
            .map(|c| (c.seq_id, c.start_pos as usize))
            .collect();
        self.replay.batch(batch_id, starts, frames.clone());
        self.pending.push_back(InFlight {
            batch_id,
            sampled: sampling.iter().map(|s| s.seq_id).collect(),
            pooled: batch
                .iter()
                .filter(|c| c.pool != Pool::None)
                .map(|c| c.seq_id)
                .collect(),
            sent: std::time::Instant::now(),
        });
        for c in batch {
            *self.lens.entry(c.seq_id).or_default() += c.len;
        }
        self.send_logged(frames)?;
        Ok(Launched::Pending(batch_id))
    }

    /// Waits for the tokens of the oldest batch in flight, which must be `ticket`.
    fn receive_batch(&mut self, ticket: u64) -> Result<StageData, PipelineError> {
        let Some(flight) = self.pending.pop_front() else {
            return Err(PipelineError::NothingInFlight);
        };
        if flight.batch_id != ticket {
            return Err(PipelineError::OutOfOrder {
                ticket,
                oldest: flight.batch_id,
            });
        }
        let (items, pooled) = self.wait_tokens(flight.batch_id)?;
        self.wait_seconds.record(flight.sent.elapsed());
        self.replay.answered(flight.batch_id);
        let pooled_ids = pooled.as_ref().map_or(&[][..], |p| &p.seq_ids[..]);
        // One item per sequence sampled, or several in a row for one that verified a draft.
        let mut answered: Vec<u64> = items.iter().map(|i| i.seq_id).collect();
        answered.dedup();
        if answered != flight.sampled || pooled_ids != flight.pooled {
            return Err(self.lost(PipelineError::OtherSequences));
        }
        let pooled = match pooled {
            Some(p) => HostMatrix::new(p.seq_ids.len(), p.cols as usize, p.values)?,
            None => HostMatrix::default(),
        };
        let picks = items
            .into_iter()
            .map(|i| Pick {
                id: i.token,
                logprob: i.logprob,
                top: i.top,
            })
            .collect();
        Ok(StageData::Sampled(Outputs { picks, pooled }))
    }

    /// Sends a KV operation down the pipeline (every stage applies it).
    fn send_kv(&mut self, op: KvOp) -> Result<(), PipelineError> {
        self.check_broken()?;
        match op {
            KvOp::Release { seq_id } | KvOp::Retain { seq_id, .. } => {
                self.lens.remove(&seq_id);
            }
            KvOp::Rewind { seq_id, len } => {
                if let Some(held) = self.lens.get_mut(&seq_id) {
                    *held = (*held).min(len);
                }
            }
            KvOp::Start { .. } | KvOp::DropPrefix { .. } | KvOp::Fork { .. } => {}
        }
        let frame = encode(&kv_frame(op))?;
        self.replay.kv(frame.clone());
        self.send_logged(vec![frame])?;
        match op {
            KvOp::Start { seq_id, len, .. }
            | KvOp::Fork {
                into: seq_id, len, ..
            } => {
                self.lens.insert(seq_id, len);
            }
            _ => {}
        }
        Ok(())
    }
}

impl Stage for RemoteChain {
    fn info(&self) -> StageInfo {
        StageInfo {
            concurrent_stages: self.nodes.len(),
            kv_value_bytes: shoal_model::kv::VALUE_BYTES,
            local_kv_layers: 0,
            kv_token_capacity: self.kv_capacity,
        }
    }

    fn launch(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<Launched, EngineError> {
        Ok(self.send_batch(batch, input, sampling)?)
    }

    fn complete(&mut self, ticket: u64) -> Result<StageData, EngineError> {
        Ok(self.receive_batch(ticket)?)
    }

    fn kv(&mut self, op: KvOp) -> Result<(), EngineError> {
        Ok(self.send_kv(op)?)
    }

    fn held_sequences(&self) -> usize {
        self.lens.len()
    }
}

#[cfg(test)]
#[path = "chain_tests.rs"]
mod tests;
