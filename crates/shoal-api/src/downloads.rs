//! Download routes: `GET /downloads` (every node's downloads: progress, speed, ETA, sources),
//! `POST /downloads` (start fetching a model on this node or on `node`), `DELETE /downloads/{model}`
//! (cancel it; `?node=` for another node's).
//!
//! The list comes from the cluster snapshot (each node publishes its own downloads in its facts), so any
//! node answers for all. Starting and cancelling act on this node's [`shoal_transfer::Downloads`]; a
//! request naming another node is forwarded to that node's API.
//!
//! The model is a model id ([`shoal_store::check_model_id`]: never a path, `..`, empty, NUL or over-long)
//! and the node a node id, both checked before anything else (a 400 otherwise). A forwarded request is
//! built from those checked parts: the member's API address from the cluster's facts, then each path
//! segment percent-encoded on its own ([`peer_url`]) — client text is never pasted into a URL, so a model
//! such as `../instance/x` can neither climb out of `/downloads/` nor reach another route of the peer.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use shoal_cluster::facts::DownloadFacts;

use crate::{ApiError, ApiState};

/// `GET /downloads`: `{"nodes": {node id: [download, …]}}` for every member.
#[utoipa::path(
    get,
    path = "/downloads",
    operation_id = "get_downloads",
    tag = "cluster",
    responses(
        (status = 200, description = "Every node's downloads.", body = Object),
        crate::schema::OpenAiErrors
    )
)]
pub async fn list(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let cluster = state
        .cluster
        .as_ref()
        .ok_or_else(|| ApiError::NotFound("this node runs without a cluster".into()))?;
    let snap = cluster.snapshot();
    let mut nodes: BTreeMap<String, Vec<DownloadFacts>> = BTreeMap::new();
    for id in snap.state.members() {
        if let Some(f) = snap.state.facts_of(id) {
            nodes.insert(id.to_string(), f.downloads.clone());
        }
    }
    Ok(Json(json!({ "nodes": nodes })))
}

/// Body of `POST /downloads`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartBody {
    model: String,
    /// The node that should download (default: this one).
    #[serde(default)]
    node: Option<String>,
}

/// `POST /downloads`: starts fetching `model` (peers first, then the internet) and answers at once with
/// 202; progress shows in `GET /downloads`.
#[utoipa::path(
    post,
    path = "/downloads",
    operation_id = "post_downloads",
    tag = "cluster",
    request_body = StartBody,
    responses(
        (status = 202, description = "`{\"model\", \"state\": \"running\"}`; progress shows in `GET /downloads`.", body = Object),
        crate::schema::OpenAiErrors
    )
)]
pub async fn start(
    State(state): State<ApiState>,
    headers: axum::http::HeaderMap,
    body: Result<Json<StartBody>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    // The one mapping of body rejections: an over-long body is a 413 however it was sent.
    let Json(body) = body?;
    let model = model_id(&body.model)?;
    if let Some(base) = other_node_url(&state, body.node.as_deref())? {
        let payload = json!({ "model": model });
        let url = peer_url(&base, &["downloads"])?;
        return forward(reqwest::Method::POST, url, Some(payload), &headers).await;
    }
    let downloads = local(&state)?;
    downloads
        .start(model)
        .map_err(|e| ApiError::invalid("model", e.to_string()))?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "model": model, "state": "running" })),
    ))
}

/// Query of `DELETE /downloads/{model}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeQuery {
    node: Option<String>,
}

/// `DELETE /downloads/{model}`: cancels a running download (its verified part is kept for a resume).
#[utoipa::path(
    delete,
    path = "/downloads/{model}",
    operation_id = "delete_downloads_model",
    tag = "cluster",
    params(("model" = String, Path, description = "The model id (it may contain `/`)."), ("node" = Option<String>, Query, description = "The node that runs it (default: this one).")),
    responses(
        (status = 200, description = "Cancelled; its verified part is kept for a resume.", body = Object),
        crate::schema::OpenAiErrors
    )
)]
pub async fn cancel(
    State(state): State<ApiState>,
    headers: axum::http::HeaderMap,
    Path(model): Path<String>,
    query: Result<Query<NodeQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let model = model_id(&model)?;
    if let Some(base) = other_node_url(&state, q.node.as_deref())? {
        let url = peer_url(&base, &["downloads", model])?;
        return forward(reqwest::Method::DELETE, url, None, &headers).await;
    }
    if local(&state)?.cancel(model) {
        Ok((
            StatusCode::OK,
            Json(json!({ "model": model, "state": "cancelled" })),
        ))
    } else {
        Err(ApiError::NotFound(format!(
            "no running download of '{model}' on this node"
        )))
    }
}

