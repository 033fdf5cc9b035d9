//! The cluster key as it changes: an epoch (generation) and the key, the keys it replaced, the removed
//! nodes it was made without and the identities known to have been members.
//!
//! `shoal remove NODE` rotates the key ([`KeyRing::rotate`]): a new random key at the next epoch, sent
//! to every remaining member over the authenticated, encrypted control connection, which each adopts
//! ([`KeyRing::offer`]: the higher epoch wins; at the same epoch the key with the larger SHA-256, so two
//! rotations at once settle on one key everywhere). The ring lives in `<state-dir>/cluster-keys.json`
//! (mode 0600, replaced atomically) and outlives the configured key: at start the configured key is
//! looked up in the ring, and when it is the current or an earlier key, the current one is used.
//!
//! Earlier keys are kept (the last [`KEEP_PREVIOUS`]) only to let a member that was away when the key
//! changed in again: a connection made with an earlier key is admitted only from an identity in
//! [`KeyRing::is_member`] and not removed, which is then handed the current key (see `node::keys`).
//! See decision 021.

use shoal_ids::NodeId;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use libp2p::pnet::PreSharedKey;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ClusterError;
use crate::error::IdentityProblem;

/// File name of the key ring inside the state directory.
pub const KEYRING_FILE: &str = "cluster-keys.json";
/// How many replaced keys are kept for the admission of returning members.
pub const KEEP_PREVIOUS: usize = 8;

/// One generation of the cluster key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochKey {
    pub epoch: u64,
    pub key: String,
}

impl EpochKey {
    /// The private-network key this key gives.
    pub fn psk(&self) -> PreSharedKey {
        crate::identity::cluster_psk(&self.key)
    }

    /// Orders two keys of one epoch the same way on every node.
    fn digest(&self) -> [u8; 32] {
        Sha256::digest(self.key.as_bytes()).into()
    }

    fn rank(&self) -> (u64, [u8; 32]) {
        (self.epoch, self.digest())
    }
}

/// What a rotation sends to a member (`ControlMsg::Rekey`), and what the ring file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyOffer {
    pub current: EpochKey,
    /// Replaced keys, newest first.
    #[serde(default)]
    pub previous: Vec<EpochKey>,
    /// The removed nodes the current key was made without (never sent to them).
    #[serde(default)]
    pub excludes: BTreeSet<NodeId>,
    /// Identities that were members (connected with a current key): who may come back with an old key.
    #[serde(default)]
    pub members: BTreeSet<NodeId>,
}

/// The ring of one node (see the module doc).
#[derive(Debug)]
pub struct KeyRing {
    path: PathBuf,
    ring: KeyOffer,
}

