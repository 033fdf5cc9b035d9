//! The data plane: `shoal-wire` frames on dedicated libp2p streams between pipeline neighbours.
//!
//! Each instance of `n` stages uses `n` streams: stage k → stage k+1 for `k < n-1` (activations, sampling
//! jobs, releases, prefix operations, in that order), and one from the driver to the last stage on which
//! the last stage sends sampled tokens back. The streams ride on the nodes' libp2p connections, so they
//! are encrypted and authenticated like everything else (pnet + noise), and a dead peer closes them.
//!
//! - [`RemoteChain`] is the driver's [`Stage`] for all stages after its own: it sends a batch and waits for
//!   its tokens, failing fast (as [`EngineError::StageLost`]) when a stream closes or a stage node leaves.
//! - [`serve_stages`] accepts inbound streams for the stages this node hosts ([`Hosts`]) and runs each on its
//!   own thread: read → compute → write to the next stage (or tokens to the driver), so sending one batch
//!   overlaps with computing the next.

use std::collections::HashMap;
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use futures::io::{ReadHalf, WriteHalf};
use futures::{AsyncReadExt, AsyncWriteExt, StreamExt};
use libp2p::{PeerId, Stream, StreamProtocol};
use sha2::{Digest, Sha256};
use shoal_engine::SamplingParams;
use shoal_engine::error::EngineError;
use shoal_engine::sampler::{REPETITION_WINDOW, Sampler};
use shoal_engine::stage::{
    ChunkSpec, Launched, LocalStage, Pick, SampleRef, Stage, StageData, sample_row,
};
use shoal_wire::{
    Activations, ChunkHeader, DEFAULT_MAX_FRAME_LEN, DType, Frame, FrameReader,
    HANDSHAKE_HEADER_LEN, Handshake, PrefixAction, PrefixOp, Role, SampleJob, TokenItem,
};
use tokio::sync::mpsc;

use crate::node::{ClusterHandle, Snapshot, Traffic};

pub const STAGE_PROTOCOL: StreamProtocol = StreamProtocol::new("/shoal/stage/1");
/// Encoded frames queued to a stream's writer task. A stage is at most a few batches ahead of its
/// neighbour (the driver waits for each batch's tokens), so this never fills in normal operation; when a
/// peer stops reading it makes the sender wait instead of buffering without limit.
const WRITE_QUEUE: usize = 64;
/// Frames read from a stream and not yet processed (same reasoning).
const READ_QUEUE: usize = 64;
/// How often a driver waiting for tokens checks that every stage node is still a member.
const LIVENESS_POLL: Duration = Duration::from_millis(100);
/// A batch that produced no tokens for this long fails even if every node still looks alive.
const BATCH_TIMEOUT: Duration = Duration::from_secs(120);

/// A 32-byte node id for the wire handshake.
pub fn wire_node_id(peer: &PeerId) -> [u8; 32] {
    Sha256::digest(peer.to_bytes()).into()
}

/// The u64 form of an instance id (16 hex digits).
pub fn wire_instance_id(id: &str) -> u64 {
    u64::from_str_radix(id, 16).unwrap_or_else(|_| {
        let h: [u8; 32] = Sha256::digest(id.as_bytes()).into();
        u64::from_le_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]])
    })
}

/// Sends our handshake, reads and checks the peer's.
async fn handshake(stream: &mut Stream, ours: &Handshake) -> Result<Handshake, String> {
    stream
        .write_all(&ours.encode())
        .await
        .map_err(|e| e.to_string())?;
    stream.flush().await.map_err(|e| e.to_string())?;
    let peer = read_handshake(stream).await?;
    peer.check_compatible(ours).map_err(|e| e.to_string())?;
    Ok(peer)
}

/// Reads the peer's handshake (not yet checked against ours).
async fn read_handshake(stream: &mut Stream) -> Result<Handshake, String> {
    let mut buf = vec![0u8; HANDSHAKE_HEADER_LEN];
    stream
        .read_exact(&mut buf)
        .await
        .map_err(|e| e.to_string())?;
    let total = Handshake::wire_len(&buf)
        .map_err(|e| e.to_string())?
        .ok_or("short handshake")?;
    buf.resize(total, 0);
    stream
        .read_exact(&mut buf[HANDSHAKE_HEADER_LEN..])
        .await
        .map_err(|e| e.to_string())?;
    Handshake::decode(&buf)
        .map(|(h, _)| h)
        .map_err(|e| e.to_string())
}

