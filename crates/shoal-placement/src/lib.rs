//! shoal-placement: the pure pipeline planner — topology + model card + constraints → ordered stages
//! (node, layer range), each candidate predicted and explained. No I/O, no async; every decision is a
//! function of its input, so the same input always gives the same output.
//!
//! # Main types and data flow
//! - Input: a [`Topology`] ([`NodeInfo`]s with memory, decode `speed` and compute-bound `prefill_speed`,
//!   and for this model the output head's, attention's and sampling's measured times, and a GPU's own
//!   when the node offers one, undirected [`Link`]s of a [`LinkKind`] with optional measured round trip and bandwidth — a pair with
//!   no link cannot be adjacent), a [`ModelCard`] (layers, bytes per layer, embedding/head extras, KV
//!   bytes, activation size) and [`Constraints`] (pinned nodes, manual layer counts, KV reserve, stage
//!   limit, the [`Goal`] to rank by, the prompt length of the TTFT prediction, the context decode attention
//!   is priced at).
//! - [`plan`] validates the input, then takes the manual split as given, or searches node sets and orders
//!   (`search`: exhaustive up to 6 nodes; above, greedy chains, memory-first and speed-first sets, then
//!   `refine`'s local search — polynomial; `tensor`: tensor-parallel groups), chooses layer counts for the goal (`assign`, within each
//!   node's memory from `split`), predicts each candidate (`cost`, `rates`) and ranks by the goal's figure.
//!   Output: [`Placement`]s ([`Stage`]s + [`Prediction`] + explanation), best first; the first also has a
//!   [`NodeVerdict`] per node (`verdict`: why it is in or out, by costing the placement without / with
//!   it). [`best`] is the first. [`plan_replicas`] places several copies on disjoint nodes. Failures are a
//!   [`PlacementError`] with numbers.
//!
//! # Memory
//! A stage of `n` layers on node `x` needs `n · (layer_bytes + kv_reserve_tokens · kv_bytes_per_token_per_layer)`
//! plus `embed_bytes` if it is the first stage and `head_bytes` if it is the last, and must not exceed
//! what `x` offers a stage ([`NodeInfo::stage_mem`]): `x.mem_available`, plus the whole layers its GPU
//! holds when it uses one.
//!
//! # GPUs
//! A node may offer a GPU ([`NodeInfo::gpu`], a [`GpuInfo`]: its own memory and its own measured speeds,
//! in the same units). It is used when its decode speed beats the node's CPU's, or always when the node's
//! policy names it (`always`). It holds `g = ⌊(gpu memory − embed_bytes − head_bytes) / per-layer bytes⌋`
//! layers with their KV reserve ([`NodeInfo::gpu_layers`]: room is kept for the embedding and the head,
//! which it holds when its stage is first, or last with every layer on it). A stage of `n` layers there
//! runs its first `k = min(n, g)` layers on the GPU and the rest on the CPU, and its record says so
//! ([`Stage::gpu`]); it is priced as the sum of the two parts, each at its own device's terms below, the
//! head on the GPU only when `k = n`. Layer counts treat a stage's time as its GPU layers at the GPU's
//! cost and the rest at the CPU's (convex, so filling the cheapest next layer is exact for latency).
//!
//! # Cost model (microseconds)
//! A stage of `n` layers on a node takes `t(b) = n · (max(1/speed, b/p) + b · C · attention_us)`
//! for a micro-batch of `b` tokens at a context of `C` cached tokens, where `p = max(prefill_speed, speed)`
//! (a batch is never slower than its tokens one at a time, and one token costs exactly its measured decode
//! step); `n · b/speed` for the weights when `prefill_speed` is unknown: every token a full step; the last stage adds the output head (`head_us`,
//! the head's weights streamed once, or its `2 · head_params` flops per token at the batched rate when
//! larger) and `b · sample_us`. The embedding lookup on the first stage (one row copied per token) is
//! left out: it reads a few KB. A hop costs
//! `rtt/2 + bytes/bandwidth` over the pair's cheapest link (measured values replace the kind's defaults:
//! loopback 20 µs & 10 GB/s, thunderbolt 50 µs & 2.5 GB/s, ethernet 200 µs & 120 MB/s, wifi 2 ms &
//! 20 MB/s, unknown 5 ms & 10 MB/s); a token's activations are `hidden_bytes_per_token`, a sampled id
//! 4 bytes, sent back from the last stage to the first directly or back along the pipeline.
//! - One stream: `R(1) = Σ t_i(1) + Σ hops + return hop` per token ([`Placement::predicted_token_latency_us`]).
//! - `B` streams ([`BATCH_SIZES`]): `m = min(B, stages)` micro-batches of `b = ⌈B/m⌉` in flight, a cycle is
//!   `max(R(b), m · busiest(b))` (the slowest stage or link transfer bounds it): `B / cycle` tok/s.
//! - TTFT of `P` prompt tokens: chunks of [`PREFILL_CHUNK_TOKENS`], each through the whole pipeline before
//!   the next (as the engine runs one sequence): `Σ_chunks (Σ t_i(c) + Σ hops of c tokens + return)`.
//!
//!
//! # Tensor-parallel groups (decision 024)
//! A stage may be computed by a group ([`Stage::group`], a [`TensorGroup`]): `node` is rank 0 (input in,
//! output out, sampling), each rank `r` reads `s_r = weights[r] / Σ weights` of every
//! layer's heads and feed-forward columns at once. A group of `n` layers takes
//! `t(b) = fan_out(b) + n · (max_r s_r · layer_r(b, C) + 2 · exchange(b))`, plus on a last stage the
//! head split by vocabulary (`max_r s_r · head_r(b)`, one more exchange of the `b · V · 4` bytes of
//! logits, rank 0's sampling): `layer_r` is one whole layer on rank `r`'s CPU as above (its weights' roofline and
//! attention), `exchange(b) = max over member pairs of rtt/2 + b · 2H / bandwidth` (after attention's
//! output and after the feed-forward every member sends its f32 partial — twice the card's f16 `H` — to
//! every other at once: one one-way hop, the slowest pair bounding it), `fan_out(b)` rank 0 sending the
//! stage's input to the members (token ids, 4 bytes a token, on a first stage, else `b · 2H`: f32). Each rank
//! holds `⌈s_r · n · per-layer bytes⌉`, every member the embedding on a first stage and `⌈s_r ·`
//! head bytes`⌉` on a last one. Groups are offered only when [`ModelCard::max_group`] `>= 2` (the caller's, from the model
//! file): sets of 2 to `min(max_group, `[`MAX_GROUP`]`)` GPU-less nodes that are all linked to each other,
//! weighted by measured decode speed (`speed · 1000`; holding every layer, also by speed as far as each
//! rank's memory allows, the rest shared by the others), every member tried as rank 0, holding every layer
//! or as one stage of a two-stage pipeline (`tensor`: every set of the 8 fastest, plus one grown from
//! each node above that — polynomial). They are ranked by the goal's figure like every candidate, so a
//! group is chosen only when predicted faster than any single node, pipeline or smaller group; the
//! prediction shows each group's `fan_out_us` and `reduce_us` ([`StagePrediction`]) and the explanation
//! its ranks, weights and reductions, or what the best group would have predicted when none is chosen.
//!
//! Layer counts: for latency, as many layers as memory allows on the fastest nodes (minimises `Σ t_i(1)`);
//! for throughput, stage times balanced within memory. Ranking: the goal's figure, then fewer stages, then
//! the better worst link kind, then node ids. A single node that fits is always a candidate, so the chosen
//! placement is never predicted slower than the best single node; a node whose removal would be predicted
//! faster is left out (pins and manual counts still win, with a note when a node alone is predicted faster).

