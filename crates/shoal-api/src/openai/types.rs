//! Serde types of the OpenAI API: raw requests as clients send them, responses as clients expect them.
//!
//! Requests are lenient on purpose: unknown fields are ignored (clients send many), numbers that have a
//! range are read wide (`i64`, `f32`) so an out-of-range value is reported by name instead of failing as
//! a type error, and fields clients often send as `null` are `Option`s. Turning them into the engine's
//! validated request happens in [`super::params`].

use serde::{Deserialize, Serialize};

/// `POST /v1/chat/completions` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessageIn>,
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    #[serde(alias = "repeat_penalty")]
    pub repetition_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<StopInput>,
    /// llama.cpp / vLLM extension: keep generating past end-of-generation tokens.
    pub ignore_eos: Option<bool>,
    /// shoal extension: give up after this many seconds (queueing included) with 408.
    pub timeout: Option<f64>,
    pub n: Option<i64>,
    /// shoal extension: speculative decoding for this request, `{"method": "ngram" | "off",
    /// "max_draft": 1..=32}` or the method's name (absent: the server's default).
    #[schema(value_type = Option<Object>)]
    pub speculative: Option<serde_json::Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    /// Functions the model may call.
    pub tools: Option<Vec<ToolIn>>,
    /// `"none" | "auto" | "required" | {"type": "function", "function": {"name"}}`, read by
    /// [`super::tools`] (which names `tool_choice` in its errors).
    pub tool_choice: Option<serde_json::Value>,
    pub parallel_tool_calls: Option<bool>,
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`, read by
    /// [`super::tools`].
    pub response_format: Option<serde_json::Value>,
    /// `none`, `minimal`, `low`, `medium` or `high`: `none` turns a thinking model's thoughts off
    /// (`enable_thinking: false`), the others pass to templates that read `reasoning_effort` (gpt-oss;
    /// `minimal` as `low`).
    pub reasoning_effort: Option<String>,
    /// Variables for the chat template (llama-server's and vLLM's extension): `enable_thinking` (bool)
    /// and `reasoning_effort` (string) are read; any other is a 400 naming it.
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// The most tokens a thinking model's thoughts may take (llama-server's `thinking_budget_tokens`,
    /// vLLM's `thinking_token_budget`): when they are spent, the model is made to close them and answer.
    #[serde(alias = "thinking_token_budget")]
    #[schema(minimum = 1)]
    pub thinking_budget_tokens: Option<u32>,
    /// Documented by OpenAI, not implemented: refused by name when they would change the answer
    /// ([`super::params::refuse_unimplemented`]).
    #[serde(flatten)]
    pub unimplemented: Unimplemented,
}

/// Documented request fields shoal does not implement; each is a 400 naming it when set to anything
/// that would change the answer (`null`, `{}`, `[]`, `["text"]` modalities and `medium` verbosity are
/// what a client sends by default and pass).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
pub struct Unimplemented {
    pub logit_bias: Option<serde_json::Value>,
    pub audio: Option<serde_json::Value>,
    pub modalities: Option<serde_json::Value>,
    pub prediction: Option<serde_json::Value>,
    pub functions: Option<serde_json::Value>,
    pub function_call: Option<serde_json::Value>,
    pub web_search_options: Option<serde_json::Value>,
    pub verbosity: Option<serde_json::Value>,
}

/// One entry of `tools`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ToolIn {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionIn,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct FunctionIn {
    pub name: String,
    pub description: Option<String>,
    /// JSON schema of the arguments.
    pub parameters: Option<serde_json::Value>,
}

/// One of an assistant message's `tool_calls`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ToolCallIn {
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: FunctionCallIn,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct FunctionCallIn {
    pub name: String,
    /// JSON text (OpenAI's shape); an object is taken too.
    pub arguments: Option<serde_json::Value>,
}

/// `POST /v1/completions` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct CompletionRequest {
    pub prompt: PromptInput,
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    #[serde(alias = "repeat_penalty")]
    pub repetition_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<StopInput>,
    /// llama.cpp / vLLM extension: keep generating past end-of-generation tokens.
    pub ignore_eos: Option<bool>,
    /// shoal extension: give up after this many seconds (queueing included) with 408.
    pub timeout: Option<f64>,
    pub n: Option<i64>,
    /// shoal extension: speculative decoding for this request, `{"method": "ngram" | "off",
    /// "max_draft": 1..=32}` or the method's name (absent: the server's default).
    #[schema(value_type = Option<Object>)]
    pub speculative: Option<serde_json::Value>,
    pub best_of: Option<i64>,
    /// Number of top log-probabilities per token; only 0 (the sampled token's own) is supported.
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub logit_bias: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
    /// shoal's own: while the prompt is processed, SSE comments `: prefill {"done":N,"total":M}`
    /// (every SSE client skips comments; the dashboard draws them as a progress bar).
    pub include_progress: Option<bool>,
}

/// `stop`: one string or a list of them.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged, expecting = "expected a string or an array of strings")]
pub enum StopInput {
    One(String),
    Many(Vec<String>),
}

impl StopInput {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopInput::One(s) => vec![s],
            StopInput::Many(v) => v,
        }
    }
}

/// `prompt` of `/v1/completions`: text, token ids, or a batch of either (only batches of one are served).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(
    untagged,
    expecting = "expected a string, an array of strings, an array of token ids or an array of token-id arrays"
)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenBatches(Vec<Vec<u32>>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    /// OpenAI's newer name for the system role.
    Developer,
    User,
    Assistant,
    /// A tool call's result.
    Tool,
}

