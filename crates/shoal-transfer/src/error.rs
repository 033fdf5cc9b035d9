//! [`TransferError`]: what can go wrong fetching or serving a model's bytes, and [`SourceError`]: why one
//! source failed one read (the fetcher drops that source and goes on with the others).

use std::ops::Range;
use std::path::PathBuf;

/// Why a fetch, a manifest or the blob server failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("manifest of {file}: {message}")]
    BadManifest { file: String, message: String },
    #[error(
        "{file}: {missing_bytes} bytes could not be fetched (bytes {}); no source left: {reasons}",
        missing.iter().map(|r| format!("{}-{}", r.start, r.end)).collect::<Vec<_>>().join(", ")
    )]
    NoSourceLeft {
        file: String,
        missing_bytes: u64,
        missing: Vec<Range<u64>>,
        reasons: String,
    },
    #[error("{file}: the whole-file sha256 is {got}, the manifest says {expected}")]
    WholeHashMismatch {
        file: String,
        got: String,
        expected: String,
    },
    #[error("reading the GGUF header: {0}")]
    Model(#[from] shoal_model::ModelError),
    #[error("the fetch was cancelled (verified chunks are kept for a resume)")]
    Cancelled,
    #[error("accepting blob streams: {0}")]
    Accept(String),
    #[error("a background task failed: {0}")]
    Task(String),
    /// The model store (a reference that does not parse, the internet route, disk space) failed.
    #[error("{0}")]
    Store(String),
}

impl TransferError {
    /// A stable label for metrics and logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::Io { .. } => "io",
            Self::BadManifest { .. } => "bad_manifest",
            Self::NoSourceLeft { .. } => "no_source_left",
            Self::WholeHashMismatch { .. } => "whole_hash_mismatch",
            Self::Model(_) => "model",
            Self::Cancelled => "cancelled",
            Self::Accept(_) => "accept",
            Self::Task(_) => "task",
            Self::Store(_) => "store",
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}

/// Why one read from one source failed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("stream i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("opening a blob stream to {peer}: {message}")]
    Open { peer: String, message: String },
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("the peer answered {kind}: {message}")]
    Remote { kind: String, message: String },
    #[error("HTTP: {0}")]
    Http(String),
    #[error("HTTP status {status} for a ranged GET")]
    Status { status: u16 },
    #[error("the server ignored the Range header (status 200 for bytes {start}..{end})")]
    RangeIgnored { start: u64, end: u64 },
    #[error("asked for {asked} bytes at {offset}, got {got}")]
    Short { offset: u64, asked: u64, got: u64 },
    #[error("the source is closed")]
    Closed,
}

impl SourceError {
    /// A stable label for metrics and logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::Io(_) => "io",
            Self::Open { .. } => "open",
            Self::Protocol(_) => "protocol",
            Self::Remote { .. } => "remote",
            Self::Http(_) => "http",
            Self::Status { .. } => "status",
            Self::RangeIgnored { .. } => "range_ignored",
            Self::Short { .. } => "short",
            Self::Closed => "closed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_ranges_read_as_byte_ranges() {
        let e = TransferError::NoSourceLeft {
            file: "m.gguf".into(),
            missing_bytes: 12,
            missing: vec![0..4, 8..16],
            reasons: "peer a: connection reset".into(),
        };
        assert_eq!(
            e.to_string(),
            "m.gguf: 12 bytes could not be fetched (bytes 0-4, 8-16); no source left: peer a: connection reset"
        );
    }
}
