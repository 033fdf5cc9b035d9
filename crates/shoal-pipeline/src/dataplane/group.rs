//! Tensor-parallel groups on the data plane (issue 31, decision 024): the members of a stage that
//! several nodes compute at once, joined by lanes.
//!
//! Every pair of members has one lane, opened by the lower rank (a data-plane stream whose handshake
//! says [`Role::Member`], moved to a lane as every stream is; a group has no relay — without a direct
//! connection it does not form). The lanes carry the all-reduce ([`AllReduce`]) and, from rank 0, the
//! stage's input: before each batch rank 0 sends its token ids ([`Frame::Inputs`]) or hidden states
//! ([`Frame::Activations`], f32), and every KV operation it applies (`Release`, `Prefix`), ahead of
//! that batch's partial sums — so on each lane the order of frames is the order of work.
//!
//! Rank 0 is a [`LocalStage`] in the driver's engine that joined its group ([`connect_group`] makes
//! its [`MemberLink`]). The other members wait in [`Members`] with their loaded share until rank 0
//! opens to them (the driver does once every member reports ready); each then opens to the ranks above
//! its own, and once it holds a lane to every other member runs its share on a thread of its own
//! ([`run_member`]): read rank 0's next frame, compute or apply it, repeat. When rank 0 goes (its lane
//! closes) the member's caches are cleared and its share waits again for a new rank 0. A member whose
//! lane breaks ends its round with an error on every other member: the driver sees its stage lost.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use libp2p::{PeerId, Stream};
use shoal_cluster::{ClusterHandle, PathLease};
use shoal_engine::EngineError;
use shoal_engine::batch::{ChunkSpec, KvOp, StageData};
use shoal_engine::group::{GroupKv, GroupLink};
use shoal_engine::kvpool::KvShare;
use shoal_engine::stage::{LocalStage, Stage};
use shoal_ids::InstanceId;
use shoal_model::HostMatrix;
use shoal_wire::{Activations, DType, Frame, Handshake, Inputs, PrefixAction, PrefixOp, Role};

use super::lane::{Interrupt, LaneReader, LaneWriter, Received};
use super::path::open_on_path;
use super::reduce::AllReduce;
use super::{
    Lanes, accept_lane, chunk_headers, chunk_specs, encode, handshake, kv_frame, logit_rows_of,
    open_lane, prefix_kv_op, rewind_frame, wire_node_id,
};
use crate::error::PipelineError;

/// A group's stage on this node: (wire instance id, stage index).
type Key = (u64, u16);

/// What keeps a lane's stream (and, on the opening side, its path's count) while the group lives.
type Held = (Stream, Option<PathLease>);

/// Members of tensor-parallel groups hosted on this node (ranks ≥ 1), waiting for their lanes or
/// running.
#[derive(Clone, Default)]
pub struct Members {
    inner: Arc<Mutex<HashMap<Key, Slot>>>,
}

struct Slot {
    instance: InstanceId,
    rank: usize,
    /// Every member's node, by rank.
    peers: Vec<PeerId>,
    /// The share, while it waits for a rank 0 (taken while it runs).
    stage: Option<LocalStage>,
    /// Lanes gathered so far, by the other end's rank.
    links: HashMap<usize, (LaneWriter, LaneReader)>,
    held: Vec<Held>,
    /// What wakes the running member's readers (its group torn down).
    running: Vec<Weak<Interrupt>>,
    /// The KV this node set aside for the share (none for a member without heads).
    _kv: Option<KvShare>,
}

impl Members {
    /// Hosts rank `rank` of the group computing stage `index` of `instance`: `stage` is its loaded
    /// share (its KV set aside as `kv`), `peers` every member's node by rank.
    pub fn insert(
        &self,
        instance: &InstanceId,
        index: usize,
        rank: usize,
        peers: Vec<PeerId>,
        stage: LocalStage,
        kv: Option<KvShare>,
    ) {
        let slot = Slot {
            instance: *instance,
            rank,
            peers,
            stage: Some(stage),
            links: HashMap::new(),
            held: Vec::new(),
            running: Vec::new(),
            _kv: kv,
        };
        if let Ok(mut m) = self.inner.lock()
            && let Some(old) = m.insert((instance.as_u64(), index as u16), slot)
        {
            stop(&old);
        }
    }

