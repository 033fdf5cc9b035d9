//! [`ApiError`]: every way a request can fail, and the one place it becomes an HTTP response.
//!
//! Errors use OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, so every OpenAI
//! client shows them properly. Bad input is always a 4xx naming the offending parameter; internal
//! failures are logged with their details and answered with a generic message.

use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use shoal_cluster::ClusterError;
use shoal_engine::EngineError;

/// Seconds a client should wait before retrying when the engine is overloaded.
const RETRY_AFTER_SECS: &str = "1";

/// An error answered to an API client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or a parameter is out of range (400).
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<String>,
        code: Option<&'static str>,
    },
    /// The body is not declared as JSON (415).
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The body is larger than the configured limit (413).
    #[error("the request body is too large")]
    PayloadTooLarge,
    /// The requested model is not served here (404).
    #[error("the model '{}' does not exist", shown_name(model))]
    ModelNotFound { model: String },
    /// No such route (404).
    #[error("{0}")]
    NotFound(String),
    /// The route exists but not with this method (405).
    #[error("{0}")]
    MethodNotAllowed(String),
    /// No live request has this id (404, code `request_not_found`).
    #[error("no running or queued request has the id '{id}'")]
    RequestNotFound { id: String },
    /// The request was cancelled through `POST /v1/cancel/{id}` before it finished (409).
    #[error("the request was cancelled")]
    Cancelled,
    /// The request's `timeout` ran out before it finished (408).
    #[error("the request timed out after {after_ms} ms")]
    Timeout { after_ms: u64 },
    /// The engine queue is full (503, with Retry-After).
    #[error("the server is overloaded, retry later")]
    Overloaded,
    /// The engine is shutting down or gone (503).
    #[error("the model is not available right now")]
    Unavailable,
    /// A node running part of the model's pipeline left; the instance is being placed again (503).
    #[error(
        "a node running part of this model left the cluster ({0}); the model is being placed again, retry shortly"
    )]
    StageLost(String),
    /// No accepted API key (401).
    #[error("{0}")]
    Unauthorized(String),
    /// Authenticated, or not needing to be, but refused (403): an invite that is expired or used up.
    #[error("{0}")]
    Forbidden(String),
    /// Too many failed tries from this address (429, with Retry-After).
    #[error("too many failed attempts from this address: retry in {retry_after_secs} s")]
    TooManyRequests { retry_after_secs: u64 },
    /// Anything that is our fault (500). The detail is logged, never sent.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// A 400 naming the offending parameter.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidRequest {
            message: message.into(),
            param: Some(param.into()),
            code: None,
        }
    }

    /// A 400 that concerns the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::InvalidRequest {
            message: message.into(),
            param: None,
            code: None,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::ModelNotFound { .. }
            | ApiError::NotFound(_)
            | ApiError::RequestNotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Cancelled => StatusCode::CONFLICT,
            ApiError::Timeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::Overloaded | ApiError::Unavailable | ApiError::StageLost(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The OpenAI error object (also sent as an SSE event when a stream fails midway).
    pub fn body(&self) -> ErrorBody {
        let (kind, param, code) = match self {
            ApiError::InvalidRequest { param, code, .. } => {
                ("invalid_request_error", param.clone(), *code)
            }
            ApiError::UnsupportedMediaType(_) => (
                "invalid_request_error",
                None,
                Some("unsupported_media_type"),
            ),
            ApiError::PayloadTooLarge => ("invalid_request_error", None, Some("request_too_large")),
            ApiError::ModelNotFound { .. } => (
                "invalid_request_error",
                Some("model".into()),
                Some("model_not_found"),
            ),
            ApiError::NotFound(_) => ("invalid_request_error", None, Some("not_found")),
            ApiError::MethodNotAllowed(_) => {
                ("invalid_request_error", None, Some("method_not_allowed"))
            }
            ApiError::RequestNotFound { .. } => {
                ("invalid_request_error", None, Some("request_not_found"))
            }
            ApiError::Cancelled => ("cancelled", None, Some("request_cancelled")),
            ApiError::Timeout { .. } => ("timeout", Some("timeout".into()), Some("timeout")),
            ApiError::Overloaded => ("server_error", None, Some("overloaded")),
            ApiError::Unavailable => ("server_error", None, Some("unavailable")),
            ApiError::StageLost(_) => ("server_error", None, Some("stage_lost")),
            ApiError::Unauthorized(_) => ("invalid_request_error", None, Some("invalid_api_key")),
            ApiError::Forbidden(_) => ("permission_error", None, Some("forbidden")),
            ApiError::TooManyRequests { .. } => {
                ("rate_limit_error", None, Some("rate_limit_exceeded"))
            }
            ApiError::Internal(_) => ("server_error", None, None),
        };
        let message = match self {
            ApiError::Internal(_) => {
                "the server had an error while processing your request".to_string()
            }
            other => other.to_string(),
        };
        ErrorBody {
            error: ErrorObject {
                message,
                kind,
                param,
                code,
            },
        }
    }
}

