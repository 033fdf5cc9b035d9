//! Building a node's libp2p swarm — the transport (TCP without Nagle → private network → noise → yamux)
//! and the [`Behaviour`]s (ping, mDNS, control requests, raw streams, streams on a chosen path) — and
//! binding its listeners.

use std::time::Duration;

use futures::StreamExt;
use libp2p::core::transport::upgrade::Version;
use libp2p::identity::Keypair;
use libp2p::request_response::{self, ProtocolSupport};
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{
    Multiaddr, StreamProtocol, Swarm, Transport, allow_block_list, mdns, noise, ping, tcp, yamux,
};

use super::{PING_INTERVAL, PING_TIMEOUT};
use crate::ClusterError;
use crate::proto::{CONTROL_PROTOCOL, ControlMsg, ControlReply};

/// A connection whose handshake (pnet, noise, yamux) takes longer is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A control request without an answer after this long fails (the coordinator did not answer).
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for every listener to report its bound address.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections stay open while idle: liveness is the ping's job, not an idle timer's.
const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(365 * 86400);

#[derive(NetworkBehaviour)]
pub(super) struct Behaviour {
    pub(super) ping: ping::Behaviour,
    pub(super) mdns: Toggle<mdns::tokio::Behaviour>,
    pub(super) control: request_response::json::Behaviour<ControlMsg, ControlReply>,
    pub(super) streams: libp2p_stream::Behaviour,
    /// Outbound streams on a chosen connection (a path), for the data plane and path probes.
    pub(super) paths: super::pathstream::Behaviour,
    /// Nodes removed from the cluster: their connections are refused.
    pub(super) blocked: allow_block_list::Behaviour<allow_block_list::BlockedPeers>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The swarm of the node with `key`, reachable only from nodes holding a key of the ring in `keys`
/// (`pnet`); mDNS discovery only when `mdns` is set.
pub(super) fn build(
    key: Keypair,
    keys: super::pnet::SharedKeys,
    mdns: bool,
) -> Result<Swarm<Behaviour>, ClusterError> {
    let swarm = libp2p::SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_other_transport(|key| {
            let noise = noise::Config::new(key)?;
            let tcp = tcp::tokio::Transport::new(tcp::Config::default().nodelay(true));
            Ok::<_, BoxError>(
                tcp.and_then(move |socket, endpoint| {
                    super::pnet::handshake(socket, endpoint, keys.clone())
                })
                .upgrade(Version::V1Lazy)
                .authenticate(noise)
                .multiplex(yamux::Config::default())
                .timeout(HANDSHAKE_TIMEOUT),
            )
        })
        .map_err(|e| ClusterError::network("building the transport", &e))?
        .with_behaviour(|key| behaviour(key, mdns))
        .map_err(|e| ClusterError::network("building the behaviours", &e))?
        .with_swarm_config(|c| c.with_idle_connection_timeout(IDLE_CONNECTION_TIMEOUT))
        .build();
    Ok(swarm)
}

fn behaviour(key: &Keypair, mdns_on: bool) -> Result<Behaviour, BoxError> {
    let mdns = if mdns_on {
        let cfg = mdns::Config {
            ttl: Duration::from_secs(30),
            query_interval: Duration::from_secs(5),
            ..Default::default()
        };
        Some(mdns::tokio::Behaviour::new(cfg, key.public().to_peer_id())?)
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
            request_response::Config::default().with_request_timeout(CONTROL_TIMEOUT),
        ),
        streams: libp2p_stream::Behaviour::new(),
        paths: super::pathstream::Behaviour::new(),
        blocked: allow_block_list::Behaviour::default(),
    })
}

/// Listens on every address of `listen` and waits until each listener reports its address (port 0
/// becomes a real port); returns the bound addresses.
pub(super) async fn listen(
    swarm: &mut Swarm<Behaviour>,
    listen: &[Multiaddr],
) -> Result<Vec<Multiaddr>, ClusterError> {
    for addr in listen {
        swarm
            .listen_on(addr.clone())
            .map_err(|e| ClusterError::network("listening", &e))?;
    }
    let mut bound = Vec::new();
    while bound.len() < listen.len() {
        match tokio::time::timeout(LISTEN_TIMEOUT, swarm.select_next_some()).await {
            Ok(SwarmEvent::NewListenAddr { address, .. }) => bound.push(address),
            Ok(SwarmEvent::ListenerError { error, .. }) => {
                return Err(ClusterError::network("listening", &error));
            }
            Ok(_) => {}
            Err(_) => return Err(ClusterError::ListenTimeout),
        }
    }
    Ok(bound)
}
