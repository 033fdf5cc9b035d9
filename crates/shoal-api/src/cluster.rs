//! Cluster routes: `GET /state`, `GET /instance/previews`, `POST /instance`, `DELETE /instance/{id}`.
//!
//! They read the node's latest cluster snapshot or ask the coordinator through the [`ClusterHandle`];
//! they never touch sockets themselves.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use shoal_cluster::{ClusterHandle, PlaceRequest};

use crate::{ApiError, ApiState};

fn cluster(state: &ApiState) -> Result<&ClusterHandle, ApiError> {
    state
        .cluster
        .as_ref()
        .ok_or_else(|| ApiError::NotFound("this node runs without a cluster".into()))
}

/// `GET /state`: this node's view of the cluster (`cluster` is the same on every member).
pub async fn get_state(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let c = cluster(&state)?;
    let body = serde_json::to_value(c.snapshot().state_json())
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(body))
}

/// Query of `GET /instance/previews`: lists are comma-separated.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviewQuery {
    model: Option<String>,
    nodes: Option<String>,
    layers: Option<String>,
    max_stages: Option<usize>,
    kv_reserve_tokens: Option<usize>,
}

fn split_list(s: &Option<String>) -> Option<Vec<String>> {
    s.as_ref().map(|s| {
        s.split(',')
            .map(|x| x.trim().to_string())
            .filter(|x| !x.is_empty())
            .collect()
    })
}

impl PreviewQuery {
    fn into_request(self) -> Result<PlaceRequest, ApiError> {
        let model = self
            .model
            .filter(|m| !m.is_empty())
            .ok_or_else(|| ApiError::invalid("model", "the 'model' query parameter is required"))?;
        let layers = match split_list(&self.layers) {
            None => None,
            Some(v) => Some(
                v.iter()
                    .map(|x| x.parse::<usize>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| {
                        ApiError::invalid("layers", "layers must be numbers, e.g. 10,20")
                    })?,
            ),
        };
        Ok(PlaceRequest {
            model,
            nodes: split_list(&self.nodes),
            layers,
            max_stages: self.max_stages,
            kv_reserve_tokens: self.kv_reserve_tokens,
        })
    }
}

/// `GET /instance/previews?model=…`: candidate placements, best first, each explained and costed.
pub async fn previews(
    State(state): State<ApiState>,
    query: Result<Query<PreviewQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let c = cluster(&state)?;
    let Query(q) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let req = q.into_request()?;
    let placements = c
        .previews(&req)
        .map_err(|e| ApiError::invalid("model", e))?;
    Ok(Json(json!({ "model": req.model, "previews": placements })))
}

/// `POST /instance`: places an instance through the coordinator; 201 with the instance.
pub async fn create(
    State(state): State<ApiState>,
    body: Result<Json<PlaceRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let c = cluster(&state)?;
    let Json(req) = body?;
    if req.model.is_empty() {
        return Err(ApiError::invalid("model", "'model' must not be empty"));
    }
    let record = c
        .place(req)
        .await
        .map_err(|e| ApiError::invalid("model", e))?;
    let body = serde_json::to_value(record).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok((StatusCode::CREATED, Json(body)))
}

/// `DELETE /instance/{id}`.
pub async fn delete(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let c = cluster(&state)?;
    match c.remove(id.clone()).await {
        Ok(true) => Ok(Json(json!({ "id": id, "deleted": true }))),
        Ok(false) => Err(ApiError::NotFound(format!("no instance '{id}'"))),
        Err(e) => Err(ApiError::Internal(e)),
    }
}
