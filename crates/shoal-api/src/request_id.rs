//! Request ids: every request gets one ([`assign`]: the client's `x-request-id` when it is sane, else a
//! new one), kept in the request's extensions ([`RequestId`]) and headers (so a request relayed to
//! another node carries it there), answered in the response's `x-request-id`, and named by the
//! request's span ([`span`], made by the router's `TraceLayer`): every log line written while the
//! request is handled — in its handler, its response body, and on the engine thread for its sequence
//! (the engine keeps the span of the request it admitted) — reads `request{id=…}`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

/// The header a request id travels in, both ways.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// The longest request id taken from a client.
const MAX_LEN: usize = 128;

/// A request's id, in the request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub Arc<str>);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether a client's id can be used as given: 1–128 characters of letters, digits and `-_.:/+=@`
/// (nothing that would break a log line or a header).
pub fn is_sane(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/+=@".contains(&b))
}

/// A new id: 16 hex digits, unique in this process and unlikely to repeat across nodes (a per-process
/// random key hashed with a counter).
pub fn generate() -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static KEY: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let mut h = KEY.get_or_init(Default::default).build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("{:016x}", h.finish())
}

/// Middleware: gives the request its id (the client's, else a new one) and answers it in the response.
pub async fn assign(mut req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| is_sane(v))
        .map(str::to_string);
    let id = given.unwrap_or_else(generate);
    let value = HeaderValue::from_str(&id).ok();
    if let Some(v) = &value {
        req.headers_mut().insert(REQUEST_ID_HEADER, v.clone());
    }
    req.extensions_mut().insert(RequestId(id.into()));
    let mut response = next.run(req).await;
    if let Some(v) = value {
        response.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    response
}

/// The request's span (for `TraceLayer::make_span_with`): `request{id=…}` at INFO, so it shows
/// wherever INFO lines do.
pub fn span(req: &axum::http::Request<axum::body::Body>) -> tracing::Span {
    match req.extensions().get::<RequestId>() {
        Some(id) => tracing::info_span!("request", id = %id),
        None => tracing::info_span!("request"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sane_ids_are_kept_and_others_replaced() {
        assert!(is_sane("abc-123_X.y:z"));
        assert!(is_sane(&"a".repeat(128)));
        assert!(!is_sane(&"a".repeat(129)));
        assert!(!is_sane(""));
        assert!(!is_sane("a b"));
        assert!(!is_sane("a\"b"));
        let (a, b) = (generate(), generate());
        assert_ne!(a, b);
        assert_eq!(a.len(), 16);
        assert!(is_sane(&a));
    }
}