    /// Stops and forgets every member of `instance` hosted here.
    pub fn remove(&self, instance: &InstanceId) {
        if let Ok(mut m) = self.inner.lock() {
            m.retain(|k, slot| {
                let keep = k.0 != instance.as_u64();
                if !keep {
                    stop(slot);
                }
                keep
            });
        }
    }

    /// Adds the lane to rank `other`; starts the member once it has one to every other rank.
    fn add_link(&self, key: Key, other: usize, lane: (LaneWriter, LaneReader), held: Held) {
        let Ok(mut m) = self.inner.lock() else { return };
        let Some(slot) = m.get_mut(&key) else { return };
        slot.links.insert(other, lane);
        slot.held.push(held);
        self.try_start(key, slot);
    }

    /// Starts the member on a thread of its own once its share waits and it has a lane to every
    /// other rank (a new rank 0's lanes may arrive before the last group's thread gave the share back).
    fn try_start(&self, key: Key, slot: &mut Slot) {
        if slot.links.len() + 1 < slot.peers.len() {
            return;
        }
        let Some(mut stage) = slot.stage.take() else {
            return;
        };
        let links: Vec<(usize, LaneWriter, LaneReader)> =
            slot.links.drain().map(|(r, (w, rd))| (r, w, rd)).collect();
        let reduce = AllReduce::new(slot.rank, slot.peers.len(), links);
        slot.running = reduce.interrupts();
        let held = std::mem::take(&mut slot.held);
        let reduce = Arc::new(Mutex::new(reduce));
        let link = MemberLink::new(
            slot.rank,
            reduce.clone(),
            stage.model().config().dim,
            Vec::new(),
        );
        if let Err(e) = stage.join(Box::new(link)) {
            tracing::error!(
                instance = key.0,
                stage = key.1,
                "a group member cannot start: {e}"
            );
            slot.stage = Some(stage);
            return;
        }
        let members = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("shoal-member-{}-{}", key.0, key.1))
            .spawn(move || {
                let _held = held;
                run_member(&members, key, stage, &reduce)
            });
        if let Err(e) = spawned {
            tracing::error!("no thread for a group member: {e}");
        }
    }

    /// A member's share back from its thread (rank 0 went), ready for the next.
    fn put_back(&self, key: Key, stage: LocalStage) {
        if let Ok(mut m) = self.inner.lock()
            && let Some(slot) = m.get_mut(&key)
        {
            slot.stage = Some(stage);
            slot.running.clear();
            self.try_start(key, slot);
        }
    }

    /// Drops the lanes gathered for a group that cannot form (the share waits for the next).
    fn abandon(&self, key: Key) {
        if let Ok(mut m) = self.inner.lock()
            && let Some(slot) = m.get_mut(&key)
        {
            slot.links.clear();
            slot.held.clear();
        }
    }

    fn slot_of(&self, key: Key) -> Option<(InstanceId, usize, Vec<PeerId>)> {
        let m = self.inner.lock().ok()?;
        m.get(&key).map(|s| (s.instance, s.rank, s.peers.clone()))
    }
}

/// Wakes a running member so that its thread ends.
fn stop(slot: &Slot) {
    for i in slot.running.iter().filter_map(Weak::upgrade) {
        i.fire(PipelineError::RemovedWhileLoading);
    }
}

/// One member's link to its group: the all-reduce, and on rank 0 the input it sends the others.
pub struct MemberLink {
    rank: usize,
    members: usize,
    /// Rank 0: the least KV (tokens) the other members set aside.
    kv_capacity: Option<usize>,
    reduce: Arc<Mutex<AllReduce>>,
    dim: usize,
    batch_id: u64,
    msg: Vec<u8>,
    _held: Vec<Held>,
    /// Rank 0: each batch's time in all-reduces (`shoal_group_reduce_seconds`), and this batch's so far.
    reduce_seconds: Option<metrics::Histogram>,
    reducing: Duration,
    /// Values this member has all-reduced so far ([`MemberLink::reduced_values`]).
    reduced: Arc<AtomicU64>,
}

