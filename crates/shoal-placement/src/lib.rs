//! shoal-placement: the pure pipeline planner — topology + model card + constraints → ordered stages
//! (node, layer range), each candidate explained and costed. No I/O, no async; every decision is a
//! function of its input, so the same input always gives the same output.
//!
//! # Main types and data flow
//! - Input: a [`Topology`] ([`NodeInfo`]s with memory and relative speed, undirected [`Link`]s of a
//!   [`LinkKind`] with optional measured round trip and bandwidth — a pair with no link cannot be adjacent),
//!   a [`ModelCard`] (layers, bytes per layer, embedding/head extras, KV bytes, activation size) and
//!   [`Constraints`] (pinned nodes, manual layer counts, KV reserve, stage limit).
//! - [`plan`] validates the input, then either takes the manual split as given, or searches node sets and
//!   orders (`search`: exhaustive up to 6 nodes, greedy above), splits layers over each order by memory
//!   (`split`: largest remainder, ≥ 1 layer per stage, repair pass so every node fits), and predicts the
//!   per-token latency of each (`cost`). Output: [`Placement`]s ([`Stage`]s + predicted latency +
//!   explanation), best first; [`best`] is the first. Failures are a [`PlacementError`] with numbers.
//!
//! # Memory
//! A stage of `n` layers on node `x` needs `n · (layer_bytes + kv_reserve_tokens · kv_bytes_per_token_per_layer)`
//! plus `embed_bytes` if it is the first stage and `head_bytes` if it is the last, and must not exceed
//! `x.mem_available`.
//!
//! # Cost model (per generated token, microseconds)
//! `Σ stages layers / speed · 10⁶` (compute; `speed` is in layer-steps per second)
//! `+ Σ adjacent pairs (rtt/2 + hidden_bytes_per_token / bandwidth)` (activations forward)
//! `+ the sampled token's trip from the last stage back to the first` (4 bytes; direct link if any,
//! otherwise back along the pipeline). Unmeasured links use their kind's defaults (rtt, bandwidth):
//! loopback 20 µs & 10 GB/s, thunderbolt 50 µs & 2.5 GB/s, ethernet 200 µs & 120 MB/s, wifi 2 ms &
//! 20 MB/s, unknown 5 ms & 10 MB/s; measured values replace the defaults. The faster link kinds are
//! therefore preferred through their costs; ties go to fewer stages, then the better worst link kind,
//! then node ids. A single node that fits pays no network cost, so it wins unless a pipeline of faster
//! nodes beats it.

mod cost;
mod error;
mod explain;
mod model;
mod plan;
mod search;
mod split;

pub use cost::{CostBreakdown, Hop, TOKEN_BYTES, predict};
pub use error::PlacementError;
pub use explain::{fmt_bytes, fmt_us};
pub use model::{
    Constraints, Link, LinkKind, ModelCard, NodeInfo, Placement, Stage, Topology,
    stages_from_counts,
};
pub use plan::{MAX_CANDIDATES, best, plan};
pub use search::{EXHAUSTIVE_NODES, EXHAUSTIVE_ORDER_NODES};
pub use split::{largest_remainder, split_layers};
