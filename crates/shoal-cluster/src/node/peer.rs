//! Everything the network task knows about the other nodes, one [`Peer`] per node in one map
//! ([`Peers`]): where to redial it, whether it is lost, its live connection's measurements ([`Link`]),
//! the last bandwidth probe and its data-plane traffic. Plain data, tested without a swarm.
//!
//! Forgetting a connection is one `take` of [`Peer::link`]; the entry itself stays, because its
//! addresses are what the redial loop uses while the node is lost, and its last bandwidth is shown again
//! when it comes back (until a new probe answers).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use libp2p::{Multiaddr, PeerId};
use shoal_placement::LinkKind;

use crate::facts::LinkFacts;

/// The live connection to a peer: present from its first connection until the last one closes.
#[derive(Debug, Clone)]
pub(super) struct Link {
    /// Kind of the link, found once per connection (it enumerates interfaces).
    kind: LinkKind,
    /// Latest ping round trip.
    rtt: Option<Duration>,
    /// When the peer last answered a ping (or connected).
    last_pong: Instant,
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

    /// A connection to `peer` was established (its first, or another one next to it).
    pub fn connected(&mut self, peer: PeerId, kind: LinkKind, now: Instant) {
        let p = self.entry(peer);
        let rtt = p.link.as_ref().and_then(|l| l.rtt);
        p.link = Some(Link {
            kind,
            rtt,
            last_pong: now,
        });
        p.lost_since = None;
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

    /// A ping answered after `rtt`; ignored when no connection is known (a late event).
    pub fn pong(&mut self, peer: &PeerId, rtt: Duration, now: Instant) {
        if let Some(link) = self.map.get_mut(peer).and_then(|p| p.link.as_mut()) {
            link.rtt = Some(rtt);
            link.last_pong = now;
        }
    }

    /// Connected peers that answered no ping for longer than `silent_for`.
    pub fn silent(&self, silent_for: Duration) -> Vec<PeerId> {
        self.map
            .iter()
            .filter(|(_, p)| {
                p.link
                    .as_ref()
                    .is_some_and(|l| l.last_pong.elapsed() > silent_for)
            })
            .map(|(id, _)| *id)
            .collect()
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

    pub fn set_bandwidth(&mut self, peer: PeerId, bytes_per_s: f64) {
        self.entry(peer).bandwidth = Some(bytes_per_s);
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

    /// This node's links as published in its facts: one per connected peer, sorted by peer id.
    pub fn link_facts(&self) -> Vec<LinkFacts> {
        let mut links: Vec<LinkFacts> = self
            .map
            .iter()
            .filter_map(|(id, p)| {
                let link = p.link.as_ref()?;
                Some(LinkFacts {
                    peer: id.to_string(),
                    kind: link.kind,
                    rtt_us: link.rtt.map(|d| d.as_secs_f64() * 1e6),
                    bandwidth_bps: p.bandwidth,
                    tx_bytes_per_s: p.traffic.tx_bytes_per_s,
                    rx_bytes_per_s: p.traffic.rx_bytes_per_s,
                    tx_bytes: p.traffic.tx_bytes,
                    rx_bytes: p.traffic.rx_bytes,
                })
            })
            .collect();
        links.sort_by(|a, b| a.peer.cmp(&b.peer));
        links
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

    #[test]
    fn a_lost_connection_goes_at_once_but_its_addresses_stay_for_redialing() {
        let mut peers = Peers::default();
        let a = PeerId::random();
        let now = Instant::now();
        peers.learn_addr(a, addr(1));
        peers.learn_addr(a, addr(1));
        peers.connected(a, LinkKind::Loopback, now);
        peers.pong(&a, Duration::from_micros(250), now);
        peers.set_bandwidth(a, 1e9);
        assert_eq!(peers.link_facts().len(), 1);
        assert_eq!(peers.link_facts()[0].rtt_us, Some(250.0));

        peers.disconnected(&a);
        peers.lost(a, now);
        assert!(peers.link_facts().is_empty());
        assert!(
            peers.silent(Duration::ZERO).is_empty(),
            "no connection, no silence"
        );
        peers.pong(&a, Duration::from_micros(9), now);
        assert!(
            peers.get(&a).unwrap().link.is_none(),
            "a late pong connects nothing"
        );
        assert_eq!(
            peers.redial_addrs(Duration::from_secs(600), |_| false),
            [addr(1)]
        );

        // Back: the rtt starts over, the last bandwidth shows until a new probe answers.
        peers.connected(a, LinkKind::Loopback, now);
        let link = &peers.link_facts()[0];
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
        let long_ago = Instant::now() - Duration::from_secs(5);
        peers.connected(a, LinkKind::Ethernet, long_ago);
        peers.pong(&a, Duration::from_millis(1), long_ago);
        assert_eq!(peers.silent(Duration::from_secs(2)), [a]);
        peers.connected(a, LinkKind::Ethernet, Instant::now());
        assert!(peers.silent(Duration::from_secs(2)).is_empty());
        assert_eq!(peers.link_facts()[0].rtt_us, Some(1000.0));
    }

    #[test]
    fn traffic_rates_are_per_second_since_the_last_sample() {
        let mut peers = Peers::default();
        let a = PeerId::random();
        peers.connected(a, LinkKind::Ethernet, Instant::now());
        peers.record_traffic(HashMap::from([(a, (100, 50))]), 1.0);
        peers.record_traffic(HashMap::from([(a, (300, 60))]), 2.0);
        let link = &peers.link_facts()[0];
        assert_eq!((link.tx_bytes, link.rx_bytes), (300, 60));
        assert_eq!((link.tx_bytes_per_s, link.rx_bytes_per_s), (100.0, 5.0));
    }
}
