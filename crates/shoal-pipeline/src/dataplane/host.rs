//! The stage side: [`HostedStage`]s served to the upstream node of their pipeline. A hosted stage's
//! layers are a `HybridStage` (on the CPU, on this node's GPU, or its first layers on the GPU and the
//! rest on the CPU, as its record says); its KV room ([`StageKv`]) is this node's host share for the
//! CPU layers, bounded by the GPU part's device budget.
//!
//! A stage keeps its KV across upstream streams: when its pipeline moves to another path (the driver
//! opens new streams, `chain.rs`), the new stream's thread waits for the old one to finish its frames
//! and carries on with the same caches. An upstream stream that breaks ends its thread quietly (the
//! driver notices on its side and moves, or the pipeline is torn down); the stage's next stream is
//! opened on the preferred path to the next node. The stream to the next node ends too when that path
//! is cut or when this node comes to prefer another address for it (`PathMoved`, `path.rs`): the break
//! travels up to the driver, which opens the pipeline again and sends what was not confirmed.
//!
//! Each activation batch a stage runs is timed into `shoal_stage_step_seconds{instance_id, stage}` (frame
//! decoded → answer encoded), through a handle registered once per hosted stage; the KV tokens it holds
//! after each frame go to its `ShareMeter`, read at each scrape (`shoal_kv_share_used_tokens`, gone
//! with the stage).

use shoal_ids::InstanceId;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use futures::{AsyncReadExt, StreamExt};
use libp2p::{PeerId, Stream};
use shoal_engine::TokenMask;
use shoal_engine::engine::HybridStage;
use shoal_engine::kvpool::KvShare;
use shoal_engine::sampler::Sampler;
use shoal_engine::stage::{KvOp, SampleRef, Stage, StageData};
use shoal_engine::verify;
use shoal_model::HostMatrix;
use shoal_wire::{
    Activations, DEFAULT_MAX_FRAME_LEN, Frame, Handshake, Pooled, PrefixOp, Role, SampleJob,
    TokenItem,
};
use tokio::sync::mpsc;

use shoal_cluster::{ClusterHandle, Traffic};

use crate::error::PipelineError;

use super::group::Members;
use super::path::{Watch, open_on_path, watch_paths};
use super::{
    Alarm, Inbound, Inlet, Lanes, Outlet, READ_QUEUE, STAGE_PROTOCOL, WRITE_QUEUE, accept_lane,
    chunk_specs, encode, handshake, open_lane, prefix_kv_op, read_handshake, spawn_reader,
    spawn_writer, wire_node_id,
};

/// How long a new upstream stream waits for the stage while the previous stream's thread still runs
/// (a pipeline moving to another path: the old stream drains and ends) before it ends that thread
/// (a stream on a cut path may never see its end) …
const KICK_AFTER: Duration = Duration::from_secs(2);
/// … and how long it waits in all.
const HANDOVER_WAIT: Duration = Duration::from_secs(30);
/// How long the last stage waits for the driver's token stream when a batch's tokens are ready first
/// (the driver opens it before the activation stream, but the two are accepted concurrently).
const OWNER_WAIT: Duration = Duration::from_secs(5);

/// A stage this node hosts for an instance, and where its output goes.
pub struct HostedStage {
    pub instance: InstanceId,
    pub index: usize,
    pub layers: (usize, usize),
    /// The next stage's node; `None` for the last stage.
    pub next: Option<PeerId>,
    /// The layers (on the CPU, a GPU, or both); `None` while a pipeline stream is using them.
    stage: Mutex<Option<HybridStage>>,
    /// Signalled when the layers are put back.
    stage_back: Condvar,
    /// Wakes the newest upstream stream's thread (weak: it never keeps that input open).
    upstream: Mutex<Option<Alarm>>,
    /// Where the last stage sends tokens (the driver's owner stream).
    owner: Mutex<Option<Outlet>>,
    /// Signalled when the owner stream is set.
    owner_set: Condvar,
    /// This node's KV memory set aside for the stage; the driver holds at most its tokens.
    kv: StageKv,
    /// Time of each activation batch through the stage.
    step_seconds: metrics::Histogram,
    /// KV tokens the stage holds of its share, after its latest frame (read at each scrape; gone with
    /// the stage).
    kv_used: shoal_engine::meters::ShareMeter,
}

