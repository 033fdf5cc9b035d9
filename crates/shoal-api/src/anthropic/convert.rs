//! From an Anthropic request to what the engine takes: the conversation as chat messages for the
//! model's template ([`Conversation`]), the tools and output format for shoal-guide
//! ([`super::tools::guidance`]) and the checked generation parameters ([`Prepared`]).
//!
//! Each rule names the field it is about, so every refusal is a 400 naming it: `max_tokens` is required,
//! `temperature` is Anthropic's 0..1, stop sequences and the token budget follow the OpenAI routes' rules
//! ([`crate::openai::params`]), and what shoal does not offer (`thinking`, images and documents in a
//! text-only model, `mcp_servers`, `container`) is refused by name, never ignored. Hints that change
//! nothing about the answer here (`metadata`, `service_tier`, `output_config.effort`, top-level
//! `cache_control`: shoal caches prompt prefixes by itself) are accepted.
//!
//! Messages: text blocks are joined; an assistant's `tool_use` blocks become its tool calls and a
//! user's `tool_result` blocks become `tool` messages (before the user's text), named after the call
//! they answer. A conversation that ends with an assistant message of text is a prefill, as on
//! Anthropic's API: the messages before it are rendered with the template's generation prompt and the
//! assistant's text is appended, so the answer continues it.

use std::num::NonZeroU32;

use shoal_engine::{ChatMessage, Engines, SamplingParams};
use shoal_guide::{ChatGuidance, ResponseFormat, ToolCall, ToolChoice};

use super::tools::guidance;
use super::types::{
    Block, Content, CountTokensRequest, InputMessage, MessagesRequest, Role, Thinking,
};
use crate::error::ApiError;
use crate::openai::params::{resolve_model, stop_sequences, token_budget};

/// How the text blocks of one content list are joined (Anthropic sends separate blocks for separate
/// pieces of a turn, such as a reminder and the user's words).
const BLOCK_SEPARATOR: &str = "\n";

/// The conversation for the chat template.
#[derive(Debug, Default, PartialEq)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    /// A final assistant text the answer continues (appended after the rendered prompt).
    pub prefill: Option<String>,
}

/// A checked messages request.
#[derive(Debug)]
pub struct Prepared {
    /// A model the engine serves.
    pub model: String,
    pub conversation: Conversation,
    pub guidance: ChatGuidance,
    pub sampling: SamplingParams,
    pub max_tokens: NonZeroU32,
    pub stop: Vec<String>,
    pub stream: bool,
    /// What `thinking` asks of the model's thoughts.
    pub thinking: shoal_engine::Thinking,
    /// Speculative decoding (`None`: the server's default).
    pub speculative: Option<shoal_engine::Speculation>,
}

/// Checks a `POST /v1/messages` body.
pub fn prepare(engine: &Engines, req: MessagesRequest) -> Result<Prepared, ApiError> {
    let thinking = thinking(req.thinking.as_ref())?;
    if req.mcp_servers.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid(
            "mcp_servers",
            "MCP servers are not supported by this server",
        ));
    }
    if req.container.is_some() {
        return Err(ApiError::invalid(
            "container",
            "containers (code execution) are not supported by this server",
        ));
    }
    let max_tokens = match req.max_tokens {
        Some(v) => token_budget("max_tokens", v)?,
        None => return Err(ApiError::invalid("max_tokens", "Field required")),
    };
    let sampling = sampling(req.temperature, req.top_p, req.top_k)?;
    let speculative = crate::speculative::parse("speculative", req.speculative.as_ref())?;
    let stop = stop_sequences("stop_sequences", req.stop_sequences.unwrap_or_default())?;
    let format = req.output_config.and_then(|c| c.format);
    let guidance = guidance(req.tools, req.tool_choice, format)?;
    let model = resolve_model(engine, Some(req.model))?;
    let conversation = conversation(req.system, req.messages, &guidance)?;
    Ok(Prepared {
        model,
        conversation,
        guidance,
        sampling,
        max_tokens,
        stop,
        stream: req.stream.unwrap_or(false),
        thinking,
        speculative,
    })
}

/// Checks a `POST /v1/messages/count_tokens` body: the model, the conversation and its tools.
pub fn prepare_count(
    engine: &Engines,
    req: CountTokensRequest,
) -> Result<(String, Conversation, ChatGuidance), ApiError> {
    thinking(req.thinking.as_ref())?;
    let format = req.output_config.and_then(|c| c.format);
    let guidance = guidance(req.tools, req.tool_choice, format)?;
    let model = resolve_model(engine, Some(req.model))?;
    let conversation = conversation(req.system, req.messages, &guidance)?;
    Ok((model, conversation, guidance))
}

