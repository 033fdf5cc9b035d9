//! Serde types of the Ollama API: requests as Ollama clients send them, responses with Ollama's field
//! names (checked against Ollama's `docs/api.md` and the `ollama` Python client's types).
//!
//! Requests are lenient like Ollama's server: unknown fields and unknown `options` are ignored, and
//! fields clients send as `null` or empty (`format: ""`, `tools: []`) mean "not set". Documented fields
//! shoal does not implement are read so [`super::params`] can refuse them by name.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ApiError;
use crate::openai::types::StopInput;

/// `POST /api/chat` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ollama::ChatRequest)]
pub struct ChatRequest {
    #[serde(default)]
    pub model: String,
    pub messages: Option<Vec<MessageIn>>,
    pub stream: Option<bool>,
    pub format: Option<Value>,
    pub options: Option<Options>,
    pub keep_alive: Option<KeepAlive>,
    pub tools: Option<Vec<Value>>,
    pub think: Option<Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    /// shoal extension: speculative decoding for this request, `{"method": "ngram" | "off",
    /// "max_draft": 1..=32}` or the method's name (absent: the server's default).
    #[schema(value_type = Option<Object>)]
    pub speculative: Option<Value>,
}

/// One chat message.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ollama::MessageIn)]
pub struct MessageIn {
    pub role: String,
    pub content: Option<String>,
    pub images: Option<Vec<Value>>,
    pub tool_calls: Option<Vec<Value>>,
    /// The tool a `tool` message answers for.
    pub tool_name: Option<String>,
    /// An earlier answer's thinking, sent back by clients: the template reads it (gpt-oss's before a
    /// tool call).
    pub thinking: Option<String>,
}

/// `POST /api/generate` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ollama::GenerateRequest)]
pub struct GenerateRequest {
    #[serde(default)]
    pub model: String,
    pub prompt: Option<String>,
    pub suffix: Option<String>,
    pub system: Option<String>,
    pub template: Option<String>,
    pub context: Option<Vec<i64>>,
    pub raw: Option<bool>,
    pub images: Option<Vec<Value>>,
    pub stream: Option<bool>,
    pub format: Option<Value>,
    pub options: Option<Options>,
    pub keep_alive: Option<KeepAlive>,
    pub think: Option<Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    /// shoal extension: speculative decoding for this request, `{"method": "ngram" | "off",
    /// "max_draft": 1..=32}` or the method's name (absent: the server's default).
    #[schema(value_type = Option<Object>)]
    pub speculative: Option<Value>,
}

/// `keep_alive`: a duration string (`"5m"`, `"-1"`) or a number of seconds. Accepted and not acted on:
/// shoal keeps a placed model loaded until its instance is removed.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ollama::KeepAlive)]
#[serde(
    untagged,
    expecting = "expected a duration string or a number of seconds"
)]
pub enum KeepAlive {
    Text(String),
    Seconds(f64),
}

/// `options`: the Modelfile parameters a request may set. Unknown keys are ignored, as Ollama does;
/// options that only tune loading or the hardware (`num_gpu`, `num_thread`, `use_mmap`, …) are ignored
/// too, since shoal sizes those itself.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[schema(as = ollama::Options)]
pub struct Options {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub num_predict: Option<i64>,
    pub stop: Option<StopInput>,
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub num_ctx: Option<i64>,
    /// Sampling methods shoal does not implement: refused unless off.
    pub mirostat: Option<i64>,
    pub typical_p: Option<f32>,
    pub tfs_z: Option<f32>,
}

/// `POST /api/show`, `DELETE /api/delete` bodies (`name` is the older spelling of `model`).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ollama::ModelRequest)]
pub struct ModelRequest {
    pub model: Option<String>,
    pub name: Option<String>,
    /// `show`: the tokenizer's arrays in `model_info` in full.
    pub verbose: Option<bool>,
}

impl ModelRequest {
    /// The model named (`model`, else `name`); 400 when neither is.
    pub fn model(&self) -> Result<String, ApiError> {
        required_model(self.model.as_deref(), self.name.as_deref())
    }
}

/// `model`, else the older `name`: the first that is not blank; 400 naming `model` when both are.
pub fn required_model(model: Option<&str>, name: Option<&str>) -> Result<String, ApiError> {
    [model, name]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|m| !m.is_empty())
        .map(str::to_string)
        .ok_or_else(|| ApiError::invalid("model", "model is required"))
}

/// `POST /api/pull` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ollama::PullRequest)]
pub struct PullRequest {
    pub model: Option<String>,
    pub name: Option<String>,
    pub stream: Option<bool>,
    pub insecure: Option<bool>,
}

impl PullRequest {
    /// The model named (`model`, else `name`); 400 when neither is.
    pub fn model(&self) -> Result<String, ApiError> {
        required_model(self.model.as_deref(), self.name.as_deref())
    }
}

/// A chat answer (one NDJSON line when streaming, the whole answer otherwise).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::ChatResponse)]
pub struct ChatResponse {
    pub model: String,
    pub created_at: String,
    pub message: MessageOut,
    pub done: bool,
    /// On the last object only: why it ended and what it took.
    #[serde(flatten)]
    #[schema(value_type = EndingFields)]
    pub end: Option<Ending>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<Logprob>>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::MessageOut)]
