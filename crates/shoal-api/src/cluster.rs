//! Cluster routes: `GET /state`, `GET /instance/previews`, `POST /instance`, `DELETE /instance/{id}`,
//! and [`forward_to_driver`], the middleware that sends a generation request to the instance of its
//! model that [`crate::balance`] chooses (relayed to another node's API when it is not this node's).
//!
//! The routes read the node's latest cluster snapshot or ask the coordinator through the
//! [`ClusterHandle`]; they never touch cluster sockets themselves.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use shoal_cluster::{
    ClusterHandle, InstanceId, InstanceRecord, ModelId, NodeId, PlaceRequest, Placement,
};

use crate::balance::{self, InFlight, Target};
use crate::dialect::error_response;
use crate::{ApiError, ApiState};

/// `GET /state`: this node's view of the cluster (`cluster` is the same on every member), plus this
/// node's own `engines` (the counters of each model's engine here: what its instance served) and
/// `routing` (requests this node sent to each instance, and how many of them are still running).
#[utoipa::path(
    get,
    path = "/state",
    operation_id = "get_state",
    tag = "cluster",
    responses(
        (status = 200, description = "This node's view of the cluster (`node`, `cluster`), its `engines` and `routing`.", body = Object),
        crate::schema::OpenAiErrors
    )
)]
pub async fn get_state(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    state_value(&state).map(Json)
}

/// The body of `GET /state` (the dashboard's feed is built from it too).
pub fn state_value(state: &ApiState) -> Result<Value, ApiError> {
    let c = state.cluster()?;
    let mut body = serde_json::to_value(c.snapshot().state_json())
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let engines: serde_json::Map<String, Value> = state
        .engine
        .models()
        .into_iter()
        .filter_map(|m| {
            let stats = state.engine.get(&m.id).ok()?.stats();
            Some((m.id, serde_json::to_value(stats).ok()?))
        })
        .collect();
    if let Value::Object(map) = &mut body {
        map.insert("engines".into(), Value::Object(engines));
        map.insert("routing".into(), json!(state.balancer.stats()));
    }
    Ok(body)
}

/// Query of `GET /instance/previews`: lists are comma-separated.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PreviewQuery {
    model: Option<String>,
    nodes: Option<String>,
    layers: Option<String>,
    max_stages: Option<usize>,
    kv_reserve_tokens: Option<usize>,
    replicas: Option<usize>,
    /// `latency` or `throughput`.
    #[param(value_type = Option<String>)]
    goal: Option<shoal_cluster::proto::Goal>,
    /// `true`: one tensor-parallel group of all of `nodes`; `false`: no group.
    tensor_parallel: Option<bool>,
}

/// The node ids of a comma-separated list, each checked.
fn node_list(s: &Option<String>) -> Result<Option<Vec<NodeId>>, ApiError> {
    split_list(s)
        .map(|v| {
            v.iter()
                .map(|n| NodeId::parse(n).map_err(|e| ApiError::invalid("nodes", e.to_string())))
                .collect()
        })
        .transpose()
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
        let model =
            ModelId::parse(&model).map_err(|e| ApiError::invalid("model", e.to_string()))?;
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
            nodes: node_list(&self.nodes)?,
            layers,
            max_stages: self.max_stages,
            kv_reserve_tokens: self.kv_reserve_tokens,
            replicas: self.replicas,
            goal: self.goal,
            tensor_parallel: self.tensor_parallel,
        })
    }
}

