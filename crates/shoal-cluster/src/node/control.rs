//! Control messages of the network task: requests from peers, replies to ours, commands from handles.

use libp2p::request_response::{self, OutboundFailure, OutboundRequestId, ResponseChannel};
use libp2p::{Multiaddr, PeerId};
use shoal_ids::{InstanceId, NodeId};

use super::handle::Command;
use super::{NetTask, Pending, is_unspecified, random_id};
use crate::facts::{InstanceStatus, NodeFacts};
use crate::proto::{ControlMsg, ControlReply, InstanceRecord, PlaceRequest};
use crate::{ClusterError, PlaceError};

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
            } => self.on_reply(request_id, response),
            Event::OutboundFailure {
                request_id, error, ..
            } => self.on_no_reply(request_id, &error),
            _ => {}
        }
    }

    /// The coordinator answered a place or remove request of ours.
    fn on_reply(&mut self, request: OutboundRequestId, reply: ControlReply) {
        let Some(pending) = self.pending.remove(&request) else {
            return;
        };
        match (pending, reply) {
            (Pending::Place(tx), ControlReply::Placed(r)) => {
                let _ = tx.send(r.map(|record| vec![record]).map_err(ClusterError::from));
            }
            (Pending::Place(tx), ControlReply::PlacedReplicas(r)) => {
                let _ = tx.send(r.map_err(ClusterError::from));
            }
            (Pending::Remove(tx), ControlReply::Removed(r)) => {
                let _ = tx.send(r.map_err(ClusterError::from));
            }
            (pending, other) => pending.fail(ClusterError::UnexpectedReply {
                reply: format!("{other:?}"),
            }),
        }
    }

    /// A place or remove request of ours got no answer.
    fn on_no_reply(&mut self, request: OutboundRequestId, error: &OutboundFailure) {
        if let Some(pending) = self.pending.remove(&request) {
            pending.fail(ClusterError::CoordinatorSilent {
                message: error.to_string(),
            });
        }
    }

    fn on_request(
        &mut self,
        peer: PeerId,
        msg: ControlMsg,
        channel: ResponseChannel<ControlReply>,
    ) {
        if self.refused.contains(&peer) {
            return; // connected with an earlier key without being a member: never answered
        }
        let reply = match msg {
            ControlMsg::Rekey(offer) => {
                self.on_rekey(peer, &offer);
                ControlReply::Ack
            }
            ControlMsg::Facts(facts) => {
                self.on_peer_facts(peer, *facts);
                ControlReply::Ack
            }
            ControlMsg::Members(list) => {
                self.on_members(list);
                ControlReply::Ack
            }
            ControlMsg::Table(table) => {
                if self.state.on_table(&peer.to_string(), table) {
                    self.broadcast_table();
                }
                ControlReply::Ack
            }
            ControlMsg::Place(req) => {
                let placed = self.place_here(&req).map_err(Into::into);
                if req.replicas.is_some() {
                    ControlReply::PlacedReplicas(placed)
                } else {
                    // Exactly one: the reply nodes that predate replicas understand.
                    ControlReply::Placed(placed.and_then(|mut v| {
                        v.pop()
                            .ok_or_else(|| ClusterError::from(PlaceError::NoCandidate).into())
                    }))
                }
            }
            ControlMsg::Remove { id } => {
                ControlReply::Removed(self.remove_here(&id).map_err(Into::into))
            }
        };
        let _ = self
            .swarm
            .behaviour_mut()
            .control
            .send_response(channel, reply);
    }

    /// A peer's own facts: its addresses are remembered for redialing; a new member may need instances
    /// re-placed.
    fn on_peer_facts(&mut self, peer: PeerId, facts: NodeFacts) {
        if facts.id != peer.to_string() {
            tracing::warn!(%peer, claimed = %facts.id, "facts about another node ignored");
            return;
        }
        self.adopt_removals(&facts.removed);
        if self.is_removed(&peer) {
            return;
        }
        self.peers.set_name(peer, &facts.name);
        for a in &facts.addrs {
            if let Ok(m) = a.parse::<Multiaddr>()
                && !is_unspecified(&m)
            {
                self.peers.learn_addr(peer, m);
            }
        }
        if self.state.on_facts(facts) {
            tracing::info!(%peer, "member joined");
            metrics::counter!("shoal_membership_changes_total", "change" => "join").increment(1);
            if self.state.is_coordinator() {
                self.broadcast_table();
            }
            // A node whose members changed may have instances to re-place.
            self.reconcile();
        }
    }

    /// A peer's member list: dials the members this node is not connected to.
    fn on_members(&mut self, list: Vec<(NodeId, Vec<String>)>) {
        for (id, addrs) in list {
            let Ok(pid) = id.parse::<PeerId>() else {
                continue;
            };
            if pid == self.id || self.swarm.is_connected(&pid) || self.is_removed(&pid) {
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
    }

    /// Places `req` in this node's table (as the coordinator) and tells everyone: one instance, or
    /// every replica the request names.
    fn place_here(&mut self, req: &PlaceRequest) -> Result<Vec<InstanceRecord>, ClusterError> {
        let records = if req.replicas.is_some() {
            self.state.place_replicas(req, random_id)?
        } else {
            vec![self.state.place(req, random_id())?]
        };
        self.broadcast_table();
        Ok(records)
    }

    /// Removes instance `id` from this node's table (as the coordinator) and tells everyone if it was
    /// there.
    fn remove_here(&mut self, id: &InstanceId) -> Result<bool, ClusterError> {
        let removed = self.state.remove(id)?;
        if removed {
            self.broadcast_table();
        }
        Ok(removed)
    }

    /// Sends `msg` to the coordinator, whose reply will go to `pending`.
    fn ask_coordinator(&mut self, msg: ControlMsg, pending: Pending) {
        let coordinator = self.state.coordinator();
        match coordinator.parse::<PeerId>() {
            Ok(c) => {
                let request = self.swarm.behaviour_mut().control.send_request(&c, msg);
                self.pending.insert(request, pending);
            }
            Err(_) => pending.fail(ClusterError::NoCoordinator {
                coordinator: coordinator.to_string(),
            }),
        }
    }

    pub(super) fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Place(req, tx) => {
                if self.state.is_coordinator() {
                    let _ = tx.send(self.place_here(&req));
                } else {
                    self.ask_coordinator(ControlMsg::Place(req), Pending::Place(tx));
                }
            }
            Command::Remove(id, tx) => {
                if self.state.is_coordinator() {
                    let _ = tx.send(self.remove_here(&id));
                } else {
                    self.ask_coordinator(ControlMsg::Remove { id }, Pending::Remove(tx));
                }
            }
            Command::SetStatus(instance, status) => self.set_status(instance, status),
            Command::SetKvCapacity(instance, tokens) => {
                let me = self.state.me_mut();
                if me.kv_capacity.insert(instance, tokens) != Some(tokens) {
                    self.refresh_own_facts();
                    self.push_facts();
                }
            }
            Command::SetLoad(instance, load) => {
                let me = self.state.me_mut();
                match load {
                    Some(l) => me.load.insert(instance, l),
                    None => me.load.remove(&instance),
                };
            }
            Command::SetDownloads(downloads) => {
                let me = self.state.me_mut();
                if me.downloads != downloads {
                    me.downloads = downloads;
                    self.refresh_own_facts();
                    self.push_facts();
                }
            }
            Command::SetModels(models) => {
                let me = self.state.me_mut();
                if me.models != models {
                    me.models = models;
                    self.refresh_own_facts();
                    self.push_facts();
                }
            }
            Command::SetCompute(compute) => {
                let me = self.state.me_mut();
                if me.compute != compute {
                    if let Some(speed) = compute.reference_speed() {
                        me.speed = speed;
                    }
                    me.compute = compute;
                    self.refresh_own_facts();
                    self.push_facts();
                }
            }
            Command::SetGpus(gpus) => {
                let me = self.state.me_mut();
                if me.gpus != gpus {
                    me.gpus = gpus;
                    self.refresh_own_facts();
                    self.push_facts();
                }
            }
            Command::SetDevice(device) => {
                let me = self.state.me_mut();
                if me.device != device {
                    me.device = device;
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
            Command::DoctorTargets(tx) => {
                let _ = tx.send(self.doctor_targets());
            }
            Command::RemoveNode(query, tx) => {
                let _ = tx.send(self.remove_node(&query));
            }
        }
    }

    /// This node's load state for one instance (`None`: no longer part of it), published on change.
    fn set_status(&mut self, instance: InstanceId, status: Option<InstanceStatus>) {
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
}

impl Pending {
    /// Answers the waiting handle with `err`.
    fn fail(self, err: ClusterError) {
        match self {
            Pending::Place(tx) => {
                let _ = tx.send(Err(err));
            }
            Pending::Remove(tx) => {
                let _ = tx.send(Err(err));
            }
        }
    }
}
