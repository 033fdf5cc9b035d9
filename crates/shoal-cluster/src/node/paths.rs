//! Paths to a peer: every live connection to it is a path over one of its addresses ([`Path`]), with its
//! own ping round trip and bandwidth probe. [`PeerPaths`] keeps one peer's, picks the one the data plane
//! should use (the cheapest to carry [`REFERENCE_BYTES`]: `rtt + bytes / bandwidth`, moving away from the
//! one in use only when another is cheaper by [`SWITCH_MARGIN`], or at once when it dies; never to a
//! connection not probed yet while another is measured, nor between two connections over one address)
//! and says what to publish ([`PathFacts`]). [`PathBook`] is what the network task hands the data
//! plane after every change: the preferred connection per peer and which connections are alive. Plain
//! data, tested without a swarm.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use libp2p::PeerId;
use libp2p::swarm::ConnectionId;

use super::PROBE_BYTES;
use crate::facts::PathFacts;

/// The message size paths are compared on: an activation batch of a few hundred rows (a decode step of
/// a small model is smaller, a prompt chunk of a big one larger).
pub const REFERENCE_BYTES: f64 = 64.0 * 1024.0;
/// Bandwidth assumed for a path not probed yet (a modest network), in the cost it shows before its
/// probe; such a path is chosen only while no path is measured (see [`choose`]).
const UNMEASURED_BPS: f64 = 12.5e6;
/// A path replaces the one in use only when it costs less by this share of the current cost …
const SWITCH_MARGIN: f64 = 0.25;
/// … and by at least this much (round trips jitter by tens of microseconds).
const SWITCH_SLACK_US: f64 = 100.0;
/// A path's round trip is the least of its pings over this long: the path's own delay, not the queueing
/// of a moment when either node was busy (a ping crosses both nodes' async runtimes, and on a loaded
/// node those add milliseconds that a data-plane lane's small message — a hop, a group's exchange —
/// does not meet). A path that truly grew slower shows it once its faster pings leave the window.
const RTT_WINDOW: Duration = Duration::from_secs(10);
/// A path is probed for bandwidth this often while its peer has paths over two or more addresses.
pub const REPROBE_EVERY: Duration = Duration::from_secs(2);
/// Bytes of a probe on a peer with paths over several addresses, and of a repeated probe: small, it
/// runs beside the data plane (on a slow path, all it sends queues in front of the pings).
pub const REPROBE_BYTES: usize = 128 << 10;
/// A repeated probe of a measured path sends about this long's worth of its measured bandwidth …
const REPROBE_SPAN: Duration = Duration::from_millis(50);
/// … and at least this many bytes.
const MIN_REPROBE_BYTES: usize = 16 << 10;
/// A connection whose peer answers pings on another is closed after this long without a pong.
pub const PATH_SILENT_FOR: Duration = Duration::from_secs(4);

/// One connection to a peer.
#[derive(Debug, Clone)]
pub struct Path {
    /// The peer's address on this path (the dialed address, or where its connection came from).
    pub addr: IpAddr,
    /// The least ping round trip of the last [`RTT_WINDOW`].
    pub rtt: Option<Duration>,
    /// The pings of the last [`RTT_WINDOW`]: when each was answered and its round trip.
    pings: std::collections::VecDeque<(Instant, Duration)>,
    /// When the peer last answered a ping on this connection (or connected).
    pub last_pong: Instant,
    /// Bytes per second measured by the last probe on this connection.
    pub bandwidth: Option<f64>,
    /// When a probe was last started on it.
    pub probed_at: Option<Instant>,
}

impl Path {
    fn new(addr: IpAddr, now: Instant) -> Self {
        Path {
            addr,
            rtt: None,
            pings: std::collections::VecDeque::new(),
            last_pong: now,
            bandwidth: None,
            probed_at: None,
        }
    }

    /// Whether a probe measured this path's bandwidth.
    fn is_measured(&self) -> bool {
        self.bandwidth.is_some_and(|b| b.is_finite() && b > 0.0)
    }

    /// Predicted microseconds to carry [`REFERENCE_BYTES`] one way and hear back: rtt + bytes / rate.
    pub fn cost_us(&self) -> f64 {
        let rtt = self.rtt.map_or(1000.0, |d| d.as_secs_f64() * 1e6);
        let bps = match self.bandwidth {
            Some(b) if self.is_measured() => b,
            _ => UNMEASURED_BPS,
        };
        rtt + REFERENCE_BYTES / bps * 1e6
    }
}

