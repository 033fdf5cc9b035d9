//! Dialing: outgoing connection attempts by address ([`Dials`], peer ids are not known before the
//! handshake), the static peers given with `--peer` and how dialing them goes, the periodic redial of
//! static peers and lost members, and paths: a connected member is dialed at each address it announced
//! that no live connection runs over yet (one connection per path; a failing address is retried less
//! and less often, up to [`PATH_BACKOFF_MAX`]). Loopback and unspecified addresses are no paths.

use std::collections::HashMap;
use std::fmt::Display;
use std::time::{Duration, Instant};

use libp2p::swarm::ConnectionId;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::{Multiaddr, PeerId};

use super::handle::StaticPeer;
use super::{NetTask, REDIAL_LOST_FOR, ip_of, strip_p2p};

/// A dial of the same address is not repeated while the previous one may still be under way.
const DIAL_PATIENCE: Duration = Duration::from_secs(10);
/// The longest wait before dialing a path's address again after failures (1 s, 2 s, 4 s, … up to it).
const PATH_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Connection attempts in flight and the static peers.
#[derive(Debug, Default)]
pub(super) struct Dials {
    /// Dials in flight, by address.
    in_flight: HashMap<Multiaddr, Instant>,
    /// Address of each outgoing connection attempt, so a failure names the address that failed.
    by_connection: HashMap<ConnectionId, Multiaddr>,
    /// Static peers (`--peer`), as given and as published in `GET /state`.
    static_addrs: Vec<Multiaddr>,
    static_peers: Vec<StaticPeer>,
    /// Path addresses whose dials failed: how many times in a row, and when last.
    path_failures: HashMap<Multiaddr, (u32, Instant)>,
}

impl Dials {
    pub fn new(static_addrs: Vec<Multiaddr>) -> Self {
        let static_peers = static_addrs
            .iter()
            .map(|a| StaticPeer {
                // Compared with dialed addresses, which libp2p reports without the `/p2p/` suffix.
                addr: strip_p2p(a).to_string(),
                peer: None,
                connected: false,
                failed_dials: 0,
                last_error: None,
            })
            .collect();
        Self {
            static_addrs,
            static_peers,
            ..Self::default()
        }
    }

    pub fn static_peers(&self) -> &[StaticPeer] {
        &self.static_peers
    }

    /// False while a dial of `addr` started less than [`DIAL_PATIENCE`] ago.
    fn may_dial(&self, addr: &Multiaddr) -> bool {
        self.in_flight
            .get(addr)
            .is_none_or(|t| t.elapsed() >= DIAL_PATIENCE)
    }

    fn started(&mut self, addr: Multiaddr, connection: ConnectionId) {
        self.in_flight.insert(addr.clone(), Instant::now());
        self.by_connection.insert(connection, addr);
    }

    /// Whether a path address may be dialed now (no dial in flight, backoff after failures passed).
    fn may_dial_path(&self, addr: &Multiaddr) -> bool {
        self.may_dial(addr)
            && self.path_failures.get(addr).is_none_or(|(n, at)| {
                let wait = Duration::from_secs(1u64 << (*n).min(5)).min(PATH_BACKOFF_MAX);
                at.elapsed() >= wait
            })
    }

    /// A dial of `addr` failed: a static peer at that address counts it.
    pub fn failed(&mut self, addr: &Multiaddr, error: &dyn Display) {
        self.in_flight.remove(addr);
        if let Some((n, at)) = self.path_failures.get_mut(addr) {
            *n += 1;
            *at = Instant::now();
        }
        let plain = strip_p2p(addr).to_string();
        let error = error.to_string();
        for sp in self.static_peers.iter_mut().filter(|sp| sp.addr == plain) {
            sp.failed_dials += 1;
            sp.last_error = Some(error.clone());
            sp.connected = false;
        }
    }

    /// The outgoing attempt `connection` failed: the address it dialed, if it was ours.
    pub fn connection_failed(&mut self, connection: ConnectionId) -> Option<Multiaddr> {
        self.by_connection.remove(&connection)
    }

    /// Connection `connection` to `peer` is up; `dialed` is the address when this node dialed it.
    pub fn established(
        &mut self,
        connection: ConnectionId,
        peer: PeerId,
        dialed: Option<&Multiaddr>,
    ) {
        self.by_connection.remove(&connection);
        let Some(address) = dialed else { return };
        let plain = strip_p2p(address);
        self.path_failures.remove(&plain);
        self.in_flight.remove(address);
        self.in_flight.remove(&plain);
        let plain = plain.to_string();
        let peer = peer.to_string();
        for sp in self.static_peers.iter_mut().filter(|sp| sp.addr == plain) {
            sp.peer = Some(peer.clone());
            sp.connected = true;
        }
    }

    /// Stops dialing the static peers that answered as `peer` (a removed node).
    pub fn forget_peer(&mut self, peer: &str) {
        let mut keep = self
            .static_peers
            .iter()
            .map(|sp| sp.peer.as_deref() != Some(peer));
        self.static_addrs.retain(|_| keep.next().unwrap_or(true));
        self.static_peers
            .retain(|sp| sp.peer.as_deref() != Some(peer));
    }

    /// The last connection to `peer` closed.
    pub fn disconnected(&mut self, peer: &str) {
        for sp in &mut self.static_peers {
            if sp.peer.as_deref() == Some(peer) {
                sp.connected = false;
            }
        }
    }

