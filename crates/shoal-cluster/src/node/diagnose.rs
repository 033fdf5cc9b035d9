//! `shoal doctor` on the network task's side: which peers to check ([`NetTask::doctor_targets`]: every
//! connected peer on its preferred path, every lost member still being redialed, every static peer not
//! reached) and [`ClusterHandle::doctor`], which runs `crate::doctor` over streams opened on exactly
//! those paths ([`PathOpener`]).

use std::time::Instant;

use libp2p::swarm::ConnectionId;
use libp2p::{PeerId, Stream};

use super::NetTask;
use super::handle::{ClusterHandle, Command};
use super::pathstream::PathControl;
use crate::ClusterError;
use crate::doctor::{
    self, DOCTOR_PROTOCOL, DoctorError, DoctorOptions, Opener, PeerReport, PeerTarget,
};

/// A peer to check and, when connected, the connection its preferred path runs on.
pub(super) type Target = (PeerTarget, Option<(PeerId, ConnectionId)>);

/// Opens doctor streams on one chosen connection to one peer.
pub(super) struct PathOpener {
    control: PathControl,
    peer: PeerId,
    connection: ConnectionId,
}

impl Opener for PathOpener {
    type Stream = Stream;

    async fn open(&self) -> Result<Stream, DoctorError> {
        self.control
            .open_on(self.peer, self.connection, DOCTOR_PROTOCOL)
            .await
            .map_err(|e| DoctorError::Io(std::io::Error::other(e)))
    }
}

impl NetTask {
    /// The peers `shoal doctor` checks, sorted by id (static peers never reached last).
    pub(super) fn doctor_targets(&self) -> Vec<Target> {
        let facts = self.state.member_facts();
        let name_of = |id: &str| facts.iter().find(|f| f.id == id).map(|f| f.name.clone());
        let now = Instant::now();
        let mut out: Vec<Target> = self
            .peers
            .doctor_view()
            .into_iter()
            .map(|(peer, v)| {
                let id = peer.to_string();
                let unconnected = v.preferred.is_none().then(|| {
                    let addrs: Vec<String> = v.addrs.iter().map(|a| a.to_string()).collect();
                    match v.lost_since {
                        Some(t) => format!(
                            "lost {:.0} s ago, redialing {}",
                            now.duration_since(t).as_secs_f64(),
                            if addrs.is_empty() {
                                "no known address".to_string()
                            } else {
                                addrs.join(", ")
                            }
                        ),
                        None => "not connected".to_string(),
                    }
                });
                let target = PeerTarget {
                    name: name_of(&id).or(v.name),
                    id,
                    kind: v.kind,
                    addr: v.preferred.map(|(_, addr)| addr),
                    unconnected,
                };
                (target, v.preferred.map(|(c, _)| (peer, c)))
            })
            .collect();
        out.sort_by(|a, b| a.0.id.cmp(&b.0.id));
        for sp in self.dials.static_peers() {
            let known = sp
                .peer
                .as_ref()
                .is_some_and(|p| out.iter().any(|t| &t.0.id == p));
            if sp.connected || known {
                continue;
            }
            let why = match &sp.last_error {
                Some(e) => format!(
                    "static peer {} not reached ({} failed dials, last: {e})",
                    sp.addr, sp.failed_dials
                ),
                None => format!("static peer {} not reached yet", sp.addr),
            };
            let target = PeerTarget {
                id: sp.peer.clone().unwrap_or_else(|| sp.addr.clone()),
                name: None,
                kind: None,
                addr: None,
                unconnected: Some(why),
            };
            out.push((target, None));
        }
        out
    }
}

impl ClusterHandle {
    /// Measures the link to every peer afresh ([`crate::doctor`]): reachability, round trips, loss,
    /// bandwidth each way, path MTU, clock offset. Takes a few seconds per connected peer.
    pub async fn doctor(&self, opts: DoctorOptions) -> Result<Vec<PeerReport>, ClusterError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.commands
            .send(Command::DoctorTargets(tx))
            .await
            .map_err(|_| ClusterError::Stopped)?;
        let targets = rx.await.map_err(|_| ClusterError::Stopped)?;
        let control = self.paths.control.clone();
        let with_openers = targets
            .into_iter()
            .map(|(t, path)| {
                let opener = path.map(|(peer, connection)| PathOpener {
                    control: control.clone(),
                    peer,
                    connection,
                });
                (t, opener)
            })
            .collect();
        Ok(doctor::check_peers(with_openers, opts).await)
    }
}