/// The paths to one peer and the one the data plane should use.
#[derive(Debug, Clone, Default)]
pub struct PeerPaths {
    paths: BTreeMap<ConnectionId, Path>,
    preferred: Option<ConnectionId>,
}

impl PeerPaths {
    /// A new connection over the peer's address `addr`.
    pub fn add(&mut self, connection: ConnectionId, addr: IpAddr, now: Instant) {
        self.paths.insert(connection, Path::new(addr, now));
        self.reselect();
    }

    /// The connection closed (or is being closed): it is no path any more. True when none is left.
    pub fn remove(&mut self, connection: ConnectionId) -> bool {
        self.paths.remove(&connection);
        self.reselect();
        self.paths.is_empty()
    }

    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// A ping on `connection` answered after `rtt`.
    pub fn pong(&mut self, connection: ConnectionId, rtt: Duration, now: Instant) {
        if let Some(p) = self.paths.get_mut(&connection) {
            while p
                .pings
                .front()
                .is_some_and(|&(at, _)| now.saturating_duration_since(at) > RTT_WINDOW)
            {
                p.pings.pop_front();
            }
            p.pings.push_back((now, rtt));
            p.rtt = p.pings.iter().map(|&(_, r)| r).min();
            p.last_pong = now;
            self.reselect();
        }
    }

    /// A bandwidth probe on `connection` measured `bytes_per_s`.
    pub fn set_bandwidth(&mut self, connection: ConnectionId, bytes_per_s: f64) {
        if let Some(p) = self.paths.get_mut(&connection) {
            p.bandwidth = Some(bytes_per_s);
            self.reselect();
        }
    }

    /// Connections to close for silence: every one when none answered a ping for `silent_for` (the
    /// peer is gone), else those silent for [`PATH_SILENT_FOR`] (a congested path's pings wait behind
    /// its traffic: it is not dropped as fast as a dead peer).
    pub fn silent(&self, silent_for: Duration) -> Vec<ConnectionId> {
        let all = self
            .paths
            .values()
            .all(|p| p.last_pong.elapsed() > silent_for);
        let limit = if all { silent_for } else { PATH_SILENT_FOR };
        self.paths
            .iter()
            .filter(|(_, p)| p.last_pong.elapsed() > limit)
            .map(|(c, _)| *c)
            .collect()
    }

    /// How many paths there are.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// Whether some connection runs over the peer's address `ip`.
    pub fn covers(&self, ip: IpAddr) -> bool {
        self.paths.values().any(|p| p.addr == ip)
    }

    /// The path the data plane should use.
    pub fn preferred(&self) -> Option<(ConnectionId, &Path)> {
        let c = self.preferred?;
        Some((c, self.paths.get(&c)?))
    }

    /// Connections due for a bandwidth probe at `now` (marked as probed), each with the bytes its probe
    /// sends: each new one once, and every [`REPROBE_EVERY`] while the peer has paths over two
    /// addresses or more (with one, there is no choice to make and the probe would only disturb the
    /// data plane). The first probe of a peer with one address is a full one ([`PROBE_BYTES`]); with
    /// several, a probe sends at most [`REPROBE_BYTES`], and one of a measured path about
    /// [`REPROBE_SPAN`] of its bandwidth (at least [`MIN_REPROBE_BYTES`]): a degraded path is not
    /// flooded by its own measurement every few seconds, in front of the data plane's bytes.
    pub fn due_for_probe(&mut self, now: Instant) -> Vec<(ConnectionId, usize)> {
        let several = self
            .paths
            .values()
            .any(|p| self.paths.values().next().is_some_and(|q| q.addr != p.addr));
        let mut due = Vec::new();
        for (c, p) in &mut self.paths {
            let due_now = match p.probed_at {
                None => true,
                Some(t) => several && now.duration_since(t) >= REPROBE_EVERY,
            };
            if due_now {
                let bytes = match p.bandwidth {
                    // With one address a path is probed only when new (or asked to be again).
                    _ if !several => PROBE_BYTES,
                    Some(bps) if p.is_measured() => ((bps * REPROBE_SPAN.as_secs_f64()) as usize)
                        .clamp(MIN_REPROBE_BYTES, REPROBE_BYTES),
                    _ => REPROBE_BYTES,
                };
                due.push((*c, bytes));
                p.probed_at = Some(now);
            }
        }
        due
    }

    /// Probes every path again at the next chance (a full probe).
    pub fn reprobe(&mut self) {
        for p in self.paths.values_mut() {
            p.probed_at = None;
        }
    }

