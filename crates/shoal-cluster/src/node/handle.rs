//! [`ClusterHandle`]: how the rest of the node talks to the network task, and the [`Snapshot`] of the
//! cluster it publishes after every change.

use shoal_ids::{InstanceId, NodeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libp2p::PeerId;
use serde::Serialize;
use shoal_placement::{ModelCard, Placement};
use tokio::sync::{mpsc, oneshot, watch};

use super::TABLE_PROPAGATION;
use crate::ClusterError;
use crate::facts::{
    ComputeFacts, DevicePolicy, DownloadFacts, GpuFacts, InstanceLoad, InstanceStatus, RemovedNode,
};
use crate::invite::{EnrollReply, EnrollRequest, InviteBook};
use crate::proto::{InstanceRecord, PlaceRequest};
use crate::state::{ClusterState, ClusterView};

/// A static peer and how dialing it goes.
#[derive(Debug, Clone, Serialize)]
pub struct StaticPeer {
    pub addr: String,
    pub peer: Option<String>,
    pub connected: bool,
    pub failed_dials: u64,
    pub last_error: Option<String>,
}

/// What the network task publishes after every change.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub state: ClusterState,
    pub listen_addrs: Vec<String>,
    pub static_peers: Vec<StaticPeer>,
}

impl Snapshot {
    /// The body of `GET /state`.
    pub fn state_json(&self) -> StateJson {
        StateJson {
            node: self.state.me().id.clone(),
            cluster: self.state.view(),
            listen_addrs: self.listen_addrs.clone(),
            static_peers: self.static_peers.clone(),
        }
    }
}

/// `GET /state`: `cluster` is the same on every member; the rest is this node's own.
#[derive(Debug, Clone, Serialize)]
pub struct StateJson {
    pub node: NodeId,
    pub cluster: ClusterView,
    pub listen_addrs: Vec<String>,
    pub static_peers: Vec<StaticPeer>,
}

/// Where the network task answers a command.
pub(super) type Reply<T> = oneshot::Sender<Result<T, ClusterError>>;

pub(super) enum Command {
    Place(PlaceRequest, Reply<Vec<InstanceRecord>>),
    Remove(InstanceId, Reply<bool>),
    SetStatus(InstanceId, Option<InstanceStatus>),
    SetKvCapacity(InstanceId, u64),
    SetLoad(InstanceId, Option<InstanceLoad>),
    SetDownloads(Vec<DownloadFacts>),
    SetModels(Vec<ModelCard>),
    SetCompute(ComputeFacts),
    SetGpus(Vec<GpuFacts>),
    SetDevice(DevicePolicy),
    Probe,
    RemoveNode(String, Reply<RemovedNode>),
    /// The peers `shoal doctor` checks (`diagnose`).
    DoctorTargets(oneshot::Sender<Vec<super::diagnose::Target>>),
}

/// What invites need: where the invite book is and the key ring whose current key it hands out (and
/// from which the relay key and the data plane's cluster hash come).
pub(super) struct Secrets {
    pub(super) state_dir: std::path::PathBuf,
    pub(super) keys: super::pnet::SharedKeys,
}

impl Secrets {
    /// The current cluster key.
    fn current_key(&self) -> String {
        let ring = self.keys.ring.read().unwrap_or_else(|e| e.into_inner());
        ring.current().key.clone()
    }
}

/// Data-plane byte counters per peer (written by the data plane, read by the network task).
#[derive(Default)]
pub struct Traffic {
    bytes: Mutex<HashMap<PeerId, (u64, u64)>>,
}

impl Traffic {
    pub fn add(&self, peer: PeerId, tx: u64, rx: u64) {
        if let Ok(mut m) = self.bytes.lock() {
            let e = m.entry(peer).or_default();
            e.0 += tx;
            e.1 += rx;
        }
    }