impl KeyRing {
    /// The ring in `state_dir` for the configured key `configured`: the stored ring when `configured`
    /// is its current or an earlier key, else a new ring at epoch 0 (a key the operator changed by hand
    /// starts over).
    pub fn load(state_dir: &Path, configured: &str) -> Self {
        let path = state_dir.join(KEYRING_FILE);
        let fresh = || KeyOffer {
            current: EpochKey {
                epoch: 0,
                key: configured.to_string(),
            },
            previous: Vec::new(),
            excludes: BTreeSet::new(),
            members: BTreeSet::new(),
        };
        let ring = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<KeyOffer>(&bytes) {
                Ok(r)
                    if r.current.key == configured
                        || r.previous.iter().any(|p| p.key == configured) =>
                {
                    r
                }
                Ok(_) => fresh(),
                Err(e) => {
                    tracing::warn!(path = %path.display(), "cluster key ring is damaged ({e}); starting it over");
                    fresh()
                }
            },
            Err(_) => fresh(),
        };
        Self { path, ring }
    }

    pub fn current(&self) -> &EpochKey {
        &self.ring.current
    }

    /// What to send to a member so it holds this ring's key.
    pub fn offer_to_send(&self) -> KeyOffer {
        self.ring.clone()
    }

    /// Every key a connection may be made with, the current first.
    pub fn keys(&self) -> impl Iterator<Item = &EpochKey> {
        std::iter::once(&self.ring.current).chain(&self.ring.previous)
    }

    /// Whether the current key was made without every node in `removed`.
    pub fn excludes_all<'a>(&self, removed: impl IntoIterator<Item = &'a NodeId>) -> bool {
        removed.into_iter().all(|r| self.ring.excludes.contains(r))
    }

    /// Whether the current key was made without `id` (a removed node: it must never be sent the ring).
    pub fn excludes(&self, id: &str) -> bool {
        self.ring.excludes.contains(id)
    }

    /// Whether `id` connected with a current key once (a member that may return with an old key).
    pub fn is_member(&self, id: &str) -> bool {
        self.ring.members.contains(id)
    }

    /// Records `id` as a member; true (and saved) when it is new.
    pub fn add_member(&mut self, id: &NodeId) -> Result<bool, ClusterError> {
        if !self.ring.members.insert(id.clone()) {
            return Ok(false);
        }
        self.save()?;
        Ok(true)
    }

    /// Makes a new random key at the next epoch, without the nodes in `removed` (who are also dropped
    /// from the members), and saves the ring.
    pub fn rotate<'a>(
        &mut self,
        removed: impl IntoIterator<Item = &'a NodeId>,
    ) -> Result<&EpochKey, ClusterError> {
        let next = EpochKey {
            epoch: self.ring.current.epoch + 1,
            key: crate::invite::hex(&crate::invite::random_bytes::<32>()),
        };
        let old = std::mem::replace(&mut self.ring.current, next);
        self.ring.previous.insert(0, old);
        self.ring.previous.truncate(KEEP_PREVIOUS);
        for r in removed {
            self.ring.excludes.insert(r.clone());
            self.ring.members.remove(r);
        }
        self.save()?;
        Ok(&self.ring.current)
    }

    /// Takes what a member sent: its key becomes current when it ranks higher (epoch, then digest);
    /// earlier keys, exclusions and members are merged either way. Returns whether the current key
    /// changed (the ring is saved whenever anything changed).
    pub fn offer(&mut self, offer: &KeyOffer) -> Result<bool, ClusterError> {
        let before = self.ring.clone();
        let adopt = offer.current.rank() > self.ring.current.rank();
        let mut keys: Vec<EpochKey> = self
            .keys()
            .cloned()
            .chain(std::iter::once(offer.current.clone()))
            .chain(offer.previous.iter().cloned())
            .collect();
        if adopt {
            self.ring.current = offer.current.clone();
            self.ring.excludes = offer.excludes.clone();
        }
        keys.retain(|k| k.key != self.ring.current.key);
        keys.sort_by_key(|k| std::cmp::Reverse(k.rank()));
        keys.dedup_by(|a, b| a.key == b.key);
        keys.truncate(KEEP_PREVIOUS);
        self.ring.previous = keys;
        self.ring.members.extend(offer.members.iter().cloned());
        for r in &self.ring.excludes {
            self.ring.members.remove(r);
        }
        if self.ring != before {
            self.save()?;
        }
        Ok(adopt)
    }

    fn save(&self) -> Result<(), ClusterError> {
        let body = serde_json::to_vec_pretty(&self.ring).unwrap_or_default();
        crate::identity::write_private(&self.path, &body).map_err(|e| ClusterError::Identity {
            path: self.path.clone(),
            reason: IdentityProblem::Io(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(id: &str) -> NodeId {
        id.parse().unwrap()
    }

    fn read(dir: &Path) -> KeyOffer {
        serde_json::from_slice(&std::fs::read(dir.join(KEYRING_FILE)).unwrap()).unwrap()
    }

    #[test]
    fn a_rotation_makes_the_next_epoch_and_survives_a_restart_with_the_old_configured_key() {
        let dir = tempfile::tempdir().unwrap();
        let mut ring = KeyRing::load(dir.path(), "k0");
        assert_eq!(
            ring.current(),
            &EpochKey {
                epoch: 0,
                key: "k0".into()
            }
        );
        ring.add_member(&n("node-b")).unwrap();
        ring.add_member(&n("node-x")).unwrap();
        let k1 = ring.rotate(&[n("node-x")]).unwrap().clone();
        assert_eq!(k1.epoch, 1);
        assert_eq!(k1.key.len(), 64);
        assert_ne!(k1.key, "k0");
        assert!(
            ring.excludes_all(&[n("node-x")])
                && ring.excludes("node-x")
                && !ring.excludes("node-b")
        );
        assert!(!ring.excludes_all(&[n("node-x"), n("node-y")]));
        assert!(
            ring.is_member("node-b") && !ring.is_member("node-x"),
            "the removed node is no member"
        );
        assert_eq!(
            ring.keys().map(|k| k.epoch).collect::<Vec<_>>(),
            [1, 0],
            "current first, then the replaced one"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(KEYRING_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // Restarted with the key it was configured with (the old one): the rotated key is used.
        let again = KeyRing::load(dir.path(), "k0");
        assert_eq!(again.current(), &k1);
        assert_eq!(read(dir.path()).current, k1);
        // Configured with a key the ring never held: a new ring.
        let other = KeyRing::load(dir.path(), "brand-new");
        assert_eq!(
            other.current(),
            &EpochKey {
                epoch: 0,
                key: "brand-new".into()
            }
        );
    }

    #[test]
    fn offers_settle_on_one_key_whatever_the_order() {
        let (a, b, c) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let mut ra = KeyRing::load(a.path(), "k0");
        let mut rb = KeyRing::load(b.path(), "k0");
        let mut rc = KeyRing::load(c.path(), "k0");
        // Two removals at once on two nodes: two keys at epoch 1.
        ra.rotate(&[n("x")]).unwrap();
        rb.rotate(&[n("y")]).unwrap();
        let (oa, ob) = (ra.offer_to_send(), rb.offer_to_send());
        let a_first = rc.offer(&oa).unwrap();
        assert!(a_first, "a higher epoch is adopted");
        rc.offer(&ob).unwrap();
        ra.offer(&ob).unwrap();
        rb.offer(&oa).unwrap();
        assert_eq!(ra.current(), rb.current());
        assert_eq!(ra.current(), rc.current());
        // The winner excludes only one of the two: a node that knows both rotates again.
        assert!(!ra.excludes_all(&[n("x"), n("y")]));
        ra.rotate(&[n("x"), n("y")]).unwrap();
        let next = ra.offer_to_send();
        assert!(rc.offer(&next).unwrap());
        assert_eq!(rc.current().epoch, 2);
        assert!(rc.excludes_all(&[n("x"), n("y")]));
        // An older or equal offer changes nothing; the replaced keys are kept for returning members.
        assert!(!rc.offer(&oa).unwrap());
        assert!(!rc.offer(&next).unwrap());
        assert_eq!(rc.current(), ra.current());
        let keys: Vec<u64> = rc.keys().map(|k| k.epoch).collect();
        assert_eq!(keys[0], 2);
        assert!(rc.keys().any(|k| k.key == "k0"), "{keys:?}");
        assert!(rc.keys().count() <= KEEP_PREVIOUS + 1);
    }

    #[test]
    fn members_are_remembered_and_a_damaged_ring_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let mut ring = KeyRing::load(dir.path(), "k0");
        assert!(ring.add_member(&n("m")).unwrap());
        assert!(!ring.add_member(&n("m")).unwrap());
        assert!(KeyRing::load(dir.path(), "k0").is_member("m"));
        std::fs::write(dir.path().join(KEYRING_FILE), b"{not json").unwrap();
        let ring = KeyRing::load(dir.path(), "k0");
        assert!(!ring.is_member("m"));
        assert_eq!(ring.current().epoch, 0);
    }
}
