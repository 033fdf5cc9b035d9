//! shoal-engine: sequences, KV cache, sampler, scheduler and the stage seam.
//!
//! Main types: [`Engines`] (the node's models by id — what every API adapter calls), [`EngineHandle`]
//! (one model instance: its info, tokenizer, chat template and the bounded queue to its engine thread),
//! [`GenerateRequest`] (the validated request an adapter builds) and [`RequestStream`] (its
//! [`Event`]s); inside, the engine thread's `Worker` with its `KvAccount` (KV memory against the node's
//! [`kvpool::KvPool`]), the pure step planner ([`scheduler`]), the prefix cache index ([`prefix`]) and
//! the pipeline [`stage::Stage`]s it drives, local or on other nodes.
//!
//! Data flow: an adapter builds a [`GenerateRequest`] and calls [`Engines::submit`], which finds the
//! model's [`EngineHandle`]; the handle tokenizes the prompt, checks it against the model (vocabulary,
//! context length), creates the request's event channel and only then queues it for the engine
//! thread ([`engine::spawn`]). The engine thread owns the stages and all KV caches; every step it
//! admits waiting requests within the KV budget, decodes one token for each running sequence
//! (batched) and prefills waiting prompts in chunks, samples, detokenizes (stop sequences, UTF-8
//! boundaries) and sends [`Event`]s back; [`EngineStats`] counts what happened. Beside the events, each
//! landed prompt chunk updates the request's [`Prefill`] progress ([`RequestStream::prefill`]). A
//! request submitted through [`Engines`] survives its stage's death ([`resume`]): its stream continues
//! on the model's next engine with its prompt and generated tokens as a token prompt.
//!
//! [`Engines::embed`] ([`embed`]) runs each input of an [`EmbedRequest`] as a prompt-only sequence whose
//! chunks ask the last stage for pooled final hidden states instead of logits, and answers one
//! normalized vector per input ([`Embeddings`]). [`EngineHandle::warm_up`] ([`warmup`]) runs one short
//! internal request through every stage before an instance reports ready, so its first real request is
//! as fast as the rest. A request's [`LogitsProcessor`] says which tokens may
//! come next ([`TokenMask`]); the mask travels with the step to whichever stage samples.
//!
//! [`meters`]: the engine's metrics (TTFT, inter-token and end-to-end latency histograms, prompt /
//! generated / cached tokens, preemptions, prefix cache hits and evictions, step time, the node's KV
//! pool), recorded through the `metrics` facade on the engine thread with handles registered once.

mod admission;
pub mod batch;
mod config;
pub mod draft;
pub mod draft_model;
pub mod embed;
pub mod engine;
pub mod error;
pub mod gpu_stage;
pub mod group;
pub mod handle;
pub mod hybrid;
mod kv_account;
pub mod kvpool;
pub mod limits;
pub mod logits;
pub mod meters;
pub mod mtp_draft;
pub mod prefix;
pub mod registry;
pub mod request;
pub mod resume;
pub mod sampler;
pub mod scheduler;
pub mod seqkv;
mod sequence;
pub mod stage;
mod stats;
pub mod stop;
pub mod verify;
pub mod warmup;
mod worker;

pub use error::EngineError;
pub use handle::{ChatMessage, EngineHandle, ModelInfo, RequestStream, Thinking};
pub use logits::{ConstraintError, LogitsProcessor, TokenMask};
pub use registry::Engines;
pub use request::{
    EmbedRequest, Embeddings, Event, FinishReason, GenerateRequest, Prefill, Prompt,
    SamplingParams, Speculation, TopLogprob, Usage,
};
pub use stats::EngineStats;