impl HostedStage {
    pub fn new(
        instance: InstanceId,
        index: usize,
        layers: (usize, usize),
        next: Option<PeerId>,
        stage: impl Into<HybridStage>,
        kv: impl Into<StageKv>,
    ) -> Self {
        let step_seconds = metrics::histogram!(
            "shoal_stage_step_seconds",
            "instance_id" => instance.to_string(),
            "stage" => index.to_string()
        );
        let kv_used = shoal_engine::meters::ShareMeter::new(instance.to_string(), index);
        Self {
            instance,
            index,
            layers,
            next,
            stage: Mutex::new(Some(stage.into())),
            stage_back: Condvar::new(),
            upstream: Mutex::new(None),
            owner: Mutex::new(None),
            owner_set: Condvar::new(),
            kv: kv.into(),
            step_seconds,
            kv_used,
        }
    }

    /// Records `alarm` as the newest upstream's; returns the one it replaces.
    fn new_upstream(&self, alarm: Alarm) -> Option<Alarm> {
        self.upstream.lock().ok()?.replace(alarm)
    }

    /// Sets where the last stage's tokens go (the driver's newest token stream).
    fn set_owner(&self, out: Outlet) {
        if let Ok(mut o) = self.owner.lock() {
            *o = Some(out);
        }
        self.owner_set.notify_all();
    }

    /// Sends the last stage's answer to the driver (waiting up to [`OWNER_WAIT`] for its token stream);
    /// `false` when there is none.
    fn send_tokens(&self, bytes: Vec<u8>) -> bool {
        let Ok(guard) = self.owner.lock() else {
            return false;
        };
        let Ok((mut guard, _)) = self
            .owner_set
            .wait_timeout_while(guard, OWNER_WAIT, |o| o.is_none())
        else {
            return false;
        };
        guard.as_mut().is_some_and(|o| o.send(bytes))
    }

    /// Takes the layers, waiting for another stream's thread to put them back: after [`KICK_AFTER`]
    /// that thread (`previous`'s) is told to end, after [`HANDOVER_WAIT`] this one gives up.
    fn take_stage(&self, previous: Option<Alarm>) -> Option<HybridStage> {
        let start = std::time::Instant::now();
        let mut kicked = previous.is_none();
        loop {
            let guard = self.stage.lock().ok()?;
            let (mut guard, _) = self
                .stage_back
                .wait_timeout_while(guard, Duration::from_millis(100), |s| s.is_none())
                .ok()?;
            if let Some(stage) = guard.take() {
                return Some(stage);
            }
            drop(guard);
            if start.elapsed() >= HANDOVER_WAIT {
                return None;
            }
            if !kicked && start.elapsed() >= KICK_AFTER {
                // A full input means that thread is still working through frames: try again later.
                kicked = previous.as_ref().is_none_or(|a| {
                    a.try_ring(PipelineError::StreamClosed {
                        what: "upstream stream, replaced by a newer one",
                    })
                });
                if kicked {
                    tracing::warn!(instance = %self.instance, "ending the previous upstream stream's thread");
                }
            }
        }
    }

    /// Puts the layers back (with their caches) for the next stream.
    fn put_stage(&self, stage: HybridStage) {
        if let Ok(mut s) = self.stage.lock() {
            *s = Some(stage);
        }
        self.stage_back.notify_all();
    }

    /// Errs if adding `tokens` of KV would take the stage past what its node reserved for it (the
    /// driver budgets against that, so only a driver bug gets here: an error, never an allocation
    /// beyond the node's budget).
    fn check_room(&self, stage: &HybridStage, tokens: usize) -> Result<(), PipelineError> {
        let held = stage.held_tokens();
        if held + tokens > self.kv.tokens {
            return Err(PipelineError::KvFull {
                stage: self.index,
                instance: self.instance,
                held,
                tokens,
                reserved: self.kv.tokens,
            });
        }
        Ok(())
    }
}

