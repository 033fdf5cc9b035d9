//! The dashboard at `/`: one page, built into the binary (`index.html`, `app.js`, `style.css` through
//! `include_str!`; no build step, nothing fetched from elsewhere), and its live feed.
//!
//! - `GET /` answers a browser (`Accept: text/html`) with the page and everything else (curl, Ollama
//!   clients' health checks) with Ollama's own `Ollama is running`. The page and its two assets are
//!   open ([`crate::auth::OPEN_PATHS`]: they hold no data); with API keys configured the page asks for
//!   one, keeps it in the tab's `sessionStorage` and sends it as a bearer header on every request.
//! - `GET /dashboard/events` is the feed (SSE, read by the page with `fetch` so the key travels in a
//!   header): whenever the node's cluster snapshot changes, and every 500 ms for what changes without it
//!   (this node's engines), the server builds the [`snapshot`] from what `GET /state` says and sends it
//!   when it differs from the last one sent, with a keep-alive comment every 15 s — the page never polls.
//! - What the page does besides watching goes through the ordinary API: placement previews
//!   (`GET /instance/previews`), placing (`POST /instance`), cancelling a download
//!   (`DELETE /downloads/{model}`), and chat (`POST /v1/chat/completions` streamed, with
//!   `stream_options.include_progress` for the prefill progress of a long prompt).

pub mod snapshot;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use futures::Stream;

use crate::route_table::Routes;
use crate::{ApiError, ApiState};

const INDEX_HTML: &str = include_str!("index.html");
const APP_JS: &str = include_str!("app.js");
const STYLE_CSS: &str = include_str!("style.css");

/// How often the feed looks at the cluster for a change.
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// What a client that is not a browser reads at `/` (Ollama's answer: tools check for it).
pub const OLLAMA_ROOT: &str = "Ollama is running";

/// The dashboard's routes.
pub fn routes() -> Routes {
    Routes::new()
        .get("/", root)
        .get("/dashboard/app.js", app_js)
        .get("/dashboard/style.css", style_css)
        .get("/dashboard/events", events)
}

/// Whether the request comes from a browser navigating to the page.
fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/html"))
}

#[utoipa::path(
    get,
    path = "/",
    operation_id = "get_root",
    tag = "shoal",
    responses(
        (status = 200, description = "The dashboard page to a browser (`Accept: text/html`), else Ollama's `Ollama is running`.", content((String = "text/html"), (String = "text/plain")))
    )
)]
async fn root(headers: HeaderMap) -> Response {
    if wants_html(&headers) {
        return ([(header::CACHE_CONTROL, "no-cache")], Html(INDEX_HTML)).into_response();
    }
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        OLLAMA_ROOT,
    )
        .into_response()
}

#[utoipa::path(
    get,
    path = "/dashboard/app.js",
    operation_id = "get_dashboard_app_js",
    tag = "shoal",
    responses(
        (status = 200, description = "The dashboard's script.", content_type = "text/javascript", body = String)
    )
)]
async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

#[utoipa::path(
    get,
    path = "/dashboard/style.css",
    operation_id = "get_dashboard_style_css",
    tag = "shoal",
    responses(
        (status = 200, description = "The dashboard's style sheet.", content_type = "text/css", body = String)
    )
)]
async fn style_css() -> Response {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `GET /dashboard/events`: the snapshot as SSE `data:` events, one whenever it changed.
#[utoipa::path(
    get,
    path = "/dashboard/events",
    operation_id = "get_dashboard_events",
    tag = "shoal",
    responses(
        (status = 200, description = "The dashboard's feed: a snapshot as a server-sent event whenever it changed (or `{\"error\": …}` when the state cannot be read).", content_type = "text/event-stream", body = snapshot::Snapshot),
        crate::schema::OpenAiErrors
    )
)]
async fn events(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let changes = state.cluster()?.subscribe();
    Ok(Sse::new(feed(state, changes))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

struct Feed {
    state: ApiState,
    rates: snapshot::Rates,
    last: String,
    tick: tokio::time::Interval,
    /// The cluster's snapshots (a short-lived instance state, such as `loading`, is never missed);
    /// `None` once the cluster stopped.
    changes: Option<tokio::sync::watch::Receiver<std::sync::Arc<shoal_cluster::Snapshot>>>,
}

/// Snapshots that differ from the one sent before, checked on every change of the cluster and every
/// [`CHECK_EVERY`]. Lives as long as the response body: a page that goes away drops it.
fn feed(
    state: ApiState,
    changes: tokio::sync::watch::Receiver<std::sync::Arc<shoal_cluster::Snapshot>>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let feed = Feed {
        state,
        rates: snapshot::Rates::default(),
        last: String::new(),
        tick,
        changes: Some(changes),
    };
    futures::stream::unfold(feed, |mut f| async move {
        loop {
            match f.changes.as_mut() {
                Some(changes) => tokio::select! {
                    _ = f.tick.tick() => {}
                    changed = changes.changed() => {
                        if changed.is_err() {
                            f.changes = None;
                        }
                    }
                },
                None => {
                    f.tick.tick().await;
                }
            }
            let text = match crate::cluster::state_value(&f.state) {
                Ok(v) => serde_json::to_string(&snapshot::build(&v, &mut f.rates, Instant::now()))
                    .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }).to_string()),
                Err(e) => serde_json::json!({ "error": e.to_string() }).to_string(),
            };
            if text != f.last {
                f.last.clone_from(&text);
                return Some((Ok(SseEvent::default().data(text)), f));
            }
        }
    })
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
