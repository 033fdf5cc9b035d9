//! Everything the network task knows about the other nodes, one [`Peer`] per node in one map
//! ([`Peers`]): where to redial it, whether it is lost, its live connections ([`Link`]: one path per
//! connection, with its own measurements, see `paths`), the last bandwidth probe and its data-plane
//! traffic. Plain data, tested without a swarm.
//!
//! Forgetting a connection is one `take` of [`Peer::link`]; the entry itself stays, because its
//! addresses are what the redial loop uses while the node is lost, and its last bandwidth is shown again
//! when it comes back (until a new probe answers).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use libp2p::swarm::ConnectionId;
use libp2p::{Multiaddr, PeerId};
use shoal_placement::LinkKind;

use super::paths::{PathBook, PeerPaths};
use crate::facts::LinkFacts;

/// The live connections to a peer: present from its first connection until the last one closes.
#[derive(Debug, Clone)]
pub(super) struct Link {
    /// Kind of the link, found once per connection (it enumerates interfaces).
    kind: LinkKind,
    /// One path per connection; the preferred one's measurements are the link's.
    paths: PeerPaths,
}

/// Data-plane bytes to and from a peer: totals at the last facts refresh and rates since the one before.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct TrafficSample {
    tx_bytes: u64,
    rx_bytes: u64,
    tx_bytes_per_s: f64,
    rx_bytes_per_s: f64,
}

/// What this node knows about one other node.
#[derive(Debug, Clone, Default)]
pub(super) struct Peer {
    /// Addresses it announced or was discovered at; redialed while it is lost.
    addrs: Vec<Multiaddr>,
    /// Set while it is redialed: since its last connection closed (or since mDNS found it unconnected).
    lost_since: Option<Instant>,
    link: Option<Link>,
    /// Bytes per second measured by the last bandwidth probe.
    bandwidth: Option<f64>,
    traffic: TrafficSample,
    /// Its host name from its last facts (kept while it is lost, for `shoal doctor`).
    name: Option<String>,
}

/// One peer as `shoal doctor` sees it ([`Peers::doctor_view`]).
#[derive(Debug, Clone)]
pub(super) struct DoctorView {
    pub kind: Option<LinkKind>,
    /// The preferred path's connection and the peer's address on it; `None` without a connection.
    pub preferred: Option<(ConnectionId, IpAddr)>,
    pub lost_since: Option<Instant>,
    pub addrs: Vec<Multiaddr>,
    /// Its host name, when its facts ever arrived.
    pub name: Option<String>,
}

/// Every peer this node has heard of, by id.
#[derive(Debug, Default)]
pub(super) struct Peers {
    map: HashMap<PeerId, Peer>,
}

impl Peers {
    fn entry(&mut self, peer: PeerId) -> &mut Peer {
        self.map.entry(peer).or_default()
    }

    /// Connection `connection` to `peer`, over its address `addr`, was established (its first, or
    /// another one next to it).
    pub fn connected(
        &mut self,
        peer: PeerId,
        connection: ConnectionId,
        addr: IpAddr,
        kind: LinkKind,
        now: Instant,
    ) {
        let p = self.entry(peer);
        let link = p.link.get_or_insert_with(|| Link {
            kind,
            paths: PeerPaths::default(),
        });
        link.kind = kind;
        link.paths.add(connection, addr, now);
        p.lost_since = None;
    }

    /// Connection `connection` to `peer` closed (or is being closed); true when it was the last one.
    pub fn closed(&mut self, peer: &PeerId, connection: ConnectionId) -> bool {
        let Some(p) = self.map.get_mut(peer) else {
            return true;
        };
        let Some(link) = p.link.as_mut() else {
            return true;
        };
        if link.paths.remove(connection) {
            p.link = None;
            return true;
        }
        false
    }

    /// The last connection to `peer` closed (or is being closed): everything about it goes at once.
    pub fn disconnected(&mut self, peer: &PeerId) {
        if let Some(p) = self.map.get_mut(peer) {
            p.link = None;
        }
    }

    /// Everything about `peer` goes, its addresses too: it is never redialed (a removed node).
    pub fn forget(&mut self, peer: &PeerId) {
        self.map.remove(peer);
    }

    /// Redial `peer` from now on (until it connects or [`Peers::redial_addrs`] gives up).
    pub fn lost(&mut self, peer: PeerId, now: Instant) {
        self.entry(peer).lost_since = Some(now);
    }