/// The KV room of a hosted stage: this node's host share for its CPU layers (none when every layer
/// runs on a GPU), and the tokens it holds — the share's, bounded by the GPU part's device budget.
pub struct StageKv {
    pub share: Option<KvShare>,
    pub tokens: usize,
}

impl From<KvShare> for StageKv {
    fn from(share: KvShare) -> Self {
        Self {
            tokens: share.tokens(),
            share: Some(share),
        }
    }
}

/// Stages hosted on this node, by wire instance id.
#[derive(Clone, Default)]
pub struct Hosts {
    inner: Arc<Mutex<HashMap<u64, Arc<HostedStage>>>>,
    /// Members of tensor-parallel groups hosted here (their lanes arrive as stage streams do).
    pub members: Members,
}

impl Hosts {
    pub fn insert(&self, host: HostedStage) {
        if let Ok(mut m) = self.inner.lock() {
            m.insert(host.instance.as_u64(), Arc::new(host));
        }
    }

    pub fn remove(&self, instance: &InstanceId) {
        if let Ok(mut m) = self.inner.lock() {
            m.remove(&instance.as_u64());
        }
        self.members.remove(instance);
    }

    fn get(&self, id: u64) -> Option<Arc<HostedStage>> {
        self.inner.lock().ok()?.get(&id).cloned()
    }
}

/// Accepts data-plane streams for the stages in `hosts` until the node shuts down, offering each a
/// lane on `lanes` (none: every stream carries its frames itself, and the streams this node opens
/// too).
pub fn serve_stages(
    cluster: ClusterHandle,
    hosts: Hosts,
    lanes: Option<Lanes>,
) -> Result<(), PipelineError> {
    let mut control = cluster.streams();
    let mut incoming = control
        .accept(STAGE_PROTOCOL)
        .map_err(PipelineError::AcceptStreams)?;
    tokio::spawn(async move {
        while let Some((peer, stream)) = incoming.next().await {
            let cluster = cluster.clone();
            let hosts = hosts.clone();
            let lanes = lanes.clone();
            tokio::spawn(async move {
                if let Err(e) = accept_stream(&cluster, &hosts, lanes.as_ref(), peer, stream).await
                {
                    tracing::warn!(%peer, kind = e.error_type(), "data-plane stream refused: {e}");
                }
            });
        }
    });
    Ok(())
}

/// Answers one data-plane stream: the driver's token route, or the previous stage's frames.
async fn accept_stream(
    cluster: &ClusterHandle,
    hosts: &Hosts,
    lanes: Option<&Lanes>,
    peer: PeerId,
    mut stream: Stream,
) -> Result<(), PipelineError> {
    // Read the peer's handshake first to learn which of our stages it wants.
    let theirs = read_handshake(&mut stream).await?;
    if let Role::Member { .. } = theirs.role {
        return super::group::accept_member(cluster, &hosts.members, lanes, peer, stream, theirs)
            .await;
    }
    let inst = theirs.role.instance_id();
    let host = hosts
        .get(inst)
        .ok_or(PipelineError::NoSuchStage { instance: inst })?;
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
    theirs.check_compatible(&ours)?;
    let traffic = cluster.traffic();
    match theirs.role {
        Role::Owner { .. } => {
            if host.next.is_some() {
                return Err(PipelineError::NotLastStage);
            }
            let lane = accept_lane(&mut stream, &ours, lanes, peer).await?;
            route_tokens(&host, stream, lane, traffic, peer);
            Ok(())
        }
        Role::Stage { stage_index, .. } => {
            if stage_index as usize + 1 != host.index {
                return Err(PipelineError::WrongUpstream {
                    from: stage_index,
                    to: host.index,
                });
            }
            serve_upstream(cluster, &host, stream, &ours, lanes, traffic, peer).await
        }
        // Answered above, before the stage is looked up.
        Role::Member { .. } => Err(PipelineError::Group {
            why: "a member's handshake on a stage's stream".into(),
        }),
    }
}

