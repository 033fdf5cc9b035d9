//! Engine errors, with a stable `error_type()` label for metrics and HTTP mapping.

/// Errors the engine reports to callers.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    #[error("model '{model}' not found")]
    ModelNotFound { model: String },
    #[error("invalid value for '{param}': {message}")]
    InvalidParam {
        param: &'static str,
        message: String,
    },
    #[error(
        "the prompt has {prompt_tokens} tokens but the model's context length is {context_length} tokens"
    )]
    PromptTooLong {
        prompt_tokens: usize,
        context_length: usize,
    },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("chat template failed: {0}")]
    Template(String),
    /// A base model (its GGUF has no `tokenizer.chat_template`): it serves completions only.
    #[error(
        "model '{model}' has no chat template (it is a base model): send a raw prompt to /v1/completions instead"
    )]
    NoChatTemplate { model: String },
    #[error("the request timed out after {after_ms} ms")]
    Timeout { after_ms: u64 },
    #[error("the engine is overloaded, retry later")]
    Overloaded,
    #[error("the engine has stopped")]
    Stopped,
    /// A pipeline stage on another node went away (node died, link cut, stage failed).
    #[error("a pipeline stage was lost: {0}")]
    StageLost(String),
    /// The device a stage was asked to run on is missing or refused (no GPU adapter, a
    /// sequence's KV above the adapter's binding limit, a weight format without a GPU kernel).
    #[error("device: {0}")]
    Device(String),
    #[error("internal engine error: {0}")]
    Internal(String),
}

impl EngineError {
    /// A short, stable label (for metrics and logs).
    pub fn error_type(&self) -> &'static str {
        match self {
            EngineError::ModelNotFound { .. } => "model_not_found",
            EngineError::InvalidParam { .. } => "invalid_param",
            EngineError::PromptTooLong { .. } => "prompt_too_long",
            EngineError::EmptyPrompt => "empty_prompt",
            EngineError::Template(_) => "template",
            EngineError::NoChatTemplate { .. } => "no_chat_template",
            EngineError::Timeout { .. } => "timeout",
            EngineError::Overloaded => "overloaded",
            EngineError::Stopped => "stopped",
            EngineError::StageLost(_) => "stage_lost",
            EngineError::Device(_) => "device",
            EngineError::Internal(_) => "internal",
        }
    }

    /// True when the caller's input caused the error (HTTP 4xx rather than 5xx).
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            EngineError::ModelNotFound { .. }
                | EngineError::InvalidParam { .. }
                | EngineError::PromptTooLong { .. }
                | EngineError::EmptyPrompt
                | EngineError::Template(_)
                | EngineError::NoChatTemplate { .. }
        )
    }
}
