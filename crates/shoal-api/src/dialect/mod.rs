//! Errors answered outside a handler — by middleware (API keys, forwarding to the driving node, the
//! body limit) and by the fallbacks (no such route, wrong method) — in the shape of the API the path
//! belongs to: Anthropic's under `/v1/messages`, Ollama's under `/api/`, OpenAI's everywhere else.

use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// `err` as the API of `path` writes errors.
pub fn error_response(path: &str, err: ApiError) -> Response {
    if path.starts_with("/v1/messages") {
        crate::anthropic::Error(err).into_response()
    } else if path.starts_with("/api/") {
        crate::ollama::Error(err).into_response()
    } else {
        err.into_response()
    }
}