/// The driver's owner stream to the last stage: the route its tokens go back on (its lane, or the
/// stream itself).
fn route_tokens(
    host: &HostedStage,
    stream: Stream,
    lane: Option<super::Lane>,
    traffic: Arc<Traffic>,
    peer: PeerId,
) {
    let out = match lane {
        Some(lane) => Outlet::Lane(lane.writer),
        None => {
            let (r, w) = stream.split();
            let (tx, rx) = mpsc::channel(WRITE_QUEUE);
            spawn_writer(w, rx, traffic.clone(), peer);
            // Nothing is expected on this stream; reading it notices the driver going away (one
            // slot: whatever arrives is dropped as it is read).
            let (rtx, mut rrx) = mpsc::channel(1);
            spawn_reader(r, rtx, traffic, peer);
            tokio::spawn(async move { while rrx.recv().await.is_some() {} });
            Outlet::Relay(tx)
        }
    };
    host.set_owner(out);
}

/// The previous stage's stream: connects on to the next stage (if any), answers the handshake (with a
/// lane offer) and runs the stage on its own thread.
async fn serve_upstream(
    cluster: &ClusterHandle,
    host: &Arc<HostedStage>,
    mut stream: Stream,
    ours: &Handshake,
    lanes: Option<&Lanes>,
    traffic: Arc<Traffic>,
    peer: PeerId,
) -> Result<(), PipelineError> {
    let (next, lease, next_path) = match host.next {
        Some(next) => {
            let mut opened = open_on_path(cluster, next, &host.instance, "stream").await?;
            let mut s = opened.stream;
            handshake(&mut s, ours).await?;
            let lane = open_lane(
                &mut s,
                opened.path.addr,
                next,
                traffic.clone(),
                lanes.is_some(),
            )
            .await?;
            let out = match lane {
                Some(lane) => Outlet::Lane(lane.writer),
                None => {
                    opened.lease.set_relayed();
                    let (r, w) = s.split();
                    drop(r);
                    let (tx, rx) = mpsc::channel(WRITE_QUEUE);
                    spawn_writer(w, rx, traffic.clone(), next);
                    Outlet::Relay(tx)
                }
            };
            (Some(out), Some(opened.lease), Some((next, opened.path)))
        }
        None => (None, None, None),
    };
    let lane = accept_lane(&mut stream, ours, lanes, peer).await?;
    let (input, alarm) = match lane {
        Some(mut lane) => {
            // The next stage's thread ending (its stream broke) ends this one, and so on up to the
            // driver, which moves the pipeline.
            if let Some(Outlet::Lane(w)) = &next {
                lane.reader.watch(w)?;
            }
            let alarm = Alarm::Lane(lane.reader.interrupt());
            (Inlet::Lane(Box::new(lane.reader)), alarm)
        }
        None => {
            let (r, _w) = stream.split();
            let (in_tx, in_rx) = mpsc::channel(READ_QUEUE);
            let alarm = Alarm::Relay(in_tx.downgrade());
            spawn_reader(r, in_tx, traffic, peer);
            (Inlet::Relay(in_rx), alarm)
        }
    };
    // The path to the next stage cut: this stream's thread ends (and the break travels up).
    let (stop_watch, stop) = tokio::sync::oneshot::channel();
    if let Some(used) = next_path {
        let writer = match &next {
            Some(Outlet::Relay(tx)) => Some(tx.clone()),
            _ => None,
        };
        watch_paths(
            cluster.paths().watch(),
            vec![used],
            writer,
            alarm.clone(),
            Watch::CutsAndMoves,
            stop,
        );
    }
    let previous = host.new_upstream(alarm);
    let host = host.clone();
    std::thread::Builder::new()
        .name(format!("stage-{}-{}", host.instance, host.index))
        .spawn(move || {
            run_stage(&host, input, next, previous);
            drop(lease);
            drop(stop_watch);
        })?;
    Ok(())
}

