//! The data plane: `shoal-wire` frames between pipeline neighbours, on direct connections (lanes).
//!
//! Each instance of `n` stages uses `n` streams: stage k → stage k+1 for `k < n-1` (activations, sampling
//! jobs, releases, prefix operations, in that order), and one from the driver to the last stage on which
//! the last stage sends sampled tokens back. Each stream opens on the nodes' libp2p connection (on the
//! chosen path, so authenticated and encrypted like everything else: pnet + noise), and right after the
//! handshake moves to a lane (`lane.rs`): a TCP connection of its own to the same address, whose keys were
//! agreed on that stream, read and written by the threads that compute — a hop is one write and one
//! wakeup. Where no lane can be made (`serve --no-lanes`, a firewall that lets only the cluster port
//! through) the stream carries the frames itself (the *relay*: reader and writer tasks between the
//! threads and the stream). `Outlet`, `Inlet` and `Alarm` are the three ends either way.
//!
//! - [`RemoteChain`] is the driver's [`Stage`](shoal_engine::stage::Stage) for all stages after its
//!   own: it sends a batch and waits for its tokens on one `Inlet` (the token lane, which a membership
//!   and a path watch can interrupt), failing at once (as [`StageLost`](shoal_engine::EngineError::StageLost)) when a
//!   stream closes or a stage node leaves.
//! - [`serve_stages`] accepts inbound streams for the stages this node hosts ([`Hosts`]) and runs each on its
//!   own thread: read → compute → write to the next stage (or tokens to the driver), so sending one batch
//!   overlaps with computing the next.
//!
//! A step crosses each hop as one message: the driver writes a batch's sampling jobs and activations as
//! one buffer, a stage holds the frames it passes on (jobs, KV operations) until its answer goes out
//! (or until it would wait for input) — one write, one packet and one wakeup of the next node per step
//! (on a relay, the stream's writer task joins what is queued into one write, one multiplexer frame).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::io::{ReadHalf, WriteHalf};
use futures::{AsyncReadExt, AsyncWriteExt};
use libp2p::{PeerId, Stream, StreamProtocol};
use sha2::{Digest, Sha256};
use shoal_engine::stage::{ChunkSpec, KvOp, Pool};
use shoal_wire::{
    DEFAULT_MAX_FRAME_LEN, Frame, FrameReader, HANDSHAKE_HEADER_LEN, Handshake, PrefixAction,
    PrefixOp,
};
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio::time::Instant;

use shoal_cluster::Traffic;

use crate::error::PipelineError;

mod chain;
mod group;
pub mod hopbench;
mod host;
mod lane;
mod path;
pub mod reduce;
mod wait;

use lane::{Interrupt, Lane, LaneReader, LaneWriter, Received};

pub use chain::RemoteChain;
pub use group::{MemberLink, Members, connect_group};
pub use host::{HostedStage, Hosts, StageKv, serve_stages};
pub use lane::Lanes;

pub const STAGE_PROTOCOL: StreamProtocol = StreamProtocol::new("/shoal/stage/1");
/// Encoded frames queued to a stream's writer task. A stage is at most a few batches ahead of its
/// neighbour (the driver waits for each batch's tokens), so this never fills in normal operation; when a
/// peer stops reading it makes the sender wait instead of buffering without limit.
const WRITE_QUEUE: usize = 64;
/// Queued messages up to this many bytes together go out as one write (see `spawn_writer`).
const COALESCE_BYTES: usize = 64 << 10;
/// Frames read from a stream and not yet processed (same reasoning).
const READ_QUEUE: usize = 64;
/// A batch that produced no tokens for this long fails even if every node still looks alive (a lost
/// stream or node fails it at once).
const BATCH_TIMEOUT: Duration = Duration::from_secs(120);

/// A 32-byte node id for the wire handshake.
pub fn wire_node_id(peer: &PeerId) -> [u8; 32] {
    Sha256::digest(peer.to_bytes()).into()
}

