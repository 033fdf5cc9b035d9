//! Invites: how a new machine gets the cluster key without anyone copying the key itself.
//!
//! `shoal invite` writes an [`Invite`] into the inviting node's [`InviteBook`] (`<state-dir>/invites.json`:
//! an id, a random 32-byte secret, uses left, expiry) and prints an [`InviteToken`]
//! (`shoal2:<id>.<secret hex>@<api url>,…`). The new machine (`shoal serve --join TOKEN`) sends an
//! [`EnrollRequest`] to one of the URLs (`POST /cluster/enroll`): the invite id, its own node id and a
//! proof that it holds the secret (HMAC-SHA256 of its node id under the secret — the secret itself never
//! travels). The member checks the proof, the expiry and the uses left ([`InviteBook::redeem`], under a
//! file lock so `shoal invite` and the server never lose an update), and answers an [`EnrollReply`]: the
//! cluster key sealed with ChaCha20-Poly1305 under a key derived from the secret (so the HTTP answer tells
//! an eavesdropper nothing) and the members' cluster addresses. The joiner keeps the key in its state dir
//! (and the invite id, so a restart with the same used-up token still joins).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// File name of the invite book inside the state directory.
pub const INVITES_FILE: &str = "invites.json";
/// File name of the record of the invite this node joined with.
pub const JOINED_FILE: &str = "joined-invite";

const TOKEN_PREFIX: &str = "shoal2:";

/// Why an invite was not honoured (or could not be used).
#[derive(Debug, thiserror::Error)]
pub enum InviteError {
    #[error("no such invite (it was never made on this node, or it was used up and removed)")]
    Unknown,
    #[error("the invite expired")]
    Expired,
    #[error("the invite proof does not match: the token is not this invite's")]
    BadProof,
    #[error("the sealed cluster key does not open with this token's secret")]
    BadSeal,
    #[error("invite book {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invite book {path} is not valid: {source}")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// One invite in the book.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Invite {
    pub id: String,
    /// The secret, hex (the book is as private as `cluster.key`: mode 0600).
    pub secret: String,
    /// Unix seconds when it was made.
    pub created: u64,
    /// Unix seconds after which it is refused; `None`: never expires.
    pub expires: Option<u64>,
    /// Joins it still allows; `None`: any number.
    pub uses_left: Option<u32>,
}

/// What `shoal serve --join` sends to a member.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EnrollRequest {
    pub invite: String,
    /// The joining node's id.
    pub node: String,
    /// HMAC-SHA256(secret, node id), hex.
    pub proof: String,
}

/// A member's answer to an accepted [`EnrollRequest`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EnrollReply {
    /// 12 bytes, hex.
    pub nonce: String,
    /// The cluster key sealed under the invite's secret (ChaCha20-Poly1305, the node id as associated
    /// data), hex.
    pub sealed: String,
    /// Cluster addresses (multiaddrs) of the members.
    pub addrs: Vec<String>,
}

/// What the joining machine holds: `shoal2:<id>.<secret hex>@<api url>,…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InviteToken {
    pub id: String,
    pub secret: [u8; 32],
    /// Base URLs of the inviting node's HTTP API.
    pub urls: Vec<String>,
}

impl InviteToken {
    pub fn encode(&self) -> String {
        format!(
            "{TOKEN_PREFIX}{}.{}@{}",
            self.id,
            hex(&self.secret),
            self.urls.join(",")
        )
    }

    /// Parses a token; `None` when it is not one.
    pub fn parse(text: &str) -> Option<Self> {
        let rest = text.trim().strip_prefix(TOKEN_PREFIX)?;
        let (head, urls) = rest.split_once('@')?;
        let (id, secret) = head.split_once('.')?;
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return None;
        }
        let secret: [u8; 32] = unhex(secret)?.try_into().ok()?;
        let urls: Vec<String> = urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(String::from)
            .collect();
        (!urls.is_empty()).then(|| Self {
            id: id.to_string(),
            secret,
            urls,
        })
    }

    /// The request that proves this token for node `node`.
    pub fn request(&self, node: &str) -> EnrollRequest {
        EnrollRequest {
            invite: self.id.clone(),
            node: node.to_string(),
            proof: hex(&proof(&self.secret, node)),
        }
    }

    /// The cluster key inside a member's reply to [`InviteToken::request`] for `node`.
    pub fn open(&self, node: &str, reply: &EnrollReply) -> Result<String, InviteError> {
        let nonce: [u8; 12] = unhex(&reply.nonce)
            .and_then(|n| n.try_into().ok())
            .ok_or(InviteError::BadSeal)?;
        let sealed = unhex(&reply.sealed).ok_or(InviteError::BadSeal)?;
        let plain = cipher(&self.secret)
            .decrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: &sealed,
                    aad: node.as_bytes(),
                },
            )
            .map_err(|_| InviteError::BadSeal)?;
        String::from_utf8(plain).map_err(|_| InviteError::BadSeal)
    }
}

