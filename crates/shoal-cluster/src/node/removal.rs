//! Removed nodes: `shoal remove NODE` takes a member out of the cluster for good. Its identity goes on
//! the swarm's block list (libp2p's `allow_block_list`: its connections are closed and refused from
//! then on), into `<state-dir>/removed.json` (kept across restarts) and into this node's facts, so every
//! member — also one that was away when it happened and comes back — learns it through the facts it
//! already gossips and refuses the node too.

use std::path::{Path, PathBuf};

use libp2p::PeerId;

use super::NetTask;
use crate::ClusterError;
use crate::facts::RemovedNode;

/// File name of the removed-node list inside the state directory.
pub const REMOVED_FILE: &str = "removed.json";

/// The nodes this node refuses, as kept in the state directory.
#[derive(Debug, Default)]
pub(super) struct Removed {
    path: PathBuf,
    list: Vec<RemovedNode>,
}

impl Removed {
    /// The list in `state_dir` (empty when there is none; a damaged file is reported and started over).
    pub fn load(state_dir: &Path) -> Self {
        let path = state_dir.join(REMOVED_FILE);
        let list = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(path = %path.display(), "removed-node list is damaged ({e}); starting it over");
                Vec::new()
            }),
            Err(_) => Vec::new(),
        };
        Self { path, list }
    }

    pub fn list(&self) -> &[RemovedNode] {
        &self.list
    }

    pub fn contains(&self, id: &str) -> bool {
        self.list.iter().any(|r| r.id == id)
    }

    /// Adds `node` (and saves the list); false when it was already there.
    fn add(&mut self, node: RemovedNode) -> bool {
        if self.contains(&node.id) {
            return false;
        }
        self.list.push(node);
        let body = serde_json::to_vec_pretty(&self.list).unwrap_or_default();
        let tmp = self.path.with_extension("tmp");
        if let Err(e) = std::fs::write(&tmp, body).and_then(|()| std::fs::rename(&tmp, &self.path))
        {
            tracing::warn!(path = %self.path.display(), "could not save the removed-node list: {e}");
        }
        true
    }
}

impl NetTask {
    /// Blocks every node of the saved list (at start).
    pub(super) fn block_saved(&mut self) {
        let ids: Vec<PeerId> = self
            .removed
            .list()
            .iter()
            .filter_map(|r| r.id.parse().ok())
            .collect();
        for id in ids {
            self.swarm.behaviour_mut().blocked.block_peer(id);
        }
    }

    /// `shoal remove NODE`: the member (or known node) whose id, id suffix (6+ characters) or name is
    /// `query`.
    pub(super) fn remove_node(&mut self, query: &str) -> Result<RemovedNode, ClusterError> {
        let query = query.trim();
        let members = self.state.member_facts();
        let matches: Vec<RemovedNode> = members
            .iter()
            .filter(|f| {
                f.id == query
                    || f.name == query
                    || (query.len() >= 6 && (f.id.ends_with(query) || f.id.starts_with(query)))
            })
            .map(|f| RemovedNode {
                id: f.id.clone(),
                name: f.name.clone(),
                at: crate::clock::unix_now(),
            })
            .collect();
        let node = match matches.as_slice() {
            [one] => one.clone(),
            [] if let Ok(peer) = query.parse::<PeerId>() => RemovedNode {
                id: super::node_id(&peer),
                name: String::new(),
                at: crate::clock::unix_now(),
            },
            [] => {
                return Err(ClusterError::NodeNotFound {
                    message: format!(
                        "no member is named '{query}' or has that id (see GET /state; a node that is not connected can be removed by its full id)"
                    ),
                });
            }
            many => {
                let ids: Vec<&str> = many.iter().map(|r| r.id.as_str()).collect();
                return Err(ClusterError::NodeNotFound {
                    message: format!(
                        "'{query}' matches {} members ({}): give the full id",
                        many.len(),
                        ids.join(", ")
                    ),
                });
            }
        };
        if node.id == super::node_id(&self.id) {
            return Err(ClusterError::NodeRefused {
                message: "a node cannot remove itself: run `shoal remove` against another member"
                    .into(),
            });
        }
        self.ban(node.clone());
        self.rotate_if_stale(true);
        Ok(node)
    }

    /// Takes `node` out of the cluster on this node: refused from now on, forgotten, told to the others.
    fn ban(&mut self, node: RemovedNode) {
        let Ok(peer) = node.id.parse::<PeerId>() else {
            return;
        };
        if peer == self.id || !self.removed.add(node.clone()) {
            return;
        }
        tracing::warn!(%peer, name = %node.name, "node removed from the cluster: its connections are refused from now on");
        self.swarm.behaviour_mut().blocked.block_peer(peer);
        self.removal_heard = Some(std::time::Instant::now());
        self.peers.forget(&peer);
        self.dials.forget_peer(&node.id);
        if self.state.peer_gone(&node.id) {
            metrics::counter!("shoal_membership_changes_total", "change" => "leave").increment(1);
        }
        self.state.me_mut().removed = self.removed.list().to_vec();
        self.refresh_own_facts();
        self.push_facts();
        self.reconcile();
    }

    /// Nodes another member removed are removed here too.
    pub(super) fn adopt_removals(&mut self, removed: &[RemovedNode]) {
        for node in removed {
            if !self.removed.contains(&node.id) {
                self.ban(node.clone());
            }
        }
        self.rotate_if_stale(false);
    }

    pub(super) fn is_removed(&self, peer: &PeerId) -> bool {
        self.removed.contains(&peer.to_string())
    }
}