/// Anthropic's knobs as the engine's [`SamplingParams`]: `temperature` in 0..1 (default 1), `top_p`,
/// `top_k` (0: off); the rest at the engine's defaults.
fn sampling(
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
) -> Result<SamplingParams, ApiError> {
    if let Some(t) = temperature
        && !(0.0..=1.0).contains(&t)
    {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature must be between 0 and 1, got {t}"),
        ));
    }
    let defaults = SamplingParams::default();
    let params = SamplingParams {
        temperature: temperature.unwrap_or(1.0),
        top_p: top_p.unwrap_or(defaults.top_p),
        top_k: top_k.unwrap_or(defaults.top_k),
        ..defaults
    };
    Ok(params.validate().map_err(shoal_engine::EngineError::from)?)
}

/// Extended thinking: `enabled` (or `adaptive`) lets a thinking model think — its thoughts come back as
/// a `thinking` block —, `disabled` or no `thinking` turns its thoughts off (Anthropic's default). The
/// `budget_tokens` (at least 1) bounds the thoughts: when spent, the model is made to close them and
/// answer ([`crate::generate::budget`]).
fn thinking(thinking: Option<&Thinking>) -> Result<shoal_engine::Thinking, ApiError> {
    let enable = match thinking.map(|t| t.kind.as_str()) {
        None | Some("disabled") => false,
        Some("enabled" | "adaptive") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "thinking.type",
                format!("thinking.type must be enabled, adaptive or disabled, got {other:?}"),
            ));
        }
    };
    let budget = match thinking.and_then(|t| t.budget_tokens) {
        Some(0) => {
            return Err(ApiError::invalid(
                "thinking.budget_tokens",
                "thinking.budget_tokens must be at least 1",
            ));
        }
        Some(n) => Some(u32::try_from(n).unwrap_or(u32::MAX)),
        None => None,
    };
    Ok(shoal_engine::Thinking {
        enable: Some(enable),
        effort: None,
        budget: budget.filter(|_| enable),
    })
}

/// The system prompt and messages as chat messages; a final assistant text is the prefill.
fn conversation(
    system: Option<Content>,
    messages: Vec<InputMessage>,
    guidance: &ChatGuidance,
) -> Result<Conversation, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "at least one message is required",
        ));
    }
    let mut out = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = system {
        let text = content_text("system", system)?;
        if !text.is_empty() {
            out.push(ChatMessage::new("system", text));
        }
    }
    let last = messages.len() - 1;
    let mut prefill = None;
    for (i, message) in messages.into_iter().enumerate() {
        let param = format!("messages[{i}].content");
        match message.role {
            Role::User => user_turn(&param, message.content, &mut out)?,
            Role::Assistant => {
                let turn = assistant_turn(&param, message.content)?;
                if i == last && turn.tool_calls.is_empty() {
                    prefill = Some(turn.content);
                } else {
                    out.push(turn);
                }
            }
        }
    }
    let constrained = guidance.response_format != ResponseFormat::Text
        || matches!(
            guidance.tool_choice,
            ToolChoice::Required | ToolChoice::Function(_)
        );
    if prefill.is_some() && constrained {
        return Err(ApiError::invalid(
            format!("messages[{last}]"),
            "a final assistant message (a prefill) cannot be combined with a forced tool_choice or output_config.format",
        ));
    }
    Ok(Conversation {
        messages: out,
        prefill,
    })
}

/// A user turn: its `tool_result` blocks as `tool` messages, then its text (if any) as a user message.
fn user_turn(param: &str, content: Content, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let blocks = match content {
        Content::Text(text) => {
            out.push(ChatMessage::new("user", text));
            return Ok(());
        }
        Content::Blocks(blocks) => blocks,
    };
    let mut texts = Vec::new();
    for (j, block) in blocks.into_iter().enumerate() {
        let param = format!("{param}[{j}]");
        if block.kind == "tool_result" {
            let result = tool_result(&param, block, out)?;
            out.push(result);
        } else {
            texts.push(block_text(&param, block)?);
        }
    }
    if !texts.is_empty() {
        out.push(ChatMessage::new("user", texts.join(BLOCK_SEPARATOR)));
    }
    Ok(())
}

