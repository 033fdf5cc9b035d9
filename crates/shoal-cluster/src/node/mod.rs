//! The network task: one libp2p swarm per node, driven by a single tokio task that owns the
//! [`ClusterState`]. Everything else talks to it through a [`ClusterHandle`] (commands with oneshot
//! replies, and a `watch` channel carrying the latest state).
//!
//! Transport: TCP (no Nagle) → private network (pnet, key from the cluster key) → noise → yamux.
//! Behaviours: ping (500 ms interval, 1 s timeout: a silent peer is dropped within ~1.5 s, a killed one as
//! soon as its socket closes), mDNS, JSON request-response for control messages, and raw streams for the
//! data plane and link probes.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use libp2p::core::ConnectedPoint;
use libp2p::core::transport::upgrade::Version;
use libp2p::multiaddr::Protocol;
use libp2p::pnet::PnetConfig;
use libp2p::request_response::{self, OutboundRequestId, ProtocolSupport};
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol, Swarm, Transport, mdns, noise, ping, tcp, yamux};
use shoal_placement::{LinkKind, ModelCard};
use tokio::sync::{mpsc, oneshot, watch};

use crate::ClusterError;
use crate::facts::{self, NodeFacts};
use crate::identity;
use crate::proto::{CONTROL_PROTOCOL, ControlMsg, ControlReply, InstanceRecord};
use crate::state::ClusterState;

mod control;
mod dial;
mod handle;
mod peer;
mod probe;

use dial::Dials;
use handle::Command;
pub use handle::{ClusterHandle, Snapshot, StateJson, StaticPeer, Traffic};
use peer::Peers;
use probe::answer_probes;

/// Ping period (libp2p ping). A peer whose last pong is older than [`SILENT_FOR`] is dropped; the check
/// runs every [`LIVENESS_CHECK`], so a hung peer or a cut link is noticed within ~1.7 s (≤ 2 s asked). A
/// killed peer is noticed at once: its sockets close. (libp2p ping alone reports a failure only at the
/// second consecutive one, and a new ping stream on a dead link waits 10 s for negotiation.)
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
}

/// Parses `HOST:PORT` (resolved now) or a multiaddr.
pub fn parse_peer(s: &str) -> Result<Multiaddr, ClusterError> {
    let err = |m: String| ClusterError::Address {
        addr: s.to_string(),
        message: m,
    };
    if s.starts_with('/') {
        return s.parse().map_err(|e| err(format!("{e}")));
    }
    let sa: SocketAddr = s
        .to_socket_addrs()
        .map_err(|e| err(e.to_string()))?
        .next()
        .ok_or_else(|| err("resolves to no address".into()))?;
    Ok(socket_multiaddr(sa))
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

#[derive(NetworkBehaviour)]
struct Behaviour {
    ping: ping::Behaviour,
    mdns: Toggle<mdns::tokio::Behaviour>,
    control: request_response::json::Behaviour<ControlMsg, ControlReply>,
    streams: libp2p_stream::Behaviour,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn random_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos() ^ u128::from(unix_now()));
    format!("{:016x}", h.finish())
}