    pub(super) fn totals(&self) -> HashMap<PeerId, (u64, u64)> {
        self.bytes.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// Handle to the network task. Cheap to clone.
#[derive(Clone)]
pub struct ClusterHandle {
    pub(super) id: PeerId,
    pub(super) commands: mpsc::Sender<Command>,
    pub(super) snapshot: watch::Receiver<Arc<Snapshot>>,
    pub(super) streams: libp2p_stream::Control,
    pub(super) paths: super::Paths,
    pub(super) traffic: Arc<Traffic>,
    pub(super) secrets: Arc<Secrets>,
}

impl ClusterHandle {
    pub fn id(&self) -> PeerId {
        self.id
    }

    /// The data-plane handshake's name of the cluster, from the current cluster key (it changes when
    /// the key is rotated).
    pub fn cluster_hash(&self) -> [u8; 32] {
        crate::identity::cluster_hash(&self.secrets.current_key())
    }

    /// The key that marks HTTP requests this node sends on to other members ([`crate::relay_proof`]),
    /// from the current cluster key.
    pub fn relay_key(&self) -> crate::relay_proof::RelayKey {
        crate::relay_proof::RelayKey::from_cluster_key(&self.secrets.current_key())
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.borrow().clone()
    }

    /// A receiver that sees every new snapshot.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.snapshot.clone()
    }

    pub fn streams(&self) -> libp2p_stream::Control {
        self.streams.clone()
    }

    /// The paths to each peer and streams on a chosen one (the data plane's outbound streams).
    pub fn paths(&self) -> &super::Paths {
        &self.paths
    }

    pub fn traffic(&self) -> Arc<Traffic> {
        self.traffic.clone()
    }

    /// Candidate placements on the current members, best first; when none fits beside the instances
    /// already placed, the error names those it would have to evict.
    pub fn previews(&self, req: &PlaceRequest) -> Result<Vec<Placement>, ClusterError> {
        let snap = self.snapshot();
        let state = &snap.state;
        Ok(state
            .previews(req)
            .map_err(|e| state.name_evictions(req, e))?)
    }

    /// Sends a command and waits for the task's answer.
    async fn ask<T>(&self, command: impl FnOnce(Reply<T>) -> Command) -> Result<T, ClusterError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(command(tx))
            .await
            .map_err(|_| ClusterError::Stopped)?;
        rx.await.map_err(|_| ClusterError::Stopped)?
    }

    /// Places an instance (through the coordinator). Returns once this node's table has it and every
    /// member holds that table (or [`TABLE_PROPAGATION`] passed), so a caller reading `/state` next sees
    /// it, and a coordinator lost right after cannot hand over a table without it.
    pub async fn place(&self, req: PlaceRequest) -> Result<InstanceRecord, ClusterError> {
        let one = PlaceRequest {
            replicas: None,
            ..req
        };
        self.place_replicas(one)
            .await?
            .pop()
            .ok_or(ClusterError::Place(crate::PlaceError::NoCandidate))
    }

    /// Places every replica `req` names (one without `replicas`; all or nothing), like [`Self::place`].
    pub async fn place_replicas(
        &self,
        req: PlaceRequest,
    ) -> Result<Vec<InstanceRecord>, ClusterError> {
        let records = self.ask(|tx| Command::Place(req, tx)).await?;
        let ids: Vec<InstanceId> = records.iter().map(|r| r.id).collect();
        self.wait_for(TABLE_PROPAGATION, |s| {
            let table = &s.state.table().instances;
            ids.iter().all(|id| table.iter().any(|i| &i.id == id)) && everyone_has_table(s)
        })
        .await;
        Ok(records)
    }

    /// The placements [`Self::place_replicas`] would make now, one per replica.
    pub fn replica_previews(&self, req: &PlaceRequest) -> Result<Vec<Placement>, ClusterError> {
        Ok(self.snapshot().state.replica_previews(req)?)
    }

    /// Removes an instance (through the coordinator); `Ok(false)` when there is none. Returns once this
    /// node's table no longer has it and every member holds that table (or [`TABLE_PROPAGATION`]
    /// passed): a coordinator killed right after cannot hand over a table that still has it. A failure is a [`ClusterError::Remove`].
    pub async fn remove(&self, id: InstanceId) -> Result<bool, ClusterError> {
        let removed = self
            .ask(|tx| Command::Remove(id, tx))
            .await
            .map_err(|reason| ClusterError::Remove {
                id,
                reason: Box::new(reason),
            })?;
        self.wait_for(TABLE_PROPAGATION, |s| {
            s.state.table().instances.iter().all(|i| i.id != id) && everyone_has_table(s)
        })
        .await;
        Ok(removed)
    }

