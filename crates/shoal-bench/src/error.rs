//! What can go wrong in a benchmark run, with a stable `error_type()` label.

use shoal_engine::EngineError;

/// Errors of `shoal bench` (and of the [`crate::sse`] client `shoal chat --url` uses).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A list flag (`--threads`, `--streams`, `--concurrency`) that is not comma-separated counts.
    #[error("{flag}: {error}")]
    BadList {
        flag: &'static str,
        error: std::num::ParseIntError,
    },
    #[error("--extra")]
    ExtraNotJson(#[source] serde_json::Error),
    #[error("--extra must be a JSON object")]
    ExtraNotObject,
    #[error(
        "--long-prompt needs -n of at least {min} (the long prompt arrives after {after} tokens)"
    )]
    TooFewTokensForLongPrompt { min: usize, after: usize },
    /// Loading the model or submitting a request to the in-process engine.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The engine ended a benchmark request with an error.
    #[error("benchmark request failed: {0}")]
    RequestFailed(EngineError),
    #[error("connecting to {url}")]
    Connect {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with an error status; `body` is its error body.
    #[error("{status}: {body}")]
    Status {
        status: reqwest::StatusCode,
        body: String,
    },
    /// Building the HTTP client, or reading a response body.
    #[error(transparent)]
    Http(#[from] reqwest::Error),
    #[error("bad SSE chunk")]
    BadChunk(#[source] serde_json::Error),
    /// An `error` object in the stream.
    #[error("server error: {0}")]
    Server(serde_json::Value),
    #[error("the streams never reached their 16th token")]
    StreamsStalled(#[source] tokio::time::error::Elapsed),
    #[error(
        "{count} requests streamed another number of tokens than asked (or than their usage says)"
    )]
    ShortRequests { count: usize },
    #[error("{count} streams streamed another number of tokens than asked")]
    ShortStreams { count: usize },
    /// Starting the async runtime.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Writing the JSON report.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

impl BenchError {
    /// A short, stable label (for logs and scripts).
    pub fn error_type(&self) -> &'static str {
        match self {
            BenchError::BadList { .. } => "bad_list",
            BenchError::ExtraNotJson(_) | BenchError::ExtraNotObject => "bad_extra",
            BenchError::TooFewTokensForLongPrompt { .. } => "too_few_tokens",
            BenchError::Engine(_) => "engine",
            BenchError::RequestFailed(_) => "request_failed",
            BenchError::Connect { .. } => "connect",
            BenchError::Status { .. } => "status",
            BenchError::Http(_) => "http",
            BenchError::BadChunk(_) => "bad_chunk",
            BenchError::Server(_) => "server",
            BenchError::StreamsStalled(_) => "streams_stalled",
            BenchError::ShortRequests { .. } | BenchError::ShortStreams { .. } => "short",
            BenchError::Io(_) => "io",
            BenchError::Json(_) => "json",
        }
    }
}
