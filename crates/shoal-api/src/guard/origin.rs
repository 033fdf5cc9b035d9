//! Which web pages may use this node: [`OriginPolicy`], the browser origins allowed to call the API
//! (CORS) and to change anything, and the DNS-rebinding check of the `Host` a request names.
//!
//! A browser lets a page of one origin send requests to another, and marks them with an `Origin`
//! header; without the node's consent (`Access-Control-Allow-Origin`) the page cannot read the answer,
//! but a "simple" request (a form `POST`, a `text/plain` body) is sent without asking first. So the
//! policy is applied twice: [`OriginPolicy::cors`] answers preflights and sets the CORS headers for
//! allowed origins only, and [`refuse_foreign`] (middleware) refuses with a 403 every state-changing
//! request (any method but `GET`, `HEAD`, `OPTIONS`) whose `Origin` is present and not allowed —
//! before it reaches a handler. Clients that are not browsers send no `Origin` and are not affected.
//!
//! Allowed by default, as Ollama's `OLLAMA_ORIGINS` defaults do: the node's own pages (an origin whose
//! host and port are the request's `Host`), pages served from this machine (`http`/`https` on
//! `localhost`, `*.localhost`, `127.0.0.0/8`, `[::1]`, any port) and the schemes desktop apps use
//! (`app://`, `file://`, `tauri://`). More come from `--cors-origin` / `SHOAL_ORIGINS`: an exact origin,
//! one `*` wildcard (`http://host:*` any port, `https://*.example.com`), or `*` for every origin.
//! Credentials (cookies) are never allowed cross-origin, so no wildcard ever meets them.
//!
//! DNS rebinding: a page of `evil.example` whose name is made to resolve to `127.0.0.1` is same-origin
//! with itself while talking to a node bound to loopback. Such a node ([`OriginPolicy::bound_to`] a
//! loopback address) answers only requests whose `Host` is a loopback name or address, or the host of a
//! configured origin; a node bound to another address is reached by any name and does not check.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::Response;
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer, ExposeHeaders};

use crate::{ApiError, ApiState};

/// Origins allowed on any node, as `OLLAMA_ORIGINS` allows them by default: desktop apps' schemes.
const APP_SCHEMES: [&str; 3] = ["app", "file", "tauri"];

/// One origin given with `--cors-origin` / `SHOAL_ORIGINS`, lowercased.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// `*`: every origin.
    Any,
    /// One origin, exactly.
    Exact(String),
    /// One `*` in it: every origin that starts with `prefix` and ends with `suffix`.
    Wildcard { prefix: String, suffix: String },
}

impl Pattern {
    fn parse(given: &str) -> Result<Self, String> {
        let text = normalize(given.trim());
        if text == "*" {
            return Ok(Pattern::Any);
        }
        let Some((scheme, rest)) = text.split_once("://") else {
            return Err(format!(
                "'{given}' is not an origin: write SCHEME://HOST[:PORT] (e.g. http://localhost:3000), with at most one '*', or '*'"
            ));
        };
        if scheme.is_empty() || rest.is_empty() || rest.contains('/') {
            return Err(format!(
                "'{given}' is not an origin: SCHEME://HOST[:PORT], without a path"
            ));
        }
        match text.split_once('*') {
            None => Ok(Pattern::Exact(text)),
            Some((_, suffix)) if suffix.contains('*') => {
                Err(format!("'{given}' has more than one '*'"))
            }
            Some((prefix, suffix)) => Ok(Pattern::Wildcard {
                prefix: prefix.to_string(),
                suffix: suffix.to_string(),
            }),
        }
    }

    fn matches(&self, origin: &str) -> bool {
        match self {
            Pattern::Any => true,
            Pattern::Exact(o) => o == origin,
            Pattern::Wildcard { prefix, suffix } => {
                let wild_port = suffix.is_empty() && prefix.ends_with(':');
                (origin.len() >= prefix.len() + suffix.len()
                    && origin.starts_with(prefix.as_str())
                    && origin.ends_with(suffix.as_str()))
                    // `http://host:*` also allows `http://host` (the scheme's default port).
                    || (wild_port && origin == &prefix[..prefix.len() - 1])
            }
        }
    }

    /// The host of the origin this pattern names, when it names one host (for the rebinding check).
    fn host(&self) -> Option<&str> {
        let text = match self {
            Pattern::Exact(o) => o.as_str(),
            Pattern::Wildcard { prefix, suffix } if suffix.is_empty() && prefix.ends_with(':') => {
                prefix.as_str()
            }
            _ => return None,
        };
        let authority = text.split_once("://")?.1;
        let host = split_host(authority.trim_end_matches(':'));
        (!host.is_empty() && !host.contains('*')).then_some(host)
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A state-changing request from a page whose origin is not allowed.
    Origin,
    /// A request naming a host that is not this machine, on a node bound to loopback (DNS rebinding).
    Host,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::Origin => {
                "requests from this web origin are not allowed: start the node with --cors-origin ORIGIN (or SHOAL_ORIGINS) to allow it"
            }
            Refusal::Host => {
                "this node listens on loopback and answers only requests for a loopback host (localhost, 127.0.0.1, [::1]) or a --cors-origin's host"
            }
        })
    }
}

