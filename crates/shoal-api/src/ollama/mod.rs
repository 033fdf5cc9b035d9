//! The Ollama API, on the same port as everything else, so Ollama clients (the `ollama` CLI and Python
//! client, Open WebUI and friends) talk to shoal as to an Ollama server.
//!
//! - Generation ([`routes`], behind the cluster's forwarding middleware because their body names a
//!   `model`): `POST /api/chat` and `POST /api/generate` ([`generate`]),
//!   `POST /api/embed` and `POST /api/embeddings` ([`embed`]). A handler parses its body ([`types`]),
//!   checks it into the engine's validated request ([`params`]: `options` →
//!   [`shoal_engine::SamplingParams`] through the OpenAI adapter's one set of rules), turns `tools` and
//!   `format` into shoal-guide's plan ([`tools`]), renders the messages with the model's own template
//!   and submits. The answer is NDJSON ([`stream`]; Ollama streams unless `stream: false`) or one
//!   object; both end with Ollama's measurements (`total_duration`, `prompt_eval_count`, … in ns).
//! - The rest ([`plain_routes`]): `GET /api/tags`, `GET /api/ps`, `POST /api/show` (never places the
//!   model), `DELETE /api/delete` ([`models`], from
//!   this node's store, its engines and the cluster's facts; GGUF details from [`details`]),
//!   `POST /api/pull` ([`pull`], through this node's [`shoal_transfer::Downloads`], progress as NDJSON),
//!   `GET /api/version`, and any other `/api/…` path answering 404 in Ollama's shape.
//! - Errors: [`Error`] (in [`crate::dialect::ollama`], which the middleware uses too) wraps the one
//!   [`ApiError`] and writes Ollama's shape, `{"error": "message"}`, with the same status; a stream that
//!   fails midway ends with such a line. Malformed JSON answers the same way (handlers take
//!   `Result<Json<T>, JsonRejection>`). Bodies are read as JSON whatever their `Content-Type`, as Ollama
//!   reads them.
//!
//! Data flow of a chat: `ChatRequest` → [`params::Checked`] (model, sampling, budget, stop) →
//! [`tools::guidance`] + messages → `Guides::plan` → `render_chat_tools` → `GenerateRequest` (with the
//! plan's constraint) → `Engines::submit` → [`crate::cancel::LiveRequest`] → [`stream::Run`] (events +
//! timings) → NDJSON lines or one JSON object (calls split out by the plan's parser). The
//! `LiveRequest` lives in the response body (streaming) or the handler future: a client that goes away
//! drops it and the engine cancels the sequence.

pub mod details;
pub mod embed;
pub mod generate;
pub mod models;
pub mod params;
pub mod pull;
pub mod stream;
pub mod tools;
pub mod types;

pub use crate::dialect::ollama::Error;

use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::Router;
use axum::http::{Method, Uri, header};
use axum::routing::any;

use crate::ApiState;
use crate::error::ApiError;
use crate::route_table::Routes;

/// The generation routes (their JSON body names a `model`; the cluster forwards them to its driver).
pub fn routes() -> Routes {
    Routes::new()
        .post("/api/chat", generate::chat)
        .post("/api/generate", generate::generate)
        .post("/api/embed", embed::embed)
        .post("/api/embeddings", embed::embeddings)
        .map(|r| r.route_layer(axum::middleware::map_request(json_body)))
}

/// The routes without a model to forward by.
pub fn plain_routes() -> Routes {
    Routes::new()
        .get("/api/tags", models::tags)
        .get("/api/ps", models::ps)
        // Answered from this node's store and the cluster's model cards: showing a model never places it.
        .post("/api/show", models::show)
        .delete("/api/delete", models::delete)
        .post("/api/pull", pull::pull)
        .get("/api/version", version)
        .map(|r| r.route_layer(axum::middleware::map_request(json_body)))
}

/// Ollama's answer to every other `/api/…` path and method: a 404 in its shape (a fallback, not a
/// route of the API: it is in no list of routes).
pub fn unknown_routes() -> Router<ApiState> {
    Router::new().route("/api/{*rest}", any(unknown_route))
}

/// Ollama reads every body as JSON whatever its `Content-Type` (its own docs send `curl -d '{…}'`, which
/// says form data): so do these routes.
async fn json_body(mut req: axum::extract::Request) -> axum::extract::Request {
    req.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    req
}

/// `GET /api/version`.
#[utoipa::path(
    get,
    path = "/api/version",
    operation_id = "get_api_version",
    tag = "ollama",
    responses(
        (status = 200, description = "shoal's version.", body = types::VersionResponse)
    )
)]
async fn version() -> Json<types::VersionResponse> {
    Json(types::VersionResponse {
        version: env!("CARGO_PKG_VERSION"),
    })
}

/// Any other `/api/…` path (`/api/copy`, `/api/create`, `/api/push`, `/api/blobs/…`): 404 in Ollama's shape.
async fn unknown_route(method: Method, uri: Uri) -> Error {
    Error(ApiError::NotFound(format!(
        "{method} {} is not served by shoal",
        uri.path()
    )))
}

/// The model a request names, as this node's engines serve it: `name` itself, or `name` without an
/// Ollama-style `:latest` tag. 404 when neither is served.
pub fn served_model(state: &ApiState, name: &str) -> Result<String, Error> {
    if name.trim().is_empty() {
        return Err(ApiError::invalid("model", "model is required").into());
    }
    if state.engine.get(name).is_ok() {
        return Ok(name.to_string());
    }
    if let Some(base) = name.strip_suffix(":latest")
        && state.engine.get(base).is_ok()
    {
        return Ok(base.to_string());
    }
    Err(ApiError::ModelNotFound {
        model: name.to_string(),
    }
    .into())
}

/// Now as RFC 3339 in UTC with nanoseconds (`2024-07-22T20:33:28.123648Z`), for `created_at`.
pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

/// `t` as RFC 3339 in UTC with nanoseconds; times before 1970 read as 1970.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (year, month, day) = civil_date(secs / 86_400);
    let rem = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// The proleptic Gregorian date of `days` days after 1970-01-01 (counted in 400-year eras of 146 097
/// days, each starting on a March 1st so the leap day is the era-year's last day).
fn civil_date(days: u64) -> (u64, u64, u64) {
    // Days since 0000-03-01.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_dates() {
        let at = |s: u64, n: u32| rfc3339(UNIX_EPOCH + Duration::new(s, n));
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000000Z");
        // 2000-02-29 (a leap day of a century divisible by 400), 12:34:56.
        assert_eq!(at(951_827_696, 7), "2000-02-29T12:34:56.000000007Z");
        assert_eq!(at(1_709_251_199, 0), "2024-02-29T23:59:59.000000000Z");
        assert_eq!(at(4_102_444_800, 0), "2100-01-01T00:00:00.000000000Z");
        assert_eq!(at(253_402_300_799, 0), "9999-12-31T23:59:59.000000000Z");
    }
}
