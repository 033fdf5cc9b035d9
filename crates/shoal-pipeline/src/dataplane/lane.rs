//! Lanes: a data-plane stream's frames on a direct TCP connection between the two nodes, read and
//! written by the threads that compute — no task, multiplexer or channel between a stage and its
//! socket, so a hop costs one write and one wakeup of the thread that waits for it (and not even the
//! wakeup in steady decode: the reader polls around the time its input is due, `wait.rs`).
//!
//! A lane is set up over the stream it replaces (already authenticated and encrypted by the cluster's
//! libp2p connection): right after the handshake the accepting node offers a [`Frame::Lane`] with the
//! port of its [`Lanes`] listener and a fresh random 32-byte token; the opening node connects to that
//! port on the address of the path the stream runs on, presents `SHA-256("shoal lane id v1" ‖ token)`
//! and waits for the acceptor's first sealed record; then it answers with `Lane { port: 1 }` on the
//! stream (or `port: 0` when it could not connect, and both keep using the stream — the *relay*).
//! The token never crosses the network in the clear, so only the two nodes know the keys:
//! `SHA-256("shoal lane opener v1" ‖ token)` seals what the opener sends,
//! `SHA-256("shoal lane acceptor v1" ‖ token)` what the acceptor sends.
//!
//! On the lane, bytes go in records: `[len u32][ChaCha20-Poly1305 ciphertext ‖ tag]`, `len` counting
//! ciphertext and tag (≤ [`MAX_RECORD`] + 16), the nonce a per-direction record counter, so a record
//! dropped, replayed, reordered or altered fails to open and ends the lane. The plaintext is the
//! stream's bytes ([`shoal_wire`] frames); records do not align with frames.
//!
//! [`LaneReader`] and [`LaneWriter`] are the two halves; an [`Interrupt`] (what watchers hold, weakly)
//! shuts the socket down with a reason, which wakes the thread blocked on the reader.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce, Tag};
use libp2p::PeerId;
use sha2::{Digest, Sha256};
use shoal_cluster::Traffic;
use shoal_wire::{DEFAULT_MAX_FRAME_LEN, Frame, FrameReader};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

use super::Inbound;
use super::wait::{Pacer, Ready};
use crate::error::PipelineError;

/// Plaintext bytes in one record at most (a longer message goes as several records).
pub const MAX_RECORD: usize = 1 << 20;
const TAG_LEN: usize = 16;
/// How long the accepting side waits for a lane's id and the opening side for the first record.
const SETUP_TIMEOUT: Duration = Duration::from_secs(3);
/// How long an opening node tries to connect a lane: a LAN or VPN answers in far less, and a data port
/// that drops packets must not hold a pipeline's bring-up (each stream waits this once) …
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// … and how long an address that failed is not tried again (its streams are relayed meanwhile).
const UNREACHABLE_FOR: Duration = Duration::from_secs(60);

/// Lane addresses that could not be connected lately, and when.
static UNREACHABLE: std::sync::LazyLock<Mutex<HashMap<SocketAddr, Instant>>> =
    std::sync::LazyLock::new(Mutex::default);
/// A write that makes no progress for this long fails (a peer that stopped reading).
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Keepalive: probes after this long without traffic, …
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
/// … this often, and the peer is dead after this many unanswered.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_PROBES: u32 = 3;
/// Bytes one read takes from the socket at most.
const READ_CHUNK: usize = 256 << 10;

/// An offer waiting for its connection: where the lane goes, the peer and the keys.
struct Waiting {
    tx: oneshot::Sender<Lane>,
    peer: PeerId,
    /// Seals what the acceptor sends.
    acceptor: [u8; 32],
    /// Opens what the opener sends.
    opener: [u8; 32],
}

/// Offers that wait for their connection, by lane id.
type Pending = Arc<Mutex<HashMap<[u8; 32], Waiting>>>;

/// This node's lane listener: where opening nodes connect, and the offers waiting for them.
#[derive(Clone)]
pub struct Lanes {
    port: u16,
    pending: Pending,
}

