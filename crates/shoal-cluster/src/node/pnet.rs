//! The private network under noise, with more than one key: libp2p's pnet protocol (each side sends a
//! 24-byte nonce, then everything is XSalsa20 under the key with the sender's nonce), except that a
//! listener accepts any key of the [`KeyRing`](crate::keyring::KeyRing), not only the current one.
//!
//! A dialer always uses the current key. A listener reads the dialer's first 20 bytes — which are
//! always multistream-select's header, `\x13/multistream/1.0.0\n` — and tries each key of the ring on
//! them; the one that decrypts them is the connection's key. A connection made with an earlier key is
//! recorded ([`SharedKeys::take_stale`]): the network task admits it only from a known member, and
//! hands that member the current key (see `keys`). No key decrypts them: the connection is refused
//! before noise, as libp2p's pnet refuses a wrong key.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll, ready};

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::Multiaddr;
use libp2p::core::ConnectedPoint;
use salsa20::XSalsa20;
use salsa20::cipher::{KeyIvInit, StreamCipher};

use crate::keyring::KeyRing;

const NONCE: usize = 24;
/// What every dialer sends first through the private network (multistream-select's header).
const HEADER: &[u8; 20] = b"\x13/multistream/1.0.0\n";
/// Encrypted bytes taken from one write at most.
const WRITE_CHUNK: usize = 64 << 10;
/// Stale connections remembered between the handshake and the network task's look-up, at most.
const STALE_MAX: usize = 1024;

/// The key ring shared by the transport, the network task and the handle, and the connections made
/// with an earlier key.
#[derive(Clone)]
pub(crate) struct SharedKeys {
    pub(crate) ring: Arc<RwLock<KeyRing>>,
    stale: Arc<Mutex<HashMap<Multiaddr, u64>>>,
}

impl SharedKeys {
    pub(crate) fn new(ring: KeyRing) -> Self {
        Self {
            ring: Arc::new(RwLock::new(ring)),
            stale: Arc::default(),
        }
    }

    /// The current key's epoch and private-network key, then the earlier ones.
    fn psks(&self) -> Vec<(u64, [u8; 32])> {
        let ring = self.ring.read().unwrap_or_else(|e| e.into_inner());
        ring.keys()
            .map(|k| (k.epoch, crate::identity::cluster_psk_bytes(&k.key)))
            .collect()
    }

    /// The epoch of the earlier key the connection from `send_back_addr` was made with (`None`: made
    /// with the current key).
    pub(crate) fn take_stale(&self, send_back_addr: &Multiaddr) -> Option<u64> {
        self.stale.lock().ok()?.remove(send_back_addr)
    }

    fn mark_stale(&self, send_back_addr: Multiaddr, epoch: u64) {
        if let Ok(mut m) = self.stale.lock() {
            if m.len() >= STALE_MAX {
                m.clear();
            }
            m.insert(send_back_addr, epoch);
        }
    }
}

/// Runs the handshake on a new TCP connection (see the module doc).
pub(super) async fn handshake<S>(
    mut socket: S,
    endpoint: ConnectedPoint,
    keys: SharedKeys,
) -> io::Result<Pnet<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let local = crate::invite::random_bytes::<NONCE>();
    socket.write_all(&local).await?;
    socket.flush().await?;
    let mut remote = [0u8; NONCE];
    socket.read_exact(&mut remote).await?;
    let candidates = keys.psks();
    let send_back_addr = match endpoint {
        ConnectedPoint::Dialer { .. } => {
            let (_, psk) = candidates[0];
            return Ok(Pnet::new(socket, &psk, &local, &remote, Vec::new()));
        }
        ConnectedPoint::Listener { send_back_addr, .. } => send_back_addr,
    };
    let mut first = [0u8; HEADER.len()];
    socket.read_exact(&mut first).await?;
    for (i, (epoch, psk)) in candidates.iter().enumerate() {
        let mut read = XSalsa20::new(&(*psk).into(), &remote.into());
        let mut plain = first;
        read.apply_keystream(&mut plain);
        if &plain == HEADER {
            if i > 0 {
                keys.mark_stale(send_back_addr, *epoch);
            }
            return Ok(Pnet {
                inner: socket,
                read,
                write: XSalsa20::new(&(*psk).into(), &local.into()),
                replay: plain.to_vec(),
                out: Vec::new(),
                out_at: 0,
            });
        }
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        "the peer does not hold this cluster's key",
    ))
}

