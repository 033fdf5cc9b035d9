//! [`PeerSource`]: one model's file on one peer, read over the blob protocol.
//!
//! The source keeps a few streams open to the peer ([`PeerSource::new`]'s `streams`, opened on first
//! use) and sends each request on the next one round-robin. A stream is a [`Conn`]: a writer task that
//! sends requests as they come (so several are in flight: the pipeline that fills a link whose
//! bandwidth-delay product is larger than a chunk) and hands each request's reply slot to a reader task,
//! which reads the answers in order. A broken stream fails every request waiting on it; the fetcher then
//! drops the source.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::{AsyncReadExt, AsyncWriteExt};
use libp2p::PeerId;
use tokio::sync::{mpsc, oneshot};

use crate::error::SourceError;
use crate::manifest::Manifest;
use crate::protocol::{
    BLOB_PROTOCOL, MAX_READ_LEN, MAX_RESPONSE_LEN, Request, Response, read_message, write_message,
};
use crate::source::ChunkSource;

/// Requests queued to one stream and not yet written. The fetcher keeps a few in flight per source, so
/// this is never the limit; it only bounds a caller that does not.
const REQUEST_QUEUE: usize = 32;

/// What a request gets back.
enum Reply {
    Manifest(Manifest),
    Data(Bytes),
}

type Job = (Request, oneshot::Sender<Result<Reply, SourceError>>);

/// One open blob stream: requests go in, replies come back on each job's oneshot.
struct Conn {
    tx: mpsc::Sender<Job>,
}

/// A model's file on one peer.
pub struct PeerSource {
    control: libp2p_stream::Control,
    peer: PeerId,
    model: String,
    conns: Vec<tokio::sync::Mutex<Option<Arc<Conn>>>>,
    next: AtomicUsize,
}

impl PeerSource {
    /// `model` on `peer`, over up to `streams` (at least 1) parallel streams. Nothing is opened yet.
    pub fn new(
        control: libp2p_stream::Control,
        peer: PeerId,
        model: impl Into<String>,
        streams: usize,
    ) -> Self {
        Self {
            control,
            peer,
            model: model.into(),
            conns: (0..streams.max(1))
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    pub fn peer(&self) -> PeerId {
        self.peer
    }

    /// The peer's manifest of the model, checked for sane numbers (not yet for being the file you want:
    /// compare [`Manifest::root`]s). The first request for a file hashes it on the peer (about a second
    /// per GB; its sidecar makes later ones instant), so give this a generous timeout.
    pub async fn manifest(&self) -> Result<Manifest, SourceError> {
        let req = Request::Manifest {
            model: self.model.clone(),
        };
        match self.call(req).await? {
            Reply::Manifest(m) => {
                m.validate()
                    .map_err(|e| SourceError::Protocol(e.to_string()))?;
                Ok(m)
            }
            Reply::Data(_) => Err(SourceError::Protocol(
                "data where a manifest was due".into(),
            )),
        }
    }

    async fn read_range(&self, offset: u64, len: u64) -> Result<Bytes, SourceError> {
        let req = Request::Read {
            model: self.model.clone(),
            offset,
            len,
        };
        match self.call(req).await? {
            Reply::Data(b) if b.len() as u64 == len => Ok(b),
            Reply::Data(b) => Err(SourceError::Short {
                offset,
                asked: len,
                got: b.len() as u64,
            }),
            Reply::Manifest(_) => Err(SourceError::Protocol(
                "a manifest where data was due".into(),
            )),
        }
    }

    /// Sends `req` on the next stream (opening it if needed) and waits for its reply. A stream that
    /// broke under the request (its connection closed: two nodes may hold two connections and one may
    /// close as idle) is replaced by a fresh one and the request sent once more; a peer that is really
    /// gone fails the second time, when no stream opens.
    async fn call(&self, req: Request) -> Result<Reply, SourceError> {
        let slot = &self.conns[self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len()];
        match self.call_on(slot, req.clone()).await {
            Err(SourceError::Io(e)) => {
                tracing::debug!(peer = %self.peer, "blob stream broke ({e}): opening another");
                self.call_on(slot, req).await
            }
            Err(SourceError::Closed) => self.call_on(slot, req).await,
            other => other,
        }
    }

    async fn call_on(
        &self,
        slot: &tokio::sync::Mutex<Option<Arc<Conn>>>,
        req: Request,
    ) -> Result<Reply, SourceError> {
        let conn = {
            let mut slot = slot.lock().await;
            match slot.as_ref() {
                Some(c) if !c.tx.is_closed() => c.clone(),
                _ => {
                    let c = Arc::new(self.open().await?);
                    *slot = Some(c.clone());
                    c
                }
            }
        };
        let (tx, rx) = oneshot::channel();
        let result = match conn.tx.send((req, tx)).await {
            Ok(()) => rx.await.map_err(|_| SourceError::Closed).and_then(|r| r),
            Err(_) => Err(SourceError::Closed),
        };
        if matches!(result, Err(SourceError::Io(_) | SourceError::Closed)) {
            // This stream cannot carry more requests: the next call opens another.
            let mut slot = slot.lock().await;
            if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, &conn)) {
                *slot = None;
            }
        }
        result
    }

