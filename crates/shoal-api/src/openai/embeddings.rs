//! `POST /v1/embeddings`: one vector per input — the model's final hidden states after the output norm,
//! mean-pooled over the input's tokens (or as the GGUF's `pooling_type` says) and L2-normalized, as
//! `llama-server --embeddings --pooling mean` answers for a decoder LLM ([`shoal_engine::Engines::embed`];
//! also on a pipeline, whose last stage returns the pooled rows).
//!
//! `input` is a string, a list of strings, a list of token ids or a list of such lists (at most
//! [`MAX_INPUTS`]; none empty); text is tokenized as llama.cpp's server does (special tokens parsed,
//! BOS/EOS as the GGUF asks). `encoding_format` is `float` (default) or `base64` (the little-endian f32
//! bytes, what the `openai` Python SDK asks for by default). `dimensions` is refused by name: the model
//! has one size. `usage` counts the tokens of every input.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use serde::{Deserialize, Serialize};
use shoal_engine::{EmbedRequest, Prompt};

use super::params::resolve_model;
use super::types::PromptInput;
use crate::ApiState;
use crate::error::ApiError;

/// Inputs one request may hold (OpenAI's limit; the engine enforces it for every API).
pub use shoal_engine::embed::MAX_INPUTS;

/// The request field every input problem is reported against.
const INPUT_PARAM: &str = "input";

/// `POST /v1/embeddings` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct EmbeddingRequest {
    pub input: PromptInput,
    pub model: Option<String>,
    pub encoding_format: Option<String>,
    pub dimensions: Option<i64>,
}

/// The answer: `{"object": "list", "data": [...], "model", "usage"}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EmbeddingList {
    pub object: &'static str,
    pub data: Vec<EmbeddingObject>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EmbeddingObject {
    pub object: &'static str,
    pub index: usize,
    pub embedding: Vector,
}

/// A vector as floats, or as the base64 of its little-endian f32 bytes.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Clone, Copy, Serialize, utoipa::ToSchema)]
pub struct EmbeddingUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
}

#[utoipa::path(
    post,
    path = "/v1/embeddings",
    operation_id = "post_v1_embeddings",
    tag = "openai",
    request_body = EmbeddingRequest,
    responses(
        (status = 200, description = "One vector per input.", body = EmbeddingList),
        crate::schema::OpenAiErrors
    )
)]
pub async fn embeddings(
    State(state): State<ApiState>,
    body: Result<Json<EmbeddingRequest>, JsonRejection>,
) -> Result<Json<EmbeddingList>, ApiError> {
    let Json(req) = body?;
    if req.dimensions.is_some() {
        return Err(ApiError::invalid(
            "dimensions",
            "dimensions is not supported: a model's embeddings have its hidden size",
        ));
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("encoding_format must be 'float' or 'base64', got '{other}'"),
            ));
        }
    };
    let inputs = to_inputs(req.input)?;
    let model = resolve_model(&state.engine, req.model)?;
    let out = state
        .engine
        .embed(EmbedRequest {
            model: model.clone(),
            inputs,
            truncate: false,
            timeout: None,
        })
        .await
        .map_err(|e| ApiError::from_engine(e, INPUT_PARAM))?;
    let data = out
        .vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| EmbeddingObject {
            object: "embedding",
            index,
            embedding: if base64 {
                Vector::Base64(base64_f32(&v))
            } else {
                Vector::Float(v)
            },
        })
        .collect();
    Ok(Json(EmbeddingList {
        object: "list",
        data,
        model,
        usage: EmbeddingUsage {
            prompt_tokens: out.prompt_tokens,
            total_tokens: out.prompt_tokens,
        },
    }))
}

/// The inputs as engine prompts: at least one, none empty (the engine refuses more than [`MAX_INPUTS`]).
fn to_inputs(input: PromptInput) -> Result<Vec<Prompt>, ApiError> {
    let inputs: Vec<Prompt> = match input {
        PromptInput::Text(text) => vec![Prompt::Text(text)],
        PromptInput::Tokens(ids) => vec![Prompt::Tokens(ids)],
        PromptInput::Texts(texts) => texts.into_iter().map(Prompt::Text).collect(),
        PromptInput::TokenBatches(batches) => batches.into_iter().map(Prompt::Tokens).collect(),
    };
    let empty = |p: &Prompt| match p {
        Prompt::Text(t) => t.is_empty(),
        Prompt::Tokens(t) => t.is_empty(),
    };
    if inputs.is_empty() || inputs.iter().any(empty) {
        return Err(ApiError::invalid(
            INPUT_PARAM,
            "input must not be empty, nor hold an empty string or token list",
        ));
    }
    Ok(inputs)
}

/// Standard base64 (RFC 4648, padded) of `v`'s little-endian f32 bytes.
fn base64_f32(v: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let b = [
            group[0],
            group.get(1).copied().unwrap_or(0),
            group.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= group.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_of_little_endian_floats() {
        // 1.0 = 00 00 80 3F, -2.0 = 00 00 00 C0.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, -2.0]), "AACAPwAAAMA=");
        assert_eq!(base64_f32(&[]), "");
        assert_eq!(base64_f32(&[0.0; 3]), "AAAAAAAAAAAAAAAA");
    }

    #[test]
    fn inputs_must_be_there_and_not_empty() {
        let bad = |i: PromptInput| to_inputs(i).unwrap_err();
        for input in [
            PromptInput::Text(String::new()),
            PromptInput::Texts(vec![]),
            PromptInput::Texts(vec!["a".into(), String::new()]),
            PromptInput::Tokens(vec![]),
            PromptInput::TokenBatches(vec![vec![1], vec![]]),
        ] {
            assert!(
                matches!(bad(input), ApiError::InvalidRequest { param: Some(p), .. } if p == "input")
            );
        }
        assert_eq!(
            to_inputs(PromptInput::TokenBatches(vec![vec![1, 2], vec![3]])).ok(),
            Some(vec![Prompt::Tokens(vec![1, 2]), Prompt::Tokens(vec![3])])
        );
    }
}
