//! Serde types of Anthropic's Messages API: requests as clients send them, responses as the SDKs read
//! them.
//!
//! Requests are lenient where Anthropic's are: unknown fields are ignored (clients send extras such as
//! `cache_control` on blocks), numbers with a range are read wide (`i64`, `f32`) so an out-of-range
//! value is reported by name, and fields clients send as `null` are `Option`s. Content blocks keep their
//! `type` as a string ([`Block`]) so a block shoal does not serve (an image, a document) is refused by
//! name in [`super::convert`] rather than failing as an unreadable body; tools stay JSON values until
//! [`super::tools`] reads each one, so a bad one is named by its index.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/messages` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = anthropic::MessagesRequest)]
pub struct MessagesRequest {
    pub model: String,
    pub messages: Vec<InputMessage>,
    pub system: Option<Content>,
    /// Required by Anthropic; `Option` so its absence is a 400 naming it.
    pub max_tokens: Option<i64>,
    pub stop_sequences: Option<Vec<String>>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub stream: Option<bool>,
    /// Accepted and unused (`user_id` is for Anthropic's abuse detection).
    pub metadata: Option<Value>,
    pub thinking: Option<Thinking>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<ToolChoiceIn>,
    /// Anthropic-hosted MCP servers: not something a local server can offer.
    pub mcp_servers: Option<Vec<Value>>,
    /// Anthropic's code-execution container: not offered.
    pub container: Option<Value>,
    /// `effort` (a hint, accepted) and `format` (structured output, refused until it is wired).
    pub output_config: Option<OutputConfig>,
    /// shoal extension: speculative decoding for this request, `{"method": "ngram" | "off",
    /// "max_draft": 1..=32}` or the method's name (absent: the server's default).
    #[schema(value_type = Option<Object>)]
    pub speculative: Option<Value>,
}

/// `output_config`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = anthropic::OutputConfig)]
pub struct OutputConfig {
    pub format: Option<Value>,
}

/// `POST /v1/messages/count_tokens` body: a messages request without the generation knobs.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = anthropic::CountTokensRequest)]
pub struct CountTokensRequest {
    pub model: String,
    pub messages: Vec<InputMessage>,
    pub system: Option<Content>,
    pub thinking: Option<Thinking>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<ToolChoiceIn>,
    pub output_config: Option<OutputConfig>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[schema(as = anthropic::Role)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
}

impl Role {
    /// The role name chat templates know.
    pub fn template_name(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = anthropic::InputMessage)]
pub struct InputMessage {
    pub role: Role,
    pub content: Content,
}

/// Message or system content: a string or a list of content blocks.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = anthropic::Content)]
#[serde(
    untagged,
    expecting = "expected a string or an array of content blocks"
)]
pub enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// One content block as sent; which fields matter depends on `type` (`text`: `text`; `tool_use`:
/// `id`, `name`, `input`; `tool_result`: `tool_use_id`, `content`, `is_error`).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[schema(as = anthropic::Block)]
pub struct Block {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    pub id: Option<String>,
    pub name: Option<String>,
    pub input: Option<Value>,
    pub tool_use_id: Option<String>,
    /// A `tool_result`'s content (a string or blocks).
    #[schema(no_recursion)]
    pub content: Option<Content>,
    pub is_error: Option<bool>,
    /// A `thinking` block's thoughts (an earlier answer's, sent back).
    pub thinking: Option<String>,
}

/// A tool the model may call. Anthropic's server tools (`web_search_…`, `bash_…`: a `type` other than
/// `custom`) are refused by name in [`super::tools`].
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = anthropic::ToolIn)]
pub struct ToolIn {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Option<Value>,
}

/// `tool_choice`: `{"type": "auto" | "any" | "tool" | "none", "name"?, "disable_parallel_tool_use"?}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = anthropic::ToolChoiceIn)]
pub struct ToolChoiceIn {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: Option<String>,
    pub disable_parallel_tool_use: Option<bool>,
}

/// `thinking`: extended thinking, `{"type": "enabled", "budget_tokens": N}` or `{"type": "disabled"}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = anthropic::Thinking)]
pub struct Thinking {
    #[serde(rename = "type")]
    pub kind: String,
    /// The thoughts' budget (Anthropic: at least 1024 and below `max_tokens`); checked, not enforced
    /// apart from `max_tokens`.
    pub budget_tokens: Option<u64>,
}

// ---------------------------------------------------------------------------------------------------
// Responses

/// `message`: the whole answer, also the (empty-content) payload of `message_start`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = anthropic::MessageOut)]
pub struct MessageOut {
    pub id: String,
    #[serde(rename = "type")]
    #[schema(schema_with = schema::message)]
    pub kind: &'static str,
    #[schema(schema_with = schema::assistant)]
    pub role: &'static str,
    pub model: String,
    pub content: Vec<ContentOut>,
    /// Null in `message_start`.
    #[schema(schema_with = schema::stop_reason_or_null)]
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
    pub usage: UsageOut,
}

/// A content block of the answer.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = anthropic::ContentOut)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentOut {
    /// The model's thoughts before its answer (with `thinking` enabled). shoal signs nothing: the
    /// signature is empty; thinking blocks sent back in a conversation reach the template, which decides
    /// what it shows (gpt-oss the thoughts before a tool call).
    Thinking {
        thinking: String,
        signature: String,
    },
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

/// Token counts. Anthropic's `input_tokens` are the prompt tokens computed for this request; those whose
/// KV came from shoal's prefix cache are `cache_read_input_tokens` (the prompt is their sum). Nothing is
/// ever written to a cache on request, so `cache_creation_input_tokens` is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = anthropic::UsageOut)]
pub struct UsageOut {
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub cache_creation_input_tokens: u32,
    pub cache_read_input_tokens: u32,
}

impl From<shoal_engine::Usage> for UsageOut {
    fn from(u: shoal_engine::Usage) -> Self {
        UsageOut {
            input_tokens: u.prompt_tokens.saturating_sub(u.cached_tokens),
            output_tokens: u.completion_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: u.cached_tokens,
        }
    }
}

/// `POST /v1/messages/count_tokens` answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = anthropic::TokenCount)]
pub struct TokenCount {
    pub input_tokens: usize,
}

/// The OpenAPI schemas of fields whose values are a fixed few.
pub(crate) mod schema {
    use crate::schema::one_of;
    use utoipa::openapi::schema::Object;

    pub fn message() -> Object {
        one_of(&["message"], false)
    }
    pub fn assistant() -> Object {
        one_of(&["assistant"], false)
    }
    const STOP_REASONS: [&str; 5] = [
        "end_turn",
        "max_tokens",
        "stop_sequence",
        "tool_use",
        "model_context_window_exceeded",
    ];

    pub fn stop_reason() -> Object {
        one_of(&STOP_REASONS, false)
    }
    pub fn stop_reason_or_null() -> Object {
        one_of(&STOP_REASONS, true)
    }
}