/// Sends our handshake, reads and checks the peer's.
async fn handshake(stream: &mut Stream, ours: &Handshake) -> Result<Handshake, PipelineError> {
    stream.write_all(&ours.encode()).await?;
    stream.flush().await?;
    let peer = read_handshake(stream).await?;
    peer.check_compatible(ours)?;
    Ok(peer)
}

/// Reads the peer's handshake (not yet checked against ours).
async fn read_handshake(stream: &mut Stream) -> Result<Handshake, PipelineError> {
    let mut buf = vec![0u8; HANDSHAKE_HEADER_LEN];
    stream.read_exact(&mut buf).await?;
    let total = Handshake::wire_len(&buf)?.ok_or(PipelineError::ShortHandshake)?;
    buf.resize(total, 0);
    stream.read_exact(&mut buf[HANDSHAKE_HEADER_LEN..]).await?;
    Ok(Handshake::decode(&buf).map(|(h, _)| h)?)
}

/// Writes queued frames to the stream until the queue closes or a write fails; closes the stream after.
fn spawn_writer(
    mut w: WriteHalf<Stream>,
    mut rx: mpsc::Receiver<Vec<u8>>,
    traffic: Arc<Traffic>,
    peer: PeerId,
) {
    tokio::spawn(async move {
        'stream: while let Some(mut buf) = rx.recv().await {
            // What is already queued goes out with it: small messages join one write (one frame of
            // the multiplexer, one packet, one wakeup of the reader), larger ones follow as they are.
            let mut n = 0u64;
            loop {
                let more = if buf.len() < COALESCE_BYTES {
                    rx.try_recv().ok()
                } else {
                    None
                };
                match more {
                    Some(m) if buf.len() + m.len() <= COALESCE_BYTES => buf.extend_from_slice(&m),
                    more => {
                        if w.write_all(&buf).await.is_err() {
                            break 'stream;
                        }
                        n += buf.len() as u64;
                        match more {
                            Some(m) => buf = m,
                            None => break,
                        }
                    }
                }
            }
            if w.flush().await.is_err() {
                break;
            }
            traffic.add(peer, n, 0);
        }
        let _ = w.close().await;
    });
}

/// What a stream's reader task hands on: a frame, or why the stream ended badly.
type Inbound = Result<Frame, PipelineError>;

/// Reads frames into `tx` until the stream ends or breaks; a malformed frame is logged and ends it.
fn spawn_reader(
    mut r: ReadHalf<Stream>,
    tx: mpsc::Sender<Inbound>,
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
                Err(source) => {
                    let _ = tx
                        .send(Err(PipelineError::StreamBroke { peer, source }))
                        .await;
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
                    Err(source) => {
                        tracing::warn!(%peer, kind = source.error_type(), "malformed frame, closing the stream: {source}");
                        let _ = tx
                            .send(Err(PipelineError::Malformed { peer, source }))
                            .await;
                        return;
                    }
                }
            }
        }
    });
}

/// The frame that carries a KV operation down a pipeline: `Release` or `Prefix`.
fn kv_frame(op: KvOp) -> Frame {
    let prefix = |action, seq_id, prefix_id, len: usize| {
        Frame::Prefix(PrefixOp {
            action,
            seq_id,
            prefix_id,
            len: len as u32,
        })
    };
    match op {
        KvOp::Release { seq_id } => Frame::Release {
            seq_ids: vec![seq_id],
        },
        KvOp::Retain {
            seq_id,
            prefix_id,
            len,
        } => prefix(PrefixAction::Retain, seq_id, prefix_id, len),
        KvOp::Start {
            prefix_id,
            seq_id,
            len,
        } => prefix(PrefixAction::Start, seq_id, prefix_id, len),
        KvOp::DropPrefix { prefix_id } => prefix(PrefixAction::Drop, 0, prefix_id, 0),
        // The new sequence's id travels in the prefix id's place.
        KvOp::Fork { seq_id, into, len } => prefix(PrefixAction::Fork, seq_id, into, len),
        // Speculative decoding's rejected drafted tokens: the stage's own rewind.
        KvOp::Rewind { seq_id, len } => rewind_frame(seq_id, len),
    }
}

