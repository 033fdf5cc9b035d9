//! Command-line arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use shoal_bench::{DeviceChoice, parse_device};
use shoal_engine::Speculation;
use shoal_engine::engine::{EngineConfig, default_threads};
use shoal_model::LayerRange;

#[derive(Parser)]
#[command(
    name = "shoal",
    version,
    about = "Pool your machines into one AI cluster"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Which log lines to write: a level or per-module levels, e.g. `info,shoal_cluster=debug`
    /// [default: RUST_LOG, else SHOAL_LOG, else info].
    #[arg(long, global = true, value_name = "FILTER")]
    pub log: Option<String>,
    /// Log lines as text or as one JSON object per line.
    #[arg(long, global = true, value_enum, default_value_t = crate::logs::LogFormat::Text)]
    pub log_format: crate::logs::LogFormat,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve a model over the OpenAI-compatible HTTP API.
    Serve(Box<ServeArgs>),
    /// Stream an answer to a prompt in the terminal.
    Chat(ChatArgs),
    /// Measure prefill and decode speed, TTFT and inter-token latency.
    Bench(BenchCommand),
    /// Download a model into the models directory (catalog id, hub `org/repo:QUANT`, or a path).
    Pull(PullArgs),
    /// List every model in the models directory: id, size, source, complete or partial.
    Models(ModelsArgs),
    /// Delete a model from the models directory.
    Rm(RmArgs),
    /// Print a token another machine joins this node's cluster with (`shoal serve --join TOKEN`).
    Invite(InviteArgs),
    /// Take a node out of the cluster for good: every member refuses it from then on.
    Remove(RemoveArgs),
    /// Check this node and its links: each peer's reachability, round trips, loss, bandwidth each way,
    /// path MTU and clock; this machine's CPU, memory and models. Exit status 1 when something is wrong.
    Doctor(DoctorArgs),
}

/// `shoal doctor`.
#[derive(Args, Clone)]
pub struct DoctorArgs {
    /// The running node to ask for fresh link measurements.
    #[arg(long, default_value = "http://127.0.0.1:52415")]
    pub url: String,
    /// API key of that node, when it needs one.
    #[arg(long, env = "SHOAL_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Print the report as JSON (for scripts).
    #[arg(long)]
    pub json: bool,
    /// Where models are stored [default: ~/.cache/shoal/models].
    #[arg(long, env = "SHOAL_MODELS_DIR")]
    pub models_dir: Option<PathBuf>,
    /// Hash every model file and compare it with the sha256 recorded when it was downloaded.
    #[arg(long)]
    pub verify: bool,
    /// Pings per peer [default: 50].
    #[arg(long)]
    pub pings: Option<usize>,
    /// How long each bandwidth transfer runs, in milliseconds [default: 2000].
    #[arg(long)]
    pub transfer_ms: Option<u64>,
}

#[derive(Args, Clone)]
pub struct ModelArgs {
    /// Model: a catalog id, a hub id (`org/repo:Q4_K_M`, `org/repo/file.gguf`, `org/repo@rev:Q8_0`),
    /// or a path to a .gguf file.
    #[arg(long, default_value = shoal_store::DEFAULT_MODEL)]
    pub model: String,
    /// Where models are stored [default: ~/.cache/shoal/models].
    #[arg(long, env = "SHOAL_MODELS_DIR")]
    pub models_dir: Option<PathBuf>,
    /// Use only complete local files (also HF_HUB_OFFLINE=1); never download.
    #[arg(long)]
    pub offline: bool,
}

