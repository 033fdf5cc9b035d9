//! shoal-bench: the `shoal bench` command — how fast the engine and a serving stack are, in the style of
//! llama.cpp's `llama-bench` and vLLM's `benchmark_serving`, medians over repetitions.
//!
//! Main types and data flow:
//! - [`BenchArgs`]: the command's flags; the binary embeds them in `shoal bench` next to its model flags,
//!   resolves the model and calls one of the two runners.
//! - [`run_in_process`] (`engine_bench`): loads the model into engines here and measures one greedy
//!   sequence (prefill and decode tok/s, TTFT, inter-token latency), the second turn's TTFT with and
//!   without the prefix cache (`--second-turn`), or N concurrent sequences (`--streams`).
//! - [`run_serving`] (`serving`, `long_prompt`): `--url` — bursts of C concurrent streaming completions
//!   against any OpenAI-compatible server, or 4 streams with a long prompt arriving mid-way.
//! - [`run_memory_bandwidth`] (`membw`): `--memory-bandwidth` — the machine's read bandwidth per thread
//!   count, the denominator of the decode roofline.
//! - [`DeviceChoice`] (`device`): `--device cpu|gpu|gpu:N|auto`, shared with `shoal serve` and `chat`;
//!   the in-process benchmarks run their engines there; `auto` by measured [`Rates`].
//! - Shared parts: `prompts` (distinct prompts no prefix cache helps), `client` (one timed streaming
//!   completion), [`sse`] (the JSON POST and server-sent-events reader `shoal chat --url` uses too),
//!   `stats` (median, percentile), [`BenchError`].
//!
//! Flags → a runner → timed requests (an engine's token stream, or HTTP SSE) → arrival instants →
//! `stats` → a table, or JSON with `--json`, on stdout.

mod args;
mod client;
mod device;
mod engine_bench;
mod error;
mod long_prompt;
mod membw;
mod prompts;
mod serving;
pub mod sse;
mod stats;

pub use args::BenchArgs;
pub use device::{DeviceChoice, Rates, parse_device};
pub use engine_bench::run as run_in_process;
pub use error::BenchError;
pub use membw::run as run_memory_bandwidth;
pub use serving::run as run_serving;