impl Lanes {
    /// Binds the listener on `ip:port` (`port` 0: a free one) and accepts lanes until the runtime ends
    /// (call within the runtime).
    pub fn bind(ip: IpAddr, port: u16, traffic: Arc<Traffic>) -> std::io::Result<Lanes> {
        let listener = std::net::TcpListener::bind((ip, port))?;
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let port = listener.local_addr()?.port();
        let pending: Pending = Arc::default();
        let map = pending.clone();
        tokio::spawn(async move {
            loop {
                let Ok((sock, from)) = listener.accept().await else {
                    // Out of file descriptors or similar: try again shortly rather than spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let map = map.clone();
                let traffic = traffic.clone();
                tokio::spawn(async move {
                    if let Err(e) = admit(sock, &map, traffic).await {
                        tracing::debug!(%from, "lane connection refused: {e}");
                    }
                });
            }
        });
        tracing::info!(%ip, port, "data-plane lanes listening");
        Ok(Lanes { port, pending })
    }

    /// The port opening nodes connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A new offer for a stream with `peer`: the frame to send it and what waits for its connection.
    pub(super) fn offer(&self, peer: PeerId) -> Result<(Frame, Offer), PipelineError> {
        let mut token = [0u8; 32];
        getrandom::getrandom(&mut token).map_err(|e| std::io::Error::other(e.to_string()))?;
        let (tx, rx) = oneshot::channel();
        let id = lane_id(&token);
        let waiting = Waiting {
            tx,
            peer,
            acceptor: derive(ACCEPTOR_KEY, &token),
            opener: derive(OPENER_KEY, &token),
        };
        if let Ok(mut m) = self.pending.lock() {
            m.insert(id, waiting);
        }
        let frame = Frame::Lane {
            port: self.port,
            token,
        };
        let offer = Offer {
            id,
            peer,
            rx,
            pending: Arc::downgrade(&self.pending),
        };
        Ok((frame, offer))
    }
}

/// An offered lane, waiting for the opening node's connection; withdrawn when dropped.
pub(super) struct Offer {
    id: [u8; 32],
    peer: PeerId,
    rx: oneshot::Receiver<Lane>,
    pending: Weak<Mutex<HashMap<[u8; 32], Waiting>>>,
}

impl Offer {
    /// The lane, once the opening node connected with this offer's id (it says so on the stream
    /// only after the lane answered it, so this waits at most briefly).
    pub(super) async fn lane(mut self) -> Result<Lane, PipelineError> {
        match tokio::time::timeout(SETUP_TIMEOUT, &mut self.rx).await {
            Ok(Ok(lane)) if lane.peer == self.peer => Ok(lane),
            _ => Err(PipelineError::LaneSetup {
                peer: self.peer,
                why: "the opening node said it connected, but no lane arrived".into(),
            }),
        }
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        if let Some(p) = self.pending.upgrade()
            && let Ok(mut m) = p.lock()
        {
            m.remove(&self.id);
        }
    }
}

/// Reads a connecting lane's id; when an offer waits for it, answers with the first (empty) sealed
/// record and hands the lane over.
async fn admit(
    mut sock: tokio::net::TcpStream,
    pending: &Pending,
    traffic: Arc<Traffic>,
) -> Result<(), PipelineError> {
    let mut id = [0u8; 32];
    tokio::time::timeout(SETUP_TIMEOUT, sock.read_exact(&mut id))
        .await
        .map_err(|_| std::io::Error::from(ErrorKind::TimedOut))??;
    let Some(w) = pending.lock().ok().and_then(|mut m| m.remove(&id)) else {
        return Ok(());
    };
    let sock = into_std(sock)?;
    let mut lane = Lane::new(sock, w.peer, w.acceptor, w.opener, traffic)?;
    lane.writer.send(&[])?;
    let _ = w.tx.send(lane);
    Ok(())
}

const ID_LABEL: &[u8] = b"shoal lane id v1";
const OPENER_KEY: &[u8] = b"shoal lane opener v1";
const ACCEPTOR_KEY: &[u8] = b"shoal lane acceptor v1";

/// The id a connecting opener presents for `token`.
fn lane_id(token: &[u8; 32]) -> [u8; 32] {
    derive(ID_LABEL, token)
}

fn derive(label: &[u8], token: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(label);
    h.update(token);
    h.finalize().into()
}

/// A lane's socket for the threads: blocking, no Nagle delay, writes bounded, and a peer that vanished
/// without closing (power gone, path cut) noticed by keepalive probes — a thread blocked reading
/// then wakes with an error instead of holding its stage for good.
fn into_std(sock: tokio::net::TcpStream) -> std::io::Result<TcpStream> {
    let sock = sock.into_std()?;
    sock.set_nonblocking(false)?;
    sock.set_nodelay(true)?;
    sock.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    socket2::SockRef::from(&sock).set_tcp_keepalive(&keepalive)?;
    Ok(sock)
}

/// The opening side: connects to `addr` with the offer's `token`, waits for the acceptor's first
/// record and returns the lane.
pub(super) async fn connect(
    addr: SocketAddr,
    token: &[u8; 32],
    peer: PeerId,
    traffic: Arc<Traffic>,
) -> Result<Lane, PipelineError> {
    let failed_lately = UNREACHABLE
        .lock()
        .ok()
        .and_then(|m| m.get(&addr).copied())
        .is_some_and(|t| t.elapsed() < UNREACHABLE_FOR);
    if failed_lately {
        return Err(PipelineError::LaneSetup {
            peer,
            why: format!("{addr} could not be connected lately"),
        });
    }
    let connected =
        tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr)).await;
    let mut sock = match connected {
        Ok(Ok(sock)) => sock,
        failed => {
            if let Ok(mut m) = UNREACHABLE.lock() {
                m.insert(addr, Instant::now());
            }
            return Err(match failed {
                Ok(Err(e)) => e.into(),
                _ => std::io::Error::from(ErrorKind::TimedOut).into(),
            });
        }
    };
    if let Ok(mut m) = UNREACHABLE.lock() {
        m.remove(&addr);
    }
    let setup = async {
        sock.set_nodelay(true)?;
        sock.write_all(&lane_id(token)).await?;
        // The first record: 4 length bytes and an empty plaintext's tag.
        let mut first = [0u8; 4 + TAG_LEN];
        sock.read_exact(&mut first).await?;
        Ok::<_, std::io::Error>((sock, first))
    };
    let (sock, first) = tokio::time::timeout(SETUP_TIMEOUT, setup)
        .await
        .map_err(|_| std::io::Error::from(ErrorKind::TimedOut))??;
    let sock = into_std(sock)?;
    let opener = derive(OPENER_KEY, token);
    let acceptor = derive(ACCEPTOR_KEY, token);
    let mut lane = Lane::new(sock, peer, opener, acceptor, traffic)?;
    lane.reader.raw.extend_from_slice(&first);
    match lane.reader.open_record() {
        Ok(true) => Ok(lane),
        _ => Err(PipelineError::LaneSetup {
            peer,
            why: "the first record did not open".into(),
        }),
    }
}

