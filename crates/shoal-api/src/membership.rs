//! Membership routes: `POST /cluster/enroll` (a machine joining with an invite token; open even with API
//! keys, since the invite's proof is its credential) and `POST /cluster/remove` (`shoal remove NODE`:
//! the node is refused by every member from then on).
//!
//! Enrolling is open to strangers, so it is bounded: a body of at most [`ENROLL_BODY_LIMIT`] bytes (413
//! past it), fields checked for the shape a real joiner sends before anything else reads them (a 400
//! that never repeats them), a few failed tries per client address ([`crate::guard::attempts`]: then
//! 429 with `Retry-After`), and a log line per refusal that names only the checked node id, never the
//! invite.

use std::net::SocketAddr;
use std::time::Instant;

use axum::extract::rejection::JsonRejection;
use axum::extract::{ConnectInfo, State};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};
use shoal_cluster::invite::{EnrollReply, EnrollRequest};

use crate::{ApiError, ApiState};

/// The path of the enroll route (the API-key check lets it through).
pub const ENROLL_PATH: &str = "/cluster/enroll";

/// Largest enrolment body: a real one is a few hundred bytes.
pub const ENROLL_BODY_LIMIT: usize = 4096;

/// Longest field of an enrolment: ids are a dozen to a few dozen characters, the proof 64 hex digits.
const FIELD_MAX: usize = 128;

/// `POST /cluster/enroll`: checks the invite and answers the sealed cluster key.
#[utoipa::path(
    post,
    path = "/cluster/enroll",
    operation_id = "post_cluster_enroll",
    tag = "cluster",
    request_body = Object,
    responses(
        (status = 200, description = "The sealed cluster key, for a node with a valid invite.", body = Object),
        crate::schema::OpenAiErrors
    )
)]
pub async fn enroll(
    State(state): State<ApiState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    body: Result<Json<EnrollRequest>, JsonRejection>,
) -> Result<Json<EnrollReply>, ApiError> {
    let ip = peer.map(|Extension(ConnectInfo(addr))| addr.ip());
    let attempt = state
        .enroll_attempts
        .begin(ip, Instant::now())
        .map_err(|wait| ApiError::TooManyRequests {
            retry_after_secs: wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
        })?;
    let Json(req) = body?;
    check_fields(&req)?;
    let cluster = state.cluster()?;
    let reply = cluster.enroll(&req).inspect_err(|e| {
        let from = ip.map(|ip| ip.to_string()).unwrap_or_default();
        tracing::warn!(node = %req.node, %from, "invite refused: {e}");
    })?;
    attempt.succeeded();
    Ok(Json(reply))
}

/// A 400 unless every field has the shape a joining node sends: the invite id, the node id (letters and
/// digits) and the proof (hex), each short. The message never repeats what was sent.
fn check_fields(req: &EnrollRequest) -> Result<(), ApiError> {
    let fields = [
        ("invite", req.invite.as_str(), id_char as fn(char) -> bool),
        ("node", req.node.as_str(), id_char),
        ("proof", req.proof.as_str(), |c: char| c.is_ascii_hexdigit()),
    ];
    for (name, value, allowed) in fields {
        if value.is_empty() || value.len() > FIELD_MAX || !value.chars().all(allowed) {
            return Err(ApiError::invalid(
                name,
                format!("'{name}' is not what `shoal serve --join` sends"),
            ));
        }
    }
    Ok(())
}

fn id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct RemoveNode {
    /// The node's id, the end of its id (6+ characters) or its name.
    node: String,
}

/// `POST /cluster/remove` `{"node": …}`.
#[utoipa::path(
    post,
    path = "/cluster/remove",
    operation_id = "post_cluster_remove",
    tag = "cluster",
    request_body = RemoveNode,
    responses(
        (status = 200, description = "The node is removed.", body = Object),
        crate::schema::OpenAiErrors
    )
)]
pub async fn remove(
    State(state): State<ApiState>,
    body: Result<Json<RemoveNode>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(req) = body?;
    let cluster = state.cluster()?;
    let removed = cluster.remove_node(&req.node).await?;
    Ok(Json(json!({ "removed": removed })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(invite: &str, node: &str, proof: &str) -> EnrollRequest {
        EnrollRequest {
            invite: invite.into(),
            node: node.into(),
            proof: proof.into(),
        }
    }

    #[test]
    fn enrolment_fields_are_checked_before_anything_reads_them() {
        let node = "12D3KooWLRPJAA5o6Z6y6Zp8aE8xYfXrXo6yq2xk1Cq7wV7xH2fS";
        let proof = "ab".repeat(32);
        assert_eq!(check_fields(&request("a1b2c3d4e5f6", node, &proof)), Ok(()));
        for (req, field) in [
            (request("a1b2\nINFO forged", node, &proof), "invite"),
            (
                request("a1b2c3", "node\n2026-01-01T00:00:00Z INFO forged", &proof),
                "node",
            ),
            (request("a1b2c3", &"x".repeat(2 << 20), &proof), "node"),
            (request("a1b2c3", "", &proof), "node"),
            (request("a1b2c3", node, "not hex"), "proof"),
        ] {
            let err = check_fields(&req).expect_err("refused");
            let body = err.body();
            assert_eq!(body.error.param.as_deref(), Some(field));
            assert!(!body.error.message.contains("forged") && body.error.message.len() < 200);
        }
    }
}
