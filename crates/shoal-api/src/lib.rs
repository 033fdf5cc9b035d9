//! shoal-api: the HTTP API on axum, talking to the engine through [`shoal_engine::EngineHandle`].
//!
//! - [`router`] builds the whole [`axum::Router`] from an [`ApiState`], its routes listed once by
//!   [`routes`] ([`route_table::Routes`]: the router and the list of what it serves, which the tests
//!   check [`openapi`]'s document against); [`serve`] ([`server`]: our own
//!   accept loop with a header timeout and a connection cap) runs it on a listener until a shutdown
//!   future resolves. Tests drive the router with `oneshot`, no sockets.
//! - [`openai`], [`anthropic`] and [`ollama`] hold each API's routes: its request and response shapes
//!   and the conversions between them and shoal's. A chat-like handler (OpenAI chat and Responses,
//!   Anthropic Messages, Ollama chat) turns its body into one validated [`generate::Chat`] and hands it
//!   to the one generation path ([`generate`]): the request's id allocated up front, shoal-guide's plan
//!   built off the async workers, one submit; the engine answers with a
//!   [`shoal_engine::RequestStream`] of events, each read once into a [`generate::Outcome`] that every
//!   output format renders.
//! - Non-streaming answers gather the outcomes into one JSON object; streaming answers hand the
//!   request to an SSE body ([`sse`]) or NDJSON lines (Ollama). Either way the stream lives exactly as long as the client's
//!   request: when the client disconnects, axum drops the handler future or the body, the `RequestStream`
//!   is dropped, and the engine cancels the sequence at its next step.
//! - [`error::ApiError`] is every failure; its one `IntoResponse` impl writes OpenAI's error shape with
//!   the right status and hides internal details.
//!
//! - [`guard`]: the edge against strangers — which web origins may use the node (CORS, state-changing
//!   requests from other origins refused, DNS rebinding refused on loopback), bodies declared over the
//!   limit refused at once, failed enrolments limited per address.
//! - [`rejection`]: a rejection axum writes itself (`text/plain`) answered in the route's API shape.
//! - [`request_id`]: every request's id (the client's `x-request-id` or a new one), answered in the
//!   response and named by the request's span in every log line about it.
//! - [`auth`]: API keys — with keys configured every route but `/health`, `/cluster/enroll` and the dashboard's page
//!   needs one (401 otherwise).
//! - [`dashboard`]: the page at `/` (Ollama's `Ollama is running` for clients that are not browsers) and its
//!   live feed `GET /dashboard/events`.
//! - [`metrics`]: `GET /metrics` in Prometheus' text format (events recorded where they happen, the
//!   cluster state read at each scrape) and the middleware counting and timing every request.
//! - [`relayed`]: requests another member sent on carry a proof made with the cluster's key; a client's
//!   copy of that header is dropped, so no client passes as a node.
//! - [`cancel`] lets a client stop a request by its response id (`POST /v1/cancel/{id}`): handlers hold
//!   each request as a [`cancel::LiveRequest`] under its ticket, which maps the client's id to the
//!   engine's sequences and its owner; the engine ends the request with `Done { Cancelled }`.
//!
//! - [`cluster`] holds the cluster routes, answered from the node's [`shoal_cluster::ClusterHandle`], and
//!   the middleware that sends each generation request to an instance of its model chosen by
//!   [`balance`] (this node's engine or another driver's API: least queued work, prefix affinity);
//!   [`membership`] joining with an invite and removing nodes; [`downloads`] the model downloads of every node (listed from the cluster's facts, started and
//!   cancelled through this node's [`shoal_transfer::Downloads`]).
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/responses`, `POST /v1/embeddings`, `POST /v1/cancel/{id}`,
//! `GET /v1/models`, `GET /v1/models/{id}`, `GET /`, `GET /dashboard/events`, `GET /health`, `GET /metrics`, `GET /openapi.json`, `GET /state`, `GET /instance/previews`,
//! `POST /instance`, `DELETE /instance/{id}`, `POST /links/probe`, `POST /doctor` ([`doctor`]: fresh link measurements to every peer), `POST /cluster/enroll`, `POST /cluster/remove`, `GET`/`POST /downloads`,
//! `DELETE /downloads/{model}`.

pub mod anthropic;
pub mod auth;
pub mod balance;
mod body;
pub mod cancel;
pub mod cluster;
pub mod dashboard;
pub mod dialect;
pub mod doctor;
pub mod downloads;
pub mod error;
pub mod generate;
pub mod guard;
pub mod limits;
pub mod membership;
pub mod metrics;
pub mod ollama;
pub mod openai;
pub mod openapi;
pub mod rejection;
pub mod relayed;
pub mod request_id;
pub mod route_table;
pub mod schema;
pub mod server;
pub mod speculative;
pub mod sse;

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};
use axum::response::IntoResponse;
use axum::routing::post;
use shoal_engine::{Engines, RequestStream};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

use cancel::{Cancellations, LiveRequest};
pub use error::ApiError;
pub use route_table::Routes;
pub use server::{ServeConfig, serve};

/// The API's default port.
pub const DEFAULT_PORT: u16 = 52415;

/// Largest accepted request body by default: far above any prompt that fits a context window, small
/// enough that a flood of huge bodies cannot exhaust memory.
pub const DEFAULT_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// What every handler can reach. Cheap to clone.
#[derive(Clone)]
pub struct ApiState {
    /// The engines of the models this node serves.
    pub engine: Engines,
    /// Largest accepted request body in bytes; larger ones get 413.
    pub body_limit: usize,
    /// The tickets of requests still being answered, for `POST /v1/cancel/{id}`.
    pub cancellations: Arc<Cancellations>,
    /// The cluster this node belongs to (`/state`, `/instance…`); `None` for a bare engine.
    pub cluster: Option<shoal_cluster::ClusterHandle>,
    /// Held while this node places an instance for a request (see [`cluster::forward_to_driver`]).
    pub placing: Arc<tokio::sync::Mutex<()>>,
    /// Which instance of a model serves each request, and what this node sent where ([`balance`]).
    pub balancer: Arc<balance::Balancer>,
    /// This node's model downloads (`POST`/`DELETE /downloads`); `None` for a bare engine.
    pub downloads: Option<shoal_transfer::Downloads>,
    /// With keys, every route but `/health` and `/cluster/enroll` needs one ([`auth`]); `None`: the API is open.
    pub api_keys: Option<auth::ApiKeys>,
    /// Constrained decoding per model (JSON schemas, forced tool calls), built on first need.
    pub guides: shoal_guide::Guides,
    /// The process's Prometheus recorder ([`metrics::install`]) that `GET /metrics` renders; `None`:
    /// that route answers 404.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// The web origins allowed to use this node, and the `Host` check of a loopback node
    /// ([`guard::origin`]).
    pub origins: guard::origin::OriginPolicy,
    /// Failed `POST /cluster/enroll` tries per client address ([`guard::attempts`]).
    pub enroll_attempts: Arc<guard::attempts::FailedAttempts>,
}

impl ApiState {
    pub fn new(engine: impl Into<Engines>) -> Self {
        ApiState {
            engine: engine.into(),
            cluster: None,
            placing: Arc::default(),
            balancer: Arc::default(),
            downloads: None,
            api_keys: None,
            guides: shoal_guide::Guides::default(),
            metrics: None,
            body_limit: DEFAULT_BODY_LIMIT,
            cancellations: Arc::default(),
            origins: guard::origin::OriginPolicy::default(),
            enroll_attempts: Arc::default(),
        }
    }

    /// The cluster this node belongs to; a 404 for a bare engine.
    pub fn cluster(&self) -> Result<&shoal_cluster::ClusterHandle, ApiError> {
        self.cluster
            .as_ref()
            .ok_or_else(|| ApiError::NotFound("this node runs without a cluster".into()))
    }

    /// Wraps a just-submitted request that clients cannot cancel by id (it has no ticket).
    pub fn track(&self, stream: RequestStream) -> LiveRequest {
        LiveRequest::new(stream, None, self.cancellations.clone())
    }

    /// Wraps a just-submitted request under its [`cancel::Ticket`], so its owner can cancel it by id and
    /// its handler can learn that it was.
    pub fn track_ticket(&self, stream: RequestStream, ticket: &Arc<cancel::Ticket>) -> LiveRequest {
        LiveRequest::new(stream, Some(ticket.clone()), self.cancellations.clone())
    }
}

/// All routes, with body limit, CORS and the origin policy (browser clients on other origins) and request
/// tracing.
pub fn router(state: ApiState) -> Router {
    let body_limit = state.body_limit;
    let cors = state.origins.cors();
    routes(&state)
        .into_router()
        .merge(ollama::unknown_routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(rejection::in_api_shape))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_key,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::track,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            relayed::check,
        ))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::declared_too_large,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::origin::refuse_foreign,
        ))
        .layer(cors)
        .layer(TraceLayer::new_for_http().make_span_with(request_id::span))
        .layer(CatchPanicLayer::custom(panicked))
        .layer(axum::middleware::from_fn(request_id::assign))
        .with_state(state)
}

/// Every route of the API, with the layers of some of them (generation requests go to their model's
/// driver; enrolment bodies are small): the list the OpenAPI document is checked against.
pub fn routes(state: &ApiState) -> Routes {
    let generation = Routes::new()
        .post("/v1/chat/completions", openai::chat::chat_completions)
        .post("/v1/completions", openai::completions::completions)
        .post("/v1/embeddings", openai::embeddings::embeddings)
        .post("/v1/responses", openai::responses::create_response)
        .merge(anthropic::routes())
        .merge(ollama::routes())
        .map(|r| {
            r.route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                cluster::forward_to_driver,
            ))
        });
    Routes::new()
        .merge(generation)
        .merge(ollama::plain_routes())
        .merge(dashboard::routes())
        .post("/v1/cancel/{id}", cancel::cancel_request)
        .get("/v1/models", openai::list_models)
        .get("/v1/models/{*id}", openai::get_model)
        .get("/health", health)
        .get("/metrics", metrics::get_metrics)
        .get("/state", cluster::get_state)
        .get("/instance/previews", cluster::previews)
        .post("/instance", cluster::create)
        .delete("/instance/{id}", cluster::delete)
        .post("/links/probe", cluster::probe_links)
        .post("/doctor", doctor::doctor)
        .on(
            "POST",
            membership::ENROLL_PATH,
            post(membership::enroll).layer(DefaultBodyLimit::max(membership::ENROLL_BODY_LIMIT)),
        )
        .post("/cluster/remove", membership::remove)
        .get("/downloads", downloads::list)
        .post("/downloads", downloads::start)
        .delete("/downloads/{*model}", downloads::cancel)
        .get("/openapi.json", openapi::openapi_json)
}

/// `GET /health` answer: `{"status": "ok"}`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Health {
    #[schema(schema_with = health_ok)]
    pub status: &'static str,
}

fn health_ok() -> utoipa::openapi::schema::Object {
    schema::one_of(&["ok"], false)
}

#[utoipa::path(
    get,
    path = "/health",
    operation_id = "get_health",
    tag = "shoal",
    responses(
        (status = 200, description = "The node answers; needs no key.", body = Health)
    )
)]
async fn health() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// A handler that panicked (a bug) answers a 500 in OpenAI's shape instead of dropping the connection;
/// the node keeps serving.
fn panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> axum::response::Response {
    let what = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic without a message");
    tracing::error!(panic = what, "a request handler panicked");
    ApiError::Internal(what.to_string()).into_response()
}

async fn not_found(method: Method, uri: Uri) -> axum::response::Response {
    let err = ApiError::NotFound(format!("no route for {method} {}", uri.path()));
    dialect::error_response(uri.path(), err)
}

async fn method_not_allowed(method: Method, uri: Uri) -> axum::response::Response {
    let err = ApiError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()));
    dialect::error_response(uri.path(), err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[tokio::test]
    async fn a_panicking_handler_answers_a_500_in_openai_shape() {
        let response = panicked(Box::new(String::from("index out of bounds")));
        assert_eq!(
            response.status(),
            axum::http::StatusCode::INTERNAL_SERVER_ERROR
        );
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["type"], "server_error");
        // Details stay in the log.
        assert!(!v["error"]["message"].as_str().unwrap().contains("index"));
    }
}
