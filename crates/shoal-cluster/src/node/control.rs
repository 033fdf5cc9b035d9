//! Control messages of the network task: requests from peers, replies to ours, commands from handles.

use libp2p::request_response::{self, ResponseChannel};
use libp2p::{Multiaddr, PeerId};

use super::handle::Command;
use super::{NetTask, Pending, is_unspecified, random_id};
use crate::proto::{ControlMsg, ControlReply};

impl NetTask {
    pub(super) fn on_control(&mut self, event: request_response::Event<ControlMsg, ControlReply>) {
        use request_response::{Event, Message};
        match event {
            Event::Message {
                peer,
                message:
                    Message::Request {
                        request, channel, ..
                    },
                ..
            } => self.on_request(peer, request, channel),
            Event::Message {
                message:
                    Message::Response {
                        request_id,
                        response,
                    },
                ..
            } => match (self.pending.remove(&request_id), response) {
                (Some(Pending::Place(tx)), ControlReply::Placed(r)) => {
                    let _ = tx.send(r);
                }
                (Some(Pending::Remove(tx)), ControlReply::Removed(r)) => {
                    let _ = tx.send(r);
                }
                (Some(Pending::Place(tx)), other) => {
                    let _ = tx.send(Err(format!("unexpected reply {other:?}")));
                }
                (Some(Pending::Remove(tx)), other) => {
                    let _ = tx.send(Err(format!("unexpected reply {other:?}")));
                }
                (None, _) => {}
            },
            Event::OutboundFailure {
                request_id, error, ..
            } => match self.pending.remove(&request_id) {
                Some(Pending::Place(tx)) => {
                    let _ = tx.send(Err(format!("the coordinator did not answer: {error}")));
                }
                Some(Pending::Remove(tx)) => {
                    let _ = tx.send(Err(format!("the coordinator did not answer: {error}")));
                }
                None => {}
            },
            _ => {}
        }
    }

    fn on_request(
        &mut self,
        peer: PeerId,
        msg: ControlMsg,
        channel: ResponseChannel<ControlReply>,
    ) {
        let reply = match msg {
            ControlMsg::Facts(facts) => {
                if facts.id != peer.to_string() {
                    tracing::warn!(%peer, claimed = %facts.id, "facts about another node ignored");
                } else {
                    for a in &facts.addrs {
                        if let Ok(m) = a.parse::<Multiaddr>()
                            && !is_unspecified(&m)
                        {
                            self.peers.learn_addr(peer, m);
                        }
                    }
                    if self.state.on_facts(*facts) {
                        tracing::info!(%peer, "member joined");
                        if self.state.is_coordinator() {
                            self.broadcast_table();
                        }
                        // A node whose members changed may have instances to re-place.
                        self.reconcile();
                    }
                }
                ControlReply::Ack
            }
            ControlMsg::Members(list) => {
                for (id, addrs) in list {
                    let Ok(pid) = id.parse::<PeerId>() else {
                        continue;
                    };
                    if pid == self.id || self.swarm.is_connected(&pid) {
                        continue;
                    }
                    let addrs: Vec<Multiaddr> = addrs
                        .iter()
                        .filter_map(|a| a.parse().ok())
                        .filter(|a| !is_unspecified(a))
                        .collect();
                    self.peers.set_addrs(pid, addrs.clone());
                    for a in addrs {
                        self.dial(a);
                    }
                }
                ControlReply::Ack
            }
            ControlMsg::Table(table) => {
                if self.state.on_table(&peer.to_string(), table) {
                    self.broadcast_table();
                }
                ControlReply::Ack
            }
            ControlMsg::Place(req) => {
                let r = self.state.place(&req, random_id());
                if r.is_ok() {
                    self.broadcast_table();
                }
                ControlReply::Placed(r)
            }
            ControlMsg::Remove { id } => {
                let r = self.state.remove(&id);
                if r == Ok(true) {
                    self.broadcast_table();
                }
                ControlReply::Removed(r)
            }
        };
        let _ = self
            .swarm
            .behaviour_mut()
            .control
            .send_response(channel, reply);
    }

    fn coordinator_peer(&self) -> Option<PeerId> {
        self.state.coordinator().parse().ok()
    }

    pub(super) fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Place(req, tx) => {
                if self.state.is_coordinator() {
                    let r = self.state.place(&req, random_id());
                    if r.is_ok() {
                        self.broadcast_table();
                    }
                    let _ = tx.send(r);
                } else if let Some(c) = self.coordinator_peer() {
                    let id = self
                        .swarm
                        .behaviour_mut()
                        .control
                        .send_request(&c, ControlMsg::Place(req));
                    self.pending.insert(id, Pending::Place(tx));
                }
            }
            Command::Remove(id, tx) => {
                if self.state.is_coordinator() {
                    let r = self.state.remove(&id);
                    if r == Ok(true) {
                        self.broadcast_table();
                    }
                    let _ = tx.send(r);
                } else if let Some(c) = self.coordinator_peer() {
                    let rid = self
                        .swarm
                        .behaviour_mut()
                        .control
                        .send_request(&c, ControlMsg::Remove { id });
                    self.pending.insert(rid, Pending::Remove(tx));
                }
            }
            Command::SetStatus(instance, status) => {
                let me = self.state.me_mut();
                let changed = match status {
                    Some(s) => me.instances.insert(instance, s.clone()) != Some(s),
                    None => {
                        me.kv_capacity.remove(&instance);
                        me.instances.remove(&instance).is_some()
                    }
                };
                if changed {
                    self.refresh_own_facts();
                    self.push_facts();
                }
            }
            Command::SetKvCapacity(instance, tokens) => {
                let me = self.state.me_mut();
                if me.kv_capacity.insert(instance, tokens) != Some(tokens) {
                    self.refresh_own_facts();
                    self.push_facts();
                }
            }
            Command::Probe => {
                let peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
                for peer in peers {
                    self.spawn_probe(peer);
                }
            }
        }
    }
}