impl Role {
    /// The role name chat templates know.
    pub fn template_name(self) -> &'static str {
        match self {
            Role::System | Role::Developer => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ChatMessageIn {
    pub role: Role,
    /// `null` is allowed (assistant turns that only carried tool calls) and reads as empty text.
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// An assistant turn's function calls.
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
    /// The function a `tool` message answers for (optional).
    pub name: Option<String>,
    /// An assistant turn's thoughts, as shoal answered them (`message.reasoning_content`), sent back:
    /// the template reads them (gpt-oss's before a tool call, Qwen3's in the current turn).
    pub reasoning_content: Option<String>,
}

/// Message content: a string or a list of typed parts.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged, expecting = "expected a string or an array of content parts")]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

// ---------------------------------------------------------------------------------------------------
// Responses

#[derive(Debug, Clone, Copy, Serialize, utoipa::ToSchema)]
pub struct UsageOut {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Debug, Clone, Copy, Serialize, utoipa::ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

impl From<shoal_engine::Usage> for UsageOut {
    fn from(u: shoal_engine::Usage) -> Self {
        UsageOut {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens.saturating_add(u.completion_tokens),
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.cached_tokens,
            },
        }
    }
}

/// `chat.completion`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    #[schema(schema_with = schema::chat_completion)]
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: &'static str,
    pub choices: Vec<ChatChoice>,
    pub usage: UsageOut,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    /// `tool_calls` when the model stopped after calling.
    #[schema(schema_with = schema::chat_finish)]
    pub finish_reason: &'static str,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AssistantMessage {
    #[schema(schema_with = schema::assistant)]
    pub role: &'static str,
    /// `null` when the answer is only tool calls.
    pub content: Option<String>,
    /// The model's thoughts before its answer (models that think in `<think>` blocks), as llama-server
    /// and vLLM return them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<super::tools::ToolCallJson>>,
}

/// `chat.completion.chunk`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatChunk {
    pub id: String,
    #[schema(schema_with = schema::chat_chunk)]
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: &'static str,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageOut>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    /// Null until the last chunk of the choice.
    #[schema(schema_with = schema::chat_finish_or_null)]
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = schema::assistant)]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// A piece of the model's thoughts (see [`AssistantMessage::reasoning_content`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Complete calls, each with its `index` (OpenAI clients also take a call whole).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<super::tools::ToolCallJson>>,
}

/// What the `data` of one SSE event of a streamed chat completion carries, as the OpenAPI document
/// states it: a chunk, or the error that ends the stream (`[DONE]`, the last event, is no JSON).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum ChatStreamData {
    Chunk(ChatChunk),
    Error(crate::error::ErrorBody),
}

/// The same for a streamed text completion.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum TextStreamData {
    Chunk(TextCompletion),
    Error(crate::error::ErrorBody),
}

/// Chat log-probabilities: each sampled token's own and its `top_logprobs` alternatives (when asked).
#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprob>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TokenLogprob {
    /// The text this token made decodable (may be empty inside a multi-byte character).
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// `text_completion`, also the shape of its stream chunks.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TextCompletion {
    pub id: String,
    #[schema(schema_with = schema::text_completion)]
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: &'static str,
    pub choices: Vec<TextChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageOut>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TextChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<TextLogprobs>,
    /// Null until the last chunk of a stream.
    #[schema(schema_with = schema::text_finish_or_null)]
    pub finish_reason: Option<&'static str>,
}

/// Legacy completion log-probabilities: the sampled tokens' own, and with `logprobs: k > 0` one
/// `{token text: logprob}` object per token (`null` for `logprobs: 0`).
#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
pub struct TextLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Option<Vec<std::collections::BTreeMap<String, f32>>>,
    pub text_offset: Vec<usize>,
}

/// `GET /v1/models`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelObject>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ModelObject {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: String,
    /// Not in OpenAI's schema (clients ignore unknown fields): the context window in tokens.
    pub context_length: usize,
}

impl From<shoal_engine::ModelInfo> for ModelObject {
    fn from(m: shoal_engine::ModelInfo) -> Self {
        ModelObject {
            id: m.id,
            object: "model",
            created: m.created,
            owned_by: m.owned_by,
            context_length: m.context_length,
        }
    }
}

/// The OpenAPI schemas of fields whose values are a fixed few (`&'static str` in the types).
mod schema {
    use crate::schema::one_of;
    use utoipa::openapi::schema::Object;

    const CHAT_FINISH: [&str; 4] = ["stop", "length", "tool_calls", "cancelled"];
    const TEXT_FINISH: [&str; 3] = ["stop", "length", "cancelled"];

    pub fn chat_completion() -> Object {
        one_of(&["chat.completion"], false)
    }
    pub fn chat_chunk() -> Object {
        one_of(&["chat.completion.chunk"], false)
    }
    pub fn text_completion() -> Object {
        one_of(&["text_completion"], false)
    }
    pub fn assistant() -> Object {
        one_of(&["assistant"], false)
    }
    pub fn chat_finish() -> Object {
        one_of(&CHAT_FINISH, false)
    }
    pub fn chat_finish_or_null() -> Object {
        one_of(&CHAT_FINISH, true)
    }
    pub fn text_finish_or_null() -> Object {
        one_of(&TEXT_FINISH, true)
    }
}
