//! Requests one node sends on to another member, told apart from clients' requests by proof, not trust.
//!
//! A node relays a generation request to the driver the balancer chose ([`crate::cluster`]) and a
//! download request to the node it names ([`crate::downloads`]). The receiving node serves a relayed
//! request itself (it never forwards it again) and does not count it again in `/metrics`. The mark
//! ([`RELAYED_HEADER`]) is a [`shoal_cluster::relay_proof`] proof over the exact request, made with a key
//! only members hold: [`check`] (a middleware on every route) verifies it, removes the header whatever
//! the outcome, and on success adds the [`Relayed`] extension that handlers and other middleware read. A
//! client's own header is dropped (its request is served as any client's), so no client can pass as a
//! node.

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use shoal_cluster::ClusterHandle;

use crate::ApiState;

/// The header that carries the proof.
pub const RELAYED_HEADER: &str = "x-shoal-forwarded";

/// Present in a request's extensions when another member of the cluster sent it on (proof verified).
#[derive(Debug, Clone, Copy)]
pub struct Relayed;

/// Whether `req` was sent on by another member (its proof verified by [`check`]).
pub fn is_relayed<B>(req: &axum::http::Request<B>) -> bool {
    req.extensions().get::<Relayed>().is_some()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The header that marks a request this node sends on: `method` to `path_and_query` (as it appears in
/// the URL, percent-encoded) with `body`.
pub fn mark(
    cluster: &ClusterHandle,
    method: &Method,
    path_and_query: &str,
    body: &[u8],
) -> (HeaderName, HeaderValue) {
    let proof = cluster
        .relay_key()
        .sign(unix_now(), method.as_str(), path_and_query, body);
    let value = HeaderValue::from_str(&proof).expect("a proof is ASCII");
    (HeaderName::from_static(RELAYED_HEADER), value)
}

/// Middleware on every route: verifies a relay proof and strips the header (see the module doc).
pub async fn check(State(state): State<ApiState>, req: Request, next: Next) -> Response {
    if !req.headers().contains_key(RELAYED_HEADER) {
        return next.run(req).await;
    }
    let (mut parts, body) = req.into_parts();
    let proof = parts
        .headers
        .remove(RELAYED_HEADER)
        .and_then(|v| v.to_str().ok().map(str::to_owned));
    let Some(cluster) = &state.cluster else {
        return next.run(Request::from_parts(parts, body)).await;
    };
    // The proof covers the body: read it, within the body limit.
    let bytes: Bytes = match axum::body::to_bytes(body, state.body_limit).await {
        Ok(b) => b,
        Err(_) => {
            return crate::dialect::error_response(
                parts.uri.path(),
                crate::ApiError::PayloadTooLarge,
            );
        }
    };
    let target = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |p| p.as_str());
    match proof.map(|p| {
        cluster
            .relay_key()
            .verify(&p, unix_now(), parts.method.as_str(), target, &bytes)
    }) {
        Some(Ok(())) => {
            parts.extensions.insert(Relayed);
        }
        Some(Err(e)) => tracing::debug!("a request marked as relayed is served as a client's: {e}"),
        None => tracing::debug!("a request marked as relayed is served as a client's: not ASCII"),
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}
