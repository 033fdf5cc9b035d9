//! [`Error`]: an [`ApiError`] answered in Anthropic's shape, `{"type": "error", "error": {"type",
//! "message"}}`, with Anthropic's statuses and error types — what the `anthropic` SDKs turn into their
//! typed exceptions (`BadRequestError`, `NotFoundError`, `AuthenticationError`, ...).
//!
//! The status comes from [`ApiError::status`], mapped onto the codes Anthropic documents: an
//! overloaded engine is 529 `overloaded_error` (the SDKs retry it), a body that is not declared as JSON
//! is a plain 400, the rest keep their status with the matching type. The message is
//! [`ApiError::body`]'s, so internal details stay hidden exactly as on the OpenAI routes.

use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::ApiError;

/// Anthropic's status for an overloaded API.
const OVERLOADED: u16 = 529;

/// An error answered in Anthropic's shape.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(transparent)]
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

impl From<shoal_engine::EngineError> for Error {
    fn from(err: shoal_engine::EngineError) -> Self {
        Error(ApiError::from_engine(err, "messages"))
    }
}

/// `{"type": "error", "error": {...}}`, also the payload of a stream's `error` event.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = anthropic::ErrorBody)]
pub struct ErrorBody {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub error: ErrorObject,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = anthropic::ErrorObject)]
pub struct ErrorObject {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub message: String,
}

impl Error {
    /// The status Anthropic answers this error with.
    pub fn status(&self) -> StatusCode {
        match (&self.0, self.0.status()) {
            (ApiError::Overloaded, _) => {
                StatusCode::from_u16(OVERLOADED).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
            }
            (_, StatusCode::UNSUPPORTED_MEDIA_TYPE) => StatusCode::BAD_REQUEST,
            (_, status) => status,
        }
    }

    /// Anthropic's error type for this error.
    pub fn kind(&self) -> &'static str {
        match self.status().as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            408 => "timeout_error",
            409 => "conflict_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            OVERLOADED => "overloaded_error",
            400..=499 => "invalid_request_error",
            _ => "api_error",
        }
    }

    /// The error object, internal details hidden; a named parameter leads the message (`max_tokens:
    /// ...`, as Anthropic writes them) unless the message names it already.
    pub fn body(&self) -> ErrorBody {
        let openai = self.0.body().error;
        let message = match openai.param {
            Some(param) if !openai.message.contains(param.as_str()) => {
                format!("{param}: {}", openai.message)
            }
            _ => openai.message,
        };
        ErrorBody {
            kind: "error",
            error: ErrorObject {
                kind: self.kind(),
                message,
            },
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), error = %self.0, "request failed");
        } else {
            tracing::debug!(status = status.as_u16(), error = %self.0, "request rejected");
        }
        let mut response = (status, axum::Json(self.body())).into_response();
        if matches!(self.0, ApiError::Overloaded) {
            // What the OpenAI routes send too: the engine's queue drains within about a second.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(err: ApiError) -> (u16, &'static str, String) {
        let e = Error(err);
        let body = e.body();
        (e.status().as_u16(), body.error.kind, body.error.message)
    }

    #[test]
    fn statuses_and_types_are_anthropics() {
        let (status, kind, msg) = shape(ApiError::invalid("max_tokens", "Field required"));
        assert_eq!((status, kind), (400, "invalid_request_error"));
        assert_eq!(msg, "max_tokens: Field required");
        let (status, kind, _) = shape(ApiError::ModelNotFound { model: "x".into() });
        assert_eq!((status, kind), (404, "not_found_error"));
        let (status, kind, _) = shape(ApiError::Unauthorized("no key".into()));
        assert_eq!((status, kind), (401, "authentication_error"));
        assert_eq!(shape(ApiError::PayloadTooLarge).1, "request_too_large");
        let (status, kind, _) = shape(ApiError::Overloaded);
        assert_eq!((status, kind), (529, "overloaded_error"));
        let (status, kind, _) = shape(ApiError::UnsupportedMediaType("json please".into()));
        assert_eq!((status, kind), (400, "invalid_request_error"));
        let (status, kind, msg) = shape(ApiError::Internal("secret /root".into()));
        assert_eq!((status, kind), (500, "api_error"));
        assert!(!msg.contains("secret"), "{msg}");
        let (status, kind, _) = shape(ApiError::StageLost("node b".into()));
        assert_eq!((status, kind), (503, "api_error"));
    }

    #[test]
    fn overloaded_says_when_to_retry() {
        let response = Error(ApiError::Overloaded).into_response();
        assert_eq!(response.status().as_u16(), 529);
        assert!(response.headers().contains_key(header::RETRY_AFTER));
    }

    #[test]
    fn a_message_that_names_its_parameter_is_not_prefixed_twice() {
        let (_, _, msg) = shape(ApiError::invalid(
            "temperature",
            "temperature must be in [0, 1]",
        ));
        assert_eq!(msg, "temperature must be in [0, 1]");
    }
}
