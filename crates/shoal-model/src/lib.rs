//! shoal-model: model formats, tokenizer, chat templates and model families.
//!
//! - [`gguf::GgufFile`] opens a GGUF file and reads metadata and single tensors by name, so a stage
//!   reads only the tensors of its own layers.
//! - [`config::ModelConfig`] is the architecture-independent shape of a model (layers, dims, heads);
//!   [`Footprint`] is what it costs to hold (bytes per layer, embeddings, head, KV per token), for placement.
//! - [`tokenizer::Tokenizer`] and [`chat::ChatTemplate`] come from the GGUF metadata.
//! - [`arch::Arch`] names the families shoal runs (llama, mistral, qwen2, qwen3, gemma3, phi3, and the
//!   mixture-of-experts qwen2moe, qwen3moe, gpt-oss, glm4moe and deepseek2) and what sets each apart, as
//!   data; [`config::ArchParams`] is that resolved for one file. [`ffn`] is a layer's feed-forward: dense
//!   or routed experts; `mla` is deepseek2's latent attention, the other kind of layer attention.
//! - [`decoder::DecoderStage`] is one pipeline stage of any of them: layers `[start, end)`, plus the
//!   token embedding on the first stage and the final norm and output head on the last. Its `forward`
//!   takes a batch of sequence chunks (several sequences decoding one token each, or prompts being
//!   prefilled in chunks) with one [`kv::KvCache`] per sequence; `run` also returns the final-normed
//!   hidden states a chunk asks for ([`Pool`]: embeddings).
//! - [`HostMatrix`] is what stages hand each other (hidden states in, hidden states or logits out): a
//!   row-major f32 buffer the CPU path computes in, the wire encodes from and the sampler samples in place.
//! - [`linear::LinearSet`] keeps quantized weights quantized and runs them through `shoal-kernels` SIMD
//!   kernels (several matrices reading one input, e.g. Q | K | V, in one call).
//!
//! - [`block`] describes once which tensors a stage reads (names, optional parts, shapes); both
//!   loaders read it. [`gpu::GpuDecoderStage`] is the same stage on a GPU (shoal-gpu's WGSL
//!   kernels, decision 016): weights uploaded once and kept quantized, each sequence's KV on the
//!   device ([`gpu::GpuKv`]), the same `run` over the same inputs and outputs.
//!
//! - [`split`] cuts a stage's layers over tensor-parallel members (issue 31, decision 024): a
//!   [`split::Share`] of query heads, feed-forward columns and (mixture-of-experts layers) routed
//!   experts and shared-expert columns per member, placed on quantization-block and KV-group
//!   boundaries by measured weight; `DecoderStage::load_share` reads only its rows, columns and
//!   experts, and `run_split` hands each partial sum to the caller's all-reduce.
//!
//! - [`decoder::nextn::Nextn`] is a model's own multi-token-prediction block (GLM-4.5's `nextn` layer): a whole
//!   last stage loads it beside its head when asked (`DecoderStage::load_nextn`: a node drafting
//!   with it); the main pass never runs it, speculative decoding drafts with it.
//!
//! The CPU path is shoal-kernels' (the candle-op path for GPU devices was removed: decision 008).
//!
//! No tokio, no sockets: this crate is pure computation and file reading.

pub mod arch;
pub mod attention;
pub mod block;
pub mod chat;
pub mod config;
pub mod decoder;
pub mod error;
pub mod ffn;
pub mod footprint;
pub mod gguf;
pub mod gpu;
pub mod kv;
pub mod linear;
pub mod matrix;
pub(crate) mod mla;
pub mod ops;
pub mod split;
pub mod supported;
pub mod tokenizer;

pub use arch::Arch;
pub use config::{ArchParams, Experts, LayerRange, ModelConfig, Pooling};
pub use decoder::{DecoderStage, Pool, SeqChunk, StageInput, StageOutput};
pub use error::ModelError;
pub use footprint::Footprint;
pub use gguf::{stage_byte_ranges, stage_byte_ranges_at};
pub use kv::{KvBuffers, KvCache, KvSource};
pub use matrix::HostMatrix;