/// Serves one upstream connection: every frame in order, until the upstream closes or a step fails.
fn run_stage(
    host: &HostedStage,
    mut input: Inlet,
    mut next: Option<Outlet>,
    previous: Option<Alarm>,
) {
    let Some(mut stage) = host.take_stage(previous) else {
        tracing::warn!(instance = %host.instance, "stage busy with another stream for {HANDOVER_WAIT:?}");
        return;
    };
    let mut jobs: HashMap<u64, Vec<SampleJob>> = HashMap::new();
    let last = next.is_none();
    let mut send = |bytes: Vec<u8>| -> bool {
        match &mut next {
            Some(out) => out.send(bytes),
            None => host.send_tokens(bytes),
        }
    };
    // Frames passed on unchanged (sampling jobs, KV operations) wait in `held` and go out with the
    // next answer, or before the thread waits for input: one message, one write, one wakeup downstream.
    let mut held = Vec::new();
    while let Some(frame) = recv_or_flush(&mut input, &mut held, &mut send) {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                // Nothing is sent on: the upstream moves to another path (and sends again what it
                // may have lost), or the pipeline is torn down.
                tracing::warn!(instance = %host.instance, kind = e.error_type(), "upstream stream broke: {e}");
                break;
            }
        };
        let answer = matches!(frame, Frame::Activations(_));
        let started = std::time::Instant::now();
        let stepped = step(&mut stage, host, &mut jobs, frame, last);
        if answer {
            host.step_seconds.record(started.elapsed());
        }
        // After KV operations too: a freed sequence gives its tokens back without a batch.
        host.kv_used.used(stage.held_tokens());
        match stepped {
            Ok(None) => continue,
            Ok(Some(bytes)) => {
                append(&mut held, bytes);
                if answer && !send(std::mem::take(&mut held)) {
                    tracing::warn!(instance = %host.instance, "downstream closed");
                    break;
                }
            }
            Err(e) => {
                tracing::error!(instance = %host.instance, kind = e.error_type(), "stage step failed: {e}");
                let _ = encode(&Frame::Error {
                    code: 500,
                    message: e.to_string(),
                })
                .map(|bytes| {
                    append(&mut held, bytes);
                    send(std::mem::take(&mut held))
                });
                break;
            }
        }
    }
    if !held.is_empty() {
        send(held);
    }
    // The caches stay: a stream on another path carries on with them (they go with the instance).
    host.put_stage(stage);
}

/// The next frame from upstream; what `held` has is sent first when none is waiting. `None` once the
/// upstream closed, or when the held frames cannot be sent (the downstream closed).
fn recv_or_flush(
    input: &mut Inlet,
    held: &mut Vec<u8>,
    send: &mut impl FnMut(Vec<u8>) -> bool,
) -> Option<Inbound> {
    // Only frames held back make it worth looking before waiting.
    if held.is_empty() {
        return input.recv();
    }
    if let Some(frame) = input.try_recv() {
        return Some(frame);
    }
    if !send(std::mem::take(held)) {
        tracing::warn!("downstream closed");
        return None;
    }
    input.recv()
}

/// Appends an encoded message to what is held (taking it whole when nothing is).
fn append(held: &mut Vec<u8>, bytes: Vec<u8>) {
    if held.is_empty() {
        *held = bytes;
    } else {
        held.extend_from_slice(&bytes);
    }
}

/// Applies one frame; returns the encoded frame to pass on (to the next stage, or tokens to the driver).
fn step(
    stage: &mut HybridStage,
    host: &HostedStage,
    jobs: &mut HashMap<u64, Vec<SampleJob>>,
    frame: Frame,
    last: bool,
) -> Result<Option<Vec<u8>>, PipelineError> {
    let out = match frame {
        Frame::Sample { batch_id, jobs: j } if last => {
            jobs.insert(batch_id, j);
            None
        }
        Frame::Activations(a) => return forward(stage, host, jobs, &a, last),
        Frame::Release { seq_ids } => {
            for &seq_id in &seq_ids {
                stage.kv(KvOp::Release { seq_id })?;
            }
            (!last).then_some(Frame::Release { seq_ids })
        }
        Frame::Prefix(op) => {
            apply_prefix(stage, host, &op)?;
            (!last).then_some(Frame::Prefix(op))
        }
        Frame::Error { code, message } => return Err(PipelineError::Upstream { code, message }),
        other @ Frame::Sample { .. } => Some(other),
        Frame::Ping { .. }
        | Frame::Pong { .. }
        | Frame::Tokens { .. }
        | Frame::Pooled(_)
        | Frame::Inputs(_)
        | Frame::Lane { .. } => None,
    };
    out.as_ref().map(encode).transpose()
}

