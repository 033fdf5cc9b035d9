//! [`RemoteChain`]: the driver's view of the stages on other nodes.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::Instant;

use futures::AsyncReadExt;
use libp2p::PeerId;
use shoal_engine::error::EngineError;
use shoal_engine::stage::{
    ChunkSpec, KvOp, Launched, Pick, SampleRef, Stage, StageData, StageInfo,
};
use shoal_wire::{
    Activations, ChunkHeader, DType, Frame, Handshake, PrefixAction, PrefixOp, Role, TokenItem,
};
use tokio::sync::mpsc;

use shoal_cluster::{ClusterHandle, Snapshot};

use crate::error::PipelineError;

use super::{
    BATCH_TIMEOUT, Inbound, LIVENESS_POLL, READ_QUEUE, WRITE_QUEUE, encode, handshake, open_stream,
    spawn_reader, spawn_writer, wire_instance_id, wire_node_id,
};

/// The stages after the driver's own, on other nodes, seen as one [`Stage`].
pub struct RemoteChain {
    down: mpsc::Sender<Vec<u8>>,
    tokens: std_mpsc::Receiver<Inbound>,
    /// Tokens of KV each sequence holds on the remote stages (mirrors what was sent).
    lens: HashMap<u64, usize>,
    next_batch: u64,
    dtype: DType,
    nodes: Vec<String>,
    members: tokio::sync::watch::Receiver<Arc<Snapshot>>,
    broken: Option<String>,
    /// Batches sent and not yet answered, oldest first, with the sequences whose tokens they owe.
    pending: std::collections::VecDeque<(u64, Vec<u64>)>,
    /// Tokens of KV the remote stages have room for (the least of them), when they said.
    kv_capacity: Option<usize>,
    /// Kept so the owner stream stays open as long as the chain lives.
    _owner: mpsc::Sender<Vec<u8>>,
}

impl RemoteChain {
    /// Bounds the KV tokens the engine may hold to what the remote stages reserved.
    pub fn with_kv_capacity(mut self, tokens: Option<usize>) -> Self {
        self.kv_capacity = tokens;
        self
    }