    /// Keeps the preferred path unless it is gone or another is cheaper by the margin.
    fn reselect(&mut self) {
        self.preferred = choose(&self.paths, self.preferred);
    }

    /// What is published: one entry per address (its best connection), cheapest first.
    pub fn facts(&self, streams: &super::pathstream::StreamsOn) -> Vec<PathFacts> {
        let mut by_addr: BTreeMap<IpAddr, PathFacts> = BTreeMap::new();
        for (c, p) in &self.paths {
            let users = streams.instances.get(c).cloned().unwrap_or_default();
            let relayed = streams.relayed.get(c).cloned().unwrap_or_default();
            let f = PathFacts {
                addr: p.addr.to_string(),
                rtt_us: p.rtt.map(|d| d.as_secs_f64() * 1e6),
                bandwidth_bps: p.bandwidth,
                cost_us: p.cost_us(),
                preferred: self.preferred == Some(*c),
                instances: users,
                relayed,
            };
            by_addr
                .entry(p.addr)
                .and_modify(|e| {
                    let mut instances = std::mem::take(&mut e.instances);
                    instances.extend(f.instances.iter().cloned());
                    let mut relayed = std::mem::take(&mut e.relayed);
                    relayed.extend(f.relayed.iter().cloned());
                    if f.preferred || (!e.preferred && f.cost_us < e.cost_us) {
                        *e = f.clone();
                    }
                    for v in [&mut instances, &mut relayed] {
                        v.sort();
                        v.dedup();
                    }
                    e.instances = instances;
                    e.relayed = relayed;
                })
                .or_insert(f);
        }
        let mut out: Vec<PathFacts> = by_addr.into_values().collect();
        out.sort_by(|a, b| a.cost_us.total_cmp(&b.cost_us));
        out
    }

    fn connections(&self) -> Vec<ConnectionId> {
        self.paths.keys().copied().collect()
    }
}

/// The path to use among `paths`, given the one in use now: the cheapest, unless the current one is
/// alive and within [`SWITCH_MARGIN`] (and [`SWITCH_SLACK_US`]) of it, or over the same address. While
/// any path has a measured bandwidth only those are candidates: a connection not probed yet (a path
/// coming back, or one redialed right after it was dropped for silence) takes over once its probe says
/// it is faster, never on the guess of [`UNMEASURED_BPS`].
pub fn choose(
    paths: &BTreeMap<ConnectionId, Path>,
    current: Option<ConnectionId>,
) -> Option<ConnectionId> {
    let any_measured = paths.values().any(Path::is_measured);
    let candidate = |p: &Path| !any_measured || p.is_measured();
    let (best, best_path) = paths
        .iter()
        .filter(|(_, p)| candidate(p))
        .min_by(|a, b| a.1.cost_us().total_cmp(&b.1.cost_us()))?;
    if let Some(cur) = current.and_then(|c| paths.get(&c).map(|p| (c, p)))
        && candidate(cur.1)
    {
        let (c, p) = cur;
        let gain = p.cost_us() - best_path.cost_us();
        // Two connections over one address are one network path: what tells them apart is jitter.
        if best_path.addr == p.addr || gain < SWITCH_SLACK_US || gain < SWITCH_MARGIN * p.cost_us()
        {
            return Some(c);
        }
    }
    Some(*best)
}

/// One path as the data plane sees it: the connection, and the peer's address on it (for `/state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathId {
    pub connection: ConnectionId,
    pub addr: IpAddr,
}

/// The paths of every connected peer, as published to the data plane.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PathBook {
    preferred: HashMap<PeerId, PathId>,
    alive: HashMap<PeerId, Vec<ConnectionId>>,
}