impl MemberLink {
    /// A counter of the values this member has all-reduced (each partial sum's length, summed):
    /// what its exchanges carry, e.g. whether a split head's step sent whole logit rows.
    pub fn reduced_values(&self) -> Arc<AtomicU64> {
        self.reduced.clone()
    }

    fn new(rank: usize, reduce: Arc<Mutex<AllReduce>>, dim: usize, held: Vec<Held>) -> Self {
        let members = reduce.lock().map_or(0, |r| r.members());
        Self {
            rank,
            members,
            kv_capacity: None,
            reduce,
            dim,
            batch_id: 0,
            msg: Vec::new(),
            _held: held,
            reduce_seconds: None,
            reducing: Duration::ZERO,
            reduced: Arc::default(),
        }
    }

    fn send(&mut self) -> Result<(), EngineError> {
        let mut r = self.reduce.lock().map_err(|_| poisoned())?;
        r.send_all(&self.msg).map_err(EngineError::from)
    }
}

fn poisoned() -> EngineError {
    EngineError::Internal("a group's all-reduce was poisoned by a panic".into())
}

impl GroupLink for MemberLink {
    fn rank(&self) -> usize {
        self.rank
    }

    fn members(&self) -> usize {
        self.members
    }

    fn kv_token_capacity(&self) -> Option<usize> {
        self.kv_capacity
    }

    fn send_batch(
        &mut self,
        batch: &[ChunkSpec],
        starts: &[usize],
        rows: Option<&[usize]>,
        input: &StageData,
    ) -> Result<(), EngineError> {
        if self.rank() != 0 {
            return Ok(());
        }
        if let Some(h) = &self.reduce_seconds
            && !self.reducing.is_zero()
        {
            h.record(self.reducing.as_secs_f64());
        }
        self.reducing = Duration::ZERO;
        self.batch_id += 1;
        let chunks = chunk_headers(batch, starts.iter().copied(), rows);
        self.msg.clear();
        let wire = |e: shoal_wire::WireError| EngineError::from(PipelineError::from(e));
        match input {
            StageData::Tokens(ids) => {
                let frame = Frame::Inputs(Inputs {
                    batch_id: self.batch_id,
                    chunks,
                    tokens: ids.clone(),
                });
                frame
                    .encode_into(&mut self.msg, shoal_wire::DEFAULT_MAX_FRAME_LEN)
                    .map_err(wire)?;
            }
            StageData::Hidden(h) => Activations::encode_f32_into(
                &mut self.msg,
                self.batch_id,
                &chunks,
                h.cols() as u32,
                h.data(),
                DType::F32,
            )
            .map_err(wire)?,
            _ => {
                return Err(EngineError::Internal(
                    "a group's input is token ids or hidden states".into(),
                ));
            }
        }
        self.send()
    }

    fn send_kv(&mut self, change: GroupKv) -> Result<(), EngineError> {
        if self.rank() != 0 {
            return Ok(());
        }
        let frame = match change {
            GroupKv::Op(op) => kv_frame(op),
            GroupKv::Rewind { seq_id, len } => rewind_frame(seq_id, len),
            GroupKv::Clear => Frame::Prefix(PrefixOp {
                action: PrefixAction::Clear,
                seq_id: 0,
                prefix_id: 0,
                len: 0,
            }),
        };
        self.msg = encode(&frame)?;
        self.send()
    }

    fn reduce(&mut self, partial: &mut [f32]) -> Result<(), EngineError> {
        let started = Instant::now();
        let mut r = self.reduce.lock().map_err(|_| poisoned())?;
        let result = r.reduce(partial, self.dim).map_err(EngineError::from);
        self.reducing += started.elapsed();
        self.reduced
            .fetch_add(partial.len() as u64, std::sync::atomic::Ordering::Relaxed);
        result
    }
}