/// Runs one batch of activations through the stage; returns the encoded answer (activations for the
/// next stage, or the last stage's tokens).
fn forward(
    stage: &mut HybridStage,
    host: &HostedStage,
    jobs: &mut HashMap<u64, Vec<SampleJob>>,
    a: &Activations,
    last: bool,
) -> Result<Option<Vec<u8>>, PipelineError> {
    check_batch(stage, host, a)?;
    let [rows, cols] = a.shape;
    let hidden = HostMatrix::new(rows as usize, cols as usize, a.to_f32()?)?;
    let batch = chunk_specs(&a.chunks);
    // The last stage samples (on its threads) as the driver's jobs for this batch say, within the
    // tokens each job's mask allows.
    let mut batch_jobs = if last {
        jobs.remove(&a.batch_id).unwrap_or_default()
    } else {
        Vec::new()
    };
    let samplers: Vec<_> = batch_jobs.iter().map(Sampler::from_job).collect();
    let masks: Vec<Option<TokenMask>> = batch_jobs
        .iter_mut()
        .map(|j| (!j.mask.is_empty()).then(|| TokenMask::from_words(std::mem::take(&mut j.mask))))
        .collect();
    let draft_masks: Vec<Vec<Option<TokenMask>>> = batch_jobs
        .iter_mut()
        .map(|j| {
            std::mem::take(&mut j.draft_masks)
                .into_iter()
                .map(|m| (!m.is_empty()).then(|| TokenMask::from_words(m)))
                .collect()
        })
        .collect();
    let refs: Vec<SampleRef<'_>> = batch_jobs
        .iter()
        .zip(&samplers)
        .zip(masks.iter().zip(&draft_masks))
        .map(|((job, sampler), (mask, draft_masks))| SampleRef {
            seq_id: job.seq_id,
            sampler,
            history: &job.history,
            mask: mask.as_ref(),
            draft: &job.draft,
            draft_masks,
        })
        .collect();
    let wanted = a.chunks.iter().filter(|c| c.want_logits).count();
    if last && refs.len() != wanted {
        return Err(PipelineError::JobsMismatch {
            batch_id: a.batch_id,
            wanted,
            jobs: refs.len(),
        });
    }
    let out = stage.forward(&batch, StageData::Hidden(hidden), &refs)?;
    answer(host, a, out, &batch_jobs, wanted, last)
}

/// Errs if the batch would take the stage past its KV share, or a chunk does not start where its
/// sequence's cache ends.
fn check_batch(
    stage: &HybridStage,
    host: &HostedStage,
    a: &Activations,
) -> Result<(), PipelineError> {
    host.check_room(stage, a.chunks.iter().map(|c| c.len as usize).sum())?;
    for c in &a.chunks {
        let held = stage.cached_len(c.seq_id);
        if held != c.start_pos as usize {
            return Err(PipelineError::StartMismatch {
                seq_id: c.seq_id,
                start: c.start_pos,
                held,
            });
        }
    }
    Ok(())
}

