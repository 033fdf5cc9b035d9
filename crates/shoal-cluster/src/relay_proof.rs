//! Proof that an HTTP request comes from a member of the cluster, not from a client.
//!
//! A node's API sends some requests on to another member (a generation request to the driver of the
//! instance the balancer chose, a download started on another node). The receiving node treats such a
//! request differently from a client's (it serves it itself or answers 503, it does not count it again in
//! its metrics), so the mark it carries must be one a client cannot make: the header holds
//! `v1.<unix seconds>.<hex HMAC-SHA256>` over the method, the path and query, the body's sha256 and the
//! time, keyed by a key derived from the cluster key ([`RelayKey`]). Only nodes that hold the cluster
//! key can make it; it is refused [`MAX_SKEW_SECS`] after (or before) the time it names, and it covers the
//! exact request it came with, so a mark seen on one request cannot be moved to another.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// How far the time in a proof may be from the receiver's clock (members' clocks are loosely in step).
pub const MAX_SKEW_SECS: u64 = 300;

const VERSION: &str = "v1";

/// The key that signs relayed requests, derived from the cluster key (never the cluster key itself).
#[derive(Clone)]
pub struct RelayKey([u8; 32]);

impl std::fmt::Debug for RelayKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RelayKey(…)")
    }
}

/// Why a proof was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayProofError {
    #[error("not a relay proof")]
    Malformed,
    #[error("the proof's time is more than {MAX_SKEW_SECS} s from this node's clock")]
    Stale,
    #[error("the proof does not match the request or the cluster")]
    Mismatch,
}

impl RelayKey {
    /// The relay key of the cluster whose key is `cluster_key`.
    pub fn from_cluster_key(cluster_key: &str) -> Self {
        let mut h = Sha256::new();
        h.update(b"shoal relayed-request proof v1\0");
        h.update(cluster_key.as_bytes());
        RelayKey(h.finalize().into())
    }

    fn tag(&self, time: u64, method: &str, path: &str, body: &[u8]) -> [u8; 32] {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(VERSION.as_bytes());
        mac.update(&time.to_be_bytes());
        // Lengths first, so no two (method, path) pairs run together into the same bytes.
        for part in [method.as_bytes(), path.as_bytes()] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.update(&Sha256::digest(body));
        mac.finalize().into_bytes().into()
    }

    /// The header value that marks this request (`path` with its query) as sent on by a member at `now`.
    pub fn sign(&self, now: u64, method: &str, path: &str, body: &[u8]) -> String {
        format!(
            "{VERSION}.{now}.{}",
            hex(&self.tag(now, method, path, body))
        )
    }

    /// Checks a header value against the request it came with, at `now` (Unix seconds).
    pub fn verify(
        &self,
        header: &str,
        now: u64,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<(), RelayProofError> {
        let mut parts = header.splitn(3, '.');
        let (Some(VERSION), Some(time), Some(tag)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(RelayProofError::Malformed);
        };
        let time: u64 = time.parse().map_err(|_| RelayProofError::Malformed)?;
        let given = unhex(tag).ok_or(RelayProofError::Malformed)?;
        if time.abs_diff(now) > MAX_SKEW_SECS {
            return Err(RelayProofError::Stale);
        }
        let want = self.tag(time, method, path, body);
        // Constant time: no early exit on the first differing byte.
        let diff = want
            .iter()
            .zip(&given)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff == 0 {
            Ok(())
        } else {
            Err(RelayProofError::Mismatch)
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    #[test]
    fn a_proof_verifies_only_for_its_request_cluster_and_time() {
        let key = RelayKey::from_cluster_key("secret");
        let proof = key.sign(NOW, "POST", "/v1/chat/completions", b"{\"a\":1}");
        assert_eq!(
            key.verify(
                &proof,
                NOW + 10,
                "POST",
                "/v1/chat/completions",
                b"{\"a\":1}"
            ),
            Ok(())
        );
        // Another body, path, method, cluster or time.
        let m = Err(RelayProofError::Mismatch);
        assert_eq!(
            key.verify(&proof, NOW, "POST", "/v1/chat/completions", b"{}"),
            m
        );
        assert_eq!(
            key.verify(&proof, NOW, "POST", "/v1/completions", b"{\"a\":1}"),
            m
        );
        assert_eq!(
            key.verify(&proof, NOW, "PUT", "/v1/chat/completions", b"{\"a\":1}"),
            m
        );
        let other = RelayKey::from_cluster_key("other");
        assert_eq!(
            other.verify(&proof, NOW, "POST", "/v1/chat/completions", b"{\"a\":1}"),
            m
        );
        assert_eq!(
            key.verify(
                &proof,
                NOW + MAX_SKEW_SECS + 1,
                "POST",
                "/v1/chat/completions",
                b"{\"a\":1}"
            ),
            Err(RelayProofError::Stale)
        );
    }

    #[test]
    fn what_a_client_can_send_is_refused() {
        let key = RelayKey::from_cluster_key("secret");
        for header in [
            "1",
            "",
            "v1",
            "v1.x.00",
            "v1.1.zz",
            "v2.1.00",
            "v1.1800000000.é",
        ] {
            assert_eq!(
                key.verify(header, NOW, "POST", "/", b""),
                Err(RelayProofError::Malformed),
                "{header:?}"
            );
        }
        let forged = format!("v1.{NOW}.{}", "0".repeat(64));
        assert_eq!(
            key.verify(&forged, NOW, "POST", "/", b""),
            Err(RelayProofError::Mismatch)
        );
    }
}
