//! What the network task tells its peers unasked: this node's facts (refreshed every [`FACTS_PERIOD`]
//! and on change: memory, CPU load / temperature / power from [`crate::sysload`], links), the member list (so every node connects to every other) and, from the coordinator,
//! the instance table.
//!
//! [`FACTS_PERIOD`]: super::FACTS_PERIOD

use std::time::Instant;

use libp2p::PeerId;

use super::NetTask;
use crate::facts;
use crate::proto::ControlMsg;

impl NetTask {
    /// The periodic round: fresh facts, the member list and (coordinator) the table to every peer.
    pub(super) fn gossip(&mut self) {
        self.refresh_own_facts();
        self.push_facts();
        let members = self.members_msg();
        self.send_to_all(&members);
        self.rotate_if_stale(false);
        if self.state.is_coordinator() {
            // Moves forward first (a ready replacement sends its old instance draining), then looks for
            // placements predicted faster on today's members, links and speeds.
            self.state.advance_moves(Instant::now());
            self.state.plan_moves(super::random_id);
            self.broadcast_table();
        }
    }

    /// Memory, links (with their traffic since the last refresh) and addresses, as of now.
    pub(super) fn refresh_own_facts(&mut self) {
        let (mem, _) = facts::local_resources();
        let host = self.host.sample();
        let secs = self.traffic_at.elapsed().as_secs_f64().max(1e-3);
        self.peers.record_traffic(self.traffic.totals(), secs);
        self.traffic_at = Instant::now();
        let links = self.peers.link_facts(&self.path_uses.snapshot());
        let addrs = self.own_addrs();
        let me = self.state.me_mut();
        me.memory = mem;
        me.cpu_load = host.cpu_load;
        me.temperature_c = host.temperature_c;
        me.power_w = host.power_w;
        me.thermal = facts::thermal();
        me.links = links;
        me.addrs = addrs;
        me.seq += 1;
    }

    /// Publishes this node's facts: to every peer, and to this node's own snapshot.
    pub(super) fn push_facts(&mut self) {
        let facts = self.state.me().clone();
        self.published = Some(facts.clone());
        self.send_to_all(&ControlMsg::Facts(Box::new(facts)));
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

    /// Greets a peer that just connected: facts, members and (coordinator) the table.
    pub(super) fn send_facts_to(&mut self, peer: PeerId) {
        let facts = ControlMsg::Facts(Box::new(self.state.me().clone()));
        self.send(peer, facts);
        let members = self.members_msg();
        self.send(peer, members);
        if self.state.is_coordinator() {
            let table = ControlMsg::Table(self.state.table().clone());
            self.send(peer, table);
        }
    }

    pub(super) fn broadcast_table(&mut self) {
        let table = ControlMsg::Table(self.state.table().clone());
        self.send_to_all(&table);
    }

    pub(super) fn send(&mut self, peer: PeerId, msg: ControlMsg) {
        self.swarm.behaviour_mut().control.send_request(&peer, msg);
    }

    fn send_to_all(&mut self, msg: &ControlMsg) {
        let peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
        for p in peers {
            self.send(p, msg.clone());
        }
    }
}