    async fn open(&self) -> Result<Conn, SourceError> {
        let stream = self
            .control
            .clone()
            .open_stream(self.peer, BLOB_PROTOCOL)
            .await
            .map_err(|e| SourceError::Open {
                peer: self.peer.to_string(),
                message: e.to_string(),
            })?;
        Ok(Conn::spawn(stream))
    }
}

impl Conn {
    fn spawn<S>(stream: S) -> Self
    where
        S: futures::AsyncRead + futures::AsyncWrite + Unpin + Send + 'static,
    {
        let (mut r, mut w) = stream.split();
        let (tx, mut rx) = mpsc::channel::<Job>(REQUEST_QUEUE);
        // Reply slots in request order; as deep as the request queue plus what is being written.
        let (pending_tx, mut pending_rx) =
            mpsc::channel::<(bool, oneshot::Sender<Result<Reply, SourceError>>)>(REQUEST_QUEUE);
        tokio::spawn(async move {
            while let Some((req, reply)) = rx.recv().await {
                let is_read = matches!(req, Request::Read { .. });
                if let Err(e) = write_message(&mut w, &req).await {
                    let _ = reply.send(Err(e));
                    break;
                }
                if rx.is_empty()
                    && let Err(e) = w.flush().await
                {
                    let _ = reply.send(Err(e.into()));
                    break;
                }
                if pending_tx.send((is_read, reply)).await.is_err() {
                    break;
                }
            }
            let _ = w.close().await;
        });
        tokio::spawn(async move {
            while let Some((is_read, reply)) = pending_rx.recv().await {
                let result = read_reply(&mut r, is_read).await;
                let broken = matches!(result, Err(SourceError::Io(_) | SourceError::Protocol(_)));
                let _ = reply.send(result);
                if broken {
                    // Later replies cannot be framed any more: fail them (dropping their slots).
                    pending_rx.close();
                    while pending_rx.recv().await.is_some() {}
                    return;
                }
            }
        });
        Self { tx }
    }
}

/// Reads one reply: a header and, for data, its bytes.
async fn read_reply<R: futures::AsyncRead + Unpin>(
    r: &mut R,
    is_read: bool,
) -> Result<Reply, SourceError> {
    let resp = read_message::<_, Response>(r, MAX_RESPONSE_LEN)
        .await?
        .ok_or(SourceError::Closed)?;
    match resp {
        Response::Data { len } if is_read && len <= MAX_READ_LEN => {
            let mut buf = BytesMut::zeroed(len as usize);
            r.read_exact(&mut buf).await?;
            Ok(Reply::Data(buf.freeze()))
        }
        Response::Data { len } => Err(SourceError::Protocol(format!(
            "{len} bytes of data where they were not due"
        ))),
        Response::Manifest(m) if !is_read => Ok(Reply::Manifest(m)),
        Response::Manifest(_) => Err(SourceError::Protocol(
            "a manifest where data was due".into(),
        )),
        Response::Error { kind, message } => Err(SourceError::Remote {
            kind: format!("{kind:?}"),
            message,
        }),
    }
}

impl ChunkSource for PeerSource {
    fn read(&self, offset: u64, len: u64) -> BoxFuture<'_, Result<Bytes, SourceError>> {
        Box::pin(self.read_range(offset, len))
    }

    fn name(&self) -> String {
        format!("peer {}", self.peer)
    }
}
