//! Paths for the data plane: streams open on the preferred path to a peer (`shoal_cluster::Paths`),
//! the watches that report a path in use closing or a pipeline's node leaving the cluster, and [`Replay`], what the driver keeps so a cut path
//! costs no request.
//!
//! The driver's [`RemoteChain`](super::RemoteChain) keeps every frame it sent since the oldest batch
//! whose tokens have not come back (batches and KV releases). When the path under its streams is cut,
//! it opens new streams on the path left and sends them again — after KV operations that take each
//! sequence back to where its oldest unanswered batch started (a stage may or may not have applied
//! that batch; with the same cache length and the same sampling job it computes the same tokens).
//! Tokens of a batch already answered that arrive again are dropped by the chain. The stages keep
//! their KV across upstream streams (`host.rs`), so the new stream carries on where the old one left.
//! KV operations still unconfirmed go again too, in their order: a stage applies each so that twice is
//! the same as once (`host.rs` `apply_prefix`: a prefix already kept, a sequence already started or
//! forked, is left as it is; releases and drops of what is gone do nothing). A sequence released
//! after its unanswered batch may already be gone from a stage: there the rewind leaves a placeholder
//! of blank KV, so the batch computes again for its other sequences; the placeholder's token goes to
//! a request that is over, and its KV is never kept (`LocalStage::rewind`).

use shoal_ids::{InstanceId, NodeId};
use std::collections::VecDeque;
use std::sync::Arc;

use libp2p::PeerId;
use shoal_cluster::{ClusterHandle, PathBook, PathId, PathStream};
use shoal_engine::stage::KvOp;
use tokio::sync::{mpsc, oneshot, watch};

use super::{Alarm, STAGE_PROTOCOL, encode, kv_frame, rewind_frame};
use crate::error::PipelineError;

/// Opens a data-plane stream for `instance` to `peer` on its preferred path (`what` names it in the
/// error).
pub(super) async fn open_on_path(
    cluster: &ClusterHandle,
    peer: PeerId,
    instance: &InstanceId,
    what: &'static str,
) -> Result<PathStream, PipelineError> {
    cluster
        .paths()
        .open(peer, STAGE_PROTOCOL, instance)
        .await
        .map_err(|source| PipelineError::OpenPath { what, peer, source })
}

/// What a path watch reacts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Watch {
    /// A path in use closing only: the driver moves to a newly preferred path itself, between steps.
    Cuts,
    /// Also the peer's preferred path running over another address than the one in use (a better
    /// network path, or this one degraded): a stage's stream to the next stage, which only moves when
    /// the pipeline opens again.
    CutsAndMoves,
}

/// Rings `events` with [`PipelineError::PathLost`] as soon as a path in `used` is no live connection
/// any more, or when a relay's `writer` task ended (the stream broke; a lane's writer is the engine
/// thread, which sees a broken write itself), and with [`Watch::CutsAndMoves`] with
/// [`PipelineError::PathMoved`] once a peer's preferred path runs over another address; ends then,
/// when `stop` fires, or when the path feed closes.
pub(super) fn watch_paths(
    mut book: watch::Receiver<Arc<PathBook>>,
    used: Vec<(PeerId, PathId)>,
    writer: Option<mpsc::Sender<Vec<u8>>>,
    events: Alarm,
    watch: Watch,
    mut stop: oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let lost = loop {
            let (gone, moved) = {
                let b = book.borrow_and_update();
                let gone = used
                    .iter()
                    .find(|(peer, path)| !b.is_alive(peer, path.connection))
                    .map(|(peer, _)| *peer);
                let moved = used
                    .iter()
                    .filter(|_| watch == Watch::CutsAndMoves)
                    .find(|(peer, path)| off_preferred(&b, peer, path, true))
                    .map(|(peer, _)| *peer);
                (gone, moved)
            };
            if let Some(peer) = gone {
                break PipelineError::PathLost { peer };
            }
            if let Some(peer) = moved {
                break PipelineError::PathMoved { peer };
            }
            let writer_closed = async {
                match &writer {
                    Some(w) => w.closed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut stop => return,
                _ = writer_closed => break PipelineError::PathLost {
                    peer: used.first().map_or(PeerId::random(), |u| u.0),
                },
                changed = book.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        };
        // The writer's sender goes before the event: a switch must not wait on it.
        drop(writer);
        if let PipelineError::PathMoved { peer } = &lost {
            tracing::info!(%peer, "the stream to the next stage ends: its node prefers a path over another address");
        }
        events.ring(lost).await;
    })
}