/// `{"error": {...}}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorObject,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorObject {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), error = %self, "request failed");
        } else {
            tracing::debug!(status = status.as_u16(), error = %self, "request rejected");
        }
        let mut response = (status, axum::Json(self.body())).into_response();
        let retry_after = match self {
            ApiError::Overloaded => Some(HeaderValue::from_static(RETRY_AFTER_SECS)),
            ApiError::TooManyRequests { retry_after_secs } => Some(retry_after_secs.into()),
            _ => None,
        };
        if let Some(v) = retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, v);
        }
        response
    }
}

impl From<EngineError> for ApiError {
    fn from(err: EngineError) -> Self {
        ApiError::from_engine(err, "prompt")
    }
}

impl ApiError {
    /// Maps an engine error; `prompt_param` names the request field holding the prompt
    /// (`messages` for chat, `prompt` for completions).
    pub fn from_engine(err: EngineError, prompt_param: &str) -> Self {
        match err {
            EngineError::ModelNotFound { model } => ApiError::ModelNotFound { model },
            EngineError::InvalidParam { param, message } => ApiError::invalid(param, message),
            e @ EngineError::PromptTooLong { .. } => ApiError::InvalidRequest {
                message: e.to_string(),
                param: Some(prompt_param.into()),
                code: Some("context_length_exceeded"),
            },
            EngineError::EmptyPrompt => ApiError::invalid(prompt_param, "the prompt is empty"),
            EngineError::Template(message) => {
                ApiError::bad_request(format!("chat template failed: {message}"))
            }
            e @ EngineError::NoChatTemplate { .. } => ApiError::InvalidRequest {
                message: e.to_string(),
                param: Some("messages".into()),
                code: Some("no_chat_template"),
            },
            EngineError::Timeout { after_ms } => ApiError::Timeout { after_ms },
            EngineError::Overloaded => ApiError::Overloaded,
            EngineError::Stopped => ApiError::Unavailable,
            EngineError::StageLost(detail) => ApiError::StageLost(detail),
            EngineError::Internal(detail) => ApiError::Internal(detail),
            // A GPU that failed under a stage: a server-side fault, its details kept for the log.
            e @ EngineError::Device(_) => ApiError::Internal(e.to_string()),
        }
    }
}

impl From<ClusterError> for ApiError {
    /// The one mapping of cluster failures: a placement the cluster cannot make (or cannot ask its
    /// coordinator about) is a 400 on `model` with the reason; a failed removal, or anything of the
    /// node's own cluster setup, is ours (500).
    fn from(err: ClusterError) -> Self {
        match err {
            e @ (ClusterError::Place(_)
            | ClusterError::NotCoordinator { .. }
            | ClusterError::NoCoordinator { .. }
            | ClusterError::CoordinatorSilent { .. }
            | ClusterError::UnexpectedReply { .. }
            | ClusterError::Refused { .. }
            | ClusterError::Stopped) => ApiError::invalid("model", e.to_string()),
            ClusterError::Invite(
                e @ (shoal_cluster::invite::InviteError::Io { .. }
                | shoal_cluster::invite::InviteError::Corrupt { .. }),
            ) => ApiError::Internal(e.to_string()),
            e @ (ClusterError::Invite(_) | ClusterError::NodeRefused { .. }) => {
                ApiError::Forbidden(e.to_string())
            }
            e @ ClusterError::NodeNotFound { .. } => ApiError::NotFound(e.to_string()),
            e @ (ClusterError::Remove { .. }
            | ClusterError::Identity { .. }
            | ClusterError::Network { .. }
            | ClusterError::ListenTimeout
            | ClusterError::Address { .. }) => ApiError::Internal(e.to_string()),
        }
    }
}

/// A name a client sent, as an error message repeats it: at most 80 characters (a 64 KiB model name
/// must not come back as a 64 KiB error, nor fill the log).
pub fn shown_name(name: &str) -> String {
    const MAX: usize = 80;
    match name.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &name[..cut]),
        None => name.to_string(),
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        match rejection {
            JsonRejection::JsonSyntaxError(e) => ApiError::bad_request(format!(
                "could not parse the request body as JSON: {}",
                source_text(&e)
            )),
            JsonRejection::JsonDataError(e) => {
                let detail = source_text(&e);
                let param = data_error_param(&detail);
                ApiError::InvalidRequest {
                    message: format!("invalid request body: {detail}"),
                    param,
                    code: None,
                }
            }
            JsonRejection::MissingJsonContentType(_) => ApiError::UnsupportedMediaType(
                "expected a request with `Content-Type: application/json`".into(),
            ),
            JsonRejection::BytesRejection(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::PayloadTooLarge
            }
            JsonRejection::BytesRejection(_) => {
                ApiError::bad_request("could not read the request body")
            }
            other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge,
            other => ApiError::bad_request(other.body_text()),
        }
    }
}