/// The browser origins allowed to use this node, and whether it checks the `Host` of requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OriginPolicy {
    extra: Vec<Pattern>,
    /// The node listens on a loopback address: requests must name a loopback host.
    loopback: bool,
}

impl OriginPolicy {
    /// The defaults plus `extra` origins (from `--cors-origin` / `SHOAL_ORIGINS`; empty entries are
    /// skipped); an error names an entry that is not an origin.
    pub fn new<S: AsRef<str>>(extra: impl IntoIterator<Item = S>) -> Result<Self, String> {
        let extra = extra
            .into_iter()
            .filter(|s| !s.as_ref().trim().is_empty())
            .map(|s| Pattern::parse(s.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(OriginPolicy {
            extra,
            loopback: false,
        })
    }

    /// This policy for a node listening on `addr`: bound to a loopback address, it checks the `Host` of
    /// every request (DNS rebinding); bound to any other address, it does not.
    pub fn bound_to(mut self, addr: SocketAddr) -> Self {
        self.loopback = addr.ip().to_canonical().is_loopback();
        self
    }

    /// Whether a page of `origin` may use the API of a request for `host` (its `Host` header).
    pub fn allows(&self, origin: &str, host: Option<&str>) -> bool {
        let origin = normalize(origin);
        let Some((scheme, authority)) = origin.split_once("://") else {
            return self.extra.contains(&Pattern::Any);
        };
        if APP_SCHEMES.contains(&scheme) {
            return true;
        }
        let web = scheme == "http" || scheme == "https";
        if web && is_loopback_host(split_host(authority)) {
            return true;
        }
        if web && host.is_some_and(|h| h.eq_ignore_ascii_case(authority)) {
            return true; // same origin: the node's own pages
        }
        self.extra.iter().any(|p| p.matches(&origin))
    }

    /// Whether a node with this policy answers a request naming `host` (`Host` header, port and all).
    pub fn host_allowed(&self, host: &str) -> bool {
        if !self.loopback {
            return true;
        }
        let name = split_host(host).trim_end_matches('.').to_ascii_lowercase();
        is_loopback_host(&name)
            || name
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.to_canonical().is_unspecified())
            || self
                .extra
                .iter()
                .filter_map(Pattern::host)
                .any(|h| h == name)
    }

    /// `Ok` when a request with `method` and `headers` may go on; else why it is refused.
    pub fn check(&self, method: &Method, headers: &HeaderMap) -> Result<(), Refusal> {
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        if self.loopback
            && headers.contains_key(header::HOST)
            && !host.is_some_and(|h| self.host_allowed(h))
        {
            return Err(Refusal::Host);
        }
        let reads = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        match headers.get(header::ORIGIN) {
            Some(origin) if !reads => {
                let allowed = origin.to_str().is_ok_and(|o| self.allows(o, host));
                if allowed {
                    Ok(())
                } else {
                    Err(Refusal::Origin)
                }
            }
            _ => Ok(()),
        }
    }

    /// The CORS layer for this policy: allowed origins get `Access-Control-Allow-Origin` (their own
    /// origin echoed, never `*`) and their preflights' methods and headers; no origin gets credentials.
    pub fn cors(&self) -> CorsLayer {
        let policy = self.clone();
        CorsLayer::new()
            .allow_origin(AllowOrigin::predicate(
                move |origin: &HeaderValue, parts| {
                    let host = parts
                        .headers
                        .get(header::HOST)
                        .and_then(|v| v.to_str().ok());
                    origin.to_str().is_ok_and(|o| policy.allows(o, host))
                },
            ))
            .allow_methods(AllowMethods::mirror_request())
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers(ExposeHeaders::any())
            .allow_credentials(false)
    }
}

/// Middleware: a request refused by the node's [`OriginPolicy`] is a 403 in the API's own shape and
/// reaches no handler.
pub async fn refuse_foreign(State(state): State<ApiState>, req: Request, next: Next) -> Response {
    match state.origins.check(req.method(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            let (method, path) = (req.method(), req.uri().path());
            tracing::debug!(%method, %path, ?refusal, "refused by the origin policy");
            crate::dialect::error_response(
                req.uri().path(),
                ApiError::Forbidden(refusal.to_string()),
            )
        }
    }
}

/// `origin` lowercased, without a trailing `/` after its host (`file://` stays whole).
fn normalize(origin: &str) -> String {
    let origin = origin.to_ascii_lowercase();
    match origin.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{}", rest.trim_end_matches('/')),
        None => origin,
    }
}

/// The host of `authority` (`host[:port]`, `[v6]:port`), without the port or an IPv6 literal's
/// brackets.
fn split_host(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(ip, _)| ip);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

