//! Swarm events of the network task — connections opening and closing, failed dials, pings, mDNS — and
//! failure detection, per path: a peer's only connection is closed when its ping failed or it stayed
//! silent for [`SILENT_FOR`], one of several after a longer silence (`paths::PATH_SILENT_FOR`); a peer whose last connection closed (or was closed so) is forgotten, and
//! the coordinator re-places the instances it ran. A peer with another live path stays a member.

use std::net::{IpAddr, Ipv4Addr};
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
                connection_id,
                num_established,
                cause,
                ..
            } => {
                let last_path = self.peers.closed(&peer_id, connection_id);
                if num_established == 0 {
                    let why = match cause {
                        Some(e) => format!("connection closed: {e}"),
                        None => "connection closed".to_string(),
                    };
                    self.forget(peer_id, &why);
                } else if last_path {
                    tracing::debug!(%peer_id, "last path closed, other connections still closing");
                }
            }
            SwarmEvent::OutgoingConnectionError {
                error,
                connection_id,
                ..
            } => self.on_dial_error(connection_id, &error),
            SwarmEvent::Behaviour(BehaviourEvent::Ping(ping::Event {
                peer,
                connection,
                result,
            })) => self.on_ping(peer, connection, result),
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
        let stale = dialed
            .is_none()
            .then(|| self.keys.take_stale(remote))
            .flatten();
        if !self.admit(peer, connection, stale) {
            return;
        }
        self.dials.established(connection, peer, dialed);
        let ip = ip_of(remote);
        let kind = ip.map_or(LinkKind::Unknown, facts::link_kind);
        let ip = ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        self.peers
            .connected(peer, connection, ip, kind, Instant::now());
        let id = peer.to_string();
        self.state.peer_connected(&id);
        tracing::debug!(%peer, %remote, "connected");
        // The key ring first (a member back with an earlier key needs the current one), then publish
        // the new link at once (placement needs it), then greet the peer.
        self.send_keys(peer);
        self.refresh_own_facts();
        self.push_facts();
        self.send_facts_to(peer);
    }

    fn on_dial_error(&mut self, connection: ConnectionId, error: &DialError) {
        if let Some(addr) = self.dials.connection_failed(connection) {
            self.dials.failed(&addr, error);
        }
        tracing::debug!("dial failed: {error}");
    }

    fn on_ping(
        &mut self,
        peer: PeerId,
        connection: ConnectionId,
        result: Result<std::time::Duration, ping::Failure>,
    ) {
        match result {
            Ok(rtt) => self.peers.pong(&peer, connection, rtt, Instant::now()),
            // With another path, a failed ping may be congestion: the silence check decides.
            Err(e) if self.peers.paths(&peer) > 1 => {
                tracing::debug!(%peer, ?connection, "ping failed ({e}) on one of several paths");
            }
            Err(e) => self.drop_path(peer, connection, &format!("ping failed ({e})")),
        }
    }

    /// Closes one connection to `peer` and stops using it as a path; the peer is forgotten when it was
    /// its last.
    pub(super) fn drop_path(&mut self, peer: PeerId, connection: ConnectionId, why: &str) {
        let _ = self.swarm.close_connection(connection);
        if self.peers.closed(&peer, connection) {
            tracing::warn!(%peer, "{why} on its last path: dropping the peer");
            let _ = self.swarm.disconnect_peer_id(peer);
            self.forget(peer, why);
        } else {
            tracing::warn!(%peer, ?connection, "{why}: closing that path, others remain");
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
        for (peer, connection) in self.peers.silent(SILENT_FOR) {
            self.drop_path(peer, connection, &format!("no pong for {SILENT_FOR:?}"));
        }
        self.probe_due();
    }

    /// A peer is gone: drop it from membership and let the coordinator re-place its instances.
    fn forget(&mut self, peer: PeerId, why: &str) {
        self.peers.disconnected(&peer);
        let id = peer.to_string();
        if self.state.peer_gone(&id) {
            tracing::warn!(%peer, "member left: {why}");
            metrics::counter!("shoal_membership_changes_total", "change" => "leave").increment(1);
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
