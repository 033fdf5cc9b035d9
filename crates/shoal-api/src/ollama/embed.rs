//! `POST /api/embed` and the older `POST /api/embeddings`, through [`shoal_engine::Engines::embed`]: one
//! L2-normalized vector per input (the model's final hidden states, pooled as its GGUF says — the mean
//! for a decoder LLM — as llama.cpp's embedding mode gives), on one node or a pipeline.
//!
//! As in Ollama: `input` is a string or a list of strings (an empty string is no input at all and
//! answers an empty list), inputs longer than the context are cut unless `truncate: false` (then 400),
//! `dimensions` keeps the first N numbers of each vector and normalizes them again, `options` and
//! `keep_alive` are accepted. `/api/embeddings` takes one `prompt` and answers `{"embedding": [...]}`
//! (an empty prompt answers an empty vector).

use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use serde::{Deserialize, Serialize};
use shoal_engine::{EmbedRequest as EngineEmbed, Prompt};

use super::stream::nanos;
use super::types::{KeepAlive, Options};
use super::{Error, served_model};
use crate::ApiState;
use crate::error::ApiError;

/// `POST /api/embed` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ollama::EmbedRequest)]
pub struct EmbedRequest {
    #[serde(default)]
    pub model: String,
    pub input: Option<EmbedInput>,
    pub truncate: Option<bool>,
    pub dimensions: Option<i64>,
    pub options: Option<Options>,
    pub keep_alive: Option<KeepAlive>,
}

/// `input`: one text or several.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ollama::EmbedInput)]
#[serde(untagged, expecting = "expected a string or an array of strings")]
pub enum EmbedInput {
    One(String),
    Many(Vec<String>),
}

/// `POST /api/embeddings` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ollama::EmbeddingsRequest)]
pub struct EmbeddingsRequest {
    #[serde(default)]
    pub model: String,
    pub prompt: Option<String>,
    pub options: Option<Options>,
    pub keep_alive: Option<KeepAlive>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::EmbedResponse)]
pub struct EmbedResponse {
    pub model: String,
    pub embeddings: Vec<Vec<f32>>,
    pub total_duration: u64,
    pub load_duration: u64,
    pub prompt_eval_count: u32,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::EmbeddingsResponse)]
pub struct EmbeddingsResponse {
    pub embedding: Vec<f32>,
}

/// `POST /api/embed`.
#[utoipa::path(
    post,
    path = "/api/embed",
    operation_id = "post_api_embed",
    tag = "ollama",
    request_body = EmbedRequest,
    responses(
        (status = 200, description = "One vector per input.", body = EmbedResponse),
        crate::schema::OllamaErrors
    )
)]
pub async fn embed(
    State(state): State<ApiState>,
    body: Result<Json<EmbedRequest>, JsonRejection>,
) -> Result<Json<EmbedResponse>, Error> {
    let started = Instant::now();
    let Json(req) = body?;
    let model = served_model(&state, &req.model)?;
    let inputs = match req.input {
        None => Vec::new(),
        Some(EmbedInput::One(text)) if text.is_empty() => Vec::new(),
        Some(EmbedInput::One(text)) => vec![text],
        Some(EmbedInput::Many(texts)) => texts,
    };
    let loaded = started.elapsed();
    let (mut vectors, prompt_tokens) =
        vectors(&state, &model, inputs, req.truncate.unwrap_or(true)).await?;
    if let Some(d) = req.dimensions {
        shorten(&mut vectors, d)?;
    }
    Ok(Json(EmbedResponse {
        model,
        embeddings: vectors,
        total_duration: nanos(started.elapsed()),
        load_duration: nanos(loaded),
        prompt_eval_count: prompt_tokens,
    }))
}

/// `POST /api/embeddings` (Ollama's older route).
#[utoipa::path(
    post,
    path = "/api/embeddings",
    operation_id = "post_api_embeddings",
    tag = "ollama",
    request_body = EmbeddingsRequest,
    responses(
        (status = 200, description = "The prompt's vector.", body = EmbeddingsResponse),
        crate::schema::OllamaErrors
    )
)]
pub async fn embeddings(
    State(state): State<ApiState>,
    body: Result<Json<EmbeddingsRequest>, JsonRejection>,
) -> Result<Json<EmbeddingsResponse>, Error> {
    let Json(req) = body?;
    let model = served_model(&state, &req.model)?;
    let inputs: Vec<String> = req.prompt.into_iter().filter(|p| !p.is_empty()).collect();
    let (vectors, _) = vectors(&state, &model, inputs, true).await?;
    Ok(Json(EmbeddingsResponse {
        embedding: vectors.into_iter().next().unwrap_or_default(),
    }))
}

/// One vector per text (none for no texts) and the tokens they took.
async fn vectors(
    state: &ApiState,
    model: &str,
    inputs: Vec<String>,
    truncate: bool,
) -> Result<(Vec<Vec<f32>>, u32), Error> {
    if inputs.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let request = EngineEmbed {
        model: model.to_string(),
        inputs: inputs.into_iter().map(Prompt::Text).collect(),
        truncate,
        timeout: None,
    };
    let out = state
        .engine
        .embed(request)
        .await
        .map_err(|e| ApiError::from_engine(e, "input"))?;
    Ok((out.vectors, out.prompt_tokens))
}

/// `dimensions`: the first `d` numbers of each vector, normalized again.
fn shorten(vectors: &mut [Vec<f32>], d: i64) -> Result<(), Error> {
    let full = vectors.first().map_or(0, Vec::len);
    let keep = usize::try_from(d).unwrap_or(0);
    if keep == 0 || (full > 0 && keep > full) {
        return Err(ApiError::invalid(
            "dimensions",
            format!("dimensions must be between 1 and the model's embedding size {full}, got {d}"),
        )
        .into());
    }
    for v in vectors {
        v.truncate(keep);
        shoal_engine::embed::normalize(v);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dimensions_cut_and_renormalize() {
        let mut v = vec![vec![0.6, 0.0, 0.8], vec![0.0, 1.0, 0.0]];
        shorten(&mut v, 2).expect("2 of 3");
        assert_eq!(v[0], vec![1.0, 0.0]);
        assert_eq!(v[1], vec![0.0, 1.0]);
        for bad in [0, -1, 3] {
            let mut v = vec![vec![1.0, 0.0]];
            assert!(shorten(&mut v, bad).is_err_and(|e| e.message().starts_with("dimensions")));
        }
    }
}