    /// Connects the driver (`stage 0`, this node) to `nodes` (stages 1.., in order) of `instance`.
    pub async fn connect(
        cluster: &ClusterHandle,
        instance: &str,
        layers: &[(usize, usize)],
        nodes: &[String],
        dtype: DType,
    ) -> Result<Self, PipelineError> {
        let peers: Vec<PeerId> = nodes
            .iter()
            .map(|n| {
                n.parse().map_err(|source| PipelineError::BadNodeId {
                    node: n.clone(),
                    source,
                })
            })
            .collect::<Result<_, _>>()?;
        let (first, last) = match (peers.first(), peers.last()) {
            (Some(f), Some(l)) => (*f, *l),
            _ => return Err(PipelineError::NoRemoteStages),
        };
        let me = wire_node_id(&cluster.id());
        let inst = wire_instance_id(instance);
        let traffic = cluster.traffic();
        // Owner stream first: the last stage must know where tokens go before any batch arrives.
        let mut owner = open_stream(cluster, last, "token stream").await?;
        handshake(
            &mut owner,
            &Handshake::new(
                me,
                cluster.cluster_hash(),
                Role::Owner { instance_id: inst },
            ),
        )
        .await?;
        let mut down = open_stream(cluster, first, "activation stream").await?;
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
            kv_capacity: None,
            pending: std::collections::VecDeque::new(),
            _owner: owner_tx,
        })
    }

    /// Marks the pipeline broken by `why` (the first reason is kept for every later call).
    fn lost(&mut self, why: PipelineError) -> PipelineError {
        if self.broken.is_none() {
            tracing::error!(kind = why.error_type(), "pipeline broken: {why}");
            self.broken = Some(why.to_string());
        }
        why
    }

    fn check_broken(&self) -> Result<(), PipelineError> {
        match &self.broken {
            Some(reason) => Err(PipelineError::Broken {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn send(&mut self, frame: &Frame) -> Result<(), PipelineError> {
        self.check_broken()?;
        let bytes = encode(frame)?;
        self.send_bytes(bytes)
    }

    fn send_bytes(&mut self, bytes: Vec<u8>) -> Result<(), PipelineError> {
        self.check_broken()?;
        if self.down.blocking_send(bytes).is_err() {
            return Err(self.lost(PipelineError::StreamClosed {
                what: "stream to the next stage",
            }));
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

    fn wait_tokens(&mut self, batch_id: u64) -> Result<Vec<TokenItem>, PipelineError> {
        let start = Instant::now();
        loop {
            match self.tokens.recv_timeout(LIVENESS_POLL) {
                Ok(Ok(Frame::Tokens { batch_id: b, items })) if b == batch_id => return Ok(items),
                Ok(Ok(Frame::Tokens { batch_id: got, .. })) => {
                    return Err(self.lost(PipelineError::OtherBatch {
                        got,
                        want: batch_id,
                    }));
                }
                Ok(Ok(Frame::Error { code, message })) => {
                    return Err(self.lost(PipelineError::StageFailed { code, message }));
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(self.lost(e)),
                Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(self.lost(PipelineError::StreamClosed {
                        what: "token stream from the last stage",
                    }));
                }
                Err(std_mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(node) = self.missing_node() {
                        return Err(self.lost(PipelineError::NodeLeft { node }));
                    }
                    if start.elapsed() > BATCH_TIMEOUT {
                        return Err(self.lost(PipelineError::NoTokensInTime));
                    }
                }
            }
        }
    }
}

impl RemoteChain {
    /// Tokens of KV `seq_id` holds on the remote stages (as sent).
    pub fn cached_len(&self, seq_id: u64) -> usize {
        self.lens.get(&seq_id).copied().unwrap_or(0)
    }

    /// Sends a batch's sampling jobs and hidden states to the next stage.
    fn send_batch(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<Launched, PipelineError> {
        let StageData::Hidden(h) = input else {
            return Err(PipelineError::NotHidden);
        };
        let batch_id = self.next_batch;
        self.next_batch += 1;
        let chunks: Vec<ChunkHeader> = batch
            .iter()
            .map(|c| ChunkHeader {
                seq_id: c.seq_id,
                start_pos: self.lens.get(&c.seq_id).copied().unwrap_or(0) as u32,
                len: c.len as u32,
                want_logits: c.want_logits,
            })
            .collect();
        // Encoded straight from the hidden states.
        let acts =
            Activations::encode_f32(batch_id, &chunks, h.cols() as u32, h.data(), self.dtype)?;
        if !sampling.is_empty() {
            let jobs = sampling
                .iter()
                .map(|s| s.sampler.job(s.seq_id, s.history))
                .collect();
            self.send(&Frame::Sample { batch_id, jobs })?;
        }
        self.send_bytes(acts)?;
        for c in batch {
            *self.lens.entry(c.seq_id).or_default() += c.len;
        }
        self.pending
            .push_back((batch_id, sampling.iter().map(|s| s.seq_id).collect()));
        Ok(Launched::Pending(batch_id))
    }

    /// Waits for the tokens of the oldest batch in flight, which must be `ticket`.
    fn receive_batch(&mut self, ticket: u64) -> Result<StageData, PipelineError> {
        let Some((batch_id, expected)) = self.pending.pop_front() else {
            return Err(PipelineError::NothingInFlight);
        };
        if batch_id != ticket {
            return Err(PipelineError::OutOfOrder {
                ticket,
                oldest: batch_id,
            });
        }
        let items = self.wait_tokens(batch_id)?;
        if items.len() != expected.len() || items.iter().zip(&expected).any(|(i, s)| i.seq_id != *s)
        {
            return Err(self.lost(PipelineError::OtherSequences));
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

    /// Sends a KV operation down the pipeline (every stage applies it).
    fn send_kv(&mut self, op: KvOp) -> Result<(), PipelineError> {
        match op {
            KvOp::Release { seq_id } => {
                self.lens.remove(&seq_id);
                self.send(&Frame::Release {
                    seq_ids: vec![seq_id],
                })
            }
            KvOp::Retain {
                seq_id,
                prefix_id,
                len,
            } => {
                self.lens.remove(&seq_id);
                self.send(&Frame::Prefix(PrefixOp {
                    action: PrefixAction::Retain,
                    seq_id,
                    prefix_id,
                    len: len as u32,
                }))
            }
            KvOp::Start {
                prefix_id,
                seq_id,
                len,
            } => {
                self.send(&Frame::Prefix(PrefixOp {
                    action: PrefixAction::Start,
                    seq_id,
                    prefix_id,
                    len: len as u32,
                }))?;
                self.lens.insert(seq_id, len);
                Ok(())
            }
            KvOp::DropPrefix { prefix_id } => self.send(&Frame::Prefix(PrefixOp {
                action: PrefixAction::Drop,
                seq_id: 0,
                prefix_id,
                len: 0,
            })),
        }
    }
}

impl Stage for RemoteChain {
    fn info(&self) -> StageInfo {
        StageInfo {
            concurrent_stages: self.nodes.len(),
            kv_value_bytes: shoal_model::kv::value_bytes(true),
            local_kv_layers: 0,
            kv_token_capacity: self.kv_capacity,
        }
    }

    fn launch(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<Launched, EngineError> {
        Ok(self.send_batch(batch, input, sampling)?)
    }

    fn complete(&mut self, ticket: u64) -> Result<StageData, EngineError> {
        Ok(self.receive_batch(ticket)?)
    }

    fn kv(&mut self, op: KvOp) -> Result<(), EngineError> {
        Ok(self.send_kv(op)?)
    }

    fn held_sequences(&self) -> usize {
        self.lens.len()
    }
}
