//! Membership routes: `POST /cluster/enroll` (a machine joining with an invite token; open even with API
//! keys, since the invite's proof is its credential) and `POST /cluster/remove` (`shoal remove NODE`:
//! the node is refused by every member from then on).

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use serde::Deserialize;
use serde_json::{Value, json};
use shoal_cluster::invite::{EnrollReply, EnrollRequest};

use crate::{ApiError, ApiState};

/// The path of the enroll route (the API-key check lets it through).
pub const ENROLL_PATH: &str = "/cluster/enroll";

/// `POST /cluster/enroll`: checks the invite and answers the sealed cluster key.
pub async fn enroll(
    State(state): State<ApiState>,
    body: Result<Json<EnrollRequest>, JsonRejection>,
) -> Result<Json<EnrollReply>, ApiError> {
    let Json(req) = body?;
    let cluster = state.cluster()?;
    let reply = cluster.enroll(&req).inspect_err(|e| {
        tracing::warn!(node = %req.node, invite = %req.invite, "invite refused: {e}");
    })?;
    Ok(Json(reply))
}

#[derive(Debug, Deserialize)]
pub struct RemoveNode {
    /// The node's id, the end of its id (6+ characters) or its name.
    node: String,
}

/// `POST /cluster/remove` `{"node": …}`.
pub async fn remove(
    State(state): State<ApiState>,
    body: Result<Json<RemoveNode>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(req) = body?;
    let cluster = state.cluster()?;
    let removed = cluster.remove_node(&req.node).await?;
    Ok(Json(json!({ "removed": removed })))
}
