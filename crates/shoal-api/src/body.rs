//! A request's body read whole, and the `model` it names: what the middleware that route or count a
//! generation request by model (`cluster::forward_to_driver`, the metrics middleware) need before the
//! handler reads the body itself.

use axum::body::Bytes;
use axum::http::request::Parts;
use axum::response::Response;

use crate::ApiError;
use crate::dialect::error_response;

/// The one field of a generation request the middleware read (serde skips the others).
#[derive(serde::Deserialize)]
struct ModelOf {
    model: String,
}

/// `req` split into its head and its whole body (at most `limit` bytes, else a 413 in the path's API
/// shape), with the body's `model` when it is JSON naming one.
pub(crate) async fn read_with_model(
    req: axum::extract::Request,
    limit: usize,
) -> Result<(Parts, Bytes, Option<String>), Response> {
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => return Err(error_response(parts.uri.path(), ApiError::PayloadTooLarge)),
    };
    let model = serde_json::from_slice::<ModelOf>(&bytes)
        .ok()
        .map(|m| m.model);
    Ok((parts, bytes, model))
}