/// Whether `peer`'s preferred path in `book` is not `used`; with `other_address`, only one over another
/// address than `used` (another connection over the same address is the same network path: nothing to
/// gain by moving, no way around a stall).
pub(super) fn off_preferred(
    book: &PathBook,
    peer: &PeerId,
    used: &PathId,
    other_address: bool,
) -> bool {
    book.preferred(peer)
        .is_some_and(|p| p.connection != used.connection && (!other_address || p.addr != used.addr))
}

/// One frame group sent down the pipeline and not yet confirmed by the tokens of a later batch.
#[derive(Debug, Clone)]
enum Logged {
    /// A batch: its encoded frames (sampling jobs, activations) and where each of its chunks started.
    Batch {
        batch_id: u64,
        starts: Vec<(u64, usize)>,
        frames: Vec<Vec<u8>>,
    },
    /// A KV operation (stages apply each one so that twice is the same as once).
    Kv(Vec<u8>),
}

/// What the driver sent since the oldest unanswered batch.
#[derive(Debug, Default)]
pub(super) struct Replay {
    log: VecDeque<Logged>,
}

impl Replay {
    /// A batch was sent: `starts` are its chunks' (sequence, first position), `frames` its bytes.
    pub fn batch(&mut self, batch_id: u64, starts: Vec<(u64, usize)>, frames: Vec<Vec<u8>>) {
        self.log.push_back(Logged::Batch {
            batch_id,
            starts,
            frames,
        });
    }

    /// A KV operation was sent (its encoded frame).
    pub fn kv(&mut self, frame: Vec<u8>) {
        self.log.push_back(Logged::Kv(frame));
    }

    /// The tokens of `batch_id` came back: it and everything sent before it were applied by every
    /// stage.
    pub fn answered(&mut self, batch_id: u64) {
        while let Some(front) = self.log.pop_front() {
            if matches!(front, Logged::Batch { batch_id: b, .. } if b == batch_id) {
                break;
            }
        }
    }

    /// Whether nothing is unconfirmed.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }

    /// The frames to send on new streams after a cut, in order: each sequence of an unanswered batch
    /// taken back to where its first such batch started, then everything logged again.
    pub fn frames(&self) -> Result<Vec<Vec<u8>>, PipelineError> {
        let mut rewind: Vec<(u64, usize)> = Vec::new();
        for entry in &self.log {
            match entry {
                Logged::Batch { starts, .. } => {
                    for &(seq, start) in starts {
                        if !rewind.iter().any(|(s, _)| *s == seq) {
                            rewind.push((seq, start));
                        }
                    }
                }
                Logged::Kv(_) => {}
            }
        }
        let mut out = Vec::new();
        for (seq, start) in rewind {
            // From the start, the batch makes the sequence anew; else every stage cuts it back to
            // where the batch started (or, where it was released since, holds a placeholder).
            out.push(encode(&match start {
                0 => kv_frame(KvOp::Release { seq_id: seq }),
                len => rewind_frame(seq, len),
            })?);
        }
        for entry in &self.log {
            match entry {
                Logged::Batch { frames, .. } => out.extend(frames.iter().cloned()),
                Logged::Kv(f) => out.push(f.clone()),
            }
        }
        Ok(out)
    }
}