/// `GET /instance/previews?model=…`: candidate placements, best first, each explained and costed. With
/// `replicas=N`: `replicas`, the N placements on disjoint nodes `POST /instance` would make.
#[utoipa::path(
    get,
    path = "/instance/previews",
    operation_id = "get_instance_previews",
    tag = "cluster",
    params(PreviewQuery),
    responses(
        (status = 200, description = "Candidate placements, best first (`previews`), or with `replicas` the placements `POST /instance` would make (`replicas`).", body = Previews),
        crate::schema::OpenAiErrors
    )
)]
pub async fn previews(
    State(state): State<ApiState>,
    query: Result<Query<PreviewQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Previews>, ApiError> {
    let c = state.cluster()?;
    let Query(q) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let req = q.into_request()?;
    if req.replicas.is_some() {
        let replicas = c.replica_previews(&req)?;
        return Ok(Json(Previews::Replicas {
            model: req.model,
            replicas,
        }));
    }
    let previews = c.previews(&req)?;
    Ok(Json(Previews::One {
        model: req.model,
        previews,
    }))
}

/// The answer of `GET /instance/previews`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Previews {
    /// Candidate placements of one instance, best first.
    One {
        model: ModelId,
        previews: Vec<Placement>,
    },
    /// With `replicas`: one placement per replica, on disjoint nodes.
    Replicas {
        model: ModelId,
        replicas: Vec<Placement>,
    },
}

/// The answer of `POST /instance`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Placed {
    /// The instance placed (boxed: a record is much larger than the other variant).
    One(Box<InstanceRecord>),
    /// With `replicas`: every replica placed.
    Replicas {
        model: ModelId,
        instances: Vec<InstanceRecord>,
    },
}

/// `POST /instance`: places an instance through the coordinator; 201 with the instance. With
/// `replicas`: 201 with `instances`, every replica placed (all or nothing).
#[utoipa::path(
    post,
    path = "/instance",
    operation_id = "post_instance",
    tag = "cluster",
    request_body = PlaceRequest,
    responses(
        (status = 201, description = "The instance placed (with `replicas`: every replica, `instances`).", body = Placed),
        crate::schema::OpenAiErrors
    )
)]
pub async fn create(
    State(state): State<ApiState>,
    body: Result<Json<PlaceRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Placed>), ApiError> {
    let c = state.cluster()?;
    // A model id is never empty (`ModelId` refuses it while the body is read).
    let Json(req) = body?;
    let placed = if req.replicas.is_some() {
        let model = req.model.clone();
        let instances = c.place_replicas(req).await?;
        Placed::Replicas { model, instances }
    } else {
        Placed::One(Box::new(c.place(req).await?))
    };
    Ok((StatusCode::CREATED, Json(placed)))
}

/// `POST /links/probe`: measures the bandwidth to every connected peer again (results appear in
/// `/state` → `links[].bandwidth_bps` within a few seconds).
#[utoipa::path(
    post,
    path = "/links/probe",
    operation_id = "post_links_probe",
    tag = "cluster",
    responses(
        (status = 202, description = "`{\"probing\": N}`: peers being measured again.", body = Object),
        crate::schema::OpenAiErrors
    )
)]
pub async fn probe_links(
    State(state): State<ApiState>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let c = state.cluster()?;
    let peers = c.snapshot().state.members().len().saturating_sub(1);
    c.probe_links().await;
    Ok((StatusCode::ACCEPTED, Json(json!({ "probing": peers }))))
}

/// `DELETE /instance/{id}`.
#[utoipa::path(
    delete,
    path = "/instance/{id}",
    operation_id = "delete_instance_id",
    tag = "cluster",
    params(("id" = String, Path, description = "The instance id.")),
    responses(
        (status = 200, description = "`{\"id\", \"deleted\": true}`.", body = Object),
        crate::schema::OpenAiErrors
    )
)]
pub async fn delete(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let c = state.cluster()?;
    // Not an instance id at all: no such instance, the same answer as an unknown one.
    let Ok(instance) = InstanceId::parse(&id) else {
        return Err(ApiError::NotFound(format!("no instance '{id}'")));
    };
    match c.remove(instance).await {
        Ok(true) => Ok(Json(json!({ "id": id, "deleted": true }))),
        Ok(false) => Err(ApiError::NotFound(format!("no instance '{id}'"))),
        Err(e) => Err(e.into()),
    }
}

