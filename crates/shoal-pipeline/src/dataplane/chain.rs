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

use super::{
    BATCH_TIMEOUT, LIVENESS_POLL, READ_QUEUE, STAGE_PROTOCOL, WRITE_QUEUE, encode, handshake,
    spawn_reader, spawn_writer, wire_instance_id, wire_node_id,
};

/// The stages after the driver's own, on other nodes, seen as one [`Stage`].
pub struct RemoteChain {
    down: mpsc::Sender<Vec<u8>>,
    tokens: std_mpsc::Receiver<Result<Frame, String>>,
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
    ) -> Result<Self, String> {
        let peers: Vec<PeerId> = nodes
            .iter()
            .map(|n| n.parse().map_err(|e| format!("node id {n}: {e}")))
            .collect::<Result<_, _>>()?;
        let (first, last) = match (peers.first(), peers.last()) {
            (Some(f), Some(l)) => (*f, *l),
            _ => return Err("a remote chain needs at least one node".into()),
        };
        let me = wire_node_id(&cluster.id());
        let inst = wire_instance_id(instance);
        let mut control = cluster.streams();
        let traffic = cluster.traffic();
        // Owner stream first: the last stage must know where tokens go before any batch arrives.
        let mut owner = control
            .open_stream(last, STAGE_PROTOCOL)
            .await
            .map_err(|e| format!("opening the token stream to {last}: {e}"))?;
        handshake(
            &mut owner,
            &Handshake::new(
                me,
                cluster.cluster_hash(),
                Role::Owner { instance_id: inst },
            ),
        )
        .await?;
        let mut down = control
            .open_stream(first, STAGE_PROTOCOL)
            .await
            .map_err(|e| format!("opening the activation stream to {first}: {e}"))?;
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

    fn lost(&mut self, why: String) -> EngineError {
        if self.broken.is_none() {
            tracing::error!("pipeline broken: {why}");
            self.broken = Some(why.clone());
        }
        EngineError::StageLost(why)
    }

    fn send(&mut self, frame: &Frame) -> Result<(), EngineError> {
        if let Some(b) = &self.broken {
            return Err(EngineError::StageLost(b.clone()));
        }
        let bytes = encode(frame).map_err(EngineError::Internal)?;
        self.send_bytes(bytes)
    }

    fn send_bytes(&mut self, bytes: Vec<u8>) -> Result<(), EngineError> {
        if let Some(b) = &self.broken {
            return Err(EngineError::StageLost(b.clone()));
        }
        if self.down.blocking_send(bytes).is_err() {
            return Err(self.lost("the stream to the next stage closed".into()));
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

    fn wait_tokens(&mut self, batch_id: u64) -> Result<Vec<TokenItem>, EngineError> {
        let start = Instant::now();
        loop {
            match self.tokens.recv_timeout(LIVENESS_POLL) {
                Ok(Ok(Frame::Tokens { batch_id: b, items })) if b == batch_id => return Ok(items),
                Ok(Ok(Frame::Tokens { batch_id: b, .. })) => {
                    return Err(
                        self.lost(format!("tokens of batch {b} while waiting for {batch_id}"))
                    );
                }
                Ok(Ok(Frame::Error { code, message })) => {
                    return Err(self.lost(format!("a stage failed ({code}): {message}")));
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(self.lost(e)),
                Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(self.lost("the token stream from the last stage closed".into()));
                }
                Err(std_mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(n) = self.missing_node() {
                        return Err(self.lost(format!("node {n} left the cluster")));
                    }
                    if start.elapsed() > BATCH_TIMEOUT {
                        return Err(self.lost("no tokens from the last stage in time".into()));
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
        let StageData::Hidden(h) = input else {
            return Err(EngineError::Internal(
                "a remote chain takes hidden states".into(),
            ));
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
            Activations::encode_f32(batch_id, &chunks, h.cols() as u32, h.data(), self.dtype)
                .map_err(|e| EngineError::Internal(e.to_string()))?;
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

    fn complete(&mut self, ticket: u64) -> Result<StageData, EngineError> {
        let Some((batch_id, expected)) = self.pending.pop_front() else {
            return Err(EngineError::Internal("no batch in flight".into()));
        };
        if batch_id != ticket {
            return Err(EngineError::Internal(format!(
                "batch {ticket} completed out of order (oldest in flight: {batch_id})"
            )));
        }
        let items = self.wait_tokens(batch_id)?;
        if items.len() != expected.len() || items.iter().zip(&expected).any(|(i, s)| i.seq_id != *s)
        {
            return Err(self.lost("the last stage answered for other sequences".into()));
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

    fn kv(&mut self, op: KvOp) -> Result<(), EngineError> {
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

    fn held_sequences(&self) -> usize {
        self.lens.len()
    }
}