/// Watches the cluster membership (`members`) and sends [`PipelineError::NodeLeft`] into `events` as
/// soon as `missing` names a node of the pipeline gone, then ends; it also ends when `stop` fires (the
/// chain is dropped) or the membership feed closes.
pub(super) fn watch_nodes<T: Send + Sync + 'static>(
    mut members: watch::Receiver<T>,
    missing: impl Fn(&T) -> Option<NodeId> + Send + 'static,
    events: Alarm,
    mut stop: oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let gone = missing(&members.borrow_and_update());
            if let Some(node) = gone {
                events.ring(PipelineError::NodeLeft { node }).await;
                return;
            }
            tokio::select! {
                _ = &mut stop => return,
                changed = members.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_wire::{Frame, FrameReader};

    fn decode_all(frames: &[Vec<u8>]) -> Vec<Frame> {
        let mut r = FrameReader::new(shoal_wire::DEFAULT_MAX_FRAME_LEN);
        for f in frames {
            r.push(f);
        }
        let mut out = Vec::new();
        while let Some(f) = r.next_frame().unwrap() {
            out.push(f);
        }
        out
    }

    fn release(seq: u64) -> Vec<u8> {
        encode(&kv_frame(KvOp::Release { seq_id: seq })).unwrap()
    }

    fn ping(n: u64) -> Vec<u8> {
        encode(&Frame::Ping { nonce: n }).unwrap()
    }

    #[test]
    fn unanswered_batches_are_sent_again_after_taking_their_sequences_back() {
        let mut r = Replay::default();
        // Batch 1 answered; 2 (seq 7 from 10, seq 8 new) and 3 (seq 7 from 11) are not.
        r.batch(1, vec![(7, 9)], vec![ping(1)]);
        r.answered(1);
        assert!(r.is_empty());
        r.batch(2, vec![(7, 10), (8, 0)], vec![ping(2)]);
        r.kv(release(5));
        r.batch(3, vec![(7, 11)], vec![ping(3)]);
        let frames = decode_all(&r.frames().unwrap());
        let kinds: Vec<String> = frames
            .iter()
            .map(|f| match f {
                Frame::Prefix(p) => {
                    format!("{:?} {} {} {}", p.action, p.seq_id, p.prefix_id, p.len)
                }
                Frame::Release { seq_ids } => format!("release {seq_ids:?}"),
                Frame::Ping { nonce } => format!("batch {nonce}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "Rewind 7 0 10".to_string(),
                "release [8]".into(),
                "batch 2".into(),
                "release [5]".into(),
                "batch 3".into(),
            ]
        );
        // Batch 2 answered: only what followed it is left.
        r.answered(2);
        assert_eq!(decode_all(&r.frames().unwrap()).len(), 3);
    }

    #[test]
    fn an_unconfirmed_prefix_operation_is_sent_again_in_its_place() {
        let mut r = Replay::default();
        r.batch(4, vec![(1, 3)], vec![ping(4)]);
        let op = KvOp::Retain {
            seq_id: 1,
            prefix_id: 9,
            len: 3,
        };
        r.kv(encode(&kv_frame(op)).unwrap());
        let kinds = |r: &Replay| -> Vec<String> {
            decode_all(&r.frames().unwrap())
                .iter()
                .map(|f| match f {
                    Frame::Prefix(p) => format!("{:?} {} {}", p.action, p.seq_id, p.prefix_id),
                    Frame::Ping { nonce } => format!("batch {nonce}"),
                    other => format!("{other:?}"),
                })
                .collect()
        };
        assert_eq!(
            kinds(&r),
            [
                "Rewind 1 0".to_string(),
                "batch 4".into(),
                "Retain 1 9".into(),
            ]
        );
        // The batch answered: the prefix operation is still unconfirmed, and goes alone.
        r.answered(4);
        assert_eq!(kinds(&r), ["Retain 1 9"]);
        r.batch(5, vec![(2, 0)], vec![ping(5)]);
        r.answered(5);
        assert!(r.frames().unwrap().is_empty());
    }
}
