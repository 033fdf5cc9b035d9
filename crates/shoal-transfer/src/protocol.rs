//! The blob protocol, `/shoal/blob/1`, on the cluster's libp2p connections (encrypted and authenticated
//! like the rest of the cluster's traffic).
//!
//! A stream carries requests in sequence and their responses in the same order, so a client can pipeline
//! several. Each message is a little-endian `u32` length and that many bytes of JSON ([`Request`] or
//! [`Response`]); a [`Response::Data`] is followed by exactly `len` raw bytes. Sizes are bounded
//! ([`MAX_REQUEST_LEN`], [`MAX_RESPONSE_LEN`], [`MAX_READ_LEN`]); a malformed or oversized request closes
//! the stream (logged), never panics.
//!
//! Server: [`serve_blobs`] accepts blob streams and answers for complete files only (`locate` maps a
//! model id to its file; a `.partial`/`.incomplete` name is refused). Per stream a reader task parses
//! requests and starts each one's work (file reads and manifest hashing on the blocking pool); a writer
//! task writes the results in order, so reading chunk `k + 1` from disk overlaps sending chunk `k`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, FutureExt, StreamExt};
use libp2p::StreamProtocol;
use serde::{Deserialize, Serialize};
use shoal_cluster::ClusterHandle;
use tokio::sync::mpsc;

use crate::error::{SourceError, TransferError};
use crate::limit::UploadLimit;
use crate::manifest::Manifest;

pub const BLOB_PROTOCOL: StreamProtocol = StreamProtocol::new("/shoal/blob/1");
/// The longest request header (a model id and two numbers).
pub const MAX_REQUEST_LEN: u32 = 16 << 10;
/// The longest response header: a manifest of a 1 TiB file in 4 MiB chunks is about 17 MiB of JSON.
pub const MAX_RESPONSE_LEN: u32 = 32 << 20;
/// The most bytes one read may ask for: one chunk of the largest size a manifest may declare.
pub const MAX_READ_LEN: u64 = crate::manifest::MAX_CHUNK_SIZE;
/// Requests of one stream being worked on or written: enough to keep the disk and the link busy at
/// once (the client's pipeline depth is what fills the link); bounds the memory a peer can tie up.
const SERVER_QUEUE: usize = 4;

/// What a client asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    Manifest {
        model: String,
    },
    Read {
        model: String,
        offset: u64,
        len: u64,
    },
}

/// What the server answers, one per request, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Manifest(Manifest),
    /// `len` raw bytes follow.
    Data {
        len: u64,
    },
    Error {
        kind: ErrorKind,
        message: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// This node has no complete file for the model.
    NotFound,
    /// The range is outside the file or too long.
    BadRange,
    /// Reading or hashing the file failed.
    Io,
}

/// Writes one length-prefixed JSON message.
pub async fn write_message<W: AsyncWrite + Unpin, T: Serialize>(
    w: &mut W,
    msg: &T,
) -> Result<(), SourceError> {
    let json = serde_json::to_vec(msg).map_err(|e| SourceError::Protocol(e.to_string()))?;
    let len =
        u32::try_from(json.len()).map_err(|_| SourceError::Protocol("message too long".into()))?;
    w.write_all(&len.to_le_bytes()).await?;
    w.write_all(&json).await?;
    Ok(())
}

/// Reads one length-prefixed JSON message of at most `max` bytes; `Ok(None)` at a clean end of stream.
pub async fn read_message<R: AsyncRead + Unpin, T: for<'de> Deserialize<'de>>(
    r: &mut R,
    max: u32,
) -> Result<Option<T>, SourceError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(len);
    if len > max {
        return Err(SourceError::Protocol(format!(
            "a message of {len} bytes (at most {max})"
        )));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf).await?;
    serde_json::from_slice(&buf)
        .map(Some)
        .map_err(|e| SourceError::Protocol(format!("malformed message: {e}")))
}

/// Maps a model id to its complete file on this node (`None`: not here).
pub type Locate = Arc<dyn Fn(&str) -> Option<PathBuf> + Send + Sync>;

/// Accepts `/shoal/blob/1` streams on `cluster` and answers them in the background, for the life of the
/// runtime, sending at most `upload_limit` bytes per second in all (`None`: no limit). Call once per node.
pub fn serve_blobs(
    cluster: &ClusterHandle,
    locate: Locate,
    upload_limit: Option<u64>,
) -> Result<(), TransferError> {
    let mut control = cluster.streams();
    let mut incoming = control
        .accept(BLOB_PROTOCOL)
        .map_err(|e| TransferError::Accept(e.to_string()))?;
    let server = Arc::new(Server {
        locate,
        manifests: Mutex::new(HashMap::new()),
        hashing: tokio::sync::Mutex::new(()),
        limit: upload_limit.map(|b| Arc::new(UploadLimit::new(b))),
    });
    tokio::spawn(async move {
        while let Some((peer, stream)) = incoming.next().await {
            tokio::spawn(serve_stream(server.clone(), peer.to_string(), stream));
        }
    });
    Ok(())
}