/// `shoal pull [MODEL]`: the model as a positional argument or `--model`.
#[derive(Args, Clone)]
pub struct PullArgs {
    /// Model: a catalog id, a hub id (`org/repo:QUANT`, `org/repo/file.gguf`) or a path; overrides `--model`.
    #[arg(value_name = "MODEL")]
    pub id: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// `shoal models`.
#[derive(Args, Clone)]
pub struct ModelsArgs {
    /// Where models are stored [default: ~/.cache/shoal/models].
    #[arg(long, env = "SHOAL_MODELS_DIR")]
    pub models_dir: Option<PathBuf>,
}

/// `shoal rm MODEL`.
#[derive(Args, Clone)]
pub struct RmArgs {
    /// The model's id, as `shoal models` shows it.
    #[arg(value_name = "MODEL")]
    pub id: String,
    /// Where models are stored [default: ~/.cache/shoal/models].
    #[arg(long, env = "SHOAL_MODELS_DIR")]
    pub models_dir: Option<PathBuf>,
    /// Also delete a hub model's file from the Hugging Face cache (shared with other tools).
    #[arg(long)]
    pub purge: bool,
}

impl PullArgs {
    /// The model arguments with the positional id applied.
    pub fn resolved(&self) -> ModelArgs {
        let mut m = self.model.clone();
        if let Some(id) = &self.id {
            m.model = id.clone();
        }
        m
    }
}

/// `--models-dir`, else `~/.cache/shoal/models`.
pub fn models_dir_or_default(dir: &Option<PathBuf>) -> PathBuf {
    dir.clone().unwrap_or_else(|| {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."));
        home.join(".cache/shoal/models")
    })
}

impl ModelArgs {
    pub fn models_dir(&self) -> PathBuf {
        models_dir_or_default(&self.models_dir)
    }
}

#[derive(Args, Clone)]
pub struct EngineArgs {
    /// Compute threads [default: the performance cores where the CPU has efficiency cores too, else
    /// all cores].
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Tokens per engine step (decodes plus prefill chunks).
    #[arg(long, default_value_t = 256)]
    pub max_batch_tokens: usize,
    /// Prefill tokens per step while other sequences decode (smaller: smoother streams, slower TTFT of
    /// long prompts that arrive meanwhile).
    #[arg(long, default_value_t = 16)]
    pub prefill_chunk_while_decoding: usize,
    /// While streams decode, take only as many tokens of a long prompt (over 256 left) per step as keep a
    /// step within this many times a decode-only step (measured); 0 = always the full chunk.
    #[arg(long, default_value_t = 2.0)]
    pub itl_slack: f64,
    /// Sequences generating at once.
    #[arg(long, default_value_t = 64)]
    pub max_running: usize,
    /// Requests of a model that may wait for a free sequence slot; past them a request is refused at
    /// once (503 with Retry-After; Anthropic's 529). The engine's wait list holds this many and its
    /// intake as many again, so at most twice this many wait.
    #[arg(long, default_value_t = 256)]
    pub queue_depth: usize,
    /// KV-cache memory for all sequences and cached prefixes of every model on this node, in MiB.
    #[arg(long, default_value_t = 2048)]
    pub kv_budget_mib: usize,
    /// Tokens of finished conversations kept for prefix reuse (0 disables the prefix cache).
    #[arg(long, default_value_t = 8192)]
    pub prefix_cache_tokens: usize,
    /// Split the model into local pipeline stages, e.g. "0-10,10-20,20-30".
    #[arg(long)]
    pub stages: Option<String>,
    /// Where the layers this node drives run: `cpu`, `gpu` (the first GPU), `gpu:N` (as `shoal doctor`
    /// numbers them), or `auto` (the GPU whose measured decode rate for the model's main weight type
    /// beats the CPU's, else the CPU; the log says why).
    /// In a cluster the node publishes this choice and the planner puts each stage's first layers
    /// on that GPU (as many as fit; under `auto` only when measured faster), the node's own and those
    /// it hosts for other nodes' pipelines.
    #[arg(long, env = "SHOAL_DEVICE", default_value = "cpu", value_parser = parse_device)]
    pub device: DeviceChoice,
    /// Speculative decoding for requests that do not ask: `ngram` (prompt lookup: drafts continue the
    /// latest earlier occurrence of the last tokens, verified in one pass; greedy output unchanged,
    /// sampled output the same distribution), `draft` (needs `--draft-model`), `mtp` (the model's own
    /// multi-token-prediction block: GLM-4.5-style files; other models then draft nothing) or `off`.
    /// A request's `speculative` field overrides it.
    #[arg(long, default_value = "off")]
    pub speculative: String,
    /// The most tokens one speculative pass drafts (1–32); the engine adapts below it.
    #[arg(long, default_value_t = 8)]
    pub max_draft: u64,
}

impl EngineArgs {
    pub fn config(&self) -> anyhow::Result<EngineConfig> {
        let stages = match &self.stages {
            None => None,
            Some(spec) => Some(parse_stages(spec)?),
        };
        Ok(EngineConfig {
            threads: self.threads.unwrap_or_else(default_compute_threads).max(1),
            max_batch_tokens: self.max_batch_tokens.max(1),
            max_running: self.max_running.max(1),
            queue_depth: self.queue_depth.max(1),
            max_prefill_while_decoding: self.prefill_chunk_while_decoding.max(1),
            itl_slack: (self.itl_slack > 0.0).then_some(self.itl_slack),
            stages,
            kv_budget_bytes: self.kv_budget_mib.max(1) << 20,
            prefix_cache_tokens: self.prefix_cache_tokens,
            device: self.device.resolve_here(),
            speculative: Speculation::parse(&self.speculative, Some(self.max_draft))
                .map_err(|e| anyhow::anyhow!("--speculative / --max-draft: {e}"))?,
            ..EngineConfig::default()
        })
    }
}

/// Compute threads without `--threads`: [`compute_threads`] of this machine's core kinds and of
/// the CPUs this process may run on.
fn default_compute_threads() -> usize {
    compute_threads(shoal_cluster::facts::core_kinds(), default_threads())
}

/// The performance cores where the OS tells core kinds apart (Apple Silicon, hybrid Intel, ARM
/// big.LITTLE), as llama.cpp counts only those on Apple Silicon: an efficiency core adds little to a
/// bandwidth-bound step and holds up the parts it takes; else every core. Never more than `allowed`,
/// the CPUs this process may run on (`available_parallelism`: its affinity mask and cgroup quota,
/// which the machine-wide core kinds do not see — a container given 4 CPUs of a 16-thread hybrid
/// host computes on 4).
fn compute_threads(kinds: Option<shoal_cluster::facts::CoreKinds>, allowed: usize) -> usize {
    match kinds {
        Some(k) if k.efficiency > 0 && k.performance > 0 => k.performance.min(allowed),
        _ => allowed,
    }
}

fn parse_stages(spec: &str) -> anyhow::Result<Vec<LayerRange>> {
    spec.split(',')
        .map(|part| {
            let (a, b) = part
                .trim()
                .split_once('-')
                .ok_or_else(|| anyhow::anyhow!("stage '{part}' is not START-END"))?;
            let (start, end): (usize, usize) = (a.trim().parse()?, b.trim().parse()?);
            anyhow::ensure!(start < end, "stage '{part}' is empty");
            Ok(LayerRange { start, end })
        })
        .collect()
}

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// A small model (a GGUF file, or a model id in the store) that drafts for `--speculative draft`
    /// and for requests asking `"speculative": {"method": "draft"}`, on the instances this node drives
    /// whose model has the same token list (e.g. SmolLM2-135M for SmolLM2-1.7B).
    #[arg(long)]
    pub draft_model: Option<String>,
    /// The seed of every sampled request that names none (as llama-server's `--seed`): the same
    /// request then gives the same answer, on the instances this node drives. Unset: a random seed per
    /// request.
    #[arg(long, env = "SHOAL_SEED")]
    pub seed: Option<u64>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub api_host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 52415)]
    pub api_port: u16,
    /// Require this API key on every route but /health (`Authorization: Bearer KEY` or `x-api-key: KEY`);
    /// repeatable; env SHOAL_API_KEY (comma-separated).
    #[arg(
        long = "api-key",
        env = "SHOAL_API_KEY",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub api_keys: Vec<String>,
    /// Read API keys from this file, one per line (lines starting with # are ignored).
    #[arg(long)]
    pub api_key_file: Option<PathBuf>,
    /// Also let web pages of this origin use the API (besides the node's own pages, pages on this
    /// machine and desktop apps), e.g. `https://chat.example.com`, `http://host:*` (any port) or `*`
    /// (any page); repeatable; env SHOAL_ORIGINS (comma-separated).
    #[arg(
        long = "cors-origin",
        env = "SHOAL_ORIGINS",
        value_delimiter = ',',
        value_name = "ORIGIN"
    )]
    pub cors_origins: Vec<String>,
    /// How long a connection may take to send a request's headers, in milliseconds (also between
    /// requests of a kept-alive connection).
    #[arg(long, hide = true, env = "SHOAL_HEADER_TIMEOUT_MS")]
    pub header_timeout_ms: Option<u64>,
    /// Connections served at once [default: from the open-files limit].
    #[arg(long, hide = true, env = "SHOAL_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Publish the compute figures in this JSON file (the shape of `/state`'s `nodes[].compute`)
    /// instead of measuring them at start: figures measured once on a quiet machine, or a node
    /// declared slower than it is.
    #[arg(long, value_name = "FILE")]
    pub compute: Option<PathBuf>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

