//! The flags of `shoal bench` (all but the model's, which the binary owns and resolves).

use crate::device::{DeviceChoice, parse_device};
use crate::error::BenchError;

/// What to measure and how often; the binary flattens these into `shoal bench` after its model flags.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Thread counts to measure, e.g. "1,2".
    #[arg(long, default_value = "1")]
    pub threads: String,
    /// Prompt tokens for the prefill test.
    #[arg(short = 'p', long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Tokens generated for the decode test.
    #[arg(short = 'n', long, default_value_t = 128)]
    pub gen_tokens: usize,
    /// Repetitions per thread count (the median is reported).
    #[arg(short = 'r', long, default_value_t = 3)]
    pub repetitions: usize,
    /// Where the engine's layers run in the in-process benchmarks: `cpu`, `gpu` (the first GPU), `gpu:N`
    /// (as `shoal doctor` numbers them) or `auto` (the GPU measured faster than the CPU on the model's main
    /// weight type, else the CPU), as `shoal serve`.
    #[arg(long, env = "SHOAL_DEVICE", default_value = "cpu", value_parser = parse_device)]
    pub device: DeviceChoice,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Instead: second-turn TTFT with the prefix cache vs without (turn 1 = `-p` tokens; turn 2 = turn 1,
    /// its 8-token answer and 16 new tokens).
    #[arg(long)]
    pub second_turn: bool,
    /// Instead: aggregate decode tok/s of N concurrent greedy sequences (`-p` random prompt tokens,
    /// `-n` generated each), e.g. "1,4,16", like llama.cpp's batched-bench.
    #[arg(long)]
    pub streams: Option<String>,
    /// Instead: the serving benchmark against a running OpenAI-compatible server at this URL (shoal,
    /// llama-server, vLLM): bursts of concurrent streaming completions of `-n` tokens, `-r` times.
    #[arg(long)]
    pub url: Option<String>,
    /// Concurrency levels of `--url`, e.g. "1,4,16,64".
    #[arg(long, default_value = "1,4,16,64")]
    pub concurrency: String,
    /// With `--url`: a JSON object merged into every request body, e.g. '{"cache_prompt":false}'.
    #[arg(long)]
    pub extra: Option<String>,
    /// With `--url`: index of the first prompt (default: from the clock), so runs against one server
    /// never repeat a prompt its prefix cache would serve.
    #[arg(long)]
    pub prompt_offset: Option<usize>,
    /// With `--url`, instead of the bursts: 4 streams of `-n` tokens, alone and then with a prompt of
    /// this many words (max 4 tokens) arriving once every stream has 16 tokens; their inter-token
    /// latency both ways, and the long prompt's time to first token (1870 words ≈ 2000 tokens).
    #[arg(long)]
    pub long_prompt: Option<usize>,
    /// Instead: the machine's memory read bandwidth (GB/s) for each `--threads` count, best of `-r`
    /// passes over 1 GiB — the denominator of the decode roofline.
    #[arg(long)]
    pub memory_bandwidth: bool,
}

/// A comma-separated list of counts (`--threads`, `--streams`, `--concurrency`).
pub(crate) fn parse_list(s: &str, flag: &'static str) -> Result<Vec<usize>, BenchError> {
    s.split(',')
        .map(|t| t.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|error| BenchError::BadList { flag, error })
}