    /// Marks each static peer connected or not (by the peer id it answered with last) and returns the
    /// addresses of those that are not, to dial again.
    fn static_to_redial(&mut self, connected: &[PeerId]) -> Vec<Multiaddr> {
        let mut out = Vec::new();
        for (sp, addr) in self.static_peers.iter_mut().zip(&self.static_addrs) {
            let up = sp
                .peer
                .as_ref()
                .is_some_and(|p| connected.iter().any(|c| c.to_string() == *p));
            sp.connected = up;
            if !up {
                out.push(addr.clone());
            }
        }
        out
    }
}

impl NetTask {
    pub(super) fn dial(&mut self, addr: Multiaddr) {
        if !self.dials.may_dial(&addr) {
            return;
        }
        // A fresh local port: dialing from the listen port (libp2p's default) lets two nodes that dial each
        // other at the same moment (both found by mDNS) meet in one TCP simultaneous open where both act as
        // the initiator, and the handshake fails on both sides.
        let opts = DialOpts::unknown_peer_id()
            .address(addr.clone())
            .allocate_new_port()
            .build();
        let connection = opts.connection_id();
        match self.swarm.dial(opts) {
            Ok(()) => self.dials.started(addr, connection),
            Err(e) => self.dials.failed(&addr, &e),
        }
    }

    /// Dials `peer` (connected already) at `addr` for another path: a new connection even though one
    /// exists.
    fn dial_path(&mut self, peer: PeerId, addr: Multiaddr) {
        if !self.dials.may_dial_path(&addr) {
            return;
        }
        let opts = DialOpts::peer_id(peer)
            .addresses(vec![addr.clone()])
            .condition(PeerCondition::Always)
            .allocate_new_port()
            .build();
        let connection = opts.connection_id();
        self.dials
            .path_failures
            .entry(addr.clone())
            .or_insert((0, Instant::now()));
        match self.swarm.dial(opts) {
            Ok(()) => self.dials.started(addr, connection),
            Err(e) => self.dials.failed(&addr, &e),
        }
    }

    /// Dials every connected member at each address it announced that no connection covers yet.
    pub(super) fn redial_paths(&mut self) {
        let mut todo = Vec::new();
        for f in self.state.member_facts() {
            let Ok(peer) = f.id.parse::<PeerId>() else {
                continue;
            };
            if peer == self.id || !self.swarm.is_connected(&peer) {
                continue;
            }
            for a in &f.addrs {
                let Ok(addr) = a.parse::<Multiaddr>() else {
                    continue;
                };
                let Some(ip) = ip_of(&addr) else { continue };
                if ip.is_loopback() || ip.is_unspecified() || self.peers.covers(&peer, ip) {
                    continue;
                }
                todo.push((peer, strip_p2p(&addr)));
            }
        }
        for (peer, addr) in todo {
            self.dial_path(peer, addr);
        }
    }

    /// Dials the static peers that are not connected and the lost members at their known addresses.
    pub(super) fn redial(&mut self) {
        let connected: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
        for addr in self.dials.static_to_redial(&connected) {
            self.dial(addr);
        }
        for addr in self
            .peers
            .redial_addrs(REDIAL_LOST_FOR, |p| connected.contains(p))
        {
            self.dial(addr);
        }
        self.redial_paths();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_static_peer_counts_failures_and_knows_its_peer_once_connected() {
        let addr: Multiaddr = "/ip4/10.0.0.9/tcp/7".parse().unwrap();
        let mut dials = Dials::new(vec![addr.clone()]);
        dials.failed(&addr, &"refused");
        dials.failed(&addr, &"refused again");
        let sp = &dials.static_peers()[0];
        assert_eq!(
            (sp.failed_dials, sp.last_error.as_deref()),
            (2, Some("refused again"))
        );

        let peer = PeerId::random();
        assert_eq!(dials.static_to_redial(&[]), vec![addr.clone()]);
        dials.established(ConnectionId::new_unchecked(1), peer, Some(&addr));
        assert!(dials.static_peers()[0].connected);
        assert!(dials.static_to_redial(&[peer]).is_empty());
        let id = peer.to_string();
        dials.disconnected(&id);
        assert!(!dials.static_peers()[0].connected);
        assert_eq!(dials.static_to_redial(&[]), [addr]);
    }

    #[test]
    fn an_address_is_not_dialed_twice_while_a_dial_is_in_flight() {
        let addr: Multiaddr = "/ip4/10.0.0.9/tcp/7".parse().unwrap();
        let mut dials = Dials::new(Vec::new());
        let connection = ConnectionId::new_unchecked(3);
        assert!(dials.may_dial(&addr));
        dials.started(addr.clone(), connection);
        assert!(!dials.may_dial(&addr));
        assert_eq!(dials.connection_failed(connection), Some(addr.clone()));
        dials.failed(&addr, &"timeout");
        assert!(dials.may_dial(&addr));
    }

    #[test]
    fn a_failing_path_address_is_dialed_less_and_less_often() {
        let addr: Multiaddr = "/ip4/10.0.0.9/tcp/7".parse().unwrap();
        let mut dials = Dials::new(Vec::new());
        assert!(dials.may_dial_path(&addr));
        let long_ago = Instant::now() - Duration::from_secs(3);
        dials.path_failures.insert(addr.clone(), (1, long_ago));
        assert!(dials.may_dial_path(&addr), "2 s after one failure");
        dials.path_failures.insert(addr.clone(), (2, long_ago));
        assert!(!dials.may_dial_path(&addr), "4 s after two");
        dials.established(
            ConnectionId::new_unchecked(1),
            PeerId::random(),
            Some(&addr),
        );
        assert!(
            dials.may_dial_path(&addr),
            "a connection clears the failures"
        );
    }
}