/// A lane: both halves of one direct connection.
pub(super) struct Lane {
    pub(super) peer: PeerId,
    pub(super) reader: LaneReader,
    pub(super) writer: LaneWriter,
}

impl Lane {
    fn new(
        sock: TcpStream,
        peer: PeerId,
        send_key: [u8; 32],
        recv_key: [u8; 32],
        traffic: Arc<Traffic>,
    ) -> std::io::Result<Lane> {
        let interrupt = Arc::new(Interrupt {
            sock: sock.try_clone()?,
            why: Mutex::new(None),
        });
        let writer = LaneWriter {
            sock: sock.try_clone()?,
            cipher: ChaCha20Poly1305::new(Key::from_slice(&send_key)),
            counter: 0,
            buf: Vec::new(),
            traffic: traffic.clone(),
            peer,
        };
        let reader = LaneReader {
            sock,
            cipher: ChaCha20Poly1305::new(Key::from_slice(&recv_key)),
            counter: 0,
            raw: Vec::new(),
            scratch: vec![0; READ_CHUNK],
            frames: FrameReader::new(DEFAULT_MAX_FRAME_LEN),
            traffic,
            peer,
            interrupt,
            watch: None,
            pacer: Pacer::new(),
        };
        Ok(Lane {
            peer,
            reader,
            writer,
        })
    }
}

/// The two ends of a fresh loopback TCP connection, Nagle off as on a lane (for tests and `hopbench`).
pub(super) fn tcp_loopback_pair() -> std::io::Result<(TcpStream, TcpStream)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let a = TcpStream::connect(listener.local_addr()?)?;
    let (b, _) = listener.accept()?;
    for s in [&a, &b] {
        s.set_nodelay(true)?;
    }
    Ok((a, b))
}

