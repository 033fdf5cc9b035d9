//! Swarm events of the network task — connections opening and closing, failed dials, pings, mDNS — and
//! failure detection: a peer whose socket closed, whose ping failed or that stayed silent for
//! [`SILENT_FOR`] is forgotten, and the coordinator re-places the instances it ran.

use std::time::Instant;

use libp2p::core::ConnectedPoint;
use libp2p::swarm::{ConnectionId, DialError, SwarmEvent};
use libp2p::{Multiaddr, PeerId, mdns, ping};
use shoal_placement::LinkKind;

use super::swarm::BehaviourEvent;
use super::{NetTask, SILENT_FOR, ip_of, random_id};
use crate::facts;

impl NetTask {
    pub(super) fn on_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        match event {
            SwarmEvent::NewListenAddr { address, .. } if !self.listen_addrs.contains(&address) => {
                self.listen_addrs.push(address);
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                endpoint,
                connection_id,
                ..
            } => self.on_connected(peer_id, &endpoint, connection_id),
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
            } => self.on_dial_error(connection_id, &error),
            SwarmEvent::Behaviour(BehaviourEvent::Ping(ping::Event { peer, result, .. })) => {
                self.on_ping(peer, result)
            }
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(mdns::Event::Discovered(list))) => {
                self.on_discovered(list)
            }
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(mdns::Event::Expired(_))) => {}
            SwarmEvent::Behaviour(BehaviourEvent::Control(e)) => self.on_control(e),
            _ => {}
        }
    }

    fn on_connected(&mut self, peer: PeerId, endpoint: &ConnectedPoint, connection: ConnectionId) {
        let (remote, dialed) = match endpoint {
            ConnectedPoint::Dialer { address, .. } => (address, Some(address)),
            ConnectedPoint::Listener { send_back_addr, .. } => (send_back_addr, None),
        };
        self.dials.established(connection, peer, dialed);
        let kind = ip_of(remote).map_or(LinkKind::Unknown, facts::link_kind);
        self.peers.connected(peer, kind, Instant::now());
        let id = peer.to_string();
        self.state.peer_connected(&id);
        tracing::debug!(%peer, %remote, "connected");
        // Publish the new link at once (placement needs it), then greet the peer.
        self.refresh_own_facts();
        self.push_facts();
        self.send_facts_to(peer);
        self.spawn_probe(peer);
    }

    fn on_dial_error(&mut self, connection: ConnectionId, error: &DialError) {
        if let Some(addr) = self.dials.connection_failed(connection) {
            self.dials.failed(&addr, error);
        }
        tracing::debug!("dial failed: {error}");
    }

    fn on_ping(&mut self, peer: PeerId, result: Result<std::time::Duration, ping::Failure>) {
        match result {
            Ok(rtt) => self.peers.pong(&peer, rtt, Instant::now()),
            Err(e) => {
                tracing::warn!(%peer, "ping failed ({e}): dropping the peer");
                let _ = self.swarm.disconnect_peer_id(peer);
                self.forget(peer, "ping failed");
            }
        }
    }

    fn on_discovered(&mut self, found: Vec<(PeerId, Multiaddr)>) {
        for (peer, addr) in found {
            if peer != self.id && !self.swarm.is_connected(&peer) && !self.is_removed(&peer) {
                self.peers.learn_addr(peer, addr.clone());
                // Keep redialing until connected (a lost first packet must not strand it).
                self.peers.lost_unless_already(peer, Instant::now());
                self.dial(addr);
            }
        }
    }

    pub(super) fn drop_silent_peers(&mut self) {
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

    pub(super) fn reconcile(&mut self) {
        if self.state.reconcile(random_id) {
            self.broadcast_table();
        }
    }
}
