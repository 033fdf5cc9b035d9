//! Rotating the cluster key ([`crate::keyring`]) in the network task: who rotates, who gets the new
//! key, and who may still connect with an old one.
//!
//! - The node that runs `shoal remove` rotates at once; the coordinator rotates when its key was not
//!   made without a removal it knows of, [`ROTATE_GRACE`] after it heard of it (the removing node's key
//!   usually arrives first; two removals at once: the key that won may have reached the other removed
//!   node; the removing node died before it sent its key).
//! - A rotation sends the ring ([`ControlMsg::Rekey`]) to every connected member that is not removed,
//!   over its noise-encrypted control connection; every connection that opens (and is admitted) gets
//!   the ring too, so a member that was away, or joined with an invite, converges on the highest key;
//!   a node that adopts a key passes it on to its other members.
//! - A connection made with an earlier key (see `pnet`) is admitted only from an identity that was a
//!   member and is not removed — it is then handed the current key; from anyone else it is closed at
//!   once and whatever it sends is ignored.

use shoal_ids::NodeId;
use std::time::Duration;

use libp2p::PeerId;
use libp2p::swarm::ConnectionId;

use super::NetTask;
use crate::keyring::KeyOffer;
use crate::proto::ControlMsg;

/// How long the coordinator waits after hearing of a removal before it rotates the key itself: the node
/// that removed has rotated already, and its key is on its way (checked again every gossip round).
pub(super) const ROTATE_GRACE: Duration = Duration::from_secs(3);

/// Identities refused for an earlier key remembered at most (forgotten all at once past it: they are
/// only refused again).
const REFUSED_MAX: usize = 4096;

impl NetTask {
    /// Whether a new connection may stay; `stale`: the epoch of the earlier key it was made with.
    pub(super) fn admit(
        &mut self,
        peer: PeerId,
        connection: ConnectionId,
        stale: Option<u64>,
    ) -> bool {
        let id = super::node_id(&peer);
        let mut ring = self.keys.ring.write().unwrap_or_else(|e| e.into_inner());
        let Some(epoch) = stale else {
            // It holds the current key: a member (one that may come back later with this key).
            if let Err(e) = ring.add_member(&id) {
                tracing::warn!("could not record member {id}: {e}");
            }
            self.refused.remove(&peer);
            return true;
        };
        if ring.is_member(&id) && !ring.excludes(&id) && !self.is_removed(&peer) {
            tracing::info!(%peer, epoch, current = ring.current().epoch, "a member came back with an earlier cluster key: handing it the current one");
            self.refused.remove(&peer);
            return true;
        }
        drop(ring);
        if self.refused.len() >= REFUSED_MAX {
            self.refused.clear();
        }
        if self.refused.insert(peer) {
            tracing::warn!(%peer, epoch, "connection refused: made with an earlier cluster key by a node that is not a member");
        } else {
            tracing::debug!(%peer, epoch, "connection refused again: earlier cluster key, not a member");
        }
        let _ = self.swarm.close_connection(connection);
        false
    }

    /// Sends `peer` this node's key ring — unless the current key was made without it: a node can
    /// adopt a rotated key before it hears of the removal that caused it, and must not pass the key on
    /// to the removed node it is still connected to.
    pub(super) fn send_keys(&mut self, peer: PeerId) {
        let offer = self.ring_offer();
        if offer.excludes.contains(&super::node_id(&peer)) {
            return;
        }
        self.send(peer, ControlMsg::Rekey(Box::new(offer)));
    }

    fn ring_offer(&self) -> KeyOffer {
        self.keys
            .ring
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .offer_to_send()
    }

    /// A member's key ring: adopted when its key ranks higher.
    pub(super) fn on_rekey(&mut self, peer: PeerId, offer: &KeyOffer) {
        if self.is_removed(&peer) || self.refused.contains(&peer) {
            return;
        }
        let adopted = {
            let mut ring = self.keys.ring.write().unwrap_or_else(|e| e.into_inner());
            match ring.offer(offer) {
                Ok(adopted) => adopted,
                Err(e) => {
                    tracing::warn!("could not save the cluster key from {peer}: {e}");
                    false
                }
            }
        };
        if adopted {
            tracing::info!(%peer, epoch = offer.current.epoch, "cluster key changed: adopted the key a member sent");
            metrics::counter!("shoal_cluster_key_changes_total", "how" => "adopted").increment(1);
            // On to the other members: only a strictly higher key is passed on, so this ends.
            self.send_keys_to_members(Some(peer));
        }
        self.rotate_if_stale(false);
    }

    /// Sends the ring to every connected member that is not removed (nor `except`).
    fn send_keys_to_members(&mut self, except: Option<PeerId>) {
        let peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
        for peer in peers {
            if Some(peer) != except && !self.is_removed(&peer) && !self.refused.contains(&peer) {
                self.send_keys(peer);
            }
        }
    }

    /// Rotates the key when this node removed a node itself (`own`) or is the coordinator, and the
    /// current key was made before a removal this node knows of.
    pub(super) fn rotate_if_stale(&mut self, own: bool) {
        let waited = self
            .removal_heard
            .is_none_or(|t| t.elapsed() >= ROTATE_GRACE);
        if !(own || self.state.is_coordinator() && waited) {
            return;
        }
        let removed: Vec<NodeId> = self.removed.list().iter().map(|r| r.id.clone()).collect();
        let rotated = {
            let mut ring = self.keys.ring.write().unwrap_or_else(|e| e.into_inner());
            if ring.excludes_all(&removed) {
                return;
            }
            match ring.rotate(&removed) {
                Ok(key) => key.epoch,
                Err(e) => {
                    tracing::error!(
                        "could not save a new cluster key, keeping the old one in use: {e}"
                    );
                    return;
                }
            }
        };
        tracing::warn!(
            epoch = rotated,
            "cluster key rotated after a removal: sending it to every remaining member"
        );
        metrics::counter!("shoal_cluster_key_changes_total", "how" => "rotated").increment(1);
        self.send_keys_to_members(None);
    }
}
