//! [`GuideError`]: what can go wrong building a constraint, each naming the request field at fault
//! ([`GuideError::param`]) so an API answers 400 about the right one.

/// A constraint that cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum GuideError {
    /// `response_format`'s schema is no valid or supported JSON schema.
    #[error("invalid JSON schema in response_format: {message}")]
    Schema { message: String },
    /// A tool's `parameters` are no valid or supported JSON schema.
    #[error("invalid parameters schema for tool '{name}': {message}")]
    ToolSchema { name: String, message: String },
    /// A tool definition is unusable (no name, a duplicate, a malformed entry).
    #[error("invalid tool definition: {message}")]
    Tool { message: String },
    /// `tool_choice` names a function that is not among the `tools`.
    #[error("tool_choice names function '{name}', which is not among the tools")]
    UnknownTool { name: String },
    /// `tool_choice` asks for a call but there are no tools.
    #[error("tool_choice '{choice}' needs at least one tool in tools")]
    NoTools { choice: String },
    /// The model's vocabulary cannot be turned into llguidance's token tables.
    #[error("cannot prepare constrained decoding for this model: {message}")]
    Vocabulary { message: String },
    /// A grammar shoal built itself failed to compile (a bug, not the client's fault).
    #[error("internal grammar error: {message}")]
    Internal { message: String },
}

impl GuideError {
    /// The request field the error is about (OpenAI's names), or `None` for the server's own fault.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            GuideError::Schema { .. } => Some("response_format"),
            GuideError::ToolSchema { .. } | GuideError::Tool { .. } => Some("tools"),
            GuideError::UnknownTool { .. } | GuideError::NoTools { .. } => Some("tool_choice"),
            GuideError::Vocabulary { .. } | GuideError::Internal { .. } => None,
        }
    }

    /// Whether the client is at fault (answer 400) rather than the server (500).
    pub fn is_client_error(&self) -> bool {
        self.param().is_some()
    }
}
