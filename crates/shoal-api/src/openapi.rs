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
    paths(openapi_json)
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
    tag = "shoal",
    responses((status = 200, description = "This document (OpenAPI 3.1).", content_type = "application/json", body = Object))
)]
pub async fn openapi_json() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], document()).into_response()
}