fn local(state: &ApiState) -> Result<&shoal_transfer::Downloads, ApiError> {
    state
        .downloads
        .as_ref()
        .ok_or_else(|| ApiError::NotFound("this node does not download models".into()))
}

/// The model of a request, checked as a model id (trimmed); a 400 in the API's shape otherwise.
fn model_id(model: &str) -> Result<&str, ApiError> {
    let model = model.trim();
    shoal_store::check_model_id(model).map_err(|e| ApiError::invalid("model", e.to_string()))?;
    Ok(model)
}

/// The longest node id taken (a libp2p peer id in base58 is about 52 characters).
const MAX_NODE_LEN: usize = 128;

/// The API URL of `node` when it names another member; `None` for this node (or no node given). A node
/// that is not a node id (base58 letters and digits) is a 400, before any lookup.
fn other_node_url(state: &ApiState, node: Option<&str>) -> Result<Option<String>, ApiError> {
    if let Some(n) = node
        && (n.is_empty() || n.len() > MAX_NODE_LEN || !n.bytes().all(|b| b.is_ascii_alphanumeric()))
    {
        return Err(ApiError::invalid(
            "node",
            "'node' is not a node id (the id GET /state lists)",
        ));
    }
    let (Some(node), Some(cluster)) = (node, state.cluster.as_ref()) else {
        return Ok(None);
    };
    if node == cluster.id().to_string() {
        return Ok(None);
    }
    let snap = cluster.snapshot();
    let facts = snap
        .state
        .facts_of(node)
        .ok_or_else(|| ApiError::invalid("node", format!("no member '{node}' in the cluster")))?;
    facts
        .api_url
        .clone()
        .map(Some)
        .ok_or_else(|| ApiError::invalid("node", format!("node '{node}' has no API address")))
}

/// `segments` under a member's API address `base` (from its facts): each segment percent-encoded on its
/// own (`/` as `%2F`), so no segment adds a path level or climbs out of the route; the model segment is a
/// checked id besides, with no `..` part. Only `http` and `https` addresses are used.
fn peer_url(base: &str, segments: &[&str]) -> Result<reqwest::Url, ApiError> {
    let bad = |why: String| ApiError::Internal(format!("the member's API address '{base}': {why}"));
    let mut url = reqwest::Url::parse(base).map_err(|e| bad(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("not http or https".into()));
    }
    url.set_query(None);
    url.set_fragment(None);
    url.path_segments_mut()
        .map_err(|()| bad("not a base URL".into()))?
        .pop_if_empty()
        .extend(segments);
    Ok(url)
}

/// Sends the request to another node's API and answers with its status and JSON body.
async fn forward(
    method: reqwest::Method,
    url: reqwest::Url,
    body: Option<Value>,
    headers: &axum::http::HeaderMap,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let client = reqwest::Client::new();
    let mut req = client.request(method, url.clone());
    for (name, value) in crate::auth::key_headers(headers) {
        req = req.header(name, value);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| ApiError::Internal(format!("forwarding to {url}: {e}")))?;
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let value: Value = resp
        .json()
        .await
        .map_err(|e| ApiError::Internal(format!("answer of {url}: {e}")))?;
    Ok((status, Json(value)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forwarded_delete_cannot_reach_another_route_of_the_peer() {
        // The requests: the model climbed out of /downloads/ into /instance/… and /state.
        for hostile in ["../instance/abc", "../../state", "..", "a/../../state"] {
            assert!(model_id(hostile).is_err(), "{hostile}");
        }
        // Even unchecked, each segment stays one segment under /downloads/.
        let url = peer_url("http://10.0.0.2:52415", &["downloads", "../../state"]).expect("url");
        assert_eq!(
            url.as_str(),
            "http://10.0.0.2:52415/downloads/..%2F..%2Fstate"
        );
        let url =
            peer_url("http://10.0.0.2:52415/", &["downloads", "org/repo:Q4_K_M"]).expect("url");
        assert_eq!(url.path(), "/downloads/org%2Frepo:Q4_K_M");
        let url = peer_url("http://h:1/api?x=1#f", &["downloads", "m?node=x#y"]).expect("url");
        assert_eq!(url.as_str(), "http://h:1/api/downloads/m%3Fnode=x%23y");
        assert!(peer_url("file:///etc", &["downloads"]).is_err());
        assert!(peer_url("not a url", &["downloads"]).is_err());
    }
}