/// Middleware on the generation routes: each request for a model goes to the ready instance chosen by
/// [`crate::balance`] (least predicted queued work, prefix affinity) — this node's engine, or another
/// driver's API, whose answer (streamed or not) is relayed as it comes. The client may talk to any
/// member. A model without an instance is placed first (see `ensure_instance`); a driver that cannot
/// be reached, or answers 503 before any output, is left out and the next best tried.
pub async fn forward_to_driver(
    State(state): State<ApiState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let Some(cluster) = state.cluster.clone() else {
        return next.run(req).await;
    };
    let forwarded = crate::relayed::is_relayed(&req);
    let (parts, bytes, model) = match crate::body::read_with_model(req, state.body_limit).await {
        Ok(read) => read,
        Err(response) => return response,
    };
    let here = |parts, bytes| {
        next.clone()
            .run(axum::extract::Request::from_parts(parts, Body::from(bytes)))
    };
    let Some(model) = model else {
        return here(parts, bytes).await; // the handler says what is wrong with the body
    };
    let path = parts.uri.path().to_string();
    if forwarded {
        // Sent here by another node's balancer: served here, or a 503 it retries elsewhere.
        if state.engine.get(&model).is_err() {
            return error_response(&path, ApiError::Unavailable);
        }
        let response = here(parts, bytes).await;
        if engine_left(&state, &model, &response) {
            return error_response(&path, ApiError::Unavailable);
        }
        return response;
    }
    if state.engine.get(&model).is_err()
        && let Err(e) = ensure_instance(&state, &cluster, &model).await
    {
        return error_response(&path, e);
    }
    let prefixes = balance::prompt_prefixes(&bytes);
    let mut left_out: Vec<String> = Vec::new();
    let mut last_failure = None;
    loop {
        let local_work = state.engine.get(&model).ok().map(|e| {
            let s = e.stats();
            (s.active_sequences + s.waiting) as f64
        });
        let mut candidates = balance::candidates(&cluster.snapshot(), &model, local_work);
        candidates.retain(|c| !left_out.contains(&c.instance));
        let Some((chosen, in_flight)) = state.balancer.route(candidates, &prefixes) else {
            break;
        };
        let served = match &chosen.target {
            Target::Local => {
                let response = here(parts.clone(), bytes.clone()).await;
                if engine_left(&state, &model, &response) {
                    Err(response)
                } else {
                    Ok(response)
                }
            }
            Target::Remote { api_url } => {
                relay(&cluster, api_url, &path, bytes.clone(), &parts.headers).await
            }
        };
        match served {
            Ok(response) => return counted(response, in_flight),
            Err(failure) => {
                tracing::info!(instance = %chosen.instance, target = ?chosen.target, "not served there; trying the next instance");
                left_out.push(chosen.instance);
                last_failure = Some(failure);
            }
        }
    }
    match last_failure {
        Some(response) => response,
        // No instance: the handler answers (a model no member has is its 404).
        None => here(parts, bytes).await,
    }
}

/// The handler answered 404 because this node's engine for `model` left while the request was on its
/// way to it (its instance was removed or is draining): nothing was served, another instance may.
fn engine_left(state: &ApiState, model: &str, response: &axum::response::Response) -> bool {
    response.status() == StatusCode::NOT_FOUND && state.engine.get(model).is_err()
}

/// `response` with its body holding `in_flight` until the body ends (or the client goes away).
fn counted(response: axum::response::Response, in_flight: InFlight) -> axum::response::Response {
    response.map(|body| {
        Body::from_stream(body.into_data_stream().map(move |chunk| {
            let _held = &in_flight;
            chunk
        }))
    })
}