/// The serde error behind a JSON rejection, without axum's generic prefix.
fn source_text(err: &dyn std::error::Error) -> String {
    match err.source() {
        Some(source) => source.to_string(),
        None => err.to_string(),
    }
}

/// Best-effort name of the parameter a deserialization error is about: the serde path printed in
/// front of the message (`messages[0].role: unknown variant ...`), or the field in
/// "missing field `x`".
fn data_error_param(detail: &str) -> Option<String> {
    if let Some((path, _)) = detail.split_once(": ") {
        // A path into a positional (array) body names no parameter.
        let is_path = path.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']' | '?'));
        if is_path {
            return Some(path.to_string());
        }
    }
    let rest = detail.split_once("missing field `")?.1;
    let field = rest.split_once('`')?.0;
    Some(field.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn param_from_serde_path() {
        assert_eq!(
            data_error_param("messages[0].role: unknown variant `robot` at line 1 column 30")
                .as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            data_error_param("missing field `messages` at line 1 column 2").as_deref(),
            Some("messages")
        );
        assert_eq!(
            data_error_param("invalid type: string \"x\", expected u32").as_deref(),
            None
        );
        assert_eq!(
            data_error_param("[0]: invalid type: integer `1`, expected a sequence").as_deref(),
            None
        );
    }

    #[test]
    fn overloaded_is_503_with_retry_after() {
        let response = ApiError::from(EngineError::Overloaded).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            response
                .headers()
                .get(header::RETRY_AFTER)
                .map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
        assert_eq!(
            ApiError::from(EngineError::Stopped).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[test]
    fn too_many_requests_is_429_with_retry_after() {
        let response = ApiError::TooManyRequests {
            retry_after_secs: 42,
        }
        .into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            response
                .headers()
                .get(header::RETRY_AFTER)
                .map(|v| v.as_bytes()),
            Some(&b"42"[..])
        );
    }

    #[tokio::test]
    async fn a_json_body_over_the_limit_is_413_not_400() {
        use axum::extract::FromRequest;
        // axum's own default limit (2 MB) when no DefaultBodyLimit is set.
        let big = axum::http::Request::post("/")
            .header(header::CONTENT_TYPE, "application/json")
            .body(axum::body::Body::from(vec![b' '; 3 << 20]))
            .expect("a request");
        let rejection = axum::Json::<serde_json::Value>::from_request(big, &())
            .await
            .expect_err("over the limit");
        assert_eq!(ApiError::from(rejection), ApiError::PayloadTooLarge);
    }

    #[test]
    fn cancelled_is_409_and_unknown_request_404() {
        let body = ApiError::Cancelled.body();
        assert_eq!(ApiError::Cancelled.status(), StatusCode::CONFLICT);
        assert_eq!(body.error.kind, "cancelled");
        assert_eq!(body.error.code, Some("request_cancelled"));
        assert_eq!(body.error.message, "the request was cancelled");
        let e = ApiError::RequestNotFound {
            id: "chatcmpl-7".into(),
        };
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        assert_eq!(e.body().error.code, Some("request_not_found"));
    }

    #[test]
    fn cluster_errors_are_400_on_model_when_placing_and_500_when_removing() {
        let e = ApiError::from(ClusterError::from(
            shoal_cluster::PlaceError::LayersWithoutNodes,
        ));
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let body = e.body();
        assert_eq!(body.error.param.as_deref(), Some("model"));
        assert_eq!(
            body.error.message,
            "'layers' needs 'nodes' (one count per node)"
        );
        let refused = ApiError::from(ClusterError::Refused {
            message: "no member has model 'x'".into(),
        });
        assert_eq!(refused.body().error.message, "no member has model 'x'");
        let e = ApiError::from(ClusterError::Remove {
            id: shoal_cluster::InstanceId::from_u64(1),
            reason: Box::new(ClusterError::Stopped),
        });
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn internal_is_500() {
        let e = ApiError::from(EngineError::Internal("kv cache exploded".into()));
        assert_eq!(
            e.into_response().status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn internal_details_are_hidden() {
        let body = ApiError::Internal("secret path /root/x".into()).body();
        assert!(!body.error.message.contains("secret"));
        assert_eq!(body.error.kind, "server_error");
    }

    #[test]
    fn prompt_too_long_names_both_numbers() {
        let e = ApiError::from(EngineError::PromptTooLong {
            prompt_tokens: 9000,
            context_length: 8192,
        });
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let msg = e.body().error.message;
        assert!(msg.contains("9000") && msg.contains("8192"), "{msg}");
    }
}