/// The KV operation a `Prefix` frame carries ([`kv_frame`]'s inverse); `None` for a rewind, which
/// only a replay sends ([`rewind_frame`]) and a stage applies itself (`LocalStage::rewind`).
fn prefix_kv_op(op: &PrefixOp) -> Option<KvOp> {
    let (seq_id, prefix_id, len) = (op.seq_id, op.prefix_id, op.len as usize);
    Some(match op.action {
        PrefixAction::Retain => KvOp::Retain {
            seq_id,
            prefix_id,
            len,
        },
        PrefixAction::Start => KvOp::Start {
            prefix_id,
            seq_id,
            len,
        },
        PrefixAction::Drop => KvOp::DropPrefix { prefix_id },
        PrefixAction::Fork => KvOp::Fork {
            seq_id,
            into: prefix_id,
            len,
        },
        PrefixAction::Rewind | PrefixAction::Clear => return None,
    })
}

/// A frame that leaves `seq_id` with exactly its first `len` tokens on every stage (a placeholder
/// where it is gone: `LocalStage::rewind`).
fn rewind_frame(seq_id: u64, len: usize) -> Frame {
    Frame::Prefix(PrefixOp {
        action: PrefixAction::Rewind,
        seq_id,
        prefix_id: 0,
        len: len as u32,
    })
}

/// The wire's headers of `batch`, each chunk starting at `starts[i]` in its sequence, with `rows[i]`
/// logits rows when some chunk verifies drafted tokens (`drafted`: all but the first).
fn chunk_headers(
    batch: &[ChunkSpec],
    starts: impl IntoIterator<Item = usize>,
    rows: Option<&[usize]>,
) -> Vec<shoal_wire::ChunkHeader> {
    batch
        .iter()
        .zip(starts)
        .enumerate()
        .map(|(i, (c, start))| shoal_wire::ChunkHeader {
            seq_id: c.seq_id,
            start_pos: start as u32,
            len: c.len as u32,
            want_logits: c.want_logits,
            pool: wire_pool(c.pool),
            drafted: rows.map_or(0, |r| r[i].saturating_sub(1) as u16),
        })
        .collect()
}

/// Each chunk's logits rows when some chunk verifies drafted tokens (the `rows` of
/// [`chunk_headers`]); `None` when none does.
fn logit_rows_of(chunks: &[shoal_wire::ChunkHeader]) -> Option<Vec<usize>> {
    chunks.iter().any(|c| c.drafted > 0).then(|| {
        chunks
            .iter()
            .map(|c| usize::from(c.want_logits) + usize::from(c.drafted))
            .collect()
    })
}

/// The engine's chunks of a batch whose headers came over the wire.
fn chunk_specs(chunks: &[shoal_wire::ChunkHeader]) -> Vec<ChunkSpec> {
    chunks
        .iter()
        .map(|c| ChunkSpec {
            seq_id: c.seq_id,
            len: c.len as usize,
            want_logits: c.want_logits,
            pool: engine_pool(c.pool),
        })
        .collect()
}

/// A chunk's [`Pool`] as the wire writes it.
fn wire_pool(pool: Pool) -> shoal_wire::Pool {
    match pool {
        Pool::None => shoal_wire::Pool::None,
        Pool::Sum => shoal_wire::Pool::Sum,
        Pool::Last => shoal_wire::Pool::Last,
        Pool::First => shoal_wire::Pool::First,
    }
}