/// Starts the node: loads (or creates) its identity, listens, and spawns the network task on the current
/// tokio runtime. Returns once every listen address is bound.
pub async fn start(config: ClusterConfig) -> Result<ClusterHandle, ClusterError> {
    let key = identity::load_or_create(&config.state_dir)?;
    let id = key.public().to_peer_id();
    let psk = identity::cluster_psk(&config.cluster_key);
    let net = |e: &dyn std::fmt::Display| ClusterError::Network(e.to_string());
    let mdns_on = config.mdns;
    let mut swarm = libp2p::SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_other_transport(|key| {
            let noise = noise::Config::new(key)?;
            let tcp = tcp::tokio::Transport::new(tcp::Config::default().nodelay(true));
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(
                tcp.and_then(move |socket, _| PnetConfig::new(psk).handshake(socket))
                    .upgrade(Version::V1Lazy)
                    .authenticate(noise)
                    .multiplex(yamux::Config::default())
                    .timeout(Duration::from_secs(10)),
            )
        })
        .map_err(|e| net(&e))?
        .with_behaviour(|key| {
            let peer = key.public().to_peer_id();
            let mdns = if mdns_on {
                let cfg = mdns::Config {
                    ttl: Duration::from_secs(30),
                    query_interval: Duration::from_secs(5),
                    ..Default::default()
                };
                Some(mdns::tokio::Behaviour::new(cfg, peer)?)
            } else {
                None
            };
            Ok(Behaviour {
                ping: ping::Behaviour::new(
                    ping::Config::new()
                        .with_interval(PING_INTERVAL)
                        .with_timeout(PING_TIMEOUT),
                ),
                mdns: Toggle::from(mdns),
                control: request_response::json::Behaviour::new(
                    [(StreamProtocol::new(CONTROL_PROTOCOL), ProtocolSupport::Full)],
                    request_response::Config::default()
                        .with_request_timeout(Duration::from_secs(10)),
                ),
                streams: libp2p_stream::Behaviour::new(),
            })
        })
        .map_err(|e| net(&e))?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(365 * 86400)))
        .build();
    for addr in &config.listen {
        swarm.listen_on(addr.clone()).map_err(|e| net(&e))?;
    }
    // Wait until every listener reports its address (port 0 becomes a real port).
    let mut listen_addrs = Vec::new();
    while listen_addrs.len() < config.listen.len() {
        match tokio::time::timeout(Duration::from_secs(10), swarm.select_next_some()).await {
            Ok(SwarmEvent::NewListenAddr { address, .. }) => listen_addrs.push(address),
            Ok(SwarmEvent::ListenerError { error, .. }) => return Err(net(&error)),
            Ok(_) => {}
            Err(_) => return Err(ClusterError::Network("listening timed out".into())),
        }
    }
    let mut streams = swarm.behaviour().streams.new_control();
    let probes = streams
        .accept(PROBE_PROTOCOL)
        .map_err(|e| ClusterError::Network(format!("{e:?}")))?;
    tokio::spawn(answer_probes(probes));

    let (mem, cores) = facts::local_resources();
    let me = NodeFacts {
        id: id.to_string(),
        name: sysinfo::System::host_name().unwrap_or_else(|_| "node".into()),
        api_url: config.api_url.clone(),
        addrs: Vec::new(),
        memory: mem,
        cpu_cores: cores,
        accelerator: "cpu".into(),
        backend: config.backend.clone(),
        speed: facts::estimate_speed(cores),
        models: config.models.clone(),
        links: Vec::new(),
        instances: BTreeMap::new(),
        kv_capacity: BTreeMap::new(),
        seq: 0,
        started: unix_now(),
    };
    let state = ClusterState::new(me);
    let traffic = Arc::new(Traffic::default());
    let mut task = NetTask {
        swarm,
        id,
        state,
        listen_addrs,
        dials: Dials::new(config.peers.clone()),
        peers: Peers::default(),
        pending: HashMap::new(),
        traffic: traffic.clone(),
        traffic_at: Instant::now(),
        probe_tx: None,
        streams: streams.clone(),
        published: None,
    };
    task.refresh_own_facts();
    let (snap_tx, snap_rx) = watch::channel(Arc::new(task.snapshot()));
    let (cmd_tx, cmd_rx) = mpsc::channel(COMMAND_QUEUE);
    tokio::spawn(task.run(cmd_rx, snap_tx));
    Ok(ClusterHandle {
        id,
        commands: cmd_tx,
        snapshot: snap_rx,
        streams,
        traffic,
        cluster_hash: identity::cluster_hash(&config.cluster_key),
    })
}

struct NetTask {
    swarm: Swarm<Behaviour>,
    id: PeerId,
    state: ClusterState,
    listen_addrs: Vec<Multiaddr>,
    dials: Dials,
    /// Everything known about every other node, one entry each.
    peers: Peers,
    pending: HashMap<OutboundRequestId, Pending>,
    traffic: Arc<Traffic>,
    /// When the traffic counters were last read into `peers`.
    traffic_at: Instant,
    probe_tx: Option<mpsc::UnboundedSender<(PeerId, Option<f64>)>>,
    streams: libp2p_stream::Control,
    /// Facts as last published (what peers see; `GET /state` shows this copy too).
    published: Option<NodeFacts>,
}

enum Pending {
    Place(oneshot::Sender<Result<InstanceRecord, String>>),
    Remove(oneshot::Sender<Result<bool, String>>),
}