/// Writes queued frames to the stream until the queue closes or a write fails; closes the stream after.
fn spawn_writer(
    mut w: WriteHalf<Stream>,
    mut rx: mpsc::Receiver<Vec<u8>>,
    traffic: Arc<Traffic>,
    peer: PeerId,
) {
    tokio::spawn(async move {
        while let Some(bytes) = rx.recv().await {
            if w.write_all(&bytes).await.is_err() {
                break;
            }
            // Drain what is already queued before flushing: fewer, larger writes.
            let mut n = bytes.len() as u64;
            while let Ok(more) = rx.try_recv() {
                if w.write_all(&more).await.is_err() {
                    return;
                }
                n += more.len() as u64;
            }
            if w.flush().await.is_err() {
                break;
            }
            traffic.add(peer, n, 0);
        }
        let _ = w.close().await;
    });
}

/// Reads frames into `tx` until the stream ends or breaks; a malformed frame is logged and ends it.
fn spawn_reader(
    mut r: ReadHalf<Stream>,
    tx: mpsc::Sender<Result<Frame, String>>,
    traffic: Arc<Traffic>,
    peer: PeerId,
) {
    tokio::spawn(async move {
        let mut reader = FrameReader::new(DEFAULT_MAX_FRAME_LEN);
        let mut buf = vec![0u8; 256 << 10];
        loop {
            let n = match r.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) => {
                    let _ = tx.send(Err(format!("stream from {peer} broke: {e}"))).await;
                    return;
                }
            };
            traffic.add(peer, 0, n as u64);
            reader.push(&buf[..n]);
            loop {
                match reader.next_frame() {
                    Ok(Some(f)) => {
                        if tx.send(Ok(f)).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(%peer, kind = e.error_type(), "malformed frame, closing the stream: {e}");
                        let _ = tx
                            .send(Err(format!("malformed frame from {peer}: {e}")))
                            .await;
                        return;
                    }
                }
            }
        }
    });
}

fn encode(frame: &Frame) -> Result<Vec<u8>, String> {
    frame.encode().map_err(|e| e.to_string())
}

fn sample_job(r: &SampleRef<'_>) -> SampleJob {
    let p = r.sampler.params();
    let history = if p.repetition_penalty != 1.0 {
        r.history[r.history.len().saturating_sub(REPETITION_WINDOW)..].to_vec()
    } else {
        Vec::new()
    };
    SampleJob {
        seq_id: r.seq_id,
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: p.top_k,
        min_p: p.min_p,
        repetition_penalty: p.repetition_penalty,
        frequency_penalty: p.frequency_penalty,
        presence_penalty: p.presence_penalty,
        rng_state: r.sampler.rng_state(),
        history,
        counts: r.sampler.counts(),
    }
}

fn job_sampler(j: &SampleJob) -> Sampler {
    let params = SamplingParams {
        temperature: j.temperature,
        top_p: j.top_p,
        top_k: j.top_k,
        min_p: j.min_p,
        repetition_penalty: j.repetition_penalty,
        frequency_penalty: j.frequency_penalty,
        presence_penalty: j.presence_penalty,
        seed: None,
    };
    Sampler::from_state(params, j.rng_state, &j.counts)
}

/// The stages after the driver's own, on other nodes, seen as one [`Stage`].
pub struct RemoteChain {
    down: mpsc::Sender<Vec<u8>>,
    tokens: std_mpsc::Receiver<Result<Frame, String>>,
    /// Tokens of KV each sequence holds on the remote stages (mirrors what was sent).
    lens: HashMap<u64, usize>,
    next_batch: u64,
    dtype: DType,
    nodes: Vec<String>,
    members: tokio::sync::watch::Receiver<Arc<Snapshot>>,
    broken: Option<String>,
    /// Batches sent and not yet answered, oldest first, with the sequences whose tokens they owe.
    pending: std::collections::VecDeque<(u64, Vec<u64>)>,
    /// Kept so the owner stream stays open as long as the chain lives.
    _owner: mpsc::Sender<Vec<u8>>,
}