#[derive(Args, Clone)]
pub struct ClusterArgs {
    /// Where this node keeps its identity key (a restarted node is the same node)
    /// [default: ~/.local/share/shoal].
    #[arg(long, env = "SHOAL_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Shared secret of the cluster: nodes with another key never join (default: this node's own random
    /// key in the state dir, so nodes join only through `shoal invite` / `--join` or a key given to each).
    #[arg(long, env = "SHOAL_CLUSTER_KEY", hide_env_values = true)]
    pub cluster_key: Option<String>,
    /// Read the cluster key from this file instead.
    #[arg(long, conflicts_with = "cluster_key")]
    pub cluster_key_file: Option<PathBuf>,
    /// Join the cluster of a token printed by `shoal invite` (a member gives this node the cluster key).
    #[arg(long, value_name = "TOKEN", conflicts_with_all = ["cluster_key", "cluster_key_file"])]
    pub join: Option<String>,
    /// Cluster (libp2p) listen address: HOST:PORT or a multiaddr; port 0 picks a free one.
    #[arg(long, default_value = "0.0.0.0:52416")]
    pub cluster_listen: String,
    /// A node to join at HOST:PORT (or a multiaddr), for networks without multicast; repeatable.
    #[arg(long = "peer")]
    pub peers: Vec<String>,
    /// Do not discover peers with mDNS.
    #[arg(long)]
    pub no_mdns: bool,
    /// The machine this node runs on, as the planner counts machines (default: a hash of this
    /// kernel's boot id). Nodes that name the same machine share its cores and memory bus in the
    /// planner's pricing of tensor-parallel groups; the network lab's benchmarks give each of its
    /// namespaces its own name to stand in for separate machines.
    #[arg(long, env = "SHOAL_MACHINE", value_name = "NAME")]
    pub machine: Option<String>,
    /// Do not place the served model on this node at start (create instances through POST /instance).
    #[arg(long)]
    pub no_auto_instance: bool,
    /// Send models to peers at most this fast, in MB/s (all peers together; default: no limit).
    #[arg(long, value_name = "MB_PER_S", value_parser = positive_rate)]
    pub upload_limit: Option<f64>,
    /// Activations on the wire: f16 (half the bytes) or f32 (bit-exact with a single node).
    #[arg(long, default_value = "f16", value_parser = ["f16", "f32"])]
    pub wire_dtype: String,
    /// TCP port for the data plane's direct connections between pipeline stages (default: the
    /// cluster port + 1, or a free one when the cluster port is 0; 0 picks a free one).
    #[arg(long, value_name = "PORT")]
    pub data_port: Option<u16>,
    /// Send activations through the cluster connection only (no direct data-plane connections; for
    /// networks where only the cluster port is open).
    #[arg(long)]
    pub no_lanes: bool,
}