/// A `tool_result` block as a `tool` message, named after the call it answers.
fn tool_result(
    param: &str,
    block: Block,
    earlier: &[ChatMessage],
) -> Result<ChatMessage, ApiError> {
    let Some(id) = block.tool_use_id else {
        return Err(ApiError::invalid(
            format!("{param}.tool_use_id"),
            "Field required",
        ));
    };
    let name = earlier
        .iter()
        .rev()
        .flat_map(|m| m.tool_calls.iter())
        .find(|c| c.id == id)
        .map(|c| c.name.clone())
        .ok_or_else(|| {
            ApiError::invalid(
                format!("{param}.tool_use_id"),
                format!("no earlier tool_use block has the id '{id}'"),
            )
        })?;
    let mut text = match block.content {
        None => String::new(),
        Some(content) => content_text(&format!("{param}.content"), content)?,
    };
    if block.is_error == Some(true) {
        text = format!("Error: {text}");
    }
    Ok(ChatMessage::tool_result(id, name, text))
}

/// An assistant turn: its text blocks joined, its `tool_use` blocks as calls.
fn assistant_turn(param: &str, content: Content) -> Result<ChatMessage, ApiError> {
    let blocks = match content {
        Content::Text(text) => return Ok(ChatMessage::new("assistant", text)),
        Content::Blocks(blocks) => blocks,
    };
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    let mut thoughts: Vec<String> = Vec::new();
    for (j, block) in blocks.into_iter().enumerate() {
        let param = format!("{param}[{j}]");
        if block.kind == "tool_use" {
            calls.push(tool_call(&param, block)?);
        } else if block.kind == "thinking" {
            // An earlier answer's thoughts, sent back: the template decides what it shows (gpt-oss
            // the thoughts before a call, Qwen3 those of the current turn).
            thoughts.extend(block.thinking.filter(|t| !t.is_empty()));
        } else if block.kind != "redacted_thinking" {
            texts.push(block_text(&param, block)?);
        }
    }
    let mut message = ChatMessage::assistant_tool_calls(texts.join(BLOCK_SEPARATOR), calls);
    message.reasoning = (!thoughts.is_empty()).then(|| thoughts.join("\n"));
    Ok(message)
}

/// A `tool_use` block as a call (its `input` as JSON text).
fn tool_call(param: &str, block: Block) -> Result<ToolCall, ApiError> {
    let field = |name: &str| ApiError::invalid(format!("{param}.{name}"), "Field required");
    let id = block.id.ok_or_else(|| field("id"))?;
    let name = block.name.ok_or_else(|| field("name"))?;
    let input = block.input.ok_or_else(|| field("input"))?;
    Ok(ToolCall {
        id,
        name,
        arguments: input.to_string(),
    })
}

/// A content field as text: a string as is, text blocks joined; other block types refused by name.
fn content_text(param: &str, content: Content) -> Result<String, ApiError> {
    let blocks = match content {
        Content::Text(text) => return Ok(text),
        Content::Blocks(blocks) => blocks,
    };
    let mut texts = Vec::with_capacity(blocks.len());
    for (j, block) in blocks.into_iter().enumerate() {
        texts.push(block_text(&format!("{param}[{j}]"), block)?);
    }
    Ok(texts.join(BLOCK_SEPARATOR))
}