impl RemoteChain {
    /// Connects the driver (`stage 0`, this node) to `nodes` (stages 1.., in order) of `instance`.
    pub async fn connect(
        cluster: &ClusterHandle,
        instance: &str,
        layers: &[(usize, usize)],
        nodes: &[String],
        dtype: DType,
    ) -> Result<Self, String> {
        let peers: Vec<PeerId> = nodes
            .iter()
            .map(|n| n.parse().map_err(|e| format!("node id {n}: {e}")))
            .collect::<Result<_, _>>()?;
        let (first, last) = match (peers.first(), peers.last()) {
            (Some(f), Some(l)) => (*f, *l),
            _ => return Err("a remote chain needs at least one node".into()),
        };
        let me = wire_node_id(&cluster.id());
        let inst = wire_instance_id(instance);
        let mut control = cluster.streams();
        let traffic = cluster.traffic();
        // Owner stream first: the last stage must know where tokens go before any batch arrives.
        let mut owner = control
            .open_stream(last, STAGE_PROTOCOL)
            .await
            .map_err(|e| format!("opening the token stream to {last}: {e}"))?;
        handshake(
            &mut owner,
            &Handshake::new(
                me,
                cluster.cluster_hash(),
                Role::Owner { instance_id: inst },
            ),
        )
        .await?;
        let mut down = control
            .open_stream(first, STAGE_PROTOCOL)
            .await
            .map_err(|e| format!("opening the activation stream to {first}: {e}"))?;
        let (l0, l1) = layers.first().copied().unwrap_or((0, 0));
        handshake(
            &mut down,
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
        .await?;
        let (tok_tx, tok_rx) = std_mpsc::channel();
        let (or, ow) = owner.split();
        let (frames_tx, mut frames_rx) = mpsc::channel(READ_QUEUE);
        spawn_reader(or, frames_tx, traffic.clone(), last);
        // The engine thread waits with a timeout (to notice a node leaving), which a std channel offers.
        tokio::spawn(async move {
            while let Some(f) = frames_rx.recv().await {
                if tok_tx.send(f).is_err() {
                    return;
                }
            }
        });
        let (owner_tx, owner_rx) = mpsc::channel(1);
        spawn_writer(ow, owner_rx, traffic.clone(), last);
        let (dr, dw) = down.split();
        drop(dr);
        let (down_tx, down_rx) = mpsc::channel(WRITE_QUEUE);
        spawn_writer(dw, down_rx, traffic, first);
        Ok(Self {
            down: down_tx,
            tokens: tok_rx,
            lens: HashMap::new(),
            next_batch: 1,
            dtype,
            nodes: nodes.to_vec(),
            members: cluster.subscribe(),
            broken: None,
            pending: std::collections::VecDeque::new(),
            _owner: owner_tx,
        })
    }

    fn lost(&mut self, why: String) -> EngineError {
        if self.broken.is_none() {
            tracing::error!("pipeline broken: {why}");
            self.broken = Some(why.clone());
        }
        EngineError::StageLost(why)
    }

    fn send(&mut self, frame: &Frame) -> Result<(), EngineError> {
        if let Some(b) = &self.broken {
            return Err(EngineError::StageLost(b.clone()));
        }
        let bytes = encode(frame).map_err(EngineError::Internal)?;
        if self.down.blocking_send(bytes).is_err() {
            return Err(self.lost("the stream to the next stage closed".into()));
        }
        Ok(())
    }

    /// The first stage node that is no longer a member, if any.
    fn missing_node(&self) -> Option<String> {
        let snap = self.members.borrow().clone();
        let members = snap.state.members();
        self.nodes
            .iter()
            .find(|n| !members.contains(&n.as_str()))
            .cloned()
    }

    fn wait_tokens(&mut self, batch_id: u64) -> Result<Vec<TokenItem>, EngineError> {
        let start = Instant::now();
        loop {
            match self.tokens.recv_timeout(LIVENESS_POLL) {
                Ok(Ok(Frame::Tokens { batch_id: b, items })) if b == batch_id => return Ok(items),
                Ok(Ok(Frame::Tokens { batch_id: b, .. })) => {
                    return Err(
                        self.lost(format!("tokens of batch {b} while waiting for {batch_id}"))
                    );
                }
                Ok(Ok(Frame::Error { code, message })) => {
                    return Err(self.lost(format!("a stage failed ({code}): {message}")));
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(self.lost(e)),
                Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(self.lost("the token stream from the last stage closed".into()));
                }
                Err(std_mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(n) = self.missing_node() {
                        return Err(self.lost(format!("node {n} left the cluster")));
                    }
                    if start.elapsed() > BATCH_TIMEOUT {
                        return Err(self.lost("no tokens from the last stage in time".into()));
                    }
                }
            }
        }
    }
}

impl Stage for RemoteChain {
    fn forward(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<StageData, EngineError> {
        match self.launch(batch, input, sampling)? {
            Launched::Pending(ticket) => self.complete(ticket),
            Launched::Ready(data) => Ok(data),
        }
    }

    fn launch(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<Launched, EngineError> {
        let StageData::Hidden(h) = input else {
            return Err(EngineError::Internal(
                "a remote chain takes hidden states".into(),
            ));
        };
        let batch_id = self.next_batch;
        self.next_batch += 1;
        let (_, cols) = h
            .dims2()
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let values: Vec<f32> = h
            .flatten_all()
            .and_then(|t| t.to_vec1())
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let chunks: Vec<ChunkHeader> = batch
            .iter()
            .map(|c| ChunkHeader {
                seq_id: c.seq_id,
                start_pos: self.lens.get(&c.seq_id).copied().unwrap_or(0) as u32,
                len: c.len as u32,
                want_logits: c.want_logits,
            })
            .collect();
        let acts = Activations::from_f32(batch_id, chunks, cols as u32, &values, self.dtype)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        if !sampling.is_empty() {
            let jobs = sampling.iter().map(sample_job).collect();
            self.send(&Frame::Sample { batch_id, jobs })?;
        }
        self.send(&Frame::Activations(acts))?;
        for c in batch {
            *self.lens.entry(c.seq_id).or_default() += c.len;
        }
        self.pending
            .push_back((batch_id, sampling.iter().map(|s| s.seq_id).collect()));
        Ok(Launched::Pending(batch_id))
    }

    fn complete(&mut self, ticket: u64) -> Result<StageData, EngineError> {
        let Some((batch_id, expected)) = self.pending.pop_front() else {
            return Err(EngineError::Internal("no batch in flight".into()));
        };
        if batch_id != ticket {
            return Err(EngineError::Internal(format!(
                "batch {ticket} completed out of order (oldest in flight: {batch_id})"
            )));
        }
        let items = self.wait_tokens(batch_id)?;
        if items.len() != expected.len() || items.iter().zip(&expected).any(|(i, s)| i.seq_id != *s)
        {
            return Err(self.lost("the last stage answered for other sequences".into()));
        }
        Ok(StageData::Sampled(
            items
                .iter()
                .map(|i| Pick {
                    id: i.token,
                    logprob: i.logprob,
                })
                .collect(),
        ))
    }

    fn release(&mut self, seq_id: u64) {
        self.lens.remove(&seq_id);
        let _ = self.send(&Frame::Release {
            seq_ids: vec![seq_id],
        });
    }

    fn cached_len(&self, seq_id: u64) -> usize {
        self.lens.get(&seq_id).copied().unwrap_or(0)
    }

    fn retain_prefix(
        &mut self,
        seq_id: u64,
        prefix_id: u64,
        len: usize,
    ) -> Result<(), EngineError> {
        self.lens.remove(&seq_id);
        self.send(&Frame::Prefix(PrefixOp {
            action: PrefixAction::Retain,
            seq_id,
            prefix_id,
            len: len as u32,
        }))
    }

    fn start_from_prefix(
        &mut self,
        prefix_id: u64,
        seq_id: u64,
        len: usize,
    ) -> Result<(), EngineError> {
        self.send(&Frame::Prefix(PrefixOp {
            action: PrefixAction::Start,
            seq_id,
            prefix_id,
            len: len as u32,
        }))?;
        self.lens.insert(seq_id, len);
        Ok(())
    }

    fn drop_prefix(&mut self, prefix_id: u64) {
        let _ = self.send(&Frame::Prefix(PrefixOp {
            action: PrefixAction::Drop,
            seq_id: 0,
            prefix_id,
            len: 0,
        }));
    }

    fn held_sequences(&self) -> usize {
        self.lens.len()
    }

    fn concurrent_stages(&self) -> usize {
        self.nodes.len()
    }
}

/// A stage this node hosts for an instance, and where its output goes.
pub struct HostedStage {
    pub instance: String,
    pub index: usize,
    pub layers: (usize, usize),
    /// The next stage's node; `None` for the last stage.
    pub next: Option<PeerId>,
    /// The layers; `None` while a pipeline is using them.
    stage: Mutex<Option<LocalStage>>,
    /// Where the last stage sends tokens (the driver's owner stream).
    owner: Mutex<Option<mpsc::Sender<Vec<u8>>>>,
}

impl HostedStage {
    pub fn new(
        instance: String,
        index: usize,
        layers: (usize, usize),
        next: Option<PeerId>,
        stage: LocalStage,
    ) -> Self {
        Self {
            instance,
            index,
            layers,
            next,
            stage: Mutex::new(Some(stage)),
            owner: Mutex::new(None),
        }
    }
}

/// Stages hosted on this node, by wire instance id.
#[derive(Clone, Default)]
pub struct Hosts {
    inner: Arc<Mutex<HashMap<u64, Arc<HostedStage>>>>,
}

impl Hosts {
    pub fn insert(&self, host: HostedStage) {
        if let Ok(mut m) = self.inner.lock() {
            m.insert(wire_instance_id(&host.instance), Arc::new(host));
        }
    }

    pub fn remove(&self, instance: &str) {
        if let Ok(mut m) = self.inner.lock() {
            m.remove(&wire_instance_id(instance));
        }
    }

    fn get(&self, id: u64) -> Option<Arc<HostedStage>> {
        self.inner.lock().ok()?.get(&id).cloned()
    }
}

/// Accepts data-plane streams for the stages in `hosts` until the node shuts down.
pub fn serve_stages(cluster: ClusterHandle, hosts: Hosts) -> Result<(), String> {
    let mut control = cluster.streams();
    let mut incoming = control
        .accept(STAGE_PROTOCOL)
        .map_err(|e| format!("{e:?}"))?;
    tokio::spawn(async move {
        while let Some((peer, stream)) = incoming.next().await {
            let cluster = cluster.clone();
            let hosts = hosts.clone();
            tokio::spawn(async move {
                if let Err(e) = accept_stream(&cluster, &hosts, peer, stream).await {
                    tracing::warn!(%peer, "data-plane stream refused: {e}");
                }
            });
        }
    });
    Ok(())
}

async fn accept_stream(
    cluster: &ClusterHandle,
    hosts: &Hosts,
    peer: PeerId,
    mut stream: Stream,
) -> Result<(), String> {
    // Read the peer's handshake first to learn which of our stages it wants.
    let theirs = read_handshake(&mut stream).await?;
    let inst = theirs.role.instance_id();
    let host = hosts
        .get(inst)
        .ok_or_else(|| format!("no stage of instance {inst:016x} here"))?;
    let ours = Handshake::new(
        wire_node_id(&cluster.id()),
        cluster.cluster_hash(),
        Role::Stage {
            instance_id: inst,
            stage_index: host.index as u16,
            layer_start: host.layers.0 as u32,
            layer_end: host.layers.1 as u32,
        },
    );
    theirs.check_compatible(&ours).map_err(|e| e.to_string())?;
    let traffic = cluster.traffic();
    match theirs.role {
        Role::Owner { .. } => {
            if host.next.is_some() {
                return Err("tokens come from the last stage only".into());
            }
            let (r, w) = stream.split();
            let (tx, rx) = mpsc::channel(WRITE_QUEUE);
            // Our handshake goes out first, and the token route exists before the driver can send a batch.
            tx.try_send(ours.encode())
                .map_err(|_| "token queue full at start".to_string())?;
            spawn_writer(w, rx, traffic.clone(), peer);
            if let Ok(mut o) = host.owner.lock() {
                *o = Some(tx);
            }
            // Nothing is expected on this stream; reading it notices the driver going away.
            let (tx, mut rx) = mpsc::channel(1);
            spawn_reader(r, tx, traffic, peer);
            tokio::spawn(async move { while rx.recv().await.is_some() {} });
            Ok(())
        }
        Role::Stage { stage_index, .. } => {
            if stage_index as usize + 1 != host.index {
                return Err(format!(
                    "stage {stage_index} cannot feed stage {}",
                    host.index
                ));
            }
            let next = match host.next {
                Some(next) => {
                    let mut control = cluster.streams();
                    let mut s = control
                        .open_stream(next, STAGE_PROTOCOL)
                        .await
                        .map_err(|e| format!("opening the stream to {next}: {e}"))?;
                    handshake(&mut s, &ours).await?;
                    let (r, w) = s.split();
                    drop(r);
                    let (tx, rx) = mpsc::channel(WRITE_QUEUE);
                    spawn_writer(w, rx, traffic.clone(), next);
                    Some(tx)
                }
                None => None,
            };
            stream
                .write_all(&ours.encode())
                .await
                .map_err(|e| e.to_string())?;
            stream.flush().await.map_err(|e| e.to_string())?;
            let (r, _w) = stream.split();
            let (in_tx, in_rx) = mpsc::channel(READ_QUEUE);
            spawn_reader(r, in_tx, traffic, peer);
            let host = host.clone();
            std::thread::Builder::new()
                .name(format!("stage-{}-{}", host.instance, host.index))
                .spawn(move || run_stage(&host, in_rx, next))
                .map_err(|e| e.to_string())?;
            Ok(())
        }
    }
}

/// Serves one upstream connection: every frame in order, until the upstream closes or a step fails.
fn run_stage(
    host: &HostedStage,
    mut input: mpsc::Receiver<Result<Frame, String>>,
    next: Option<mpsc::Sender<Vec<u8>>>,
) {
    let Some(mut stage) = host.stage.lock().ok().and_then(|mut s| s.take()) else {
        tracing::warn!(instance = %host.instance, "stage busy with another pipeline");
        return;
    };
    let mut jobs: HashMap<u64, Vec<SampleJob>> = HashMap::new();
    let send = |bytes: Vec<u8>| -> bool {
        match &next {
            Some(tx) => tx.blocking_send(bytes).is_ok(),
            None => match host.owner.lock().ok().and_then(|o| o.clone()) {
                Some(tx) => tx.blocking_send(bytes).is_ok(),
                None => false,
            },
        }
    };
    while let Some(frame) = input.blocking_recv() {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(instance = %host.instance, "upstream failed: {e}");
                let _ = encode(&Frame::Error {
                    code: 502,
                    message: e,
                })
                .map(send);
                break;
            }
        };
        let out = match step(&mut stage, host, &mut jobs, frame, next.is_none()) {
            Ok(Some(f)) => encode(&f),
            Ok(None) => continue,
            Err(e) => Err(e),
        };
        match out {
            Ok(bytes) => {
                if !send(bytes) {
                    tracing::warn!(instance = %host.instance, "downstream closed");
                    break;
                }
            }
            Err(e) => {
                tracing::error!(instance = %host.instance, "stage step failed: {e}");
                let _ = encode(&Frame::Error {
                    code: 500,
                    message: e,
                })
                .map(send);
                break;
            }
        }
    }
    // The pipeline that fed us is gone: its sequences are too.
    stage.clear();
    if let Ok(mut s) = host.stage.lock() {
        *s = Some(stage);
    }
}

/// Applies one frame; returns the frame to pass on (to the next stage, or tokens to the driver).
fn step(
    stage: &mut LocalStage,
    host: &HostedStage,
    jobs: &mut HashMap<u64, Vec<SampleJob>>,
    frame: Frame,
    last: bool,
) -> Result<Option<Frame>, String> {
    match frame {
        Frame::Sample { batch_id, jobs: j } if last => {
            jobs.insert(batch_id, j);
            Ok(None)
        }
        Frame::Activations(a) => {
            for c in &a.chunks {
                let have = stage.cached_len(c.seq_id);
                if have != c.start_pos as usize {
                    return Err(format!(
                        "sequence {} starts at {} but this stage holds {have} tokens",
                        c.seq_id, c.start_pos
                    ));
                }
            }
            let [rows, cols] = a.shape;
            let values = a.to_f32().map_err(|e| e.to_string())?;
            let hidden = Tensor::from_vec(values, (rows as usize, cols as usize), &Device::Cpu)
                .map_err(|e| e.to_string())?;
            let batch: Vec<ChunkSpec> = a
                .chunks
                .iter()
                .map(|c| ChunkSpec {
                    seq_id: c.seq_id,
                    len: c.len as usize,
                    want_logits: c.want_logits,
                })
                .collect();
            let out = stage
                .forward(&batch, StageData::Hidden(hidden), &[])
                .map_err(|e| e.to_string())?;
            match out {
                StageData::Hidden(h) => {
                    let values: Vec<f32> = h
                        .flatten_all()
                        .and_then(|t| t.to_vec1())
                        .map_err(|e| e.to_string())?;
                    let (_, cols) = h.dims2().map_err(|e| e.to_string())?;
                    Activations::from_f32(a.batch_id, a.chunks, cols as u32, &values, a.dtype)
                        .map(|x| Some(Frame::Activations(x)))
                        .map_err(|e| e.to_string())
                }
                StageData::Logits(l) => {
                    let rows = l.to_vec2::<f32>().map_err(|e| e.to_string())?;
                    let batch_jobs = jobs.remove(&a.batch_id).unwrap_or_default();
                    if batch_jobs.len() != rows.len() {
                        return Err(format!(
                            "batch {} has {} rows of logits but {} sampling jobs",
                            a.batch_id,
                            rows.len(),
                            batch_jobs.len()
                        ));
                    }
                    let items = rows
                        .into_iter()
                        .zip(&batch_jobs)
                        .map(|(mut row, job)| {
                            let sampler = job_sampler(job);
                            let pick = sample_row(
                                &SampleRef {
                                    seq_id: job.seq_id,
                                    sampler: &sampler,
                                    history: &job.history,
                                },
                                &mut row,
                            );
                            TokenItem {
                                seq_id: job.seq_id,
                                token: pick.id,
                                logprob: pick.logprob,
                            }
                        })
                        .collect();
                    Ok(Some(Frame::Tokens {
                        batch_id: a.batch_id,
                        items,
                    }))
                }
                _ => Err(format!("stage {} produced no output", host.index)),
            }
        }
        Frame::Release { seq_ids } => {
            for s in &seq_ids {
                stage.release(*s);
            }
            Ok((!last).then_some(Frame::Release { seq_ids }))
        }
        Frame::Prefix(op) => {
            match op.action {
                PrefixAction::Retain => {
                    stage.retain_prefix(op.seq_id, op.prefix_id, op.len as usize)
                }
                PrefixAction::Start => {
                    stage.start_from_prefix(op.prefix_id, op.seq_id, op.len as usize)
                }
                PrefixAction::Drop => {
                    stage.drop_prefix(op.prefix_id);
                    Ok(())
                }
            }
            .map_err(|e| e.to_string())?;
            Ok((!last).then_some(Frame::Prefix(op)))
        }
        Frame::Error { code, message } => Err(format!("upstream error {code}: {message}")),
        other @ Frame::Sample { .. } => Ok(Some(other)),
        Frame::Ping { .. } | Frame::Pong { .. } | Frame::Tokens { .. } => Ok(None),
    }
}
