//! The network task: one libp2p swarm per node, driven by a single tokio task that owns the
//! [`ClusterState`]. Everything else talks to it through a [`ClusterHandle`] (commands with oneshot
//! replies, and a `watch` channel carrying the latest [`Snapshot`]).
//!
//! - `swarm`: transport (TCP without Nagle → private network (pnet, key from the cluster key) → noise
//!   → yamux) and behaviours: ping (every [`PING_INTERVAL`]; a peer silent for [`SILENT_FOR`] is dropped,
//!   a killed one as soon as its socket closes), mDNS, JSON request-response for control messages, and
//!   raw streams for the data plane and link probes, and streams on a chosen connection (`pathstream`).
//! - `paths`: every connection to a peer is a path with its own ping RTT and bandwidth probe; the
//!   preferred one per peer (cheapest, moved from only by a margin or when it dies) is published to
//!   the data plane as a [`PathBook`] and in the link facts.
//! - `peer`: everything known about each other node, in one map; `dial`: dials by address, static
//!   peers and the redial loop.
//! - `events`: swarm events and failure detection; `control`: control requests, replies and handle
//!   commands; `gossip`: facts, members and table sent unasked; `probe`: bandwidth probes.
//! - `handle`: the [`ClusterHandle`] and the [`Snapshot`] it reads.
//!
//! [`start`] builds the swarm, binds the listeners, gathers this node's facts ([`local_facts`]) and
//! spawns the task.

use shoal_ids::{InstanceId, NodeId};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Display;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use libp2p::multiaddr::Protocol;
use libp2p::request_response::OutboundRequestId;
use libp2p::swarm::ConnectionId;
use libp2p::{Multiaddr, PeerId, StreamProtocol, Swarm};
use shoal_placement::ModelCard;
use tokio::sync::{mpsc, watch};

use crate::ClusterError;
use crate::clock::unix_now;
use crate::facts::{self, NodeFacts};
use crate::identity;
use crate::proto::InstanceRecord;
use crate::state::ClusterState;

mod control;
mod diagnose;
mod dial;
mod events;
mod gossip;
mod handle;
mod keys;
mod paths;
mod pathstream;
mod peer;
mod pnet;
mod probe;
mod removal;
mod swarm;

use dial::Dials;
pub use handle::{ClusterHandle, Snapshot, StateJson, StaticPeer, Traffic};
use handle::{Command, Reply};
pub use paths::{PathBook, PathId};
pub use pathstream::{PathLease, PathStream, PathStreamError, Paths};
use peer::Peers;
pub use removal::REMOVED_FILE;
use removal::Removed;
use swarm::Behaviour;

/// Ping period (libp2p ping). A peer whose last pong is older than [`SILENT_FOR`] is dropped; the check
/// runs every 100 ms, so a hung peer or a cut link is noticed within ~1.7 s (≤ 2 s asked). A killed peer
/// is noticed at once: its sockets close. (libp2p ping alone reports a failure only at the second
/// consecutive one, and a new ping stream on a dead link waits 10 s for negotiation.)
pub const PING_INTERVAL: Duration = Duration::from_millis(400);
pub const PING_TIMEOUT: Duration = Duration::from_secs(1);
pub const SILENT_FOR: Duration = Duration::from_millis(1600);
const LIVENESS_CHECK: Duration = Duration::from_millis(100);
/// Facts are pushed to every peer this often (and at once when they change).
const FACTS_PERIOD: Duration = Duration::from_secs(1);
/// Static peers and recently lost members are redialed this often.
const REDIAL_PERIOD: Duration = Duration::from_secs(1);
/// A lost member's addresses are redialed for this long (a restarted node comes back as itself).
const REDIAL_LOST_FOR: Duration = Duration::from_secs(600);
/// Commands queued to the network task; callers wait for room (the task answers each in microseconds).
const COMMAND_QUEUE: usize = 64;
/// How long `place` / `remove` wait for the coordinator's new table to arrive here.
const TABLE_PROPAGATION: Duration = Duration::from_secs(5);
/// Bytes sent by a bandwidth probe, and the longest it may take.
const PROBE_BYTES: usize = 4 << 20;
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// Probe results waiting for the task: one per probe, a few per peer at most; a probe's task waits for
/// room.
const PROBE_RESULTS: usize = 64;
/// A bandwidth probe's result: the peer, the connection it ran on, bytes per second (`None`: failed).
type ProbeResult = (PeerId, libp2p::swarm::ConnectionId, Option<f64>);

pub const PROBE_PROTOCOL: StreamProtocol = StreamProtocol::new("/shoal/probe/1");