/// Seals `cluster_key` for `node` under `secret`.
pub fn seal(secret: &[u8; 32], node: &str, cluster_key: &str) -> EnrollReply {
    let nonce = random_bytes::<12>();
    // Encryption with a fresh key and nonce of the right sizes cannot fail.
    let sealed = cipher(secret)
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: cluster_key.as_bytes(),
                aad: node.as_bytes(),
            },
        )
        .unwrap_or_default();
    EnrollReply {
        nonce: hex(&nonce),
        sealed: hex(&sealed),
        addrs: Vec::new(),
    }
}

fn cipher(secret: &[u8; 32]) -> ChaCha20Poly1305 {
    let mut h = Sha256::new();
    h.update(b"shoal invite seal v1\0");
    h.update(secret);
    ChaCha20Poly1305::new(Key::from_slice(&h.finalize()))
}

/// HMAC-SHA256 of `node` under `secret`.
pub fn proof(secret: &[u8; 32], node: &str) -> [u8; 32] {
    // HMAC takes keys of any length.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(b"shoal enroll v1\0");
    mac.update(node.as_bytes());
    mac.finalize().into_bytes().into()
}

/// The invites of one node, in `<state-dir>/invites.json`.
pub struct InviteBook {
    path: PathBuf,
}

impl InviteBook {
    pub fn new(state_dir: &Path) -> Self {
        Self {
            path: state_dir.join(INVITES_FILE),
        }
    }

    /// Makes and records a new invite valid for `uses` joins (`None`: any number) until `expires`
    /// (unix seconds; `None`: never).
    pub fn create(&self, uses: Option<u32>, expires: Option<u64>) -> Result<Invite, InviteError> {
        let now = crate::clock::unix_now();
        let invite = Invite {
            id: hex(&random_bytes::<6>()),
            secret: hex(&random_bytes::<32>()),
            created: now,
            expires,
            uses_left: uses,
        };
        self.update(|list| {
            // Expired and used-up invites are dropped whenever the book is written.
            list.retain(|i| live(i, now));
            list.push(invite.clone());
            Ok(())
        })?;
        Ok(invite)
    }

    /// The invites still usable.
    pub fn list(&self) -> Result<Vec<Invite>, InviteError> {
        let now = crate::clock::unix_now();
        let mut out = Vec::new();
        self.update(|list| {
            out = list.iter().filter(|i| live(i, now)).cloned().collect();
            Ok(())
        })?;
        Ok(out)
    }

    /// Checks `req` against the book at `now` and, when it is good, counts one use and returns the
    /// invite's secret.
    pub fn redeem(&self, req: &EnrollRequest, now: u64) -> Result<[u8; 32], InviteError> {
        let mut secret = None;
        self.update(|list| {
            let pos = list
                .iter()
                .position(|i| i.id == req.invite)
                .ok_or(InviteError::Unknown)?;
            let invite = &mut list[pos];
            let key: [u8; 32] = unhex(&invite.secret)
                .and_then(|s| s.try_into().ok())
                .ok_or(InviteError::Unknown)?;
            let expected = proof(&key, &req.node);
            let given = unhex(&req.proof).unwrap_or_default();
            if !constant_time_eq(&expected, &given) {
                return Err(InviteError::BadProof);
            }
            if invite.expires.is_some_and(|e| now > e) {
                return Err(InviteError::Expired);
            }
            match &mut invite.uses_left {
                Some(0) => return Err(InviteError::Unknown),
                Some(n) => *n -= 1,
                None => {}
            }
            if !live(invite, now) {
                list.remove(pos);
            }
            secret = Some(key);
            Ok(())
        })?;
        secret.ok_or(InviteError::Unknown)
    }

