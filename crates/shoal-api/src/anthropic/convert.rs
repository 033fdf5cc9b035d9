//! From an Anthropic request to what the engine takes: the prompt text (system and messages rendered
//! through the model's own chat template) and the checked generation parameters ([`Prepared`]).
//!
//! Each rule names the field it is about, so every refusal is a 400 naming it: `max_tokens` is required,
//! `temperature` is Anthropic's 0..1, stop sequences and the token budget follow the OpenAI routes' rules
//! ([`crate::openai::params`]), and what shoal does not offer (`thinking`, images and documents in
//! a text-only model, tools and `output_config.format` until they are wired, `mcp_servers`,
//! `container`) is refused by name, never ignored. Hints that change nothing about the answer here
//! (`metadata`, `service_tier`, `output_config.effort`, top-level `cache_control`: shoal caches prompt
//! prefixes by itself) are accepted.
//!
//! A conversation that ends with an assistant message is a prefill, as on Anthropic's API: the messages
//! before it are rendered with the template's generation prompt and the assistant's text is appended,
//! so the answer continues it.

use std::num::NonZeroU32;

use shoal_engine::{ChatMessage, Engines, SamplingParams};

use super::types::{
    Block, Content, CountTokensRequest, InputMessage, MessagesRequest, Role, Thinking,
};
use crate::error::ApiError;
use crate::openai::params::{resolve_model, stop_sequences, token_budget};

/// How the text blocks of one content list are joined (Anthropic sends separate blocks for separate
/// pieces of a turn, such as a reminder and the user's words).
const BLOCK_SEPARATOR: &str = "\n";

/// A checked messages request.
#[derive(Debug)]
pub struct Prepared {
    /// A model the engine serves.
    pub model: String,
    /// The rendered conversation, ready to submit with `add_bos`.
    pub prompt: String,
    pub sampling: SamplingParams,
    pub max_tokens: NonZeroU32,
    pub stop: Vec<String>,
    pub stream: bool,
}

/// Checks a `POST /v1/messages` body and renders its prompt.
pub fn prepare(engine: &Engines, req: MessagesRequest) -> Result<Prepared, ApiError> {
    refuse_unsupported(
        req.thinking.as_ref(),
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
    )?;
    if req.mcp_servers.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid(
            "mcp_servers",
            "MCP servers are not supported by this server",
        ));
    }
    if req.output_config.and_then(|c| c.format).is_some() {
        return Err(ApiError::invalid(
            "output_config.format",
            "structured output formats are not supported by this server yet",
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
    let stop = stop_sequences("stop_sequences", req.stop_sequences.unwrap_or_default())?;
    let model = resolve_model(engine, Some(req.model))?;
    let prompt = render(engine, &model, req.system, req.messages)?;
    Ok(Prepared {
        model,
        prompt,
        sampling,
        max_tokens,
        stop,
        stream: req.stream.unwrap_or(false),
    })
}

/// Checks a `POST /v1/messages/count_tokens` body; returns the model and the rendered prompt.
pub fn prepare_count(
    engine: &Engines,
    req: CountTokensRequest,
) -> Result<(String, String), ApiError> {
    refuse_unsupported(
        req.thinking.as_ref(),
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
    )?;
    let model = resolve_model(engine, Some(req.model))?;
    let prompt = render(engine, &model, req.system, req.messages)?;
    Ok((model, prompt))
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

/// Parameters shoal does not implement yet, refused by name.
fn refuse_unsupported(
    thinking: Option<&Thinking>,
    tools: Option<&[serde_json::Value]>,
    tool_choice: Option<&serde_json::Value>,
) -> Result<(), ApiError> {
    if let Some(t) = thinking
        && t.kind != "disabled"
    {
        return Err(ApiError::invalid(
            "thinking",
            format!(
                "extended thinking ('{}') is not supported by this server; omit `thinking` or set it to {{\"type\": \"disabled\"}}",
                t.kind
            ),
        ));
    }
    if tools.is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::invalid(
            "tools",
            "tools are not supported by this server yet",
        ));
    }
    if let Some(choice) = tool_choice {
        let kind = choice.get("type").and_then(|k| k.as_str()).unwrap_or("");
        if !matches!(kind, "auto" | "none") {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool_choice other than 'auto' or 'none' needs tools, which this server does not support yet",
            ));
        }
    }
    Ok(())
}

/// The conversation as prompt text: the system prompt and messages through the model's chat template;
/// a final assistant message is a prefill the answer continues.
fn render(
    engine: &Engines,
    model: &str,
    system: Option<Content>,
    messages: Vec<InputMessage>,
) -> Result<String, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "at least one message is required",
        ));
    }
    let mut chat = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = system {
        let text = content_text("system", system)?;
        if !text.is_empty() {
            chat.push(ChatMessage::new("system", text));
        }
    }
    let mut prefill = None;
    let last = messages.len() - 1;
    for (i, message) in messages.into_iter().enumerate() {
        let text = content_text(&format!("messages[{i}].content"), message.content)?;
        if i == last && message.role == Role::Assistant {
            prefill = Some(text);
        } else {
            chat.push(ChatMessage::new(message.role.template_name(), text));
        }
    }
    let mut prompt = engine
        .render_chat(model, &chat)
        .map_err(|e| ApiError::from_engine(e, "messages"))?;
    if let Some(prefill) = prefill {
        prompt.push_str(&prefill);
    }
    Ok(prompt)
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
        kind @ ("tool_use" | "tool_result") => Err(ApiError::invalid(
            param,
            format!("'{kind}' content needs tools, which this server does not support yet"),
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

    fn param_of(err: ApiError) -> Option<String> {
        match err {
            ApiError::InvalidRequest { param, .. } => param,
            _ => None,
        }
    }

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
    fn thinking_and_tools_are_refused_by_name() {
        let enabled = Thinking {
            kind: "enabled".into(),
        };
        let err = refuse_unsupported(Some(&enabled), None, None).expect_err("thinking");
        assert_eq!(param_of(err).as_deref(), Some("thinking"));
        let disabled = Thinking {
            kind: "disabled".into(),
        };
        assert!(refuse_unsupported(Some(&disabled), Some(&[]), None).is_ok());
        let tool = serde_json::json!({"name": "f", "input_schema": {"type": "object"}});
        let err = refuse_unsupported(None, Some(&[tool]), None).expect_err("tools");
        assert_eq!(param_of(err).as_deref(), Some("tools"));
        let any = serde_json::json!({"type": "any"});
        let err = refuse_unsupported(None, None, Some(&any)).expect_err("tool_choice");
        assert_eq!(param_of(err).as_deref(), Some("tool_choice"));
        let auto = serde_json::json!({"type": "auto"});
        assert!(refuse_unsupported(None, None, Some(&auto)).is_ok());
    }
}
