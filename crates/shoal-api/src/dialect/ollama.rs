//! [`Error`]: an [`ApiError`] answered in Ollama's shape, `{"error": "message"}`, with the status of the
//! [`ApiError`] — what the `ollama` clients raise as `ResponseError` (with `status_code`). A stream that
//! fails midway ends with the same object as its last line ([`Error::line`]).
//!
//! The message names the parameter in front when it does not already (`options.top_p: …`), uses Ollama's
//! wording for an unknown model, and hides internal details as the OpenAI routes do.

use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::ApiError;

/// An error answered in Ollama's shape: `{"error": "message"}` with the status of the [`ApiError`].
#[derive(Debug)]
pub struct Error(pub ApiError);

impl From<ApiError> for Error {
    fn from(err: ApiError) -> Self {
        Error(err)
    }
}

impl From<JsonRejection> for Error {
    fn from(rejection: JsonRejection) -> Self {
        Error(ApiError::from(rejection))
    }
}

impl Error {
    /// The message an Ollama client shows: Ollama's own wording for an unknown model, the parameter named
    /// in front of a message that does not mention it, internal details hidden.
    pub fn message(&self) -> String {
        match &self.0 {
            ApiError::ModelNotFound { model } => {
                let model = crate::error::shown_name(model);
                format!("model \"{model}\" not found, try pulling it first")
            }
            ApiError::InvalidRequest {
                message,
                param: Some(param),
                ..
            } if !message.contains(param.as_str()) => format!("{param}: {message}"),
            other => other.body().error.message,
        }
    }

    /// The `{"error": …}` object, also written as the last line of a stream that fails midway.
    pub fn line(&self) -> serde_json::Value {
        json!({ "error": self.message() })
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let body = self.line().to_string();
        // The status, headers (Retry-After, …) and logging of the one ApiError mapping; Ollama's body.
        let (mut parts, _) = self.0.into_response().into_parts();
        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json; charset=utf-8"),
        );
        Response::from_parts(parts, Body::from(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_name_the_parameter_and_use_ollamas_wording() {
        let e = Error(ApiError::ModelNotFound { model: "x".into() });
        assert_eq!(e.message(), "model \"x\" not found, try pulling it first");
        let e = Error(ApiError::invalid("options.top_p", "must be in (0, 1]"));
        assert_eq!(e.message(), "options.top_p: must be in (0, 1]");
        let e = Error(ApiError::invalid("images", "images are not supported"));
        assert_eq!(e.message(), "images are not supported");
        let e = Error(ApiError::Internal("secret /root path".into()));
        assert!(!e.message().contains("secret"));
    }
}

/// Ollama's error shape as the OpenAPI document states it: a refused request's body, and the line that
/// ends a failed stream ([`Error`] writes it).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = ollama::ErrorLine)]
#[allow(dead_code)]
pub struct ErrorLine {
    pub error: String,
}