fn block_text(param: &str, block: Block) -> Result<String, ApiError> {
    match block.kind.as_str() {
        "text" => block
            .text
            .ok_or_else(|| ApiError::invalid(format!("{param}.text"), "Field required")),
        kind @ ("image" | "document") => Err(ApiError::invalid(
            param,
            format!("'{kind}' content is not supported: the models served here read text only"),
        )),
        "tool_use" => Err(ApiError::invalid(
            param,
            "'tool_use' blocks belong in assistant messages",
        )),
        "tool_result" => Err(ApiError::invalid(
            param,
            "'tool_result' blocks belong in user messages",
        )),
        other => Err(ApiError::invalid(
            param,
            format!("content blocks of type '{other}' are not supported; only 'text' is"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::anthropic::param_of;

    #[test]
    fn temperature_is_anthropics_zero_to_one() {
        for bad in [-0.1, 1.01, 2.0] {
            let err = sampling(Some(bad), None, None).expect_err("refused");
            assert_eq!(param_of(err).as_deref(), Some("temperature"));
        }
        assert_eq!(
            sampling(Some(0.0), None, None).map(|s| s.temperature).ok(),
            Some(0.0)
        );
        assert_eq!(
            sampling(None, None, None).map(|s| s.temperature).ok(),
            Some(1.0)
        );
        let err = sampling(None, Some(1.5), None).expect_err("top_p out of range");
        assert_eq!(param_of(err).as_deref(), Some("top_p"));
    }

    #[test]
    fn text_blocks_are_joined_and_other_blocks_named() {
        let blocks = |kinds: &[(&str, Option<&str>)]| {
            Content::Blocks(
                kinds
                    .iter()
                    .map(|(k, t)| Block {
                        kind: k.to_string(),
                        text: t.map(str::to_string),
                        ..Block::default()
                    })
                    .collect(),
            )
        };
        let text = content_text("m", blocks(&[("text", Some("a")), ("text", Some("b"))]));
        assert_eq!(text.ok().as_deref(), Some("a\nb"));
        let err = content_text(
            "messages[0].content",
            blocks(&[("text", Some("a")), ("image", None)]),
        )
        .expect_err("image refused");
        assert_eq!(param_of(err).as_deref(), Some("messages[0].content[1]"));
        let err = content_text("system", blocks(&[("text", None)])).expect_err("text needed");
        assert_eq!(param_of(err).as_deref(), Some("system[0].text"));
    }

    #[test]
    fn thinking_is_on_only_when_asked() {
        let of = |kind: &str| Thinking {
            kind: kind.into(),
            budget_tokens: Some(2048),
        };
        assert_eq!(
            thinking(Some(&of("enabled"))).expect("enabled").enable,
            Some(true)
        );
        assert_eq!(
            thinking(Some(&of("disabled"))).expect("disabled").enable,
            Some(false)
        );
        assert_eq!(thinking(None).expect("default").enable, Some(false));
        let err = thinking(Some(&of("maybe"))).expect_err("unknown type");
        assert_eq!(param_of(err).as_deref(), Some("thinking.type"));
    }

    fn messages(value: serde_json::Value) -> Vec<InputMessage> {
        serde_json::from_value(value).expect("messages")
    }

    #[test]
    fn tool_use_and_tool_result_blocks_become_calls_and_tool_messages() {
        let conv = conversation(
            Some(Content::Text("Be brief.".into())),
            messages(serde_json::json!([
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "18C"}]},
                    {"type": "text", "text": "And tomorrow?"}]},
            ])),
            &ChatGuidance::default(),
        )
        .expect("valid");
        let roles: Vec<&str> = conv.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        let call = &conv.messages[2].tool_calls[0];
        assert_eq!(
            (call.id.as_str(), call.name.as_str()),
            ("t1", "get_weather")
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&call.arguments).ok(),
            Some(serde_json::json!({"city": "Paris"}))
        );
        assert_eq!(conv.messages[2].content, "Let me look.");
        let result = &conv.messages[3];
        assert_eq!(result.tool_call_id.as_deref(), Some("t1"));
        assert_eq!(result.name.as_deref(), Some("get_weather"));
        assert_eq!(result.content, "18C");
        assert_eq!(conv.prefill, None);
    }

    #[test]
    fn a_final_assistant_text_is_the_prefill() {
        let conv = conversation(
            None,
            messages(serde_json::json!([
                {"role": "user", "content": "Capital of France?"},
                {"role": "assistant", "content": [{"type": "text", "text": "The capital"}]},
            ])),
            &ChatGuidance::default(),
        )
        .expect("valid");
        assert_eq!(conv.messages.len(), 1);
        assert_eq!(conv.prefill.as_deref(), Some("The capital"));
        let forced = ChatGuidance {
            tool_choice: ToolChoice::Required,
            ..ChatGuidance::default()
        };
        let err = conversation(
            None,
            messages(serde_json::json!([
                {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])),
            &forced,
        )
        .expect_err("prefill and a forced call");
        assert_eq!(param_of(err).as_deref(), Some("messages[1]"));
    }

    #[test]
    fn misplaced_or_unknown_tool_blocks_are_named() {
        let cases = [
            (
                serde_json::json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]),
                "messages[0].content[0].tool_use_id",
            ),
            (
                serde_json::json!([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]),
                "messages[0].content[0]",
            ),
            (
                serde_json::json!([{"role": "user", "content": "x"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "input": {}}]},
                    {"role": "user", "content": "y"}]),
                "messages[1].content[0].name",
            ),
            (
                serde_json::json!([{"role": "user", "content": "x"},
                    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]),
                "messages[1].content[0]",
            ),
        ];
        for (value, want) in cases {
            let err =
                conversation(None, messages(value), &ChatGuidance::default()).expect_err(want);
            assert_eq!(param_of(err).as_deref(), Some(want));
        }
    }
}