    /// Publishes this node's load state for one instance (`None`: no longer part of it).
    pub async fn set_status(&self, instance: InstanceId, status: Option<InstanceStatus>) {
        let _ = self
            .commands
            .send(Command::SetStatus(instance, status))
            .await;
    }

    /// Publishes the KV tokens a stage hosted here has room for (cleared with the instance's status).
    pub async fn set_kv_capacity(&self, instance: InstanceId, tokens: u64) {
        let _ = self
            .commands
            .send(Command::SetKvCapacity(instance, tokens))
            .await;
    }

    /// Publishes what an instance this node drives is doing (`None`: it no longer runs here). Sent with
    /// the next periodic facts (every second), not at once: it changes with every request.
    pub async fn set_load(&self, instance: InstanceId, load: Option<InstanceLoad>) {
        let _ = self.commands.send(Command::SetLoad(instance, load)).await;
    }

    /// Publishes this node's downloads (replacing the previous list).
    pub async fn set_downloads(&self, downloads: Vec<DownloadFacts>) {
        let _ = self.commands.send(Command::SetDownloads(downloads)).await;
    }

    /// Publishes the models this node has complete (replacing the previous list): a model that finished
    /// downloading becomes placeable here and a source for peers.
    pub async fn set_models(&self, models: Vec<ModelCard>) {
        let _ = self.commands.send(Command::SetModels(models)).await;
    }

    /// Publishes what this node's compute probe measured (and [`NodeFacts::speed`] from it), at once.
    ///
    /// [`NodeFacts::speed`]: crate::facts::NodeFacts::speed
    pub async fn set_compute(&self, compute: ComputeFacts) {
        let _ = self.commands.send(Command::SetCompute(compute)).await;
    }

    /// Publishes the GPUs this node found (`NodeFacts::gpus`, replacing the previous list), at once.
    pub async fn set_gpus(&self, gpus: Vec<GpuFacts>) {
        let _ = self.commands.send(Command::SetGpus(gpus)).await;
    }

    /// Publishes which GPU this node offers the planner for its stages' layers (`--device`), at once.
    pub async fn set_device(&self, device: DevicePolicy) {
        let _ = self.commands.send(Command::SetDevice(device)).await;
    }

    /// Takes a member out of the cluster for good (`shoal remove NODE`): by id, id suffix or name.
    pub async fn remove_node(&self, node: &str) -> Result<RemovedNode, ClusterError> {
        let node = node.to_string();
        self.ask(|tx| Command::RemoveNode(node, tx)).await
    }

    /// Answers a joining node's invite ([`crate::invite`]): checks and counts the invite in this node's
    /// book, and seals the cluster key for the joiner, with the members' cluster addresses.
    pub fn enroll(&self, req: &EnrollRequest) -> Result<EnrollReply, ClusterError> {
        let snap = self.snapshot();
        if snap.state.me().removed.iter().any(|r| r.id == req.node) {
            return Err(ClusterError::NodeRefused {
                message: format!("node {} was removed from this cluster", req.node),
            });
        }
        let secret =
            InviteBook::new(&self.secrets.state_dir).redeem(req, crate::clock::unix_now())?;
        let mut reply = crate::invite::seal(&secret, &req.node, &self.secrets.current_key());
        reply.addrs = snap
            .state
            .member_facts()
            .iter()
            .flat_map(|f| f.addrs.iter().cloned())
            .collect();
        tracing::info!(node = %req.node, invite = %req.invite, "invite accepted");
        Ok(reply)
    }

    /// Measures the bandwidth to every connected peer again.
    pub async fn probe_links(&self) {
        let _ = self.commands.send(Command::Probe).await;
    }

    /// Waits until `done` holds for the snapshot, or `timeout` passes; the last snapshot either way.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&Snapshot) -> bool,
    ) -> Arc<Snapshot> {
        let mut rx = self.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let snap = rx.borrow_and_update().clone();
            if done(&snap) {
                return snap;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return self.snapshot(),
            }
        }
    }
}

/// Every member publishes (in its facts) a table version at least as new as this node's.
fn everyone_has_table(snap: &Snapshot) -> bool {
    let version = snap.state.table().version;
    snap.state
        .member_facts()
        .iter()
        .all(|f| f.table_version >= version)
}
