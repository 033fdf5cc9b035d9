//! The last word on a refused request: a rejection axum writes itself — an extractor a handler takes
//! bare (`Query<T>`, `Option<Json<T>>`) instead of as a `Result` it maps to [`ApiError`] — is a
//! `text/plain` 4xx, which no client of the three APIs parses. [`in_api_shape`] rewrites such an answer
//! into the error shape of the route's API ([`crate::dialect::error_response`]), its message kept and
//! its status mapped as [`ApiError`]'s `From<JsonRejection>` maps it (413 and 415 as they are, every
//! other refusal 400), so a malformed body or query is refused the same way on every route.

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use crate::ApiError;
use crate::dialect::error_response;

/// Longest rejection text kept (axum's are a line or two).
const MAX_TEXT: usize = 16 * 1024;

/// Middleware: a `text/plain` 4xx answer becomes the route's API error shape; every other answer
/// passes as it is.
pub async fn in_api_shape(req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    let response = next.run(req).await;
    let status = response.status();
    let plain = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain"));
    if !status.is_client_error() || !plain {
        return response;
    }
    let text = axum::body::to_bytes(response.into_body(), MAX_TEXT)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let text = if text.is_empty() {
        format!("the request was refused ({status})")
    } else {
        text
    };
    let err = match status {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::UnsupportedMediaType(text),
        _ => ApiError::bad_request(text),
    };
    error_response(&path, err)
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::extract::Query;
    use axum::routing::get;
    use serde_json::Value;
    use tower::ServiceExt;

    use super::*;

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Q {
        node: Option<String>,
    }

    async fn bare_query(Query(_): Query<Q>) -> &'static str {
        "ok"
    }

    fn app() -> Router {
        Router::new()
            .route("/downloads/x", get(bare_query))
            .route("/api/x", get(bare_query))
            .route("/v1/messages/x", get(bare_query))
            .route(
                "/metrics",
                get(|| async { ([(header::CONTENT_TYPE, "text/plain")], "up 1") }),
            )
            .layer(axum::middleware::from_fn(in_api_shape))
    }

    async fn call(uri: &str) -> (StatusCode, String, Vec<u8>) {
        let res = app()
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = res.status();
        let ct = res.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_owned();
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, ct, body.to_vec())
    }

    #[tokio::test]
    async fn a_bare_extractors_plain_rejection_is_answered_in_each_apis_shape() {
        // OpenAI's shape on the cluster's routes, the message axum wrote kept.
        let (status, ct, body) = call("/downloads/x?bogus=1").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(ct, "application/json");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("bogus"),
            "{v}"
        );
        // Ollama's `{"error": "…"}` under /api/.
        let (status, _, body) = call("/api/x?bogus=1").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert!(v["error"].as_str().unwrap().contains("bogus"), "{v}");
        // Anthropic's under /v1/messages.
        let (status, _, body) = call("/v1/messages/x?bogus=1").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }

    #[tokio::test]
    async fn accepted_requests_and_plain_text_answers_pass_unchanged() {
        let (status, ct, body) = call("/downloads/x?node=a").await;
        assert_eq!((status, body.as_slice()), (StatusCode::OK, &b"ok"[..]));
        assert!(ct.starts_with("text/plain"), "{ct}");
        let (status, ct, body) = call("/metrics").await;
        assert_eq!(
            (status, ct.as_str(), body.as_slice()),
            (StatusCode::OK, "text/plain", &b"up 1"[..])
        );
    }
}
