//! Persistent node identity and the cluster key.
//!
//! A node's identity is an ed25519 key kept in `<state-dir>/node.key`: a restarted node is the same
//! node (same id), never a ghost. The cluster key is a shared secret; nodes derive libp2p's private-network
//! key (pnet, XSalsa20 on every connection) from it, so nodes with different keys cannot even complete a
//! protocol negotiation with each other.

use std::io::Write;
use std::path::{Path, PathBuf};

use libp2p::identity::Keypair;
use libp2p::pnet::PreSharedKey;
use sha2::{Digest, Sha256};

use crate::ClusterError;
use crate::error::IdentityProblem;

/// File name of the node key inside the state directory.
pub const NODE_KEY_FILE: &str = "node.key";

/// File name of this node's own cluster key inside the state directory (used when none is given).
pub const CLUSTER_KEY_FILE: &str = "cluster.key";

/// The cluster key a node uses when none is configured: `<state-dir>/cluster.key`, made of 32 random bytes
/// (hex) on first start. Two nodes started without a key therefore never join each other; a node joins
/// another's cluster with its key (`shoal invite` on one, `serve --join TOKEN` on the other).
pub fn load_or_create_cluster_key(state_dir: &Path) -> Result<String, ClusterError> {
    let path = state_dir.join(CLUSTER_KEY_FILE);
    if path.exists() {
        return read_key_file(&path);
    }
    let fail = |reason| ClusterError::Identity {
        path: path.clone(),
        reason,
    };
    std::fs::create_dir_all(state_dir).map_err(|e| fail(IdentityProblem::Io(e)))?;
    let key = crate::invite::hex(&crate::invite::random_bytes::<32>());
    write_private(&path, key.as_bytes()).map_err(|e| fail(IdentityProblem::Io(e)))?;
    Ok(key)
}

/// What a node remembers of the invite it joined with (`<state-dir>/joined-invite`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Joined {
    pub invite: String,
    /// The members' cluster addresses the invite's answer gave.
    pub addrs: Vec<String>,
}

/// Replaces this node's cluster key in the state directory with the one an invite gave it, and records
/// the invite's id and the members' addresses, so a restart with the same (used-up) token joins with the
/// stored key.
pub fn store_joined_key(state_dir: &Path, joined: &Joined, key: &str) -> Result<(), ClusterError> {
    let fail = |path: PathBuf, e| ClusterError::Identity {
        path,
        reason: IdentityProblem::Io(e),
    };
    std::fs::create_dir_all(state_dir).map_err(|e| fail(state_dir.to_path_buf(), e))?;
    let path = state_dir.join(CLUSTER_KEY_FILE);
    write_private(&path, key.as_bytes()).map_err(|e| fail(path, e))?;
    let record = state_dir.join(crate::invite::JOINED_FILE);
    let body = serde_json::to_vec(joined).unwrap_or_default();
    write_private(&record, &body).map_err(|e| fail(record, e))
}

/// The cluster key and record stored by an earlier join with invite `invite`, if this node joined with
/// it.
pub fn joined_key(state_dir: &Path, invite: &str) -> Option<(String, Joined)> {
    let text = std::fs::read(state_dir.join(crate::invite::JOINED_FILE)).ok()?;
    let joined: Joined = serde_json::from_slice(&text).ok()?;
    if joined.invite != invite {
        return None;
    }
    let key = read_key_file(&state_dir.join(CLUSTER_KEY_FILE)).ok()?;
    Some((key, joined))
}

/// Loads the node key from `state_dir`, creating the directory and a fresh key on first start.
pub fn load_or_create(state_dir: &Path) -> Result<Keypair, ClusterError> {
    let path = state_dir.join(NODE_KEY_FILE);
    let fail = |reason| ClusterError::Identity {
        path: path.clone(),
        reason,
    };
    match std::fs::read(&path) {
        Ok(bytes) => Keypair::from_protobuf_encoding(&bytes)
            .map_err(|e| fail(IdentityProblem::NotANodeKey(e))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(state_dir).map_err(|e| fail(IdentityProblem::Io(e)))?;
            let key = Keypair::generate_ed25519();
            let bytes = key
                .to_protobuf_encoding()
                .map_err(|e| fail(IdentityProblem::Encoding(e)))?;
            write_private(&path, &bytes).map_err(|e| fail(IdentityProblem::Io(e)))?;
            Ok(key)
        }
        Err(e) => Err(fail(IdentityProblem::Io(e))),
    }
}

pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The private-network key derived from a cluster key (any length, any bytes).
pub fn cluster_psk(cluster_key: &str) -> PreSharedKey {
    PreSharedKey::new(cluster_psk_bytes(cluster_key))
}

/// The bytes of [`cluster_psk`] (the XSalsa20 key of the private network).
pub fn cluster_psk_bytes(cluster_key: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"shoal cluster key v1\0");
    h.update(cluster_key.as_bytes());
    h.finalize().into()
}

/// A hash that names the cluster without revealing its key (the data-plane handshake carries it).
pub fn cluster_hash(cluster_key: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"shoal cluster hash v1\0");
    h.update(cluster_key.as_bytes());
    h.finalize().into()
}

/// Reads a cluster key file: its content without surrounding whitespace, which must not be empty.
pub fn read_key_file(path: &Path) -> Result<String, ClusterError> {
    let fail = |reason| ClusterError::Identity {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(IdentityProblem::Io(e)))?;
    let key = text.trim();
    if key.is_empty() {
        return Err(fail(IdentityProblem::EmptyKeyFile));
    }
    Ok(key.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_without_a_key_makes_its_own_once() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let ka = load_or_create_cluster_key(a.path()).unwrap();
        assert_eq!(ka.len(), 64);
        assert_eq!(
            load_or_create_cluster_key(a.path()).unwrap(),
            ka,
            "kept across restarts"
        );
        assert_ne!(
            load_or_create_cluster_key(b.path()).unwrap(),
            ka,
            "another node, another key"
        );
    }

    #[test]
    fn identity_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create(dir.path()).unwrap();
        let b = load_or_create(dir.path()).unwrap();
        assert_eq!(a.public().to_peer_id(), b.public().to_peer_id());
        let other = tempfile::tempdir().unwrap();
        let c = load_or_create(other.path()).unwrap();
        assert_ne!(a.public().to_peer_id(), c.public().to_peer_id());
    }

    #[test]
    fn a_corrupt_key_file_is_an_error_not_a_new_identity() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(NODE_KEY_FILE), b"garbage").unwrap();
        let err = load_or_create(dir.path()).unwrap_err();
        assert!(err.to_string().contains("not a node key"), "{err}");
    }

    #[test]
    fn keys_give_distinct_psks_and_hashes() {
        assert_eq!(
            cluster_psk("a").fingerprint().to_string(),
            cluster_psk("a").fingerprint().to_string()
        );
        assert_ne!(
            cluster_psk("a").fingerprint().to_string(),
            cluster_psk("b").fingerprint().to_string()
        );
        assert_ne!(cluster_hash("a"), cluster_hash("b"));
    }
}