/// How to start a node.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub state_dir: PathBuf,
    pub cluster_key: String,
    /// libp2p listen addresses (e.g. `/ip4/0.0.0.0/tcp/52416`).
    pub listen: Vec<Multiaddr>,
    /// Static peers (for networks without multicast).
    pub peers: Vec<Multiaddr>,
    pub mdns: bool,
    pub api_url: Option<String>,
    /// Models present in the local store.
    pub models: Vec<ModelCard>,
    pub backend: String,
    /// The machine this node says it runs on (`shoal serve --machine`); `None`: this one's
    /// ([`facts::machine`]).
    pub machine: Option<String>,
}

/// Parses `HOST:PORT` (resolved now) or a multiaddr.
pub fn parse_peer(s: &str) -> Result<Multiaddr, ClusterError> {
    let err = |m: &dyn Display| ClusterError::Address {
        addr: s.to_string(),
        message: m.to_string(),
    };
    if s.starts_with('/') {
        return s.parse().map_err(|e| err(&e));
    }
    let sa: SocketAddr = s
        .to_socket_addrs()
        .map_err(|e| err(&e))?
        .next()
        .ok_or_else(|| err(&"resolves to no address"))?;
    Ok(socket_multiaddr(sa))
}

/// The IP and TCP port of an `/ip4|ip6/…/tcp/…` address (`None` for any other kind).
pub fn tcp_socket(addr: &Multiaddr) -> Option<SocketAddr> {
    use libp2p::multiaddr::Protocol;
    let mut it = addr.iter();
    let ip: std::net::IpAddr = match it.next()? {
        Protocol::Ip4(ip) => ip.into(),
        Protocol::Ip6(ip) => ip.into(),
        _ => return None,
    };
    match it.next()? {
        Protocol::Tcp(port) => Some(SocketAddr::new(ip, port)),
        _ => None,
    }
}

pub fn socket_multiaddr(sa: SocketAddr) -> Multiaddr {
    let ip = match sa.ip() {
        IpAddr::V4(v4) => Protocol::Ip4(v4),
        IpAddr::V6(v6) => Protocol::Ip6(v6),
    };
    Multiaddr::empty().with(ip).with(Protocol::Tcp(sa.port()))
}

fn ip_of(addr: &Multiaddr) -> Option<IpAddr> {
    addr.iter().find_map(|p| match p {
        Protocol::Ip4(a) => Some(IpAddr::V4(a)),
        Protocol::Ip6(a) => Some(IpAddr::V6(a)),
        _ => None,
    })
}

fn random_id() -> InstanceId {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos() ^ u128::from(unix_now()));
    InstanceId::from_u64(h.finish())
}

/// The node id of a libp2p peer: its base58 text, which is always a valid [`NodeId`].
pub fn node_id(peer: &PeerId) -> NodeId {
    NodeId::parse(&peer.to_string()).expect("a peer id's base58 text is a node id")
}

/// Starts the node: loads (or creates) its identity, listens, and spawns the network task on the current
/// tokio runtime. Returns once every listen address is bound.
pub async fn start(config: ClusterConfig) -> Result<ClusterHandle, ClusterError> {
    let key = identity::load_or_create(&config.state_dir)?;
    let id = key.public().to_peer_id();
    let ring = crate::keyring::KeyRing::load(&config.state_dir, &config.cluster_key);
    tracing::info!(epoch = ring.current().epoch, "cluster key");
    let keys = pnet::SharedKeys::new(ring);
    let mut swarm = swarm::build(key, keys.clone(), config.mdns)?;
    let listen_addrs = swarm::listen(&mut swarm, &config.listen).await?;
    let mut streams = swarm.behaviour().streams.new_control();
    probe::serve(&mut streams)?;
    let doctor_streams = streams
        .accept(crate::doctor::DOCTOR_PROTOCOL)
        .map_err(|e| ClusterError::network("accepting doctor streams", &e))?;
    crate::doctor::serve(doctor_streams);
    let mut me = local_facts(id, &config);
    let removed = Removed::load(&config.state_dir);
    me.removed = removed.list().to_vec();
    let mut task = NetTask::new(
        swarm,
        ClusterState::new(me),
        listen_addrs,
        &config.peers,
        streams,
        keys.clone(),
    );
    task.removed = removed;
    task.block_saved();
    let secrets = handle::Secrets {
        state_dir: config.state_dir.clone(),
        keys,
    };
    Ok(task.spawn(secrets))
}

