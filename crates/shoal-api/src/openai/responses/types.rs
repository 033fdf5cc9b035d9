//! The request and response bodies of `POST /v1/responses`, as the OpenAI Responses API names them.
//!
//! [`ResponsesRequest`] lists every documented field: those shoal implements are used, those it does not
//! are refused by name in [`super::unsupported`], and fields no API documents are ignored (clients send
//! extras). [`ResponseObject`] is the `response` object, also carried by the stream's
//! `response.created` / `response.completed` events.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/responses`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    pub input: Option<Input>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub stream: Option<bool>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub text: Option<TextConfig>,
    pub previous_response_id: Option<String>,
    pub conversation: Option<Value>,
    pub reasoning: Option<Value>,
    pub background: Option<bool>,
    pub prompt: Option<Value>,
    pub include: Option<Vec<String>>,
    pub top_logprobs: Option<i64>,
    pub max_tool_calls: Option<i64>,
    pub store: Option<bool>,
    pub metadata: Option<Value>,
    pub user: Option<String>,
    pub truncation: Option<String>,
    pub service_tier: Option<String>,
    pub safety_identifier: Option<String>,
    pub prompt_cache_key: Option<String>,
    /// shoal's extras, as on chat completions.
    pub seed: Option<i64>,
    pub timeout: Option<f64>,
    /// shoal extension: speculative decoding for this request, `{"method": "ngram" | "off",
    /// "max_draft": 1..=32}` or the method's name (absent: the server's default).
    #[schema(value_type = Option<Object>)]
    pub speculative: Option<serde_json::Value>,
}

/// `input`: a plain string (one user message) or a list of items.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Items(Vec<Value>),
}

/// `text`: how the output is shaped.
#[derive(Debug, Default, Deserialize, Serialize, Clone, utoipa::ToSchema)]
pub struct TextConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbosity: Option<String>,
}

/// The `response` object.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: &'static str,
    pub error: Option<Value>,
    pub incomplete_details: Option<Value>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub model: String,
    pub output: Vec<Value>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: Value,
    pub store: bool,
    pub temperature: f32,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub top_p: f32,
    pub truncation: &'static str,
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
    pub metadata: Value,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ResponseUsage {
    pub input_tokens: u32,
    pub input_tokens_details: Value,
    pub output_tokens: u32,
    pub output_tokens_details: Value,
    pub total_tokens: u32,
}

impl From<shoal_engine::Usage> for ResponseUsage {
    fn from(u: shoal_engine::Usage) -> Self {
        ResponseUsage {
            input_tokens: u.prompt_tokens,
            input_tokens_details: serde_json::json!({ "cached_tokens": u.cached_tokens }),
            output_tokens: u.completion_tokens,
            output_tokens_details: serde_json::json!({ "reasoning_tokens": 0 }),
            total_tokens: u.prompt_tokens + u.completion_tokens,
        }
    }
}