/// Two ends of a lane over a fresh loopback connection, keyed from `token` as a real lane is (for tests
/// and `hopbench`): the opener's and the acceptor's.
pub(super) fn loopback_pair(token: &[u8; 32]) -> std::io::Result<(Lane, Lane)> {
    let (a, b) = tcp_loopback_pair()?;
    let (o, c) = (derive(OPENER_KEY, token), derive(ACCEPTOR_KEY, token));
    let t = Arc::new(Traffic::default());
    let peer = PeerId::random();
    Ok((
        Lane::new(a, peer, o, c, t.clone())?,
        Lane::new(b, peer, c, o, t)?,
    ))
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&counter.to_le_bytes());
    *Nonce::from_slice(&n)
}

/// The sending half of a lane.
pub struct LaneWriter {
    sock: TcpStream,
    cipher: ChaCha20Poly1305,
    counter: u64,
    buf: Vec<u8>,
    traffic: Arc<Traffic>,
    peer: PeerId,
}

impl LaneWriter {
    /// Seals `bytes` (as one record, or several past [`MAX_RECORD`]) and writes them in one call.
    pub fn send(&mut self, bytes: &[u8]) -> Result<(), PipelineError> {
        self.buf.clear();
        let mut chunks = bytes.chunks(MAX_RECORD).peekable();
        if chunks.peek().is_none() {
            self.seal(&[])?;
        }
        for chunk in chunks {
            self.seal(chunk)?;
        }
        self.sock
            .write_all(&self.buf)
            .map_err(|source| PipelineError::StreamBroke {
                peer: self.peer,
                source,
            })?;
        self.traffic.add(self.peer, self.buf.len() as u64, 0);
        Ok(())
    }

    fn seal(&mut self, plain: &[u8]) -> Result<(), PipelineError> {
        let start = self.buf.len();
        self.buf
            .extend_from_slice(&((plain.len() + TAG_LEN) as u32).to_le_bytes());
        self.buf.extend_from_slice(plain);
        let tag = self
            .cipher
            .encrypt_in_place_detached(&nonce(self.counter), &[], &mut self.buf[start + 4..])
            .map_err(|_| PipelineError::LaneSealing { peer: self.peer })?;
        self.counter += 1;
        self.buf.extend_from_slice(&tag);
        Ok(())
    }
}

/// Wakes the thread blocked on a lane's reader (or the next read) with a reason.
pub struct Interrupt {
    sock: TcpStream,
    why: Mutex<Option<PipelineError>>,
}

