//! Download routes: `GET /downloads` (every node's downloads: progress, speed, ETA, sources),
//! `POST /downloads` (start fetching a model on this node or on `node`), `DELETE /downloads/{model}`
//! (cancel it; `?node=` for another node's).
//!
//! The list comes from the cluster snapshot (each node publishes its own downloads in its facts), so any
//! node answers for all. Starting and cancelling act on this node's [`shoal_transfer::Downloads`]; a
//! request naming another node is forwarded to that node's API.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use shoal_cluster::facts::DownloadFacts;

use crate::{ApiError, ApiState};

/// `GET /downloads`: `{"nodes": {node id: [download, …]}}` for every member.
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
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartBody {
    model: String,
    /// The node that should download (default: this one).
    #[serde(default)]
    node: Option<String>,
}

/// `POST /downloads`: starts fetching `model` (peers first, then the internet) and answers at once with
/// 202; progress shows in `GET /downloads`.
pub async fn start(
    State(state): State<ApiState>,
    headers: axum::http::HeaderMap,
    body: Result<Json<StartBody>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Json(body) = body.map_err(|e| ApiError::invalid("body", e.body_text()))?;
    if body.model.trim().is_empty() {
        return Err(ApiError::invalid("model", "'model' must not be empty"));
    }
    if let Some(url) = other_node_url(&state, body.node.as_deref())? {
        let payload = json!({ "model": body.model });
        return forward(
            reqwest::Method::POST,
            format!("{url}/downloads"),
            Some(payload),
            &headers,
        )
        .await;
    }
    let downloads = local(&state)?;
    downloads
        .start(&body.model)
        .map_err(|e| ApiError::invalid("model", e.to_string()))?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "model": body.model, "state": "running" })),
    ))
}

/// Query of `DELETE /downloads/{model}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeQuery {
    node: Option<String>,
}

/// `DELETE /downloads/{model}`: cancels a running download (its verified part is kept for a resume).
pub async fn cancel(
    State(state): State<ApiState>,
    headers: axum::http::HeaderMap,
    Path(model): Path<String>,
    Query(q): Query<NodeQuery>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    if let Some(url) = other_node_url(&state, q.node.as_deref())? {
        return forward(
            reqwest::Method::DELETE,
            format!("{url}/downloads/{model}"),
            None,
            &headers,
        )
        .await;
    }
    if local(&state)?.cancel(&model) {
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

/// The API URL of `node` when it names another member; `None` for this node (or no node given).
fn other_node_url(state: &ApiState, node: Option<&str>) -> Result<Option<String>, ApiError> {
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

/// Sends the request to another node's API and answers with its status and JSON body.
async fn forward(
    method: reqwest::Method,
    url: String,
    body: Option<Value>,
    headers: &axum::http::HeaderMap,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let client = reqwest::Client::new();
    let mut req = client.request(method, &url);
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