/// A connection encrypted by the private network.
pub(super) struct Pnet<S> {
    inner: S,
    read: XSalsa20,
    write: XSalsa20,
    /// Decrypted bytes read during the handshake, handed out first.
    replay: Vec<u8>,
    /// Encrypted bytes not yet written, from `out_at` on.
    out: Vec<u8>,
    out_at: usize,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Pnet<S> {
    fn new(inner: S, psk: &[u8; 32], local: &[u8; 24], remote: &[u8; 24], replay: Vec<u8>) -> Self {
        Self {
            inner,
            read: XSalsa20::new(&(*psk).into(), &(*remote).into()),
            write: XSalsa20::new(&(*psk).into(), &(*local).into()),
            replay,
            out: Vec::new(),
            out_at: 0,
        }
    }

    /// Writes the encrypted bytes still waiting.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.out_at < self.out.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out[self.out_at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out_at += n;
        }
        self.out.clear();
        self.out_at = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Pnet<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if !this.replay.is_empty() {
            let n = buf.len().min(this.replay.len());
            buf[..n].copy_from_slice(&this.replay[..n]);
            this.replay.drain(..n);
            return Poll::Ready(Ok(n));
        }
        let n = ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        this.read.apply_keystream(&mut buf[..n]);
        Poll::Ready(Ok(n))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Pnet<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        let n = buf.len().min(WRITE_CHUNK);
        this.out.extend_from_slice(&buf[..n]);
        this.write.apply_keystream(&mut this.out);
        // Start writing now; what the socket does not take yet goes with the next write or flush.
        if let Poll::Ready(Err(e)) = this.drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_close(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyring::KeyRing;

    fn addr(port: u16) -> Multiaddr {
        format!("/ip4/127.0.0.1/tcp/{port}").parse().unwrap()
    }

    fn listener() -> ConnectedPoint {
        ConnectedPoint::Listener {
            local_addr: addr(1),
            send_back_addr: addr(2),
        }
    }

    fn dialer() -> ConnectedPoint {
        ConnectedPoint::Dialer {
            address: addr(1),
            role_override: libp2p::core::Endpoint::Dialer,
            port_use: libp2p::core::transport::PortUse::New,
        }
    }

    /// Connects a dialer holding `dial` to a listener holding `listen`, sends the header and a
    /// message both ways; the listener's result.
    async fn pair(dial: &SharedKeys, listen: &SharedKeys) -> io::Result<Vec<u8>> {
        let (a, b) = tokio::io::duplex(1 << 16);
        use tokio_util::compat::TokioAsyncReadCompatExt;
        let (a, b) = (a.compat(), b.compat());
        let d = async {
            let mut s = handshake(a, dialer(), dial.clone()).await?;
            s.write_all(HEADER).await?;
            s.write_all(b"hello").await?;
            s.flush().await?;
            let mut back = [0u8; 2];
            s.read_exact(&mut back).await?;
            assert_eq!(&back, b"ok");
            io::Result::Ok(())
        };
        let l = async {
            let mut s = handshake(b, listener(), listen.clone()).await?;
            let mut got = vec![0u8; HEADER.len() + 5];
            s.read_exact(&mut got).await?;
            s.write_all(b"ok").await?;
            s.flush().await?;
            io::Result::Ok(got)
        };
        let (d, l) = tokio::join!(d, l);
        let got = l?;
        d?;
        Ok(got)
    }

    #[tokio::test]
    async fn a_listener_takes_the_current_key_and_earlier_ones_and_records_which() {
        let (da, db, dc) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let old = SharedKeys::new(KeyRing::load(da.path(), "k0"));
        let mut ring = KeyRing::load(db.path(), "k0");
        ring.rotate(&["x".parse().unwrap()]).unwrap();
        let rotated = SharedKeys::new(ring);
        let stranger = SharedKeys::new(KeyRing::load(dc.path(), "other"));

        let got = pair(&rotated, &rotated).await.unwrap();
        assert_eq!(&got[..HEADER.len()], HEADER);
        assert_eq!(&got[HEADER.len()..], b"hello");
        assert_eq!(rotated.take_stale(&addr(2)), None, "current key");

        pair(&old, &rotated).await.unwrap();
        assert_eq!(
            rotated.take_stale(&addr(2)),
            Some(0),
            "made with epoch 0's key"
        );

        let err = pair(&stranger, &rotated).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(
            pair(&rotated, &old).await.is_err(),
            "a node with only the old key does not take the new one"
        );
    }
}