/// [`wire_pool`]'s inverse.
fn engine_pool(pool: shoal_wire::Pool) -> Pool {
    match pool {
        shoal_wire::Pool::None => Pool::None,
        shoal_wire::Pool::Sum => Pool::Sum,
        shoal_wire::Pool::Last => Pool::Last,
        shoal_wire::Pool::First => Pool::First,
    }
}

fn encode(frame: &Frame) -> Result<Vec<u8>, PipelineError> {
    Ok(frame.encode()?)
}

/// Where a stream's frames go: its lane, written by the calling thread, or the stream's writer task
/// (the relay, when no lane could be set up).
pub(super) enum Outlet {
    Lane(LaneWriter),
    Relay(mpsc::Sender<Vec<u8>>),
}

impl Outlet {
    /// Sends one message, blocking while the peer is behind; `false` when the stream is gone.
    fn send(&mut self, bytes: Vec<u8>) -> bool {
        match self {
            Outlet::Lane(w) => match w.send(&bytes) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(kind = e.error_type(), "{e}");
                    false
                }
            },
            Outlet::Relay(tx) => tx.blocking_send(bytes).is_ok(),
        }
    }

    /// Which transport this is, for logs and `/state`.
    fn transport(&self) -> &'static str {
        match self {
            Outlet::Lane(_) => "lane",
            Outlet::Relay(_) => "relay",
        }
    }
}

/// Where a stream's frames come from: its lane, read by the waiting thread, or the channel its reader
/// task feeds (with what watchers put there).
pub(super) enum Inlet {
    Lane(Box<LaneReader>),
    Relay(mpsc::Receiver<Inbound>),
}

impl Inlet {
    /// A frame already here, without waiting.
    fn try_recv(&mut self) -> Option<Inbound> {
        match self {
            Inlet::Lane(r) => r.try_recv(),
            Inlet::Relay(rx) => rx.try_recv().ok(),
        }
    }

    /// The next frame, waiting as long as it takes (on a thread outside the runtime); `None` once
    /// the stream closed.
    fn recv(&mut self) -> Option<Inbound> {
        match self {
            Inlet::Lane(r) => match r.recv(None) {
                Received::Inbound(i) => Some(i),
                Received::Closed | Received::TimedOut => None,
            },
            Inlet::Relay(rx) => rx.blocking_recv(),
        }
    }

    /// The next frame until `deadline` (`rt`'s timer bounds a relay's wait): `Err` once the deadline
    /// passed, `Ok(None)` when the stream closed.
    fn recv_by(&mut self, rt: &Handle, deadline: Instant) -> Result<Option<Inbound>, Elapsed> {
        match self {
            Inlet::Lane(r) => match r.recv(Some(deadline.into_std())) {
                Received::Inbound(i) => Ok(Some(i)),
                Received::Closed => Ok(None),
                Received::TimedOut => Err(Elapsed),
            },
            // The timer is made inside the future: this thread has no runtime context of its own.
            Inlet::Relay(rx) => rt
                .block_on(async { tokio::time::timeout_at(deadline, rx.recv()).await })
                .map_err(|_| Elapsed),
        }
    }

    /// What a watcher holds to put an error in front of whoever waits on this inlet.
    fn alarm(&self) -> Option<Alarm> {
        match self {
            Inlet::Lane(r) => Some(Alarm::Lane(r.interrupt())),
            Inlet::Relay(_) => None,
        }
    }
}

/// A wait that reached its deadline.
#[derive(Debug)]
pub(super) struct Elapsed;

/// How a watcher (or a newer stream) wakes the thread waiting on an [`Inlet`] with an error; weak, so
/// it never keeps the stream open.
#[derive(Clone)]
pub(super) enum Alarm {
    Lane(Weak<Interrupt>),
    Relay(mpsc::WeakSender<Inbound>),
}

impl Alarm {
    /// Puts `why` in front of the waiting thread (waiting for room on a relay's channel).
    async fn ring(&self, why: PipelineError) {
        match self {
            Alarm::Lane(i) => {
                if let Some(i) = i.upgrade() {
                    i.fire(why);
                }
            }
            Alarm::Relay(tx) => {
                if let Some(tx) = tx.upgrade() {
                    let _ = tx.send(Err(why)).await;
                }
            }
        }
    }