pub struct MessageOut {
    pub role: &'static str,
    pub content: String,
    /// The model's thoughts before its answer (models that think in `<think>` blocks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<OllamaToolCall>>,
}

/// A call in `message.tool_calls`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::OllamaToolCall)]
pub struct OllamaToolCall {
    pub id: String,
    pub function: OllamaFunction,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::OllamaFunction)]
pub struct OllamaFunction {
    /// The call's place among the answer's calls.
    pub index: usize,
    pub name: String,
    /// The arguments as a JSON object.
    pub arguments: Value,
}

/// A generate answer (one NDJSON line when streaming, the whole answer otherwise).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::GenerateResponse)]
pub struct GenerateResponse {
    pub model: String,
    pub created_at: String,
    pub response: String,
    /// The model's thoughts before its answer (models that think in `<think>` blocks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    pub done: bool,
    /// On the last object only: why it ended and what it took.
    #[serde(flatten)]
    #[schema(value_type = EndingFields)]
    pub end: Option<Ending>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<Logprob>>,
}

/// What the last object of an answer adds: why it ended and what it took (durations in nanoseconds).
#[derive(Debug, Serialize)]
pub struct Ending {
    pub done_reason: &'static str,
    #[serde(flatten)]
    pub metrics: Option<Metrics>,
}

/// What [`Ending`] adds to an answer's last object, as the document states it: fields absent from the
/// other objects of a stream (a flattened `Option` the derive cannot describe).
#[derive(utoipa::ToSchema)]
#[schema(as = ollama::EndingFields)]
#[allow(dead_code)]
pub struct EndingFields {
    /// `stop`, `length`, `cancelled`, or `load` (an empty request only loads the model).
    done_reason: Option<String>,
    /// Nanoseconds.
    total_duration: Option<u64>,
    load_duration: Option<u64>,
    prompt_eval_count: Option<u32>,
    prompt_eval_duration: Option<u64>,
    eval_count: Option<u32>,
    eval_duration: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Metrics {
    pub total_duration: u64,
    pub load_duration: u64,
    pub prompt_eval_count: u32,
    pub prompt_eval_duration: u64,
    pub eval_count: u32,
    pub eval_duration: u64,
}

/// A sampled token's log-probability (`logprobs: true`), with the most likely alternatives
/// (`top_logprobs`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::Logprob)]
pub struct Logprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_logprobs: Vec<TokenLogprob>,
}

/// One of the most likely tokens at a position.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::TokenLogprob)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// `details` of a model in `/api/tags`, `/api/ps` and `/api/show`.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::ModelDetails)]
pub struct ModelDetails {
    pub parent_model: String,
    pub format: String,
    pub family: String,
    pub families: Option<Vec<String>>,
    pub parameter_size: String,
    pub quantization_level: String,
}

/// One model of `GET /api/tags`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::ListedModel)]
pub struct ListedModel {
    pub name: String,
    pub model: String,
    pub modified_at: String,
    pub size: u64,
    pub digest: String,
    pub details: ModelDetails,
}

/// `GET /api/tags` answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::TagsResponse)]
pub struct TagsResponse {
    pub models: Vec<ListedModel>,
}

/// `GET /api/ps` answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::PsResponse)]
pub struct PsResponse {
    pub models: Vec<RunningModel>,
}

/// `GET /api/version` answer: shoal's version.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::VersionResponse)]
pub struct VersionResponse {
    pub version: &'static str,
}

/// One model of `GET /api/ps`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::RunningModel)]
pub struct RunningModel {
    pub name: String,
    pub model: String,
    pub size: u64,
    pub digest: String,
    pub details: ModelDetails,
    pub expires_at: String,
    pub size_vram: u64,
    pub context_length: usize,
}

/// `POST /api/show` answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::ShowResponse)]
pub struct ShowResponse {
    pub modelfile: String,
    pub parameters: String,
    pub template: String,
    pub details: ModelDetails,
    pub model_info: serde_json::Map<String, Value>,
    pub capabilities: Vec<&'static str>,
    pub modified_at: String,
}

/// One line of `POST /api/pull` progress.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ollama::Progress)]
pub struct Progress {
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed: Option<u64>,
}

impl Progress {
    pub fn status(status: impl Into<String>) -> Self {
        Progress {
            status: status.into(),
            digest: None,
            total: None,
            completed: None,
        }
    }
}

pub use crate::dialect::ollama::ErrorLine;

/// A line of a streamed chat: an answer object, or the error that ends a failed stream.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ollama::ChatLine)]
#[serde(untagged)]
#[allow(dead_code, clippy::large_enum_variant)]
pub enum ChatLine {
    Answer(ChatResponse),
    Error(ErrorLine),
}

/// A line of a streamed generation: an answer object, or the error that ends a failed stream.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ollama::GenerateLine)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum GenerateLine {
    Answer(GenerateResponse),
    Error(ErrorLine),
}

/// A line of a pull's progress: a step, or the error that ends a failed pull.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ollama::PullLine)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum PullLine {
    Progress(Progress),
    Error(ErrorLine),
}