/// What this node publishes about itself at start (links, addresses and instances come later).
pub fn local_facts(id: PeerId, config: &ClusterConfig) -> NodeFacts {
    let (mem, cores) = facts::local_resources();
    NodeFacts {
        id: node_id(&id),
        name: sysinfo::System::host_name().unwrap_or_else(|_| "node".into()),
        api_url: config.api_url.clone(),
        addrs: Vec::new(),
        memory: mem,
        cpu_cores: cores,
        cpu_model: facts::cpu_model(),
        machine: config.machine.clone().or_else(facts::machine),
        core_kinds: facts::core_kinds(),
        thermal: facts::thermal(),
        cpu_load: None,
        temperature_c: None,
        power_w: None,
        accelerator: "cpu".into(),
        gpus: Vec::new(),
        device: Default::default(),
        backend: config.backend.clone(),
        speed: facts::estimate_speed(cores),
        compute: facts::ComputeFacts::default(),
        models: config.models.clone(),
        links: Vec::new(),
        instances: BTreeMap::new(),
        kv_capacity: BTreeMap::new(),
        downloads: Vec::new(),
        removed: Vec::new(),
        load: Default::default(),
        table_version: 0,
        seq: 0,
        started: unix_now(),
    }
}

struct NetTask {
    swarm: Swarm<Behaviour>,
    id: PeerId,
    state: ClusterState,
    listen_addrs: Vec<Multiaddr>,
    dials: Dials,
    /// Everything known about every other node, one entry each.
    peers: Peers,
    /// Place and remove requests sent to the coordinator, waiting for its reply.
    pending: HashMap<OutboundRequestId, Pending>,
    traffic: Arc<Traffic>,
    /// When the traffic counters were last read into `peers`.
    traffic_at: Instant,
    /// Bandwidth probes send their result here (`None`: the probe failed).
    probe_tx: mpsc::Sender<ProbeResult>,
    probe_rx: mpsc::Receiver<ProbeResult>,
    /// Connections the data plane found gone when it asked them for a stream ([`Paths`]).
    gone_tx: mpsc::UnboundedSender<(PeerId, ConnectionId)>,
    gone_rx: mpsc::UnboundedReceiver<(PeerId, ConnectionId)>,
    streams: libp2p_stream::Control,
    /// Opens streams on a chosen connection (probes, and the data plane through [`Paths`]).
    paths: pathstream::PathControl,
    /// Which instances' streams run on which connection (for the path facts).
    path_uses: pathstream::PathUses,
    /// The preferred and live paths, as last handed to the data plane.
    path_book: watch::Sender<Arc<PathBook>>,
    /// Facts as last published (what peers see; `GET /state` shows this copy too).
    published: Option<NodeFacts>,
    /// Nodes refused for good (`shoal remove`).
    removed: Removed,
    /// CPU load, temperature and power readings between two fact refreshes.
    host: crate::sysload::HostSampler,
    /// The cluster key ring, shared with the transport and the handle.
    keys: pnet::SharedKeys,
    /// Nodes that connected with an earlier key without being members: their messages are ignored.
    refused: std::collections::HashSet<PeerId>,
    /// When this node last learned of a removal (the coordinator waits [`keys::ROTATE_GRACE`] after it
    /// for the removing node's new key before it makes one itself).
    removal_heard: Option<Instant>,
}

/// A request to the coordinator waiting for its reply, and the handle waiting for the result.
enum Pending {
    /// Every instance placed (one unless the request names `replicas`).
    Place(Reply<Vec<InstanceRecord>>),
    Remove(Reply<bool>),
}

impl NetTask {
    fn new(
        swarm: Swarm<Behaviour>,
        state: ClusterState,
        listen_addrs: Vec<Multiaddr>,
        static_peers: &[Multiaddr],
        streams: libp2p_stream::Control,
        keys: pnet::SharedKeys,
    ) -> Self {
        let (probe_tx, probe_rx) = mpsc::channel(PROBE_RESULTS);
        let (gone_tx, gone_rx) = mpsc::unbounded_channel();
        let paths = swarm.behaviour().paths.control();
        let mut task = NetTask {
            id: *swarm.local_peer_id(),
            swarm,
            state,
            listen_addrs,
            dials: Dials::new(static_peers.to_vec()),
            peers: Peers::default(),
            pending: HashMap::new(),
            traffic: Arc::new(Traffic::default()),
            traffic_at: Instant::now(),
            probe_tx,
            probe_rx,
            gone_tx,
            gone_rx,
            streams,
            paths,
            path_uses: pathstream::PathUses::default(),
            path_book: watch::channel(Arc::new(PathBook::default())).0,
            published: None,
            removed: Removed::default(),
            host: crate::sysload::HostSampler::default(),
            keys,
            refused: Default::default(),
            removal_heard: None,
        };
        task.refresh_own_facts();
        task
    }

