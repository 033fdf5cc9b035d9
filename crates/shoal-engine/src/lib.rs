//! shoal-engine: sequences, KV cache, sampler, scheduler and the stage seam.
//!
//! Data flow: an API adapter builds a validated [`GenerateRequest`] and calls [`EngineHandle::submit`],
//! which tokenizes it, checks it against the context length, creates the request's event channel and
//! only then queues it for the engine thread. The engine thread owns the model stages and all KV caches;
//! every step it decodes one token for each running sequence (batched) and prefills waiting prompts in
//! chunks, samples, detokenizes (stop sequences, UTF-8 boundaries) and sends [`Event`]s back.

pub mod engine;
pub mod error;
pub mod handle;
pub mod kvpool;
pub mod prefix;
pub mod registry;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub mod stage;
pub mod stop;
mod worker;

pub use error::EngineError;
pub use handle::{ChatMessage, EngineHandle, EngineStats, ModelInfo, RequestStream};
pub use registry::Engines;
pub use request::{Event, FinishReason, GenerateRequest, Prompt, SamplingParams, Usage};
