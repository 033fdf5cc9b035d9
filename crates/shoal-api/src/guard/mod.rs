//! The API's edge against strangers, before any handler runs: which web pages may use the node
//! ([`origin`]: CORS, refused state-changing requests, DNS rebinding), bodies declared larger than the
//! route accepts ([`declared_too_large`]: a 413 before a byte of the body is read), and a per-address
//! limit on failed tries of the open enrolment route ([`attempts`]). The connections themselves (header
//! timeout, connection cap) are [`crate::server`]'s.

pub mod attempts;
pub mod origin;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;

use crate::{ApiError, ApiState};

/// The largest body `path` accepts: the enrolment route's few KB, else the node's limit.
pub fn body_limit_for(state: &ApiState, path: &str) -> usize {
    if path == crate::membership::ENROLL_PATH {
        crate::membership::ENROLL_BODY_LIMIT
    } else {
        state.body_limit
    }
}

/// Middleware: a request whose `Content-Length` is over its route's limit is a 413 in the path's API
/// shape at once — whatever the handler would make of a body it failed to read. Bodies without a length
/// (chunked) meet the same limit where they are read.
pub async fn declared_too_large(
    State(state): State<ApiState>,
    req: Request,
    next: Next,
) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let path = req.uri().path();
    if declared.is_some_and(|n| n > body_limit_for(&state, path) as u64) {
        return crate::dialect::error_response(path, ApiError::PayloadTooLarge);
    }
    next.run(req).await
}