mod assign;
mod compute;
mod cost;
mod error;
mod explain;
mod fmt;
mod group;
mod links;
mod model;
mod output;
mod plan;
mod rates;
mod refine;
mod replicas;
mod search;
mod split;
mod tensor;
mod verdict;

pub use cost::{CostBreakdown, Hop, predict};
pub use error::PlacementError;
pub use fmt::{fmt_bytes, fmt_tok_s, fmt_us};
pub use model::{
    Constraints, DEFAULT_GENERATED_TOKENS, DEFAULT_PROMPT_TOKENS, Goal, GpuInfo, Link, LinkKind,
    MAX_GROUP, ModelCard, NodeInfo, TOKEN_BYTES, Topology, decode_context,
};
pub use output::{
    BatchRate, GpuLayers, HopPrediction, NodeVerdict, Placement, Prediction, Stage,
    StagePrediction, TensorGroup, stages_from_counts,
};
pub use plan::{MAX_CANDIDATES, best, plan};
pub use rates::{BATCH_SIZES, PREFILL_CHUNK_TOKENS, forecast, forecast_at};
pub use replicas::{group_tok_s, plan_replicas};
pub use search::{EXHAUSTIVE_NODES, EXHAUSTIVE_ORDER_NODES};
pub use shoal_ids::{IdError, InstanceId, ModelId, NodeId};
pub use split::{largest_remainder, split_layers};