/// `localhost`, a name under `.localhost`, or a loopback address (`127.0.0.0/8`, `::1`).
fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    host == "localhost"
        || host.ends_with(".localhost")
        || host
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(extra: &[&str]) -> OriginPolicy {
        OriginPolicy::new(extra).expect("valid origins")
    }

    #[test]
    fn loopback_pages_and_app_schemes_are_allowed_by_default() {
        let p = policy(&[]);
        for origin in [
            "http://localhost",
            "http://localhost:3000",
            "https://LOCALHOST:8443",
            "http://app.localhost:5173",
            "http://127.0.0.1:8080",
            "http://127.1.2.3",
            "http://[::1]:9000",
            "app://anything",
            "file://",
            "tauri://localhost",
        ] {
            assert!(p.allows(origin, Some("127.0.0.1:52415")), "{origin}");
        }
        for origin in [
            "http://evil.example",
            "https://localhost.evil.example",
            "http://127.0.0.1.evil.example",
            "http://192.168.1.5:52415",
            "ftp://localhost",
            "null",
            "",
        ] {
            assert!(!p.allows(origin, Some("127.0.0.1:52415")), "{origin}");
        }
    }

    #[test]
    fn the_nodes_own_pages_are_same_origin() {
        let p = policy(&[]);
        assert!(p.allows("http://192.168.1.5:52415", Some("192.168.1.5:52415")));
        assert!(p.allows("https://node.lan", Some("node.lan")));
        assert!(!p.allows("http://192.168.1.5:8080", Some("192.168.1.5:52415")));
        assert!(!p.allows("http://192.168.1.5:52415", None));
    }

    #[test]
    fn configured_origins_exact_wildcard_and_any() {
        let p = policy(&[
            "https://chat.example.com/",
            "http://lab:*",
            "https://*.corp.example",
        ]);
        assert!(p.allows("https://chat.example.com", None));
        assert!(!p.allows("http://chat.example.com", None));
        assert!(!p.allows("https://chat.example.com.evil", None));
        assert!(p.allows("http://lab:8080", None) && p.allows("http://lab", None));
        assert!(!p.allows("http://lab2:8080", None));
        assert!(p.allows("https://a.corp.example", None));
        assert!(!p.allows("https://corp.example.evil", None));
        let any = policy(&["*"]);
        assert!(any.allows("http://evil.example", None) && any.allows("null", None));
        for bad in ["localhost:3000", "http://", "http://a/b", "http://*.a:*"] {
            assert!(OriginPolicy::new([bad]).is_err(), "{bad}");
        }
        assert_eq!(OriginPolicy::new(["", " "]), Ok(OriginPolicy::default()));
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    header::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                    HeaderValue::from_str(v).expect("value"),
                )
            })
            .collect()
    }

    #[test]
    fn state_changes_from_foreign_origins_are_refused_reads_are_not() {
        let p = policy(&["https://allowed.example"]);
        let foreign = headers(&[
            ("host", "127.0.0.1:52415"),
            ("origin", "http://evil.example"),
        ]);
        for m in [Method::POST, Method::DELETE, Method::PUT, Method::PATCH] {
            assert_eq!(p.check(&m, &foreign), Err(Refusal::Origin), "{m}");
        }
        for m in [Method::GET, Method::HEAD, Method::OPTIONS] {
            assert_eq!(p.check(&m, &foreign), Ok(()), "{m}");
        }
        let no_origin = headers(&[("host", "127.0.0.1:52415")]);
        assert_eq!(p.check(&Method::POST, &no_origin), Ok(()), "curl and SDKs");
        let allowed = headers(&[("origin", "https://allowed.example")]);
        assert_eq!(p.check(&Method::DELETE, &allowed), Ok(()));
        let opaque = headers(&[("origin", "null")]);
        assert_eq!(p.check(&Method::POST, &opaque), Err(Refusal::Origin));
    }

    #[test]
    fn a_loopback_node_refuses_rebound_host_names() {
        let bound = |addr: &str| policy(&["http://myapp.test:*"]).bound_to(addr.parse().unwrap());
        let p = bound("127.0.0.1:52415");
        for host in [
            "127.0.0.1:52415",
            "localhost:52415",
            "LOCALHOST",
            "dev.localhost:1",
            "[::1]:52415",
            "0.0.0.0:52415",
            "myapp.test:52415",
            "localhost.",
        ] {
            assert!(p.host_allowed(host), "{host}");
        }
        for host in [
            "evil.example:52415",
            "localhost.evil.example",
            "192.168.1.5:52415",
            "",
        ] {
            assert!(!p.host_allowed(host), "{host}");
        }
        let rebound = headers(&[("host", "evil.example:52415")]);
        assert_eq!(p.check(&Method::GET, &rebound), Err(Refusal::Host));
        assert_eq!(p.check(&Method::GET, &HeaderMap::new()), Ok(()));
        assert!(bound("[::1]:1").host_allowed("[::1]:1"));
        assert!(!bound("[::1]:1").host_allowed("evil.example"));
        // Bound to every address or a LAN address: reached by any name.
        assert!(bound("0.0.0.0:52415").host_allowed("evil.example"));
        assert!(bound("192.168.1.5:52415").host_allowed("node.lan"));
        assert!(
            policy(&[]).host_allowed("evil.example"),
            "unbound: no check"
        );
    }
}
