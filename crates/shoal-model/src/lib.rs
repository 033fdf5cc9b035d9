//! shoal-model: model formats, tokenizer, chat templates and model families.
//!
//! - [`gguf::GgufFile`] opens a GGUF file and reads metadata and single tensors by name, so a stage
//!   reads only the tensors of its own layers.
//! - [`config::ModelConfig`] is the architecture-independent shape of a model (layers, dims, heads);
//!   [`Footprint`] is what it costs to hold (bytes per layer, embeddings, head, KV per token), for placement.
//! - [`tokenizer::Tokenizer`] and [`chat::ChatTemplate`] come from the GGUF metadata.
//! - [`llama::LlamaStage`] is one pipeline stage of a Llama-family model: layers `[start, end)`, plus the
//!   token embedding on the first stage and the final norm and output head on the last. Its `forward`
//!   takes a batch of sequence chunks (several sequences decoding one token each, or prompts being
//!   prefilled in chunks) with one [`kv::KvCache`] per sequence.
//! - [`HostMatrix`] is what stages hand each other (hidden states in, hidden states or logits out): a
//!   row-major f32 buffer the CPU path computes in, the wire encodes from and the sampler samples in place.
//! - [`linear::QLinear`] keeps quantized weights quantized and runs them through `shoal-kernels` SIMD
//!   kernels on CPU (candle's `QMatMul` on GPU devices).
//!
//! No tokio, no sockets: this crate is pure computation and file reading.

pub mod attention;
pub mod chat;
pub mod config;
pub mod error;
pub mod footprint;
pub mod gguf;
pub mod kv;
pub mod linear;
pub mod llama;
pub mod matrix;
pub mod ops;
pub mod tokenizer;

pub use config::{LayerRange, ModelConfig};
pub use error::ModelError;
pub use footprint::Footprint;
pub use kv::KvCache;
pub use llama::{LlamaStage, SeqChunk, StageInput};
pub use matrix::HostMatrix;