/// The server's state shared by its streams.
struct Server {
    locate: Locate,
    /// Manifests by file, with the size and mtime they were made for.
    manifests: Mutex<HashMap<PathBuf, Stamped>>,
    /// One manifest is computed at a time (the first request for a big file hashes it once, not once per
    /// stream that asks).
    hashing: tokio::sync::Mutex<()>,
    /// Paces the data sent by all streams together.
    limit: Option<Arc<UploadLimit>>,
}

/// A manifest with the file size and modification time it was made for.
type Stamped = (u64, SystemTime, Arc<Manifest>);

/// An answer being prepared: the header and, for data, its bytes.
type Answer = BoxFuture<'static, (Response, Option<Bytes>)>;

/// Serves one stream: requests in order, answers in order.
async fn serve_stream<S>(server: Arc<Server>, peer: String, stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut r, mut w) = stream.split();
    let (tx, mut rx) = mpsc::channel::<Answer>(SERVER_QUEUE);
    let limit = server.limit.clone();
    let writer = tokio::spawn(async move {
        while let Some(answer) = rx.recv().await {
            let (header, body) = answer.await;
            if let (Some(limit), Some(b)) = (&limit, &body) {
                limit.take(b.len() as u64).await;
            }
            if write_message(&mut w, &header).await.is_err() {
                return;
            }
            if let Some(b) = body {
                if w.write_all(&b).await.is_err() {
                    return;
                }
                metrics::counter!("shoal_blob_served_bytes_total").increment(b.len() as u64);
            }
            // Flush only when nothing else is ready: fewer, larger writes.
            if rx.is_empty() && w.flush().await.is_err() {
                return;
            }
        }
        let _ = w.close().await;
    });
    loop {
        let req = match read_message::<_, Request>(&mut r, MAX_REQUEST_LEN).await {
            Ok(Some(req)) => req,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(%peer, kind = e.error_type(), "blob stream closed: {e}");
                break;
            }
        };
        if tx.send(server.clone().answer(req)).await.is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

fn error(kind: ErrorKind, message: impl Into<String>) -> (Response, Option<Bytes>) {
    (
        Response::Error {
            kind,
            message: message.into(),
        },
        None,
    )
}

impl Server {
    /// The complete file of `model` on this node.
    fn file(&self, model: &str) -> Option<PathBuf> {
        let path = (self.locate)(model)?;
        let name = path.file_name()?.to_string_lossy();
        let partial = name.ends_with(".partial") || name.ends_with(".incomplete");
        (!partial && path.is_file()).then_some(path)
    }

    /// Starts the work of one request; the future gives its answer.
    fn answer(self: Arc<Self>, req: Request) -> Answer {
        match req {
            Request::Manifest { model } => async move {
                let Some(path) = self.file(&model) else {
                    return error(ErrorKind::NotFound, format!("no complete file for {model}"));
                };
                match self.manifest(&path).await {
                    Ok(m) => (Response::Manifest((*m).clone()), None),
                    Err(e) => error(ErrorKind::Io, e.to_string()),
                }
            }
            .boxed(),
            Request::Read { model, offset, len } => {
                let path = self.file(&model);
                // Start the disk read now: it overlaps the writing of earlier answers.
                let read = path
                    .clone()
                    .map(|p| tokio::task::spawn_blocking(move || read_range(&p, offset, len)));
                async move {
                    let (Some(_), Some(read)) = (path, read) else {
                        return error(ErrorKind::NotFound, format!("no complete file for {model}"));
                    };
                    match read.await {
                        Ok(Ok(bytes)) => (
                            Response::Data {
                                len: bytes.len() as u64,
                            },
                            Some(bytes),
                        ),
                        Ok(Err(e)) => e,
                        Err(e) => error(ErrorKind::Io, e.to_string()),
                    }
                }
                .boxed()
            }
        }
    }

    /// The manifest of a complete file: from memory while its size and mtime hold, else from its sidecar
    /// or hashed (on the blocking pool).
    async fn manifest(&self, path: &Path) -> Result<Arc<Manifest>, TransferError> {
        let _one_at_a_time = self.hashing.lock().await;
        let meta = std::fs::metadata(path).map_err(TransferError::io(path))?;
        let mtime = meta.modified().map_err(TransferError::io(path))?;
        if let Ok(map) = self.manifests.lock()
            && let Some((size, t, m)) = map.get(path)
            && (*size, *t) == (meta.len(), mtime)
        {
            return Ok(m.clone());
        }
        let p = path.to_path_buf();
        let m = tokio::task::spawn_blocking(move || Manifest::load_or_compute(&p))
            .await
            .map_err(|e| TransferError::Task(e.to_string()))??;
        let m = Arc::new(m);
        if let Ok(mut map) = self.manifests.lock() {
            map.insert(path.to_path_buf(), (meta.len(), mtime, m.clone()));
        }
        Ok(m)
    }
}