    /// [`Self::ring`] without waiting: `false` when a relay's channel is full (try again later).
    fn try_ring(&self, why: PipelineError) -> bool {
        match self {
            Alarm::Lane(i) => {
                if let Some(i) = i.upgrade() {
                    i.fire(why);
                }
                true
            }
            Alarm::Relay(tx) => match tx.upgrade() {
                Some(tx) => !matches!(
                    tx.try_send(Err(why)),
                    Err(mpsc::error::TrySendError::Full(_))
                ),
                None => true,
            },
        }
    }
}

/// Reads one frame from a stream during setup (before its reader task exists).
async fn read_frame(stream: &mut Stream) -> Result<Frame, PipelineError> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await?;
    let n = u32::from_le_bytes(len);
    if n == 0 || n > 1 << 16 {
        return Err(PipelineError::ShortHandshake);
    }
    let mut buf = len.to_vec();
    buf.resize(4 + n as usize, 0);
    stream.read_exact(&mut buf[4..]).await?;
    match Frame::decode(&buf, DEFAULT_MAX_FRAME_LEN)? {
        Some((f, _)) => Ok(f),
        None => Err(PipelineError::ShortHandshake),
    }
}

/// The opening side of a stream, after the handshake: takes the acceptor's lane offer, connects to it
/// at `ip` (the address of the path the stream runs on) and says whether it did. `None`: the stream
/// itself carries the frames (no offer, lanes off, or the connection failed — logged).
async fn open_lane(
    stream: &mut Stream,
    ip: IpAddr,
    peer: PeerId,
    traffic: Arc<Traffic>,
    use_lanes: bool,
) -> Result<Option<Lane>, PipelineError> {
    let Frame::Lane { port, token } = read_frame(stream).await? else {
        return Err(PipelineError::LaneSetup {
            peer,
            why: "expected a lane offer after the handshake".into(),
        });
    };
    let lane = if port != 0 && use_lanes {
        match lane::connect(SocketAddr::new(ip, port), &token, peer, traffic).await {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(%peer, %ip, port, kind = e.error_type(),
                    "no direct connection for a data-plane stream, it goes through the cluster connection: {e}");
                None
            }
        }
    } else {
        None
    };
    let answer = Frame::Lane {
        port: u16::from(lane.is_some()),
        token: [0; 32],
    };
    stream.write_all(&encode(&answer)?).await?;
    stream.flush().await?;
    Ok(lane)
}

/// The accepting side of a stream: sends our handshake and a lane offer (none when `lanes` is `None`),
/// reads the opener's answer and returns the lane when it connected.
async fn accept_lane(
    stream: &mut Stream,
    ours: &Handshake,
    lanes: Option<&Lanes>,
    peer: PeerId,
) -> Result<Option<Lane>, PipelineError> {
    let (offer_frame, offer) = match lanes {
        Some(l) => {
            let (f, o) = l.offer(peer)?;
            (f, Some(o))
        }
        None => (
            Frame::Lane {
                port: 0,
                token: [0; 32],
            },
            None,
        ),
    };
    let mut bytes = ours.encode();
    bytes.extend(encode(&offer_frame)?);
    stream.write_all(&bytes).await?;
    stream.flush().await?;
    let Frame::Lane { port: used, .. } = read_frame(stream).await? else {
        return Err(PipelineError::LaneSetup {
            peer,
            why: "expected the answer to the lane offer".into(),
        });
    };
    match (used, offer) {
        (0, _) => Ok(None),
        (_, Some(offer)) => offer.lane().await.map(Some),
        (_, None) => Err(PipelineError::LaneSetup {
            peer,
            why: "the opening node used a lane that was not offered".into(),
        }),
    }
}
