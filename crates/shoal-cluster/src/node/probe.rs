//! Link bandwidth probes: the sender streams a few MiB, the receiver answers how long they took.

use std::time::Instant;

use futures::{AsyncReadExt, AsyncWriteExt, StreamExt};
use libp2p::PeerId;

use super::{NetTask, PROBE_BYTES, PROBE_PROTOCOL, PROBE_TIMEOUT};
use crate::ClusterError;

impl NetTask {
    /// Measures the bandwidth to `peer` in the background; the result comes back to the task's loop.
    pub(super) fn spawn_probe(&self, peer: PeerId) {
        let tx = self.probe_tx.clone();
        let control = self.streams.clone();
        tokio::spawn(async move {
            let _ = tx.send((peer, probe(control, peer).await)).await;
        });
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

/// Sender side: bytes per second to `peer`, or `None` if the probe failed.
async fn probe(mut control: libp2p_stream::Control, peer: PeerId) -> Option<f64> {
    let work = async {
        let mut stream = control.open_stream(peer, PROBE_PROTOCOL).await.ok()?;
        let chunk = vec![0x5Au8; 64 << 10];
        let mut sent = 0;
        while sent < PROBE_BYTES {
            stream.write_all(&chunk).await.ok()?;
            sent += chunk.len();
        }
        stream.flush().await.ok()?;
        let mut us = [0u8; 8];
        stream.read_exact(&mut us).await.ok()?;
        let us = u64::from_le_bytes(us).max(1);
        Some(sent as f64 / (us as f64 / 1e6))
    };
    tokio::time::timeout(PROBE_TIMEOUT, work)
        .await
        .ok()
        .flatten()
}
