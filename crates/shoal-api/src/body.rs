//! A request's body read whole, and the `model` it names: what the middleware that route or count a
//! generation request by model (`cluster::forward_to_driver`, the metrics middleware) need before the
//! handler reads the body itself.
//!
//! The first reader parses the body once and leaves [`ReadBody`] (the bytes, shared, and the model) in
//! the request's extensions; a later reader of the same request takes it from there instead of
//! collecting and parsing the body again.

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

/// A body already read by a middleware: its bytes (the request carries the same bytes on as its body)
/// and the model it names.
#[derive(Clone)]
struct ReadBody {
    bytes: Bytes,
    model: Option<String>,
}

/// `req` split into its head and its whole body (at most `limit` bytes, else a 413 in the path's API
/// shape), with the body's `model` when it is JSON naming one. Read once per request: a second call on
/// a request rebuilt from the first's head and bytes returns what the first read.
pub(crate) async fn read_with_model(
    req: axum::extract::Request,
    limit: usize,
) -> Result<(Parts, Bytes, Option<String>), Response> {
    let (mut parts, body) = req.into_parts();
    if let Some(read) = parts.extensions.get::<ReadBody>().cloned() {
        return Ok((parts, read.bytes, read.model));
    }
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => return Err(error_response(parts.uri.path(), ApiError::PayloadTooLarge)),
    };
    let model = serde_json::from_slice::<ModelOf>(&bytes)
        .ok()
        .map(|m| m.model);
    parts.extensions.insert(ReadBody {
        bytes: bytes.clone(),
        model: model.clone(),
    });
    Ok((parts, bytes, model))
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::StatusCode;

    use super::*;

    #[tokio::test]
    async fn a_second_reader_gets_the_first_read_without_reading_the_body_again() {
        let req = axum::extract::Request::post("/v1/chat/completions")
            .body(Body::from(r#"{"model":"m1","messages":[]}"#))
            .unwrap();
        let (parts, bytes, model) = read_with_model(req, 1024).await.unwrap();
        assert_eq!(model.as_deref(), Some("m1"));
        // Rebuilt with a body that fails to read: the second reader never touches it.
        let broken =
            futures::stream::once(async { Err::<Bytes, _>(std::io::Error::other("read twice")) });
        let again = axum::extract::Request::from_parts(parts, Body::from_stream(broken));
        let (_, bytes2, model2) = read_with_model(again, 1024).await.unwrap();
        assert_eq!(bytes2, bytes);
        assert_eq!(model2.as_deref(), Some("m1"));
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_a_413_and_one_without_a_model_has_none() {
        let big = axum::extract::Request::post("/v1/chat/completions")
            .body(Body::from(vec![b'x'; 2048]))
            .unwrap();
        let refused = read_with_model(big, 1024).await.unwrap_err();
        assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let plain = axum::extract::Request::post("/api/chat")
            .body(Body::from("not json"))
            .unwrap();
        let (_, bytes, model) = read_with_model(plain, 1024).await.unwrap();
        assert_eq!((&bytes[..], model), (&b"not json"[..], None));
    }
}