/// How long a request for a model without a ready instance waits for one to be placed and loaded.
const PLACEMENT_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// A request for a model that some member has but no instance serves places one (the planner's best)
/// and waits until it is loaded; one that is already loading is waited for. Models no member has are
/// left to the handler (404).
async fn ensure_instance(
    state: &ApiState,
    cluster: &ClusterHandle,
    model: &str,
) -> Result<(), ApiError> {
    let usable =
        |s: &shoal_cluster::Snapshot| s.state.view().instances_of(model).any(|i| !i.is_failed());
    {
        // One automatic placement at a time on this node, so a burst of requests places one instance.
        let _guard = state.placing.lock().await;
        let snap = cluster.snapshot();
        if !usable(&snap) {
            let present = snap
                .state
                .member_facts()
                .iter()
                .any(|f| f.models.iter().any(|c| c.id == model));
            if !present {
                return Ok(());
            }
            tracing::info!(model, "no instance serves this model: placing one");
            let Ok(id) = ModelId::parse(model) else {
                return Ok(());
            };
            let req = PlaceRequest::of(id);
            let record = cluster.place(req).await?;
            tracing::info!(model, instance = %record.id, "placed: {}", record.explanation);
        }
    }
    let snap = cluster
        .wait_for(PLACEMENT_WAIT, |s| {
            s.state.view().instances_of(model).any(|i| !i.is_loading())
        })
        .await;
    let view = snap.state.view();
    if view.instances_of(model).any(|i| i.is_ready()) {
        return Ok(());
    }
    match view.instances_of(model).find(|i| i.is_failed()) {
        Some(i) => Err(ApiError::Internal(format!(
            "instance {} of {model} did not load: {}",
            i.record.id,
            i.failure()
                .unwrap_or_else(|| "no stage reported why".into())
        ))),
        None => Err(ApiError::Unavailable),
    }
}

/// Sends the request on to another node's API (marked as relayed by this member, [`crate::relayed`], with
/// the client's API key: the nodes of a cluster share their keys) and streams its answer back. The
/// receiving node serves it with its own engine or fails (503), never forwards it again. `Err`: the node could not be reached or
/// answered 503 (no engine for the model any more, overloaded) — nothing reached the client, so another
/// instance may serve it; the response is what to answer if none can.
async fn relay(
    cluster: &ClusterHandle,
    base: &str,
    path: &str,
    body: axum::body::Bytes,
    headers: &axum::http::HeaderMap,
) -> Result<axum::response::Response, axum::response::Response> {
    let url = format!("{base}{path}");
    let (mark, proof) = crate::relayed::mark(cluster, &axum::http::Method::POST, path, &body);
    let client = reqwest::Client::new();
    let mut req = client
        .post(&url)
        .header("content-type", "application/json")
        .header(mark.as_str(), proof.as_bytes())
        .body(body);
    for (name, value) in crate::auth::key_headers(headers) {
        req = req.header(name, value);
    }
    if let Some(id) = headers.get(crate::request_id::REQUEST_ID_HEADER) {
        req = req.header(crate::request_id::REQUEST_ID_HEADER, id.clone());
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(%url, "forwarding to the driving node failed: {e}");
            return Err(error_response(path, ApiError::Unavailable));
        }
    };
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let mut out = axum::response::Response::new(Body::from_stream(resp.bytes_stream()));
    *out.status_mut() = status;
    if let Ok(v) = axum::http::HeaderValue::from_str(&content_type) {
        out.headers_mut()
            .insert(axum::http::header::CONTENT_TYPE, v);
    }
    if status == StatusCode::SERVICE_UNAVAILABLE {
        return Err(out);
    }
    Ok(out)
}

/// Models this node answers for: its own engines' and those other members drive (forwarded).
pub fn served_models(state: &ApiState) -> Vec<shoal_engine::ModelInfo> {
    let mut models = state.engine.models();
    let Some(cluster) = &state.cluster else {
        return models;
    };
    let snap = cluster.snapshot();
    for inst in snap.state.view().instances {
        let id = &inst.record.model;
        if !inst.is_ready() || models.iter().any(|m| &m.id == id) {
            continue;
        }
        let card = snap
            .state
            .member_facts()
            .iter()
            .find_map(|f| f.models.iter().find(|c| &c.id == id).cloned());
        if let Some(card) = card {
            models.push(shoal_engine::ModelInfo {
                id: id.to_string(),
                context_length: card.context_length,
                created: 0,
                owned_by: "shoal".into(),
            });
        }
    }
    models.sort_by(|a, b| a.id.cmp(&b.id));
    models
}
