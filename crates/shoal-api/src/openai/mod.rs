//! The OpenAI-compatible API: `/v1/chat/completions`, `/v1/completions`, `/v1/responses`
//! ([`responses`]), `/v1/embeddings` ([`embeddings`]), `/v1/models`.
//!
//! Each handler parses its body into [`types`] and checks it through [`params`]; chat and Responses
//! hand a [`crate::generate::Chat`] to the one front half ([`crate::generate::start`]), completions
//! submits its raw prompt ([`crate::generate::submit`]). Each answers with one JSON object (outcomes
//! gathered by [`crate::generate::collect`]) or an SSE stream ([`stream`] for chat and completions,
//! [`crate::sse`] for the Responses API): this module holds OpenAI's shapes and conversions only.

pub mod chat;
pub mod completions;
pub mod embeddings;
pub mod params;
pub mod responses;
pub mod stream;
pub mod tools;
pub mod types;

use std::time::{SystemTime, UNIX_EPOCH};

use crate::ApiState;
use crate::error::ApiError;
use axum::Json;
use axum::extract::{Path, State};
use types::{ModelList, ModelObject};

/// Reported as `system_fingerprint`: which server build produced the output.
pub const SYSTEM_FINGERPRINT: &str = concat!("shoal-", env!("CARGO_PKG_VERSION"));

/// Unix seconds, for `created`.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `GET /v1/models`.
#[utoipa::path(
    get,
    path = "/v1/models",
    operation_id = "get_v1_models",
    tag = "openai",
    responses(
        (status = 200, description = "The models this node answers for.", body = ModelList),
        crate::schema::OpenAiErrors
    )
)]
pub async fn list_models(State(state): State<ApiState>) -> Json<ModelList> {
    let data = crate::cluster::served_models(&state)
        .into_iter()
        .map(ModelObject::from)
        .collect();
    Json(ModelList {
        object: "list",
        data,
    })
}

/// `GET /v1/models/{id}` (ids may contain `/`).
#[utoipa::path(
    get,
    path = "/v1/models/{id}",
    operation_id = "get_v1_models_id",
    tag = "openai",
    params(("id" = String, Path, description = "The model id (it may contain `/`).")),
    responses(
        (status = 200, description = "The model.", body = ModelObject),
        crate::schema::OpenAiErrors
    )
)]
pub async fn get_model(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<ModelObject>, ApiError> {
    crate::cluster::served_models(&state)
        .into_iter()
        .find(|m| m.id == id)
        .map(|m| Json(ModelObject::from(m)))
        .ok_or(ApiError::ModelNotFound { model: id })
}