    /// Like [`Peers::lost`], but keeps an earlier start.
    pub fn lost_unless_already(&mut self, peer: PeerId, now: Instant) {
        self.entry(peer).lost_since.get_or_insert(now);
    }

    /// A ping on `connection` answered after `rtt`; ignored when the connection is not known (a late
    /// event).
    pub fn pong(&mut self, peer: &PeerId, connection: ConnectionId, rtt: Duration, now: Instant) {
        if let Some(link) = self.map.get_mut(peer).and_then(|p| p.link.as_mut()) {
            link.paths.pong(connection, rtt, now);
        }
    }

    /// Connections to close for silence: all of a peer's when none answered a ping for `silent_for`,
    /// else those silent for `paths::PATH_SILENT_FOR`.
    pub fn silent(&self, silent_for: Duration) -> Vec<(PeerId, ConnectionId)> {
        self.map
            .iter()
            .filter_map(|(id, p)| Some((id, p.link.as_ref()?)))
            .flat_map(|(id, l)| l.paths.silent(silent_for).into_iter().map(|c| (*id, c)))
            .collect()
    }

    /// How many live connections to `peer` there are.
    pub fn paths(&self, peer: &PeerId) -> usize {
        self.map
            .get(peer)
            .and_then(|p| p.link.as_ref())
            .map_or(0, |l| l.paths.len())
    }

    /// Whether a live connection to `peer` runs over its address `ip`.
    pub fn covers(&self, peer: &PeerId, ip: IpAddr) -> bool {
        self.map
            .get(peer)
            .and_then(|p| p.link.as_ref())
            .is_some_and(|l| l.paths.covers(ip))
    }

    /// Connections due for a bandwidth probe now, with the bytes each probe sends (see
    /// `PeerPaths::due_for_probe`).
    pub fn due_for_probe(&mut self, now: Instant) -> Vec<(PeerId, ConnectionId, usize)> {
        let mut due = Vec::new();
        for (id, p) in &mut self.map {
            if let Some(l) = p.link.as_mut() {
                let paths = l.paths.due_for_probe(now);
                due.extend(paths.into_iter().map(|(c, bytes)| (*id, c, bytes)));
            }
        }
        due
    }

    /// Probes every path to `peer` again soon.
    pub fn reprobe(&mut self, peer: &PeerId) {
        if let Some(l) = self.map.get_mut(peer).and_then(|p| p.link.as_mut()) {
            l.paths.reprobe();
        }
    }

    /// The preferred and live paths of every connected peer, for the data plane.
    pub fn path_book(&self) -> PathBook {
        PathBook::collect(
            self.map
                .iter()
                .filter_map(|(id, p)| Some((id, &p.link.as_ref()?.paths))),
        )
    }

    /// Remembers `peer`'s host name (from its facts).
    pub fn set_name(&mut self, peer: PeerId, name: &str) {
        let p = self.entry(peer);
        if p.name.as_deref() != Some(name) {
            p.name = Some(name.to_string());
        }
    }

    /// Adds an address to dial `peer` at, if new.
    pub fn learn_addr(&mut self, peer: PeerId, addr: Multiaddr) {
        let known = &mut self.entry(peer).addrs;
        if !known.contains(&addr) {
            known.push(addr);
        }
    }

    /// Replaces the addresses to dial `peer` at.
    pub fn set_addrs(&mut self, peer: PeerId, addrs: Vec<Multiaddr>) {
        self.entry(peer).addrs = addrs;
    }

    /// A bandwidth probe on `connection` to `peer` measured `bytes_per_s` (kept for the peer too when
    /// that connection is its preferred path, and shown again while a reconnected link is unprobed).
    pub fn set_bandwidth(&mut self, peer: PeerId, connection: ConnectionId, bytes_per_s: f64) {
        let p = self.entry(peer);
        if let Some(link) = p.link.as_mut() {
            link.paths.set_bandwidth(connection, bytes_per_s);
            if link.paths.preferred().is_some_and(|(c, _)| c == connection) {
                p.bandwidth = Some(bytes_per_s);
            }
        }
    }

    /// Stops redialing peers lost for `give_up_after` or more, and those connected again
    /// (`is_connected`); returns the addresses of the others, to dial now.
    pub fn redial_addrs(
        &mut self,
        give_up_after: Duration,
        is_connected: impl Fn(&PeerId) -> bool,
    ) -> Vec<Multiaddr> {
        let mut addrs = Vec::new();
        for (id, p) in &mut self.map {
            let Some(since) = p.lost_since else { continue };
            if since.elapsed() >= give_up_after || is_connected(id) {
                p.lost_since = None;
                continue;
            }
            addrs.extend(p.addrs.iter().cloned());
        }
        addrs
    }