    /// Runs the task on the current tokio runtime; the handle is the only way to reach it.
    fn spawn(self, secrets: handle::Secrets) -> ClusterHandle {
        let (snap_tx, snap_rx) = watch::channel(Arc::new(self.snapshot()));
        let (cmd_tx, cmd_rx) = mpsc::channel(COMMAND_QUEUE);
        let handle = ClusterHandle {
            id: self.id,
            commands: cmd_tx,
            snapshot: snap_rx,
            streams: self.streams.clone(),
            paths: Paths {
                control: self.paths.clone(),
                book: self.path_book.subscribe(),
                uses: self.path_uses.clone(),
                gone: self.gone_tx.clone(),
            },
            traffic: self.traffic.clone(),
            secrets: Arc::new(secrets),
        };
        tokio::spawn(self.run(cmd_rx, snap_tx));
        handle
    }

    fn snapshot(&self) -> Snapshot {
        let mut state = self.state.clone();
        if let Some(p) = &self.published {
            *state.me_mut() = p.clone();
        }
        Snapshot {
            state,
            listen_addrs: self.own_addrs(),
            static_peers: self.dials.static_peers().to_vec(),
        }
    }

    /// Dialable addresses of this node (unspecified listen addresses expanded to loopback is not done:
    /// peers learn real addresses from how they reached us).
    fn own_addrs(&self) -> Vec<String> {
        self.listen_addrs
            .iter()
            .map(|a| format!("{}", a.clone().with(Protocol::P2p(self.id))))
            .collect()
    }

    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        snap: watch::Sender<Arc<Snapshot>>,
    ) {
        let mut facts_tick = tokio::time::interval(FACTS_PERIOD);
        let mut redial_tick = tokio::time::interval(REDIAL_PERIOD);
        let mut liveness_tick = tokio::time::interval(LIVENESS_CHECK);
        self.redial();
        loop {
            tokio::select! {
                event = self.swarm.select_next_some() => self.on_event(event),
                cmd = commands.recv() => match cmd {
                    Some(c) => self.on_command(c),
                    None => return, // every handle dropped: the node is shutting down
                },
                Some((peer, connection, bps)) = self.probe_rx.recv() => {
                    tracing::debug!(%peer, ?connection, ?bps, "bandwidth probe");
                    if let Some(b) = bps {
                        self.peers.set_bandwidth(peer, connection, b);
                    }
                }
                Some((peer, connection)) = self.gone_rx.recv() => {
                    self.drop_path(peer, connection, "a data-plane stream could not open on it (the connection is gone)");
                }
                _ = facts_tick.tick() => self.gossip(),
                _ = redial_tick.tick() => self.redial(),
                _ = liveness_tick.tick() => self.drop_silent_peers(),
            }
            self.acknowledge_table();
            self.publish(&snap);
            self.publish_paths();
        }
    }

    /// Hands the data plane the paths when the preferred or live ones changed.
    fn publish_paths(&self) {
        let book = self.peers.path_book();
        self.path_book.send_if_modified(|cur| {
            let changed = **cur != book;
            if changed {
                *cur = Arc::new(book);
            }
            changed
        });
    }

    /// Publishes the version of the table this node now holds at once (not with the next periodic facts),
    /// so whoever changed the table learns quickly that this member has it.
    fn acknowledge_table(&mut self) {
        let version = self.state.table().version;
        if self.state.me().table_version != version {
            self.state.me_mut().table_version = version;
            self.refresh_own_facts();
            self.push_facts();
        }
    }

    /// Sends the snapshot to the handles when anything they show changed.
    fn publish(&self, snap: &watch::Sender<Arc<Snapshot>>) {
        let next = Arc::new(self.snapshot());
        snap.send_if_modified(|cur| {
            let changed = cur.state.view() != next.state.view()
                || cur.listen_addrs != next.listen_addrs
                || cur.static_peers.len() != next.static_peers.len()
                || cur
                    .static_peers
                    .iter()
                    .zip(&next.static_peers)
                    .any(|(a, b)| a.connected != b.connected || a.failed_dials != b.failed_dials)
                || cur.state.table() != next.state.table();
            if changed {
                *cur = next;
            }
            changed
        });
    }
}

fn strip_p2p(addr: &Multiaddr) -> Multiaddr {
    addr.iter()
        .filter(|p| !matches!(p, Protocol::P2p(_)))
        .collect()
}

fn is_unspecified(addr: &Multiaddr) -> bool {
    ip_of(addr).is_some_and(|ip| ip.is_unspecified())
}
