//! `POST /v1/chat/completions`.
//!
//! Messages are flattened to text, rendered with the model's own chat template
//! ([`shoal_engine::EngineHandle::render_chat`]) and submitted as a text prompt without an extra BOS
//! (the template writes it when the model wants one).

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::response::{IntoResponse, Response};
use shoal_engine::{ChatMessage, FinishReason, GenerateRequest, Prompt, Usage};

use super::params::CommonParams;
use super::types::{
    AssistantMessage, ChatChoice, ChatChunk, ChatChunkChoice, ChatCompletion, ChatLogprobs,
    ChatMessageIn, ChatRequest, Delta, MessageContent, TokenLogprob,
};
use super::{SYSTEM_FINGERPRINT, collect, unix_now};
use crate::ApiState;
use crate::error::ApiError;
use crate::sse::{ChunkFormat, sse_response, to_json};

/// The request field a prompt problem is reported against.
const PROMPT_PARAM: &str = "messages";

pub async fn chat_completions(
    State(state): State<ApiState>,
    body: Result<Json<ChatRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(mut req) = body?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages must contain at least one message",
        ));
    }
    let logprobs = wants_logprobs(&req)?;
    let params = CommonParams::from(&mut req).validate(&state.engine)?;
    let messages = req
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| to_chat_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let prompt = state
        .engine
        .render_chat(&params.model, &messages)
        .map_err(|e| ApiError::from_engine(e, PROMPT_PARAM))?;
    let request = GenerateRequest {
        model: params.model.clone(),
        prompt: Prompt::Text(prompt),
        sampling: params.sampling,
        max_tokens: params.max_tokens,
        stop: params.stop,
        // render_chat cut the template's own BOS where the tokenizer adds one.
        add_bos: true,
        ignore_eos: params.ignore_eos,
        timeout: params.timeout,
        logits_processor: None,
    };
    let stream = state
        .engine
        .submit(request)
        .map_err(|e| ApiError::from_engine(e, PROMPT_PARAM))?;
    let mut stream = state.track(stream);
    let id = format!("chatcmpl-{}", stream.id());
    let created = unix_now();
    if params.stream {
        let format = ChatChunks {
            id,
            created,
            model: params.model,
            logprobs,
            pending: Vec::new(),
        };
        return Ok(sse_response(stream, format, params.include_usage));
    }
    let done = collect(&mut stream, logprobs).await?;
    let logprobs = logprobs.then(|| ChatLogprobs {
        content: done
            .tokens
            .into_iter()
            .map(|(text, logprob)| token_logprob(text, logprob))
            .collect(),
    });
    let body = ChatCompletion {
        id,
        object: "chat.completion",
        created,
        model: params.model,
        system_fingerprint: SYSTEM_FINGERPRINT,
        choices: vec![ChatChoice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content: done.text,
            },
            logprobs,
            finish_reason: done.finish_reason.as_str(),
        }],
        usage: done.usage.into(),
    };
    Ok(Json(body).into_response())
}

/// `logprobs: true` returns each sampled token's log-probability; alternatives are not computed.
fn wants_logprobs(req: &ChatRequest) -> Result<bool, ApiError> {
    match req.top_logprobs {
        Some(k) if k < 0 => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs must be >= 0",
            ));
        }
        Some(k) if k > 0 => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs is not supported; logprobs=true returns the sampled tokens' log-probabilities",
            ));
        }
        _ => {}
    }
    Ok(req.logprobs.unwrap_or(false))
}

/// One message as the chat template sees it: text parts concatenated, other part types refused.
fn to_chat_message(index: usize, message: ChatMessageIn) -> Result<ChatMessage, ApiError> {
    let content = match message.content {
        None => String::new(),
        Some(MessageContent::Text(text)) => text,
        Some(MessageContent::Parts(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.into_iter().enumerate() {
                let param = format!("messages[{index}].content[{j}]");
                if part.kind != "text" {
                    return Err(ApiError::invalid(
                        param,
                        format!(
                            "content parts of type '{}' are not supported; only 'text' is",
                            part.kind
                        ),
                    ));
                }
                let Some(part_text) = part.text else {
                    return Err(ApiError::invalid(
                        format!("{param}.text"),
                        "a text part needs a 'text' field",
                    ));
                };
                text.push_str(&part_text);
            }
            text
        }
    };
    Ok(ChatMessage::new(message.role.template_name(), content))
}

fn token_logprob(text: String, logprob: f32) -> TokenLogprob {
    let bytes = text.as_bytes().to_vec();
    TokenLogprob {
        token: text,
        logprob,
        bytes,
        top_logprobs: Vec::new(),
    }
}

/// Shapes `chat.completion.chunk`s.
struct ChatChunks {
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    /// Log-probabilities of tokens whose text has not been sent yet (empty pieces).
    pending: Vec<TokenLogprob>,
}

impl ChatChunks {
    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> String {
        to_json(&ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: SYSTEM_FINGERPRINT,
            choices,
            usage: usage.map(Into::into),
        })
    }

    fn take_logprobs(&mut self) -> Option<ChatLogprobs> {
        if self.pending.is_empty() {
            return None;
        }
        Some(ChatLogprobs {
            content: std::mem::take(&mut self.pending),
        })
    }
}

impl ChunkFormat for ChatChunks {
    fn opening(&mut self) -> Option<String> {
        let delta = Delta {
            role: Some("assistant"),
            content: Some(String::new()),
        };
        let choice = ChatChunkChoice {
            index: 0,
            delta,
            logprobs: None,
            finish_reason: None,
        };
        Some(self.chunk(vec![choice], None))
    }

    fn token(&mut self, text: &str, logprob: f32) -> Option<String> {
        if self.logprobs {
            self.pending.push(token_logprob(text.to_string(), logprob));
        }
        if text.is_empty() {
            return None;
        }
        let delta = Delta {
            role: None,
            content: Some(text.to_string()),
        };
        let choice = ChatChunkChoice {
            index: 0,
            delta,
            logprobs: self.take_logprobs(),
            finish_reason: None,
        };
        Some(self.chunk(vec![choice], None))
    }

    fn finish(&mut self, reason: FinishReason) -> String {
        let choice = ChatChunkChoice {
            index: 0,
            delta: Delta::default(),
            logprobs: self.take_logprobs(),
            finish_reason: Some(reason.as_str()),
        };
        self.chunk(vec![choice], None)
    }

    fn usage(&mut self, usage: Usage) -> String {
        self.chunk(Vec::new(), Some(usage))
    }
}