    /// New data-plane byte totals per peer, `secs` after the previous ones: updates each peer's rates.
    pub fn record_traffic(&mut self, totals: HashMap<PeerId, (u64, u64)>, secs: f64) {
        for (peer, (tx, rx)) in totals {
            let t = &mut self.entry(peer).traffic;
            *t = TrafficSample {
                tx_bytes: tx,
                rx_bytes: rx,
                tx_bytes_per_s: tx.saturating_sub(t.tx_bytes) as f64 / secs,
                rx_bytes_per_s: rx.saturating_sub(t.rx_bytes) as f64 / secs,
            };
        }
    }

    /// This node's links as published in its facts: one per connected peer, sorted by peer id, with
    /// the preferred path's measurements and every path (`streams`: the instances whose data-plane
    /// streams run on each connection).
    pub fn link_facts(&self, streams: &super::pathstream::StreamsOn) -> Vec<LinkFacts> {
        let mut links: Vec<LinkFacts> = self
            .map
            .iter()
            .filter_map(|(id, p)| {
                let link = p.link.as_ref()?;
                let best = link.paths.preferred().map(|(_, path)| path);
                Some(LinkFacts {
                    peer: super::node_id(id),
                    kind: link.kind,
                    rtt_us: best.and_then(|b| b.rtt).map(|d| d.as_secs_f64() * 1e6),
                    bandwidth_bps: best.and_then(|b| b.bandwidth).or(p.bandwidth),
                    tx_bytes_per_s: p.traffic.tx_bytes_per_s,
                    rx_bytes_per_s: p.traffic.rx_bytes_per_s,
                    tx_bytes: p.traffic.tx_bytes,
                    rx_bytes: p.traffic.rx_bytes,
                    paths: link.paths.facts(streams),
                })
            })
            .collect();
        links.sort_by(|a, b| a.peer.cmp(&b.peer));
        links
    }

    /// What `shoal doctor` checks: every peer with a live connection (its link kind and preferred
    /// path) or still being redialed after it was lost (since when, at which addresses).
    pub fn doctor_view(&self) -> Vec<(PeerId, DoctorView)> {
        self.map
            .iter()
            .filter(|(_, p)| p.link.is_some() || p.lost_since.is_some())
            .map(|(id, p)| {
                let view = DoctorView {
                    kind: p.link.as_ref().map(|l| l.kind),
                    preferred: p
                        .link
                        .as_ref()
                        .and_then(|l| l.paths.preferred())
                        .map(|(c, path)| (c, path.addr)),
                    lost_since: p.lost_since,
                    addrs: p.addrs.clone(),
                    name: p.name.clone(),
                };
                (*id, view)
            })
            .collect()
    }