impl Interrupt {
    /// Shuts the lane down; its reader returns `why` (the first reason given).
    pub fn fire(&self, why: PipelineError) {
        if let Ok(mut w) = self.why.lock()
            && w.is_none()
        {
            *w = Some(why);
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// The receiving half of a lane: frames out of opened records.
pub struct LaneReader {
    sock: TcpStream,
    cipher: ChaCha20Poly1305,
    counter: u64,
    /// Bytes read and not yet opened.
    raw: Vec<u8>,
    /// Where a read lands (allocated once).
    scratch: Vec<u8>,
    frames: FrameReader,
    traffic: Arc<Traffic>,
    peer: PeerId,
    interrupt: Arc<Interrupt>,
    /// The thread's outgoing lane, watched while waiting: its peer closing it (the next stage's
    /// thread ended) ends this wait too, so a break anywhere down a pipeline travels back up at once.
    watch: Option<TcpStream>,
    /// When the next bytes are due (how a wait spends its time).
    pacer: Pacer,
}

/// What a wait on a lane found: a frame or an error, the lane closed, or the deadline passed.
pub enum Received {
    Inbound(Inbound),
    Closed,
    TimedOut,
}

impl LaneReader {
    /// What watchers hold to wake this reader (weakly: they never keep the socket open).
    pub fn interrupt(&self) -> Weak<Interrupt> {
        Arc::downgrade(&self.interrupt)
    }

    /// Whether waits poll around the input's due time (see [`Pacer`]; on by default).
    pub fn pace(&mut self, on: bool) {
        self.pacer.set(on);
    }

    /// Also ends a wait when `out`'s peer closes it (see the field).
    pub fn watch(&mut self, out: &LaneWriter) -> std::io::Result<()> {
        self.watch = Some(out.sock.try_clone()?);
        Ok(())
    }

    /// The next frame, waiting until `deadline` (`None`: as long as it takes).
    pub fn recv(&mut self, deadline: Option<Instant>) -> Received {
        // Only a wait for a message's first bytes says when messages are due (not one for its rest).
        let mut learn = self.raw.is_empty();
        loop {
            match self.buffered() {
                Ok(Some(f)) => return Received::Inbound(Ok(f)),
                Ok(None) => {}
                Err(e) => return Received::Inbound(Err(e)),
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Received::TimedOut;
            }
            let waited = self
                .pacer
                .wait(&self.sock, self.watch.as_ref(), deadline, learn);
            learn = false;
            match waited {
                Ok(Ready::Input) => {}
                Ok(Ready::Watched) => {
                    return Received::Inbound(Err(PipelineError::StreamClosed {
                        what: "stream to the next stage",
                    }));
                }
                Ok(Ready::Neither) => return Received::TimedOut,
                Err(e) => return self.ended(Some(e)),
            }
            match self.fill() {
                Ok(0) => return self.ended(None),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Received::TimedOut;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return self.ended(Some(e)),
            }
        }
    }

    /// A frame already here (read without waiting), if any.
    pub fn try_recv(&mut self) -> Option<Inbound> {
        match self.buffered() {
            Ok(Some(f)) => return Some(Ok(f)),
            Ok(None) => {}
            Err(e) => return Some(Err(e)),
        }
        if self.sock.set_nonblocking(true).is_err() {
            return None;
        }
        let got = self.fill();
        let _ = self.sock.set_nonblocking(false);
        match got {
            Ok(n) if n > 0 => self.buffered().transpose(),
            _ => None,
        }
    }

    /// The lane ended: the interrupt's reason when one fired, else the error (or a clean close).
    fn ended(&mut self, err: Option<std::io::Error>) -> Received {
        if let Some(why) = self.interrupt.why.lock().ok().and_then(|mut w| w.take()) {
            return Received::Inbound(Err(why));
        }
        match err {
            Some(source) => Received::Inbound(Err(PipelineError::StreamBroke {
                peer: self.peer,
                source,
            })),
            None => Received::Closed,
        }
    }

    /// Reads what the socket has (blocking as the socket is set); the count read.
    fn fill(&mut self) -> std::io::Result<usize> {
        let n = self.sock.read(&mut self.scratch)?;
        self.raw.extend_from_slice(&self.scratch[..n]);
        self.traffic.add(self.peer, 0, n as u64);
        Ok(n)
    }

    /// Opens every complete record and returns the next complete frame, if any.
    fn buffered(&mut self) -> Result<Option<Frame>, PipelineError> {
        while self.open_record()? {}
        self.frames
            .next_frame()
            .map_err(|source| PipelineError::Malformed {
                peer: self.peer,
                source,
            })
    }

    /// Opens the first record of `raw` into the frame reader; `false` when none is complete.
    fn open_record(&mut self) -> Result<bool, PipelineError> {
        let Some(head) = self.raw.get(..4) else {
            return Ok(false);
        };
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if !(TAG_LEN..=MAX_RECORD + TAG_LEN).contains(&len) {
            return Err(PipelineError::LaneSealing { peer: self.peer });
        }
        if self.raw.len() < 4 + len {
            return Ok(false);
        }
        let body = &mut self.raw[4..4 + len];
        let (plain, tag) = body.split_at_mut(len - TAG_LEN);
        let tag = *Tag::from_slice(tag);
        self.cipher
            .decrypt_in_place_detached(&nonce(self.counter), &[], plain, &tag)
            .map_err(|_| PipelineError::LaneSealing { peer: self.peer })?;
        self.counter += 1;
        self.frames.push(plain);
        self.raw.drain(..4 + len);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two lane ends over a real loopback connection, keyed from one token.
    fn pair(token: &[u8; 32]) -> (Lane, Lane) {
        loopback_pair(token).unwrap()
    }

    fn frame_of(r: &mut LaneReader) -> Frame {
        match r.recv(Some(Instant::now() + Duration::from_secs(5))) {
            Received::Inbound(Ok(f)) => f,
            Received::Inbound(Err(e)) => panic!("expected a frame, got {e}"),
            Received::Closed => panic!("expected a frame, the lane closed"),
            Received::TimedOut => panic!("expected a frame, none came"),
        }
    }

    #[test]
    fn frames_cross_a_lane_in_order_whatever_the_record_boundaries() {
        let (mut a, mut b) = pair(&[1; 32]);
        // Two frames in one message, one frame over several records (past MAX_RECORD), an empty one.
        let mut msg = Frame::Ping { nonce: 1 }.encode().unwrap();
        msg.extend(Frame::Pong { nonce: 2 }.encode().unwrap());
        a.writer.send(&msg).unwrap();
        let big = Frame::Error {
            code: 7,
            message: "x".repeat(MAX_RECORD + 100),
        };
        a.writer.send(&big.encode().unwrap()).unwrap();
        a.writer.send(&[]).unwrap();
        a.writer
            .send(&Frame::Ping { nonce: 3 }.encode().unwrap())
            .unwrap();
        assert_eq!(frame_of(&mut b.reader), Frame::Ping { nonce: 1 });
        assert_eq!(
            b.reader.try_recv().unwrap().unwrap(),
            Frame::Pong { nonce: 2 }
        );
        assert_eq!(frame_of(&mut b.reader), big);
        assert_eq!(frame_of(&mut b.reader), Frame::Ping { nonce: 3 });
        // And back the other way, with the other key.
        b.writer
            .send(&Frame::Pong { nonce: 4 }.encode().unwrap())
            .unwrap();
        assert_eq!(frame_of(&mut a.reader), Frame::Pong { nonce: 4 });
        assert!(a.reader.try_recv().is_none(), "nothing more waits");
        drop(a);
        assert!(matches!(b.reader.recv(None), Received::Closed));
    }

    #[test]
    fn an_altered_or_replayed_record_ends_the_lane() {
        let (mut a, mut b) = pair(&[2; 32]);
        let ping = Frame::Ping { nonce: 9 }.encode().unwrap();
        // A sealed record, written as the sender would, then replayed: the counter moved on.
        a.writer.send(&ping).unwrap();
        let sealed = a.writer.buf.clone();
        assert_eq!(frame_of(&mut b.reader), Frame::Ping { nonce: 9 });
        a.writer.sock.write_all(&sealed).unwrap();
        assert!(matches!(
            b.reader.recv(None),
            Received::Inbound(Err(PipelineError::LaneSealing { .. }))
        ));
        // One flipped bit in a fresh pair's first record.
        let (mut a, mut b) = pair(&[3; 32]);
        a.writer.buf.clear();
        a.writer.seal(&ping).unwrap();
        let mut bad = a.writer.buf.clone();
        bad[6] ^= 1;
        a.writer.sock.write_all(&bad).unwrap();
        assert!(matches!(
            b.reader.recv(None),
            Received::Inbound(Err(PipelineError::LaneSealing { .. }))
        ));
        // A lane keyed from another token cannot read it either.
        let (mut a, _) = pair(&[4; 32]);
        a.writer.send(&ping).unwrap();
        let sealed = a.writer.buf.clone();
        let (mut x, mut y) = pair(&[5; 32]);
        x.writer.sock.write_all(&sealed).unwrap();
        assert!(matches!(
            y.reader.recv(None),
            Received::Inbound(Err(PipelineError::LaneSealing { .. }))
        ));
    }

    #[test]
    fn an_interrupt_wakes_a_blocked_reader_with_its_reason() {
        let (_a, b) = pair(&[6; 32]);
        let mut reader = b.reader;
        let alarm = reader.interrupt();
        let waiter = std::thread::spawn(move || match reader.recv(None) {
            Received::Inbound(Err(PipelineError::NodeLeft { node })) => node.to_string(),
            _ => String::new(),
        });
        std::thread::sleep(Duration::from_millis(50));
        alarm.upgrade().unwrap().fire(PipelineError::NodeLeft {
            node: "c".parse().unwrap(),
        });
        assert_eq!(waiter.join().unwrap(), "c");
    }

    #[test]
    fn a_wait_ends_at_its_deadline() {
        let (_a, mut b) = pair(&[7; 32]);
        let start = Instant::now();
        assert!(matches!(
            b.reader.recv(Some(start + Duration::from_millis(50))),
            Received::TimedOut
        ));
        assert!(start.elapsed() >= Duration::from_millis(50));
    }

    #[test]
    fn a_closed_outgoing_lane_ends_the_wait_on_the_incoming_one() {
        // A stage: reads `up`, writes `down`. The next stage going away closes `down`'s far end.
        let (_upstream, mut up) = pair(&[8; 32]);
        let (down, next) = pair(&[9; 32]);
        up.reader.watch(&down.writer).unwrap();
        let waiter = std::thread::spawn(move || match up.reader.recv(None) {
            Received::Inbound(Err(PipelineError::StreamClosed { what })) => what.to_string(),
            _ => String::new(),
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(next);
        assert_eq!(waiter.join().unwrap(), "stream to the next stage");
        drop(down);
    }
}