/// A rate in MB/s: finite and > 0.
fn positive_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(format!("'{s}' is not a rate above 0 MB/s"))
    }
}

impl ServeArgs {
    /// The API keys from `--api-key` and `--api-key-file` (empty: the API is open).
    pub fn api_keys(&self) -> anyhow::Result<Vec<String>> {
        let mut keys: Vec<String> = self.api_keys.clone();
        if let Some(path) = &self.api_key_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("reading the API key file {}: {e}", path.display()))?;
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(String::from),
            );
            anyhow::ensure!(
                !keys.is_empty(),
                "the API key file {} holds no key",
                path.display()
            );
        }
        Ok(keys)
    }
}

impl ClusterArgs {
    pub fn state_dir(&self) -> PathBuf {
        state_dir_or_default(&self.state_dir)
    }

    /// The key given with `--cluster-key` / `--cluster-key-file`, else this node's own (`--join` is
    /// handled by `membership::cluster_key_and_peers`).
    pub fn cluster_key(&self) -> anyhow::Result<String> {
        Ok(match (&self.cluster_key, &self.cluster_key_file) {
            (Some(k), _) if !k.is_empty() => k.clone(),
            (Some(_), _) => anyhow::bail!("--cluster-key must not be empty"),
            (None, Some(path)) => shoal_cluster::identity::read_key_file(path)?,
            (None, None) => shoal_cluster::identity::load_or_create_cluster_key(&self.state_dir())?,
        })
    }
}

