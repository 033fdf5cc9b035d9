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
    // The OS's randomness, through a fresh ed25519 secret (32 random bytes).
    let fresh = libp2p::identity::ed25519::Keypair::generate();
    let key: String = fresh
        .secret()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    write_private(&path, key.as_bytes()).map_err(|e| fail(IdentityProblem::Io(e)))?;
    Ok(key)
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

fn write_private(path: &PathBuf, bytes: &[u8]) -> std::io::Result<()> {
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

/// What a node needs to join a cluster: its key and addresses of a member (`shoal invite` prints one,
/// `shoal serve --join TOKEN` uses it). Text form: `shoal1:<key as hex>@<addr>,<addr>…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub cluster_key: String,
    /// `HOST:PORT` or multiaddrs of members.
    pub addrs: Vec<String>,
}

const TOKEN_PREFIX: &str = "shoal1:";

impl JoinToken {
    pub fn encode(&self) -> String {
        let key: String = self
            .cluster_key
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{TOKEN_PREFIX}{key}@{}", self.addrs.join(","))
    }

    /// Parses a token; `None` when it is not one.
    pub fn parse(text: &str) -> Option<Self> {
        let rest = text.trim().strip_prefix(TOKEN_PREFIX)?;
        let (hex, addrs) = rest.split_once('@')?;
        if hex.is_empty() || hex.len() % 2 != 0 {
            return None;
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        let cluster_key = String::from_utf8(bytes).ok()?;
        let addrs: Vec<String> = addrs
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(String::from)
            .collect();
        (!addrs.is_empty()).then_some(Self { cluster_key, addrs })
    }
}

/// The private-network key derived from a cluster key (any length, any bytes).
pub fn cluster_psk(cluster_key: &str) -> PreSharedKey {
    let mut h = Sha256::new();
    h.update(b"shoal cluster key v1\0");
    h.update(cluster_key.as_bytes());
    PreSharedKey::new(h.finalize().into())
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
    fn join_tokens_round_trip_and_garbage_is_refused() {
        let t = JoinToken {
            cluster_key: "k@y with, odd: chars".into(),
            addrs: vec!["10.0.0.2:52416".into(), "/ip4/10.0.0.3/tcp/52416".into()],
        };
        assert_eq!(JoinToken::parse(&t.encode()), Some(t));
        for bad in [
            "",
            "shoal1:",
            "shoal1:zz@1.2.3.4:5",
            "shoal1:6b@",
            "shoal1:6@1.2.3.4:5",
            "x:6b@a",
        ] {
            assert_eq!(JoinToken::parse(bad), None, "{bad:?}");
        }
    }

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
