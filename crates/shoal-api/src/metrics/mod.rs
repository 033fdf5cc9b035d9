//! `GET /metrics`: every metric of this node in Prometheus' text format.
//!
//! Two kinds of series, one exposition:
//! - **Events** (requests, tokens, TTFT, inter-token and end-to-end latency, step times, preemptions,
//!   prefix cache hits, membership changes, re-placements, download bytes) are recorded through the
//!   `metrics` facade in the crate where each happens (`shoal-engine`'s `meters`, `shoal-pipeline`'s
//!   hosted stages, `shoal-cluster`, `shoal-transfer`, and [`track`] here for HTTP requests) into the
//!   global recorder that [`install`] sets up once per process (`metrics-exporter-prometheus`, no
//!   listener of its own: the route renders its [`PrometheusHandle`]; every histogram gets explicit
//!   latency buckets, so Prometheus sees histograms, not summaries).
//! - **State** (nodes, links, instances, downloads, the engines' queues) is read from the node's
//!   cluster snapshot — the data `GET /state` shows — at each scrape ([`state::render`]) into a fresh
//!   recorder, so a node, link or instance that no longer exists has no series left behind.
//!
//! [`names`] lists every metric with its type and help text (the exposition's `# HELP` lines, and the
//! list `docs/monitoring/` is checked against). `/metrics` follows the API-key rule of every other route
//! ([`crate::auth`]): Prometheus sends the key as a bearer credential.

pub mod names;
pub mod state;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::{ApiError, ApiState};

/// Bucket bounds (seconds) of every latency histogram: 1 ms (one token of a small model) to 2 min (a
/// long generation end to end).
pub const LATENCY_BUCKETS: [f64; 17] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
    30.0, 120.0,
];

/// Bucket bounds of speculative decoding's tokens per pass (1: nothing accepted).
pub const TOKENS_PER_PASS_BUCKETS: [f64; 9] = [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 33.0];

/// How often the recorder folds recorded histogram samples into its buckets when nobody scrapes (so
/// an unscraped node's memory stays bounded).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The exporter with this node's buckets.
fn builder() -> PrometheusBuilder {
    let plain = PrometheusBuilder::new();
    let built = PrometheusBuilder::new()
        .set_buckets(&LATENCY_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(shoal_engine::meters::names::SPEC_TOKENS_PER_PASS.into()),
                &TOKENS_PER_PASS_BUCKETS,
            )
        });
    match built {
        Ok(b) => b,
        // Only for empty buckets, which the constant is not.
        Err(_) => plain,
    }
}

/// Installs the process's Prometheus recorder (the first call; later calls return the same handle, so
/// every router of a test process can have one) and describes every event metric. When another
/// recorder was installed first, the handle renders only the state series.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = builder().build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!(
                    "another metrics recorder is installed: /metrics shows the cluster state only"
                );
            }
            names::describe_events();
            let upkeep = handle.clone();
            let spawned = std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(UPKEEP_EVERY);
                        upkeep.run_upkeep();
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(
                    "no metrics upkeep thread ({e}): histograms are folded at scrapes only"
                );
            }
            handle
        })
        .clone()
}

/// `GET /metrics`: the recorded events, then the cluster state as of now. 404 when this server was
/// built without a recorder ([`ApiState::metrics`] is `None`).
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "get_metrics",
    tag = "shoal",
    responses(
        (status = 200, description = "Prometheus' text format.", content_type = "text/plain", body = String),
        (status = 404, description = "The node runs without a metrics recorder.")
    )
)]
pub async fn get_metrics(State(state): State<ApiState>) -> Response {
    let Some(handle) = &state.metrics else {
        return ApiError::NotFound("metrics are not enabled on this server".into()).into_response();
    };
    let mut text = handle.render();
    text.push_str(&state::render(&state));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// Which API a path belongs to: `anthropic` (`/v1/messages…`), `ollama` (`/api/…`), `openai` (other
/// `/v1/…`), else `other` (cluster, downloads, `/metrics`, `/health`, the dashboard).
pub fn api_of(path: &str) -> &'static str {
    if path.starts_with("/v1/messages") {
        "anthropic"
    } else if path.starts_with("/api/") {
        "ollama"
    } else if path.starts_with("/v1/") {
        "openai"
    } else {
        "other"
    }
}

/// Middleware on every route: counts each request by API, route template (never the raw path: an id
/// in a path must not make a series), method, model and status, and times it to its response headers
/// (a stream's first byte). The model is read from a `POST` body's `model` field and kept only when this
/// node or a member of its cluster has that model (anything else a client sends is `other`: labels
/// stay bounded). A request is counted once, on the node the client sent it to, with the status the
/// client got: one that another node's balancer relayed here ([`crate::relayed::Relayed`], proven) is
/// not counted again (the engine's own series count it where it runs).
pub async fn track(State(state): State<ApiState>, req: Request, next: Next) -> Response {
    if crate::relayed::is_relayed(&req) {
        return next.run(req).await;
    }
    let started = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |m| m.as_str())
        .to_string();
    let api = api_of(req.uri().path());
    let method = req.method().clone();
    let (req, model) = if method == Method::POST && api != "other" {
        let (parts, bytes, model) = match crate::body::read_with_model(req, state.body_limit).await
        {
            Ok(read) => read,
            Err(response) => return response,
        };
        let model = model.map(|m| known_model(&state, m));
        (
            Request::from_parts(parts, axum::body::Body::from(bytes)),
            model,
        )
    } else {
        (req, None)
    };
    let response = next.run(req).await;
    let status = response.status().as_u16().to_string();
    let model = model.unwrap_or_default();
    metrics::counter!(names::HTTP_REQUESTS, "api" => api, "route" => route.clone(), "method" => method.to_string(), "model" => model, "status" => status)
        .increment(1);
    metrics::histogram!(names::HTTP_DURATION, "api" => api, "route" => route)
        .record(started.elapsed());
    response
}

/// `model` when this node or a member has it (or runs an instance of it), else `other`.
fn known_model(state: &ApiState, model: String) -> String {
    if state.engine.get(&model).is_ok() {
        return model;
    }
    let Some(cluster) = &state.cluster else {
        return "other".into();
    };
    let snap = cluster.snapshot();
    let known = snap
        .state
        .member_facts()
        .iter()
        .any(|f| f.models.iter().any(|c| c.id == model))
        || snap
            .state
            .table()
            .instances
            .iter()
            .any(|i| i.model == model);
    if known { model } else { "other".into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_api() {
        assert_eq!(api_of("/v1/messages"), "anthropic");
        assert_eq!(api_of("/v1/messages/count_tokens"), "anthropic");
        assert_eq!(api_of("/api/chat"), "ollama");
        assert_eq!(api_of("/v1/chat/completions"), "openai");
        assert_eq!(api_of("/metrics"), "other");
        assert_eq!(api_of("/state"), "other");
    }

    #[test]
    fn install_twice_gives_one_recorder() {
        let a = install();
        let b = install();
        metrics::counter!("shoal_test_install_total").increment(3);
        assert!(a.render().contains("shoal_test_install_total 3"));
        assert!(b.render().contains("shoal_test_install_total 3"));
    }
}