    /// Runs `f` on the book's list under an exclusive file lock and writes the result back.
    fn update(
        &self,
        f: impl FnOnce(&mut Vec<Invite>) -> Result<(), InviteError>,
    ) -> Result<(), InviteError> {
        let io = |source| InviteError::Io {
            path: self.path.clone(),
            source,
        };
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut file: File = opts.open(&self.path).map_err(io)?;
        file.lock().map_err(io)?;
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(io)?;
        let mut list: Vec<Invite> = if text.trim().is_empty() {
            Vec::new()
        } else {
            serde_json::from_str(&text).map_err(|source| InviteError::Corrupt {
                path: self.path.clone(),
                source,
            })?
        };
        let before = list.clone();
        let result = f(&mut list);
        if list != before {
            let body = serde_json::to_vec_pretty(&list).unwrap_or_default();
            file.set_len(0).map_err(io)?;
            file.rewind().map_err(io)?;
            file.write_all(&body).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        result
    }
}

fn live(invite: &Invite, now: u64) -> bool {
    invite.uses_left != Some(0) && invite.expires.is_none_or(|e| now <= e)
}

/// `n` bytes from the operating system's random source.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    // The OS source is always there on the platforms shoal runs on; a failure here is not recoverable.
    getrandom::getrandom(&mut buf).expect("the operating system's random source failed");
    buf
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token_for(invite: &Invite) -> InviteToken {
        InviteToken {
            id: invite.id.clone(),
            secret: unhex(&invite.secret).unwrap().try_into().unwrap(),
            urls: vec!["http://10.0.0.2:52415".into()],
        }
    }

    #[test]
    fn tokens_round_trip_and_garbage_is_refused() {
        let t = InviteToken {
            id: "a1b2c3".into(),
            secret: [7; 32],
            urls: vec![
                "http://10.0.0.2:52415".into(),
                "http://[fe80::1]:52415".into(),
            ],
        };
        assert_eq!(InviteToken::parse(&t.encode()), Some(t));
        let secret = hex(&[7; 32]);
        for bad in [
            String::new(),
            "shoal2:".into(),
            format!("shoal2:ab.{secret}@"),
            format!("shoal2:.{secret}@http://x"),
            format!("shoal2:a-b.{secret}@http://x"),
            "shoal2:ab.0707@http://x".into(),
            format!("shoal1:ab.{secret}@http://x"),
        ] {
            assert_eq!(InviteToken::parse(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_single_use_invite_admits_one_node_and_the_key_opens_only_with_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let book = InviteBook::new(dir.path());
        let invite = book.create(Some(1), None).unwrap();
        let token = token_for(&invite);
        let req = token.request("node-b");
        let now = crate::clock::unix_now();
        let secret = book.redeem(&req, now).unwrap();
        let reply = seal(&secret, "node-b", "the-cluster-key");
        assert_eq!(token.open("node-b", &reply).unwrap(), "the-cluster-key");
        assert!(
            matches!(token.open("node-c", &reply), Err(InviteError::BadSeal)),
            "sealed for node-b only"
        );
        let other = InviteToken {
            secret: [1; 32],
            ..token.clone()
        };
        assert!(matches!(
            other.open("node-b", &reply),
            Err(InviteError::BadSeal)
        ));
        assert!(
            matches!(book.redeem(&req, now), Err(InviteError::Unknown)),
            "used up"
        );
        assert!(book.list().unwrap().is_empty());
    }

    #[test]
    fn expired_invites_and_wrong_proofs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let book = InviteBook::new(dir.path());
        let now = crate::clock::unix_now();
        let invite = book.create(None, Some(now + 60)).unwrap();
        let token = token_for(&invite);
        let mut forged = token.request("node-b");
        forged.proof = hex(&proof(&[9; 32], "node-b"));
        assert!(matches!(
            book.redeem(&forged, now),
            Err(InviteError::BadProof)
        ));
        // A proof for another node id does not carry over.
        let mut moved = token.request("node-b");
        moved.node = "node-c".into();
        assert!(matches!(
            book.redeem(&moved, now),
            Err(InviteError::BadProof)
        ));
        // Reusable until it expires.
        for node in ["node-b", "node-c"] {
            book.redeem(&token.request(node), now).unwrap();
        }
        assert!(matches!(
            book.redeem(&token.request("node-d"), now + 61),
            Err(InviteError::Expired)
        ));
        let unknown = EnrollRequest {
            invite: "nope".into(),
            ..token.request("node-b")
        };
        assert!(matches!(
            book.redeem(&unknown, now),
            Err(InviteError::Unknown)
        ));
    }
}
