//! Each API's error shape for the one [`ApiError`]: OpenAI's is `ApiError`'s own, [`anthropic::Error`]
//! writes Anthropic's and [`ollama::Error`] Ollama's. [`error_response`] picks the shape by path
//! for errors answered outside a handler — by middleware (API keys, forwarding to the driving node, the
//! body limit) and by the fallbacks (no such route, wrong method): Anthropic's under `/v1/messages`,
//! Ollama's under `/api/`, OpenAI's everywhere else. A leaf: the API modules use it, never the reverse.

pub mod anthropic;
pub mod ollama;

use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// `err` as the API of `path` writes errors.
pub fn error_response(path: &str, err: ApiError) -> Response {
    if path.starts_with("/v1/messages") {
        anthropic::Error(err).into_response()
    } else if path.starts_with("/api/") {
        ollama::Error(err).into_response()
    } else {
        err.into_response()
    }
}