impl NetTask {
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
            .map(|a| a.clone().with(Protocol::P2p(self.id)).to_string())
            .collect()
    }

    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        snap: watch::Sender<Arc<Snapshot>>,
    ) {
        let (probe_tx, mut probe_rx) = mpsc::unbounded_channel();
        self.probe_tx = Some(probe_tx);
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
                Some((peer, bps)) = probe_rx.recv() => {
                    if let Some(b) = bps {
                        self.peers.set_bandwidth(peer, b);
                    }
                }
                _ = facts_tick.tick() => {
                    self.refresh_own_facts();
                    self.push_facts();
                    let members = self.members_msg();
                    let peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
                    for p in peers {
                        self.swarm.behaviour_mut().control.send_request(&p, members.clone());
                    }
                    if self.state.is_coordinator() {
                        self.broadcast_table();
                    }
                }
                _ = redial_tick.tick() => self.redial(),
                _ = liveness_tick.tick() => self.drop_silent_peers(),
            }
            let next = Arc::new(self.snapshot());
            snap.send_if_modified(|cur| {
                let changed = cur.state.view() != next.state.view()
                    || cur.listen_addrs != next.listen_addrs
                    || cur.static_peers.len() != next.static_peers.len()
                    || cur
                        .static_peers
                        .iter()
                        .zip(&next.static_peers)
                        .any(|(a, b)| {
                            a.connected != b.connected || a.failed_dials != b.failed_dials
                        })
                    || cur.state.table() != next.state.table();
                if changed {
                    *cur = next;
                }
                changed
            });
        }
    }

    fn refresh_own_facts(&mut self) {
        let (mem, _) = facts::local_resources();
        let secs = self.traffic_at.elapsed().as_secs_f64().max(1e-3);
        self.peers.record_traffic(self.traffic.totals(), secs);
        self.traffic_at = Instant::now();
        let links = self.peers.link_facts();
        let addrs = self.own_addrs();
        let me = self.state.me_mut();
        me.memory = mem;
        me.links = links;
        me.addrs = addrs;
        me.seq += 1;
    }

    fn push_facts(&mut self) {
        let facts = self.state.me().clone();
        self.published = Some(facts.clone());
        let peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
        for p in peers {
            self.swarm
                .behaviour_mut()
                .control
                .send_request(&p, ControlMsg::Facts(Box::new(facts.clone())));
        }
    }

    /// Every member with the addresses it announced.
    fn members_msg(&self) -> ControlMsg {
        ControlMsg::Members(
            self.state
                .member_facts()
                .iter()
                .map(|f| (f.id.clone(), f.addrs.clone()))
                .collect(),
        )
    }

    fn send_facts_to(&mut self, peer: PeerId) {
        let facts = self.state.me().clone();
        self.swarm
            .behaviour_mut()
            .control
            .send_request(&peer, ControlMsg::Facts(Box::new(facts)));
        let members = self.members_msg();
        self.swarm
            .behaviour_mut()
            .control
            .send_request(&peer, members);
        let table = self.state.table().clone();
        if self.state.is_coordinator() {
            self.swarm
                .behaviour_mut()
                .control
                .send_request(&peer, ControlMsg::Table(table));
        }
    }

    fn broadcast_table(&mut self) {
        let table = self.state.table().clone();
        let peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
        for p in peers {
            self.swarm
                .behaviour_mut()
                .control
                .send_request(&p, ControlMsg::Table(table.clone()));
        }
    }

    fn on_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        match event {
            SwarmEvent::NewListenAddr { address, .. } if !self.listen_addrs.contains(&address) => {
                self.listen_addrs.push(address);
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                endpoint,
                connection_id,
                ..
            } => {
                let (remote, dialed) = match &endpoint {
                    ConnectedPoint::Dialer { address, .. } => (address, Some(address)),
                    ConnectedPoint::Listener { send_back_addr, .. } => (send_back_addr, None),
                };
                self.dials.established(connection_id, peer_id, dialed);
                let kind = ip_of(remote).map_or(LinkKind::Unknown, facts::link_kind);
                self.peers.connected(peer_id, kind, Instant::now());
                self.state.peer_connected(&peer_id.to_string());
                tracing::debug!(peer = %peer_id, %remote, "connected");
                // Publish the new link at once (placement needs it), then greet the peer.
                self.refresh_own_facts();
                self.push_facts();
                self.send_facts_to(peer_id);
                self.spawn_probe(peer_id);
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established: 0,
                cause,
                ..
            } => self.forget(peer_id, &format!("connection closed: {cause:?}")),
            SwarmEvent::OutgoingConnectionError {
                error,
                connection_id,
                ..
            } => {
                if let Some(addr) = self.dials.connection_failed(connection_id) {
                    self.dials.failed(&addr, &error);
                }
                tracing::debug!("dial failed: {error}");
            }
            SwarmEvent::Behaviour(BehaviourEvent::Ping(ping::Event { peer, result, .. })) => {
                match result {
                    Ok(rtt) => self.peers.pong(&peer, rtt, Instant::now()),
                    Err(e) => {
                        tracing::warn!(%peer, "ping failed ({e}): dropping the peer");
                        let _ = self.swarm.disconnect_peer_id(peer);
                        self.forget(peer, "ping failed");
                    }
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(mdns::Event::Discovered(list))) => {
                for (peer, addr) in list {
                    if peer != self.id && !self.swarm.is_connected(&peer) {
                        self.peers.learn_addr(peer, addr.clone());
                        // Keep redialing until connected (a lost first packet must not strand it).
                        self.peers.lost_unless_already(peer, Instant::now());
                        self.dial(addr);
                    }
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(mdns::Event::Expired(_))) => {}
            SwarmEvent::Behaviour(BehaviourEvent::Control(e)) => self.on_control(e),
            _ => {}
        }
    }

    fn drop_silent_peers(&mut self) {
        for peer in self.peers.silent(SILENT_FOR) {
            tracing::warn!(%peer, "no pong for {SILENT_FOR:?}: dropping the peer");
            let _ = self.swarm.disconnect_peer_id(peer);
            self.forget(peer, "silent");
        }
    }

    /// A peer is gone: drop it from membership and let the coordinator re-place its instances.
    fn forget(&mut self, peer: PeerId, why: &str) {
        self.peers.disconnected(&peer);
        let id = peer.to_string();
        if self.state.peer_gone(&id) {
            tracing::warn!(%peer, "member left: {why}");
            self.peers.lost(peer, Instant::now());
        }
        self.dials.disconnected(&id);
        self.reconcile();
    }

    fn reconcile(&mut self) {
        if self.state.reconcile(random_id) {
            self.broadcast_table();
        }
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
