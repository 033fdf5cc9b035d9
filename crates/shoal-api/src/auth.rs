//! API keys: with keys configured, every route but `/health`, `/cluster/enroll` (an invite is its credential) and
//! the dashboard's page and assets (no data in them; the page asks for a key) needs one — `Authorization: Bearer KEY`
//! (OpenAI and Ollama clients) or `x-api-key: KEY` (Anthropic clients) — and answers 401 otherwise, in
//! the error shape of the API the path belongs to (`/v1/messages…`: Anthropic's, `/api/…`: Ollama's,
//! else OpenAI's).
//!
//! Keys are kept as sha256 digests and a presented key is compared digest to digest in constant time
//! (no early exit on the first differing byte; the lengths compared are always 32). Keys are never logged.
//! Requests one node forwards to another carry the client's key along, so nodes of one cluster are
//! configured with the same keys.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};

use crate::{ApiError, ApiState};

/// The keys this server accepts.
#[derive(Clone)]
pub struct ApiKeys {
    digests: Vec<[u8; 32]>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.digests.len())
    }
}

impl ApiKeys {
    /// `None` when `keys` holds no non-empty key (the API is open).
    pub fn new<S: AsRef<str>>(keys: impl IntoIterator<Item = S>) -> Option<Self> {
        let digests: Vec<[u8; 32]> = keys
            .into_iter()
            .map(|k| k.as_ref().trim().to_string())
            .filter(|k| !k.is_empty())
            .map(|k| Sha256::digest(k.as_bytes()).into())
            .collect();
        (!digests.is_empty()).then_some(Self { digests })
    }

    /// Whether `key` is one of the keys (every configured key is compared, in constant time each).
    pub fn accepts(&self, key: &str) -> bool {
        let d: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        self.digests
            .iter()
            .fold(false, |ok, k| ok | constant_time_eq(k, &d))
    }

    /// Whether the request's headers carry an accepted key.
    pub fn admits(&self, headers: &HeaderMap) -> bool {
        presented(headers).is_some_and(|k| self.accepts(k))
    }
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The key a request presents: `Authorization: Bearer KEY`, else `x-api-key: KEY`.
pub fn presented(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        });
    bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
}

/// The headers that carry a client's key, to send along when a request is forwarded to another node.
pub fn key_headers(headers: &HeaderMap) -> Vec<(header::HeaderName, header::HeaderValue)> {
    [
        header::AUTHORIZATION,
        header::HeaderName::from_static("x-api-key"),
    ]
    .into_iter()
    .filter_map(|name| headers.get(&name).map(|v| (name.clone(), v.clone())))
    .collect()
}

/// Paths anyone may read, keys or not: `/health`, enrolling (an invite is its credential), and the
/// dashboard's page and assets (they hold no data; the page asks for a key for everything else).
pub const OPEN_PATHS: [&str; 5] = [
    "/health",
    crate::membership::ENROLL_PATH,
    "/",
    "/dashboard/app.js",
    "/dashboard/style.css",
];

/// Middleware on every route: with keys configured, a request without an accepted key gets a 401.
pub async fn require_key(State(state): State<ApiState>, req: Request, next: Next) -> Response {
    let Some(keys) = &state.api_keys else {
        return next.run(req).await;
    };
    if OPEN_PATHS.contains(&req.uri().path()) || keys.admits(req.headers()) {
        return next.run(req).await;
    }
    let message = if presented(req.headers()).is_some() {
        "invalid API key"
    } else {
        "an API key is required: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
    };
    unauthorized(req.uri().path(), message)
}

/// A 401 in the shape of the API `path` belongs to.
fn unauthorized(path: &str, message: &str) -> Response {
    let mut r = crate::dialect::error_response(path, ApiError::Unauthorized(message.to_string()));
    if !path.starts_with("/v1/messages") && !path.starts_with("/api/") {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Bearer"),
        );
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_matched_whole_and_empty_ones_ignored() {
        assert!(ApiKeys::new(["", "  "]).is_none());
        let keys = ApiKeys::new(["alpha", " beta "]).unwrap();
        assert!(keys.accepts("alpha") && keys.accepts("beta"));
        for no in ["", "alph", "alphaa", "ALPHA", " alpha"] {
            assert!(!keys.accepts(no), "{no:?}");
        }
        assert_eq!(
            format!("{keys:?}"),
            "ApiKeys(2 keys)",
            "keys never show in debug output"
        );
    }

    #[test]
    fn a_key_comes_as_a_bearer_token_or_x_api_key() {
        let mut h = HeaderMap::new();
        assert_eq!(presented(&h), None);
        h.insert("x-api-key", "k1".parse().unwrap());
        assert_eq!(presented(&h), Some("k1"));
        h.insert(header::AUTHORIZATION, "bearer k2".parse().unwrap());
        assert_eq!(presented(&h), Some("k2"), "the bearer token wins");
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(presented(&h), Some("k1"));
    }
}