/// Rank 0's side: opens a lane to every other member of the group computing stage `index` of
/// `instance` (`peers` by rank, rank 0 this node) and returns the link its share joins with.
pub async fn connect_group(
    cluster: &ClusterHandle,
    instance: &InstanceId,
    index: usize,
    peers: &[PeerId],
    dim: usize,
    kv_capacity: Option<usize>,
) -> Result<MemberLink, PipelineError> {
    let mut links = Vec::new();
    let mut held = Vec::new();
    for (rank, peer) in peers.iter().enumerate().skip(1) {
        let (w, r, h) = open_member(cluster, instance, index, (0, rank), *peer).await?;
        links.push((rank, w, r));
        held.push(h);
    }
    let reduce = AllReduce::new(0, peers.len(), links);
    let mut link = MemberLink::new(0, Arc::new(Mutex::new(reduce)), dim, held);
    link.kv_capacity = kv_capacity;
    link.reduce_seconds = Some(metrics::histogram!(
        "shoal_group_reduce_seconds",
        "instance_id" => instance.to_string(),
        "stage" => index.to_string()
    ));
    Ok(link)
}

/// Attempts at opening a member's lane: a connection being replaced as two nodes meet again (its
/// stream closing under the opener) is tried again on the next one.
const OPEN_TRIES: u32 = 5;

/// Opens the lane from rank `ranks.0` to rank `ranks.1` (on `peer`), trying [`OPEN_TRIES`] times,
/// 200 ms more apart each time.
async fn open_member(
    cluster: &ClusterHandle,
    instance: &InstanceId,
    index: usize,
    ranks: (usize, usize),
    peer: PeerId,
) -> Result<(LaneWriter, LaneReader, Held), PipelineError> {
    let mut tried = 1;
    loop {
        match open_member_once(cluster, instance, index, ranks, peer).await {
            Err(e) if tried < OPEN_TRIES => {
                tracing::debug!(%peer, ranks = ?ranks, kind = e.error_type(),
                    "a group lane did not open ({e}): trying again");
                tokio::time::sleep(Duration::from_millis(200 * u64::from(tried))).await;
                tried += 1;
            }
            other => return other,
        }
    }
}

async fn open_member_once(
    cluster: &ClusterHandle,
    instance: &InstanceId,
    index: usize,
    (rank, to): (usize, usize),
    peer: PeerId,
) -> Result<(LaneWriter, LaneReader, Held), PipelineError> {
    let opened = open_on_path(cluster, peer, instance, "group lane").await?;
    let mut stream = opened.stream;
    let ours = Handshake::new(
        wire_node_id(&cluster.id()),
        cluster.cluster_hash(),
        Role::Member {
            instance_id: instance.as_u64(),
            stage_index: index as u16,
            rank: rank as u32,
            to: to as u32,
        },
    );
    handshake(&mut stream, &ours).await?;
    let addr = opened.path.addr;
    let lane = open_lane(&mut stream, addr, peer, cluster.traffic(), true).await?;
    let lane = lane.ok_or_else(|| PipelineError::LaneSetup {
        peer,
        why: "a tensor-parallel group needs a direct connection between its members".into(),
    })?;
    Ok((lane.writer, lane.reader, (stream, Some(opened.lease))))
}

/// A member's side of a lane a lower rank opened (`theirs` is its handshake, already read).
pub(super) async fn accept_member(
    cluster: &ClusterHandle,
    members: &Members,
    lanes: Option<&Lanes>,
    peer: PeerId,
    mut stream: Stream,
    theirs: Handshake,
) -> Result<(), PipelineError> {
    let Role::Member {
        instance_id,
        stage_index,
        rank: from,
        to,
    } = theirs.role
    else {
        return Err(PipelineError::Group {
            why: "not a group member's handshake".into(),
        });
    };
    let key = (instance_id, stage_index);
    let (instance, rank, peers) = members.slot_of(key).ok_or(PipelineError::NoSuchStage {
        instance: instance_id,
    })?;
    let (from, to) = (from as usize, to as usize);
    if to != rank || from >= rank || peers.get(from) != Some(&peer) {
        return Err(PipelineError::Group {
            why: format!(
                "rank {from} on {peer} opened to rank {to}, but this node is rank {rank} of {}",
                peers.len()
            ),
        });
    }
    let ours = Handshake::new(
        wire_node_id(&cluster.id()),
        cluster.cluster_hash(),
        Role::Member {
            instance_id,
            stage_index,
            rank: rank as u32,
            to: from as u32,
        },
    );
    theirs.check_compatible(&ours)?;
    let lanes = lanes.ok_or_else(|| PipelineError::LaneSetup {
        peer,
        why: "a tensor-parallel group needs lanes (this node serves with --no-lanes)".into(),
    })?;
    let lane = accept_lane(&mut stream, &ours, Some(lanes), peer)
        .await?
        .ok_or_else(|| PipelineError::LaneSetup {
            peer,
            why: "a tensor-parallel group needs a direct connection between its members".into(),
        })?;
    if from == 0 {
        // Rank 0 forms the group: this member opens to the ranks above its own.
        for (above, node) in peers.iter().enumerate().skip(rank + 1) {
            let (cluster, members, node) = (cluster.clone(), members.clone(), *node);
            tokio::spawn(async move {
                let index = stage_index as usize;
                match open_member(&cluster, &instance, index, (rank, above), node).await {
                    Ok((w, r, held)) => members.add_link(key, above, (w, r), held),
                    Err(e) => {
                        tracing::warn!(%node, rank, above, kind = e.error_type(),
                            "a group member could not reach a higher rank: {e}");
                        // Its lanes close, rank 0's included: the group fails to form at once
                        // rather than at its first all-reduce's timeout.
                        members.abandon(key);
                    }
                }
            });
        }
    }
    members.add_link(key, from, (lane.writer, lane.reader), (stream, None));
    Ok(())
}