#[derive(Args)]
pub struct ChatArgs {
    /// The prompt (a single user message).
    pub prompt: String,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Ask a running server instead of loading the model here, e.g. http://127.0.0.1:52415.
    #[arg(long)]
    pub url: Option<String>,
    #[arg(long, default_value_t = 512)]
    pub max_tokens: u32,
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    #[arg(long)]
    pub seed: Option<u64>,
    /// System prompt.
    #[arg(long)]
    pub system: Option<String>,
}

/// `--state-dir`, else `~/.local/share/shoal`.
pub fn state_dir_or_default(given: &Option<PathBuf>) -> PathBuf {
    given.clone().unwrap_or_else(|| {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."));
        home.join(".local/share/shoal")
    })
}

/// `shoal invite`: an invite in this node's book, printed as a token.
#[derive(Args)]
pub struct InviteArgs {
    /// The state directory of the node that invites (as its `shoal serve` uses it)
    /// [default: ~/.local/share/shoal].
    #[arg(long, env = "SHOAL_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// How many machines may join with the token.
    #[arg(long, default_value_t = 1)]
    pub uses: u32,
    /// Any number of machines may join with the token (until it expires).
    #[arg(long, conflicts_with = "uses")]
    pub reusable: bool,
    /// How long the token is valid: e.g. 30m, 24h, 7d, or `never`.
    #[arg(long, default_value = "24h")]
    pub ttl: String,
    /// This node's API as the joining machine reaches it (http://HOST:PORT); repeatable [default: this
    /// machine's non-loopback IPv4 addresses with --api-port].
    #[arg(long = "url")]
    pub urls: Vec<String>,
    /// The port this node's `shoal serve` listens on for HTTP.
    #[arg(long, default_value_t = shoal_api::DEFAULT_PORT)]
    pub api_port: u16,
}

/// `shoal remove NODE`.
#[derive(Args)]
pub struct RemoveArgs {
    /// The node: its id (or the last 6+ characters of it) or its name, as `GET /state` shows them.
    pub node: String,
    /// A running member's API.
    #[arg(long, default_value = "http://127.0.0.1:52415")]
    pub url: String,
    /// API key of that node, when it needs one.
    #[arg(long, env = "SHOAL_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// `shoal bench`: the model to measure (or to name in requests to `--url`), then what to measure.
#[derive(Args)]
pub struct BenchCommand {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub bench: shoal_bench::BenchArgs,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_specs_parse_and_reject_garbage() {
        assert_eq!(
            parse_stages("0-10, 10-30").unwrap(),
            vec![
                LayerRange { start: 0, end: 10 },
                LayerRange { start: 10, end: 30 }
            ]
        );
        assert!(parse_stages("0-0").is_err());
        assert!(parse_stages("3").is_err());
        assert!(parse_stages("a-b").is_err());
    }

    #[test]
    fn compute_threads_are_the_performance_cores_within_what_the_process_may_use() {
        use shoal_cluster::facts::CoreKinds;
        let hybrid = |performance, efficiency| {
            Some(CoreKinds {
                performance,
                efficiency,
            })
        };
        // An M2 Pro (8 performance, 4 efficiency cores), the whole machine available.
        assert_eq!(compute_threads(hybrid(8, 4), 12), 8);
        // A hybrid Intel of 16 performance and 8 efficiency CPUs in a container of 4 CPUs.
        assert_eq!(compute_threads(hybrid(16, 8), 4), 4);
        // No efficiency cores, or kinds unknown: every CPU the process may use.
        assert_eq!(compute_threads(hybrid(8, 0), 8), 8);
        assert_eq!(compute_threads(None, 6), 6);
    }
}