    #[cfg(test)]
    fn get(&self, peer: &PeerId) -> Option<&Peer> {
        self.map.get(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> Multiaddr {
        format!("/ip4/127.0.0.1/tcp/{port}").parse().unwrap()
    }

    const LO: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn c(n: usize) -> ConnectionId {
        ConnectionId::new_unchecked(n)
    }

    fn facts(peers: &Peers) -> Vec<LinkFacts> {
        peers.link_facts(&super::super::pathstream::StreamsOn::default())
    }

    #[test]
    fn a_lost_connection_goes_at_once_but_its_addresses_stay_for_redialing() {
        let mut peers = Peers::default();
        let a = PeerId::random();
        let now = Instant::now();
        peers.learn_addr(a, addr(1));
        peers.learn_addr(a, addr(1));
        peers.connected(a, c(1), LO, LinkKind::Loopback, now);
        peers.pong(&a, c(1), Duration::from_micros(250), now);
        peers.set_bandwidth(a, c(1), 1e9);
        assert_eq!(facts(&peers).len(), 1);
        assert_eq!(facts(&peers)[0].rtt_us, Some(250.0));

        peers.disconnected(&a);
        peers.lost(a, now);
        assert!(facts(&peers).is_empty());
        assert!(
            peers.silent(Duration::ZERO).is_empty(),
            "no connection, no silence"
        );
        peers.pong(&a, c(1), Duration::from_micros(9), now);
        assert!(
            peers.get(&a).unwrap().link.is_none(),
            "a late pong connects nothing"
        );
        assert_eq!(
            peers.redial_addrs(Duration::from_secs(600), |_| false),
            [addr(1)]
        );

        // Back: the rtt starts over, the last bandwidth shows until a new probe answers.
        peers.connected(a, c(2), LO, LinkKind::Loopback, now);
        let link = &facts(&peers)[0];
        assert_eq!((link.rtt_us, link.bandwidth_bps), (None, Some(1e9)));
        assert!(
            peers
                .redial_addrs(Duration::from_secs(600), |_| false)
                .is_empty()
        );
    }

    #[test]
    fn redialing_stops_when_connected_or_after_the_deadline() {
        let mut peers = Peers::default();
        let (a, b) = (PeerId::random(), PeerId::random());
        peers.set_addrs(a, vec![addr(1), addr(2)]);
        peers.set_addrs(b, vec![addr(3)]);
        peers.lost(a, Instant::now());
        peers.lost_unless_already(b, Instant::now());
        let mut got = peers.redial_addrs(Duration::from_secs(600), |p| *p == b);
        got.sort();
        assert_eq!(got, [addr(1), addr(2)]);
        assert!(peers.get(&b).unwrap().lost_since.is_none());
        assert!(peers.redial_addrs(Duration::ZERO, |_| false).is_empty());
        assert!(peers.get(&a).unwrap().lost_since.is_none());
    }

    #[test]
    fn silent_peers_and_a_second_connection_keeps_the_rtt() {
        let mut peers = Peers::default();
        let a = PeerId::random();
        let long_ago = Instant::now() - Duration::from_secs(3);
        peers.connected(a, c(1), LO, LinkKind::Ethernet, long_ago);
        peers.pong(&a, c(1), Duration::from_millis(1), long_ago);
        assert_eq!(peers.silent(Duration::from_secs(2)), [(a, c(1))]);
        // A second connection is a second path: the silent one goes only after PATH_SILENT_FOR.
        peers.connected(a, c(2), LO, LinkKind::Ethernet, Instant::now());
        assert!(
            peers.silent(Duration::from_secs(2)).is_empty(),
            "3 s < PATH_SILENT_FOR"
        );
        assert_eq!(peers.paths(&a), 2);
        assert_eq!(facts(&peers)[0].rtt_us, Some(1000.0));
        assert!(!peers.closed(&a, c(1)), "one path left");
        assert!(peers.silent(Duration::from_secs(2)).is_empty());
        assert!(peers.covers(&a, LO));
        assert!(peers.closed(&a, c(2)), "the last path closed");
        assert!(facts(&peers).is_empty());
    }

    #[test]
    fn traffic_rates_are_per_second_since_the_last_sample() {
        let mut peers = Peers::default();
        let a = PeerId::random();
        peers.connected(a, c(1), LO, LinkKind::Ethernet, Instant::now());
        peers.record_traffic(HashMap::from([(a, (100, 50))]), 1.0);
        peers.record_traffic(HashMap::from([(a, (300, 60))]), 2.0);
        let link = &facts(&peers)[0];
        assert_eq!((link.tx_bytes, link.rx_bytes), (300, 60));
        assert_eq!((link.tx_bytes_per_s, link.rx_bytes_per_s), (100.0, 5.0));
    }

    #[test]
    fn the_doctor_sees_connected_and_lost_peers_with_their_names() {
        let mut peers = Peers::default();
        let (a, gone, forgotten) = (PeerId::random(), PeerId::random(), PeerId::random());
        let now = Instant::now();
        peers.connected(a, c(1), LO, LinkKind::Ethernet, now);
        peers.set_name(a, "desk");
        peers.connected(gone, c(2), LO, LinkKind::Wifi, now);
        peers.set_name(gone, "laptop");
        peers.learn_addr(gone, addr(7));
        peers.disconnected(&gone);
        peers.lost(gone, now);
        peers.learn_addr(forgotten, addr(8)); // never connected, not redialed: not shown
        let mut view = peers.doctor_view();
        view.sort_by_key(|(id, _)| *id != a);
        assert_eq!(view.len(), 2);
        let (id, v) = &view[0];
        assert_eq!(*id, a);
        assert_eq!(v.preferred, Some((c(1), LO)));
        assert_eq!(
            (v.kind, v.name.as_deref()),
            (Some(LinkKind::Ethernet), Some("desk"))
        );
        let (id, v) = &view[1];
        assert_eq!(*id, gone);
        assert_eq!((v.preferred, v.kind), (None, None));
        assert_eq!(
            v.name.as_deref(),
            Some("laptop"),
            "the name outlives the connection"
        );
        assert_eq!((v.lost_since, v.addrs.clone()), (Some(now), vec![addr(7)]));
    }
}
