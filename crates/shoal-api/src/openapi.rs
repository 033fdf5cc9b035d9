//! The API's OpenAPI document (3.1), served at `GET /openapi.json`: derived with utoipa from the
//! request and response types of every API (their `ToSchema` derives) and the `#[utoipa::path]` of
//! every handler, listed once in [`ApiDoc`]. The tests check its paths against the routes the router
//! serves ([`crate::routes`]).

use std::sync::OnceLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::OpenApi;

/// The whole document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "shoal",
        description = "shoal's HTTP API: OpenAI-, Anthropic- and Ollama-compatible generation, and the cluster's own routes."
    ),
    paths(
        crate::openai::chat::chat_completions,
        crate::openai::completions::completions,
        crate::openai::embeddings::embeddings,
        crate::openai::responses::create_response,
        crate::openai::list_models,
        crate::openai::get_model,
        crate::cancel::cancel_request,
        crate::anthropic::messages,
        crate::anthropic::count_tokens,
        crate::ollama::generate::chat,
        crate::ollama::generate::generate,
        crate::ollama::embed::embed,
        crate::ollama::embed::embeddings,
        crate::ollama::models::tags,
        crate::ollama::models::ps,
        crate::ollama::models::show,
        crate::ollama::models::delete,
        crate::ollama::pull::pull,
        crate::ollama::version,
        crate::dashboard::root,
        crate::dashboard::app_js,
        crate::dashboard::style_css,
        crate::dashboard::events,
        crate::health,
        crate::metrics::get_metrics,
        crate::cluster::get_state,
        crate::cluster::previews,
        crate::cluster::create,
        crate::cluster::delete,
        crate::cluster::probe_links,
        crate::doctor::doctor,
        crate::membership::enroll,
        crate::membership::remove,
        crate::downloads::list,
        crate::downloads::start,
        crate::downloads::cancel,
        openapi_json,
    ),
    // The error shapes, named by the routes' error responses (`crate::schema`), which do not add them.
    components(schemas(
        crate::error::ErrorBody,
        crate::dialect::anthropic::ErrorBody,
        crate::ollama::types::ErrorLine
    )),
    tags(
        (name = "openai", description = "OpenAI-compatible generation, embeddings and models."),
        (name = "anthropic", description = "Anthropic's Messages API."),
        (name = "ollama", description = "Ollama's API."),
        (name = "cluster", description = "The cluster: its state, instances, members, links and downloads."),
        (name = "shoal", description = "The node: dashboard, health, metrics and this document."),
    )
)]
pub struct ApiDoc;

/// The document as JSON, built once.
pub fn document() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        ApiDoc::openapi()
            .to_json()
            .expect("the OpenAPI document serialises")
    })
}

/// `GET /openapi.json`.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "get_openapi_json",
    tag = "shoal",
    responses((status = 200, description = "This document (OpenAPI 3.1).", content_type = "application/json", body = Object))
)]
pub async fn openapi_json() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], document()).into_response()
}

#[cfg(test)]
#[path = "openapi_tests.rs"]
mod tests;
