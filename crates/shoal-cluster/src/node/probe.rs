//! Bandwidth probes, one per path (connection): the sender streams up to a few MiB for at most
//! [`PROBE_SEND_FOR`], then closes its side; the receiver answers how long the bytes took from the first
//! to the last. A new path is probed at once; paths are probed again every few seconds while a peer has
//! paths over two addresses (`paths::REPROBE_EVERY`), with a smaller probe.

use std::time::{Duration, Instant};

use futures::{AsyncReadExt, AsyncWriteExt, StreamExt};
use libp2p::PeerId;
use libp2p::swarm::ConnectionId;

use super::pathstream::PathControl;
use super::{NetTask, PROBE_BYTES, PROBE_PROTOCOL, PROBE_TIMEOUT};
use crate::ClusterError;

/// A probe stops sending after this long (a slow path is measured on fewer bytes).
const PROBE_SEND_FOR: Duration = Duration::from_millis(1000);

impl NetTask {
    /// Probes every path of `peer` again, soon (at the next liveness tick).
    pub(super) fn spawn_probe(&mut self, peer: PeerId) {
        self.peers.reprobe(&peer);
    }

    /// Starts the probes of the paths due for one; each result comes back to the task's loop.
    pub(super) fn probe_due(&mut self) {
        for (peer, connection, bytes) in self.peers.due_for_probe(Instant::now()) {
            let tx = self.probe_tx.clone();
            let control = self.paths.clone();
            tokio::spawn(async move {
                let bps = probe(control, peer, connection, bytes).await;
                let _ = tx.send((peer, connection, bps)).await;
            });
        }
    }
}

/// Answers the bandwidth probes of other nodes (in the background, for the life of the runtime).
pub(super) fn serve(control: &mut libp2p_stream::Control) -> Result<(), ClusterError> {
    let incoming = control
        .accept(PROBE_PROTOCOL)
        .map_err(|e| ClusterError::network("accepting bandwidth probes", &e))?;
    tokio::spawn(answer_probes(incoming));
    Ok(())
}

/// Receiver side of a bandwidth probe: counts bytes until the sender closes, answers the microseconds
/// from the first to the last byte.
async fn answer_probes(mut incoming: libp2p_stream::IncomingStreams) {
    while let Some((_peer, mut stream)) = incoming.next().await {
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 << 10];
            let mut first = None;
            let mut total = 0usize;
            let work = async {
                loop {
                    let n = stream.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    first.get_or_insert_with(Instant::now);
                    total += n;
                    if total >= PROBE_BYTES {
                        break;
                    }
                }
                let us = first.map_or(0, |f: Instant| f.elapsed().as_micros() as u64);
                stream.write_all(&us.to_le_bytes()).await?;
                stream.close().await
            };
            let _ = tokio::time::timeout(PROBE_TIMEOUT, work).await;
        });
    }
}

/// Sender side: bytes per second to `peer` on `connection`, or `None` if the probe failed. A probe
/// that did not finish in [`PROBE_TIMEOUT`] reports what it got through by then at most (a path that
/// slow is measured as that slow, not as unknown).
async fn probe(
    control: PathControl,
    peer: PeerId,
    connection: ConnectionId,
    bytes: usize,
) -> Option<f64> {
    let start = Instant::now();
    let sent = std::sync::atomic::AtomicUsize::new(0);
    let work = async {
        let mut stream = control
            .open_on(peer, connection, PROBE_PROTOCOL)
            .await
            .ok()?;
        let chunk = vec![0x5Au8; 64 << 10];
        let sending = Instant::now();
        while sent.load(std::sync::atomic::Ordering::Relaxed) < bytes.min(PROBE_BYTES)
            && sending.elapsed() < PROBE_SEND_FOR
        {
            stream.write_all(&chunk).await.ok()?;
            sent.fetch_add(chunk.len(), std::sync::atomic::Ordering::Relaxed);
        }
        stream.flush().await.ok()?;
        // The receiver answers at the end of the stream (or after PROBE_BYTES).
        stream.close().await.ok()?;
        let mut us = [0u8; 8];
        stream.read_exact(&mut us).await.ok()?;
        let us = u64::from_le_bytes(us).max(1);
        let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
        Some(sent as f64 / (us as f64 / 1e6))
    };
    match tokio::time::timeout(PROBE_TIMEOUT, work).await {
        Ok(bps) => bps,
        Err(_) => {
            let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
            (sent > 0).then(|| sent as f64 / start.elapsed().as_secs_f64())
        }
    }
}