/// A member's thread: rank 0's frames in order, each computed or applied on `stage`, until rank 0's
/// lane closes or the group breaks; then the caches are cleared and the share waits for a new rank 0.
fn run_member(members: &Members, key: Key, mut stage: LocalStage, reduce: &Mutex<AllReduce>) {
    let result = loop {
        let next = match reduce.lock() {
            Ok(mut r) => r.recv_from(0, None),
            Err(_) => {
                break Err(PipelineError::Group {
                    why: "its all-reduce was poisoned by a panic".into(),
                });
            }
        };
        let frame = match next {
            Received::Inbound(Ok(f)) => f,
            Received::Inbound(Err(e)) => break Err(e),
            Received::Closed | Received::TimedOut => break Ok(()),
        };
        if let Err(e) = apply(&mut stage, frame) {
            break Err(e);
        }
    };
    if let Err(e) = result {
        tracing::warn!(
            instance = key.0,
            stage = key.1,
            kind = e.error_type(),
            "a tensor-parallel group member stopped: {e}"
        );
    }
    stage.leave();
    stage.clear();
    members.put_back(key, stage);
}

/// One frame from rank 0 on a member's share.
fn apply(stage: &mut LocalStage, frame: Frame) -> Result<(), PipelineError> {
    let (chunks, input) = match frame {
        Frame::Inputs(i) => (i.chunks, StageData::Tokens(i.tokens)),
        Frame::Activations(a) => {
            let (rows, cols) = (a.shape[0] as usize, a.shape[1] as usize);
            let values = a.to_f32()?;
            let hidden =
                HostMatrix::new(rows, cols, values).map_err(|_| PipelineError::NotHidden)?;
            (a.chunks, StageData::Hidden(hidden))
        }
        Frame::Release { seq_ids } => {
            for seq_id in seq_ids {
                Stage::kv(stage, KvOp::Release { seq_id })?;
            }
            return Ok(());
        }
        Frame::Prefix(op) => {
            match (op.action, prefix_kv_op(&op)) {
                (PrefixAction::Clear, _) => stage.clear(),
                (_, Some(kv)) => Stage::kv(stage, kv)?,
                (_, None) => stage.rewind(op.seq_id, op.len as usize)?,
            }
            return Ok(());
        }
        other => {
            return Err(PipelineError::Group {
                why: format!("rank 0 sent a frame of kind {}", other.kind()),
            });
        }
    };
    for c in &chunks {
        let held = stage.cached_len(c.seq_id);
        if held != c.start_pos as usize && !stage.is_placeholder(c.seq_id) {
            return Err(PipelineError::StartMismatch {
                seq_id: c.seq_id,
                start: c.start_pos,
                held,
            });
        }
    }
    let batch = chunk_specs(&chunks);
    let rows = logit_rows_of(&chunks);
    stage.forward_member(&batch, input, rows.as_deref())?;
    Ok(())
}