impl PathBook {
    /// Collects the book from every peer's paths.
    pub fn collect<'a>(peers: impl Iterator<Item = (&'a PeerId, &'a PeerPaths)>) -> Self {
        let mut book = PathBook::default();
        for (id, paths) in peers {
            if let Some((connection, p)) = paths.preferred() {
                book.preferred.insert(
                    *id,
                    PathId {
                        connection,
                        addr: p.addr,
                    },
                );
            }
            book.alive.insert(*id, paths.connections());
        }
        book
    }

    /// The path streams to `peer` should use now.
    pub fn preferred(&self, peer: &PeerId) -> Option<PathId> {
        self.preferred.get(peer).copied()
    }

    /// Whether `connection` to `peer` is still a live path.
    pub fn is_alive(&self, peer: &PeerId, connection: ConnectionId) -> bool {
        self.alive
            .get(peer)
            .is_some_and(|cs| cs.contains(&connection))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn c(n: usize) -> ConnectionId {
        ConnectionId::new_unchecked(n)
    }

    /// Two paths: 1 over 10.0.0.2, 2 over 10.1.0.2, both answering pings in 200 µs.
    fn two() -> PeerPaths {
        let now = Instant::now();
        let mut p = PeerPaths::default();
        p.add(c(1), ip("10.0.0.2"), now);
        p.add(c(2), ip("10.1.0.2"), now);
        for conn in [c(1), c(2)] {
            p.pong(conn, Duration::from_micros(200), now);
        }
        p
    }

    /// The connection `p` prefers.
    fn chosen(p: &PeerPaths) -> Option<ConnectionId> {
        p.preferred().map(|x| x.0)
    }

    /// [`two`], with paths 1 and 2 measured at `one` and `other` bytes per second.
    fn measured(one: f64, other: f64) -> PeerPaths {
        let mut p = two();
        p.set_bandwidth(c(1), one);
        p.set_bandwidth(c(2), other);
        p
    }

    #[test]
    fn the_faster_path_is_preferred_once_measured() {
        let mut p = measured(1e9, 2.5e6);
        assert_eq!(chosen(&p), Some(c(1)));
        // A slower measurement of the other path changes nothing; a faster one of equal rtt and
        // bandwidth does not take over either (no gain).
        p.set_bandwidth(c(2), 1e9);
        assert_eq!(chosen(&p), Some(c(1)));
    }

    #[test]
    fn a_degraded_path_is_left_only_by_a_margin_and_a_dead_one_at_once() {
        let mut p = measured(1e9, 1e8);
        assert_eq!(chosen(&p), Some(c(1)));
        // Slightly worse than path 2 (cost ~855 µs vs ~855 µs): within the margin, it stays.
        p.set_bandwidth(c(1), 0.95e8);
        assert_eq!(chosen(&p), Some(c(1)));
        // Limited to 2 MB/s (cost ~33 ms): path 2 takes over.
        p.set_bandwidth(c(1), 2e6);
        assert_eq!(chosen(&p), Some(c(2)));
        // Path 1 recovers: back, it is cheaper by far more than the margin.
        p.set_bandwidth(c(1), 1e9);
        assert_eq!(chosen(&p), Some(c(1)));
        // Cut: the other path at once, whatever it costs.
        p.set_bandwidth(c(2), 1e3);
        assert!(!p.remove(c(1)));
        assert_eq!(chosen(&p), Some(c(2)));
        assert!(p.remove(c(2)));
        assert!(p.preferred().is_none());
    }

    #[test]
    fn a_path_not_probed_yet_never_takes_over_from_a_measured_one() {
        let mut p = measured(1e9, 2.5e6);
        // Path 1 is cut; path 2 (slow) serves.
        assert!(!p.remove(c(1)));
        assert_eq!(chosen(&p), Some(c(2)));
        // The address comes back on a new connection: quick pings, no probe yet. Its guessed cost
        // (~6 ms) is below path 2's (~27 ms), but it must be measured first (it may be degraded).
        let now = Instant::now();
        p.add(c(3), ip("10.0.0.2"), now);
        p.pong(c(3), Duration::from_micros(200), now);
        assert_eq!(chosen(&p), Some(c(2)));
        // Measured degraded: path 2 stays. Measured fast: it takes over.
        p.set_bandwidth(c(3), 1.5e6);
        assert_eq!(chosen(&p), Some(c(2)));
        p.set_bandwidth(c(3), 1e9);
        assert_eq!(chosen(&p), Some(c(3)));
        // With nothing measured, the first connection serves until a probe says otherwise.
        let mut q = PeerPaths::default();
        q.add(c(1), ip("10.0.0.2"), now);
        q.add(c(2), ip("10.1.0.2"), now);
        assert_eq!(chosen(&q), Some(c(1)));
        q.set_bandwidth(c(2), 2.5e6);
        assert_eq!(chosen(&q), Some(c(2)));
        q.set_bandwidth(c(1), 1e9);
        assert_eq!(chosen(&q), Some(c(1)));
    }

    #[test]
    fn connections_over_one_address_are_not_switched_between() {
        let mut p = measured(1e9, 2.5e6);
        let now = Instant::now();
        p.add(c(3), ip("10.0.0.2"), now);
        p.set_bandwidth(c(3), 1e9);
        // Round trips of the two connections over 10.0.0.2 jitter (2 ms vs 0.2 ms): path 1 stays.
        for _ in 0..20 {
            p.pong(c(1), Duration::from_millis(2), now);
            p.pong(c(3), Duration::from_micros(200), now);
        }
        assert_eq!(chosen(&p), Some(c(1)));
        // Its connection closing moves the data plane to the other one over the address.
        assert!(!p.remove(c(1)));
        assert_eq!(chosen(&p), Some(c(3)));
    }

    #[test]
    fn a_round_trip_is_the_least_ping_of_the_window() {
        let mut p = PeerPaths::default();
        let now = Instant::now();
        p.add(c(1), ip("10.0.0.2"), now);
        let rtt = |p: &PeerPaths| p.paths[&c(1)].rtt;
        p.pong(c(1), Duration::from_micros(150), now);
        // A busy moment's pings (milliseconds of queueing) leave the path's delay as it was.
        for i in 1..=5 {
            p.pong(
                c(1),
                Duration::from_millis(9),
                now + Duration::from_millis(400 * i),
            );
        }
        assert_eq!(rtt(&p), Some(Duration::from_micros(150)));
        // A path that grew slower shows it once its fast pings are older than the window.
        let later = now + RTT_WINDOW + Duration::from_secs(1);
        p.pong(c(1), Duration::from_millis(2), later);
        assert_eq!(rtt(&p), Some(Duration::from_millis(2)));
    }

    #[test]
    fn a_path_with_a_much_longer_round_trip_loses() {
        let mut p = measured(1e9, 1e9);
        // Once its faster pings have left the window.
        let now = Instant::now() + RTT_WINDOW + Duration::from_secs(1);
        for _ in 0..20 {
            p.pong(c(1), Duration::from_millis(30), now);
        }
        assert_eq!(chosen(&p), Some(c(2)));
    }

    #[test]
    fn probes_run_once_per_path_and_again_only_when_there_is_a_choice() {
        let now = Instant::now();
        let later = now + REPROBE_EVERY;
        let mut one = PeerPaths::default();
        one.add(c(1), ip("10.0.0.2"), now);
        one.add(c(3), ip("10.0.0.2"), now);
        assert_eq!(
            one.due_for_probe(now),
            [(c(1), PROBE_BYTES), (c(3), PROBE_BYTES)]
        );
        assert!(
            one.due_for_probe(later).is_empty(),
            "one address: no re-probe"
        );
        one.reprobe();
        assert_eq!(one.due_for_probe(later).len(), 2);
        let mut p = two();
        let small = [(c(1), REPROBE_BYTES), (c(2), REPROBE_BYTES)];
        assert_eq!(p.due_for_probe(now), small);
        assert!(p.due_for_probe(now).is_empty());
        assert_eq!(p.due_for_probe(later), small);
        // Measured: a fast path gets the full repeated probe, a slow one ~50 ms of its bandwidth, and
        // a crawling one the floor.
        p.set_bandwidth(c(1), 1e9);
        p.set_bandwidth(c(2), 1e6);
        let much_later = later + REPROBE_EVERY;
        assert_eq!(
            p.due_for_probe(much_later),
            [(c(1), REPROBE_BYTES), (c(2), 50_000)]
        );
        p.set_bandwidth(c(2), 1e5);
        assert_eq!(
            p.due_for_probe(much_later + REPROBE_EVERY),
            [(c(1), REPROBE_BYTES), (c(2), MIN_REPROBE_BYTES)]
        );
    }

    #[test]
    fn facts_show_one_entry_per_address_with_the_instances_on_it() {
        let mut p = two();
        p.add(c(3), ip("10.0.0.2"), Instant::now());
        p.set_bandwidth(c(1), 1e9);
        p.set_bandwidth(c(2), 1e6);
        let (inst, other) = (
            shoal_ids::InstanceId::from_u64(1),
            shoal_ids::InstanceId::from_u64(2),
        );
        let streams = super::super::pathstream::StreamsOn {
            instances: HashMap::from([(c(3), vec![inst, other])]),
            relayed: HashMap::from([(c(3), vec![other])]),
        };
        let facts = p.facts(&streams);
        assert_eq!(facts.len(), 2);
        assert_eq!(facts[0].addr, "10.0.0.2");
        assert!(facts[0].preferred && !facts[1].preferred);
        assert_eq!(facts[0].instances, [inst, other]);
        assert_eq!(facts[0].relayed, [other]);
        assert!(facts[1].relayed.is_empty());
        assert_eq!(facts[0].bandwidth_bps, Some(1e9));
        let book = PathBook::collect([(&PeerId::random(), &p)].into_iter());
        assert_eq!(
            book.preferred.values().next().map(|x| x.connection),
            Some(c(1))
        );
    }
}