/// Reads `len` bytes at `offset` of `path`, or the error answer.
fn read_range(path: &Path, offset: u64, len: u64) -> Result<Bytes, (Response, Option<Bytes>)> {
    use std::os::unix::fs::FileExt;
    if len == 0 || len > MAX_READ_LEN {
        return Err(error(
            ErrorKind::BadRange,
            format!("{len} bytes (1 to {MAX_READ_LEN} per read)"),
        ));
    }
    let file = std::fs::File::open(path).map_err(|e| error(ErrorKind::Io, e.to_string()))?;
    let size = file
        .metadata()
        .map_err(|e| error(ErrorKind::Io, e.to_string()))?
        .len();
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(error(
            ErrorKind::BadRange,
            format!("{len} bytes at {offset} run past the file's {size} bytes"),
        ));
    }
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, offset)
        .map_err(|e| error(ErrorKind::Io, e.to_string()))?;
    Ok(Bytes::from(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(dir: &Path) -> Arc<Server> {
        let dir = dir.to_path_buf();
        Arc::new(Server {
            locate: Arc::new(move |m: &str| Some(dir.join(m))),
            manifests: Mutex::new(HashMap::new()),
            hashing: tokio::sync::Mutex::new(()),
            limit: None,
        })
    }

    /// Runs the server on one end of an in-memory pipe; the client end.
    fn pipe(server: Arc<Server>) -> tokio_util::compat::Compat<tokio::io::DuplexStream> {
        use tokio_util::compat::TokioAsyncReadCompatExt;
        let (a, b) = tokio::io::duplex(1 << 20);
        tokio::spawn(serve_stream(server, "test".into(), b.compat()));
        a.compat()
    }

    #[tokio::test]
    async fn pipelined_requests_are_answered_in_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("m.gguf"), b"0123456789").unwrap();
        std::fs::write(dir.path().join("x.partial"), b"0123456789").unwrap();
        let mut c = pipe(server(dir.path()));
        let model = "m.gguf".to_string();
        let reqs = [
            Request::Read {
                model: model.clone(),
                offset: 2,
                len: 3,
            },
            Request::Manifest {
                model: model.clone(),
            },
            Request::Read {
                model: model.clone(),
                offset: 8,
                len: 3,
            },
            Request::Read {
                model: "x.partial".into(),
                offset: 0,
                len: 1,
            },
            Request::Read {
                model,
                offset: 9,
                len: 1,
            },
        ];
        for r in &reqs {
            write_message(&mut c, r).await.unwrap();
        }
        assert_eq!(
            read_message::<_, Response>(&mut c, MAX_RESPONSE_LEN)
                .await
                .unwrap()
                .unwrap(),
            Response::Data { len: 3 }
        );
        let mut body = [0u8; 3];
        c.read_exact(&mut body).await.unwrap();
        assert_eq!(&body, b"234");
        let Response::Manifest(m) = read_message::<_, Response>(&mut c, MAX_RESPONSE_LEN)
            .await
            .unwrap()
            .unwrap()
        else {
            panic!("expected a manifest")
        };
        assert_eq!((m.size, m.file_name.as_str()), (10, "m.gguf"));
        for expected in [ErrorKind::BadRange, ErrorKind::NotFound] {
            match read_message::<_, Response>(&mut c, MAX_RESPONSE_LEN)
                .await
                .unwrap()
                .unwrap()
            {
                Response::Error { kind, .. } => assert_eq!(kind, expected),
                other => panic!("expected an error, got {other:?}"),
            }
        }
        assert_eq!(
            read_message::<_, Response>(&mut c, MAX_RESPONSE_LEN)
                .await
                .unwrap()
                .unwrap(),
            Response::Data { len: 1 }
        );
    }

    #[tokio::test]
    async fn a_malformed_or_oversized_request_closes_the_stream() {
        let dir = tempfile::tempdir().unwrap();
        for bad in [
            [5u32.to_le_bytes().to_vec(), b"{nope".to_vec()].concat(),
            (MAX_REQUEST_LEN + 1).to_le_bytes().to_vec(),
        ] {
            let mut c = pipe(server(dir.path()));
            c.write_all(&bad).await.unwrap();
            c.flush().await.unwrap();
            let mut buf = [0u8; 16];
            assert_eq!(
                c.read(&mut buf).await.unwrap(),
                0,
                "the server should close the stream"
            );
        }
    }
}