/// Encodes what the stage made of batch `a`: activations to pass on, or the last stage's tokens —
/// after its pooled rows (a `Pooled` frame) when chunks asked for them.
fn answer(
    host: &HostedStage,
    a: &Activations,
    out: StageData,
    batch_jobs: &[SampleJob],
    wanted: usize,
    last: bool,
) -> Result<Option<Vec<u8>>, PipelineError> {
    let (frame, pooled) = match out {
        // Encoded straight from the stage's output.
        StageData::Hidden(h) => {
            return Activations::encode_f32(
                a.batch_id,
                &a.chunks,
                h.cols() as u32,
                h.data(),
                a.dtype,
            )
            .map(Some)
            .map_err(PipelineError::from);
        }
        // No chunk of this batch wants a token (a prompt's middle chunk): an empty answer, so
        // the driver still hears back about the batch.
        StageData::Logits { pooled, .. } if last && wanted == 0 => {
            let tokens = Frame::Tokens {
                batch_id: a.batch_id,
                items: Vec::new(),
            };
            (tokens, pooled)
        }
        StageData::Sampled(out) => {
            // One pick per job, or a job's verified draft and one more (`verify::chunk_picks`).
            let mut items = Vec::with_capacity(out.picks.len());
            let mut at = 0;
            for job in batch_jobs {
                let rest = out.picks.get(at..).unwrap_or_default();
                let n = verify::chunk_picks(&job.draft, rest);
                at += n;
                items.extend(rest[..n].iter().map(|pick| TokenItem {
                    seq_id: job.seq_id,
                    token: pick.id,
                    logprob: pick.logprob,
                    top: pick.top.clone(),
                }));
            }
            let tokens = Frame::Tokens {
                batch_id: a.batch_id,
                items,
            };
            (tokens, out.pooled)
        }
        _ => return Err(PipelineError::NoOutput { stage: host.index }),
    };
    let mut bytes = Vec::new();
    if pooled.rows() > 0 {
        let seq_ids = a
            .chunks
            .iter()
            .filter(|c| c.pool != shoal_wire::Pool::None)
            .map(|c| c.seq_id)
            .collect();
        let rows = Frame::Pooled(Pooled {
            batch_id: a.batch_id,
            seq_ids,
            cols: pooled.cols() as u32,
            values: pooled.into_data(),
        });
        rows.encode_into(&mut bytes, DEFAULT_MAX_FRAME_LEN)?;
    }
    frame.encode_into(&mut bytes, DEFAULT_MAX_FRAME_LEN)?;
    Ok(Some(bytes))
}

/// Applies one prefix-cache operation to the stage's KV (a started sequence must fit its KV share) —
/// so that twice is the same as once: a driver whose path was cut sends again what was unconfirmed.
fn apply_prefix(
    stage: &mut HybridStage,
    host: &HostedStage,
    op: &PrefixOp,
) -> Result<(), PipelineError> {
    if op.action == shoal_wire::PrefixAction::Clear {
        return Err(PipelineError::Group {
            why: "a group's clear on a pipeline stage's stream".into(),
        });
    }
    let Some(kv) = prefix_kv_op(op) else {
        // A rewind (sent again after a cut): applied twice, the same as once.
        let (seq_id, len) = (op.seq_id, op.len as usize);
        host.check_room(stage, len.saturating_sub(stage.cached_len(seq_id)))?;
        stage.rewind(seq_id, len)?;
        return Ok(());
    };
    if already_applied(stage, kv) {
        return Ok(());
    }
    if let KvOp::Start { len, .. } | KvOp::Fork { len, .. } = kv {
        host.check_room(stage, len)?;
    }
    stage.kv(kv)?;
    Ok(())
}

/// Whether `op` was applied already: what it takes from is gone. The driver sends an operation only
/// while its source exists, so a source gone means this stage applied it, and what came after it
/// consumed the result (a fork's copy retained as a prefix, a started prefix dropped). Applied again,
/// anything else gives the same state; a stage whose caches really went wrong is still caught by the
/// next batch's start positions (`check_batch`).
fn already_applied(stage: &HybridStage, op: KvOp) -> bool {
    let gone = match op {
        KvOp::Retain { seq_id, .. } => stage.cached_len(seq_id) == 0,
        // A placeholder stands for a sequence released after the fork (`LocalStage::rewind`).
        KvOp::Fork { seq_id, .. } => stage.cached_len(seq_id) == 0 || stage.is_placeholder(seq_id),
        KvOp::Start { prefix_id, .. } => !stage.has_prefix(prefix_id),
        KvOp::DropPrefix { .. } | KvOp::Release { .. } | KvOp::Rewind { .. } => false,
    };
    if gone {
        tracing::debug!(
            ?op,
            "KV operation already applied (sent again after a cut): skipped"
        );
    }
    gone
}

#[cfg(test)]
#[path = "host_tests.rs"]
mod tests;
