//! Errors of model loading and execution.

/// Errors from reading a model file or running it.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read model file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid GGUF file {path}: {message}")]
    InvalidGguf { path: String, message: String },
    #[error("metadata key '{key}' is missing or has the wrong type")]
    MissingKey { key: String },
    #[error("tensor '{name}' is missing from the model file")]
    MissingTensor { name: String },
    #[error("tensor '{name}' has type {dtype}, which shoal cannot run (it runs {supported})", supported = crate::supported::TENSOR_TYPES)]
    UnsupportedTensorType { name: String, dtype: String },
    #[error("tensor '{name}' has shape {got:?}, expected {expected:?}")]
    BadShape {
        name: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error(
        "unsupported architecture '{0}' (shoal runs: {supported})",
        supported = crate::supported::ARCHITECTURES.join(", ")
    )]
    UnsupportedArchitecture(String),
    #[error("unsupported model feature: {0}")]
    Unsupported(String),
    #[error("invalid layer range [{start}, {end}) for a model with {n_layers} layers")]
    BadLayerRange {
        start: usize,
        end: usize,
        n_layers: usize,
    },
    #[error("stage input mismatch: {0}")]
    BadInput(String),
    #[error("sequence would exceed the context length ({needed} > {context_length})")]
    ContextFull {
        needed: usize,
        context_length: usize,
    },
    /// The GPU refused or failed (no adapter, a tensor or KV cache above its binding limit, a
    /// weight format without a kernel, a device error).
    #[error("GPU: {0}")]
    Gpu(#[from] shoal_gpu::GpuError),
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
}

pub type Result<T> = std::result::Result<T, ModelError>;
