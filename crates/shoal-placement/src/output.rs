//! Output types of the planner: [`Placement`]s of [`Stage`]s, each with its [`Prediction`] (one stream's
//! rate, aggregate rates at several batch sizes, time to first token, per-stage and per-hop times) and,
//! on the chosen one, a [`NodeVerdict`] per node saying why it is in or out.

use serde::{Deserialize, Serialize};
use shoal_ids::NodeId;

use crate::model::{Goal, LinkKind};

/// One pipeline stage: `node` runs layers `start..end` (end exclusive), the first of them on one of
/// its GPUs when `gpu` says so.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Stage {
    pub node: NodeId,
    pub start: usize,
    pub end: usize,
    /// The stage's first layers on a GPU of its node, the rest on its CPU; `None` (and records from
    /// nodes that predate it): all on the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuLayers>,
    /// A tensor-parallel group reads every layer of this stage at once: `node` is its rank 0 (where
    /// the stage's input arrives and its output leaves), the group's other members and each rank's
    /// weight are here. `None` (and records from nodes that predate groups): `node` alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<TensorGroup>,
}

/// The members of a tensor-parallel stage besides its rank 0, and how the layers are shared.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TensorGroup {
    /// Ranks 1.. of the group, in rank order (rank 0 is the stage's `node`).
    pub members: Vec<NodeId>,
    /// One weight per rank, rank 0 first: each rank's share of every layer's heads, feed-forward
    /// columns and experts is as near to `weights[r] / Σ weights` as the quantization blocks allow
    /// (`shoal_model::split::shares`). Only ratios matter (the planner uses measured read speeds).
    pub weights: Vec<u32>,
}

/// Where a stage's GPU layers run: the first `layers` of the stage on GPU `index` of its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuLayers {
    pub index: usize,
    pub layers: usize,
}

impl Stage {
    /// A stage of layers `start..end` on `node`, all on its CPU.
    pub fn cpu(node: NodeId, start: usize, end: usize) -> Self {
        Self {
            node,
            start,
            end,
            gpu: None,
            group: None,
        }
    }

    /// Every node that computes this stage: its `node` (rank 0), then its group's other members.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeId> {
        std::iter::once(&self.node).chain(self.group.iter().flat_map(|g| g.members.iter()))
    }

    pub fn layers(&self) -> usize {
        self.end - self.start
    }

    /// Layers of this stage on its node's GPU (0: all on the CPU).
    pub fn gpu_layers(&self) -> usize {
        self.gpu.map_or(0, |g| g.layers.min(self.layers()))
    }
}

/// A candidate placement with its predicted cost and a human-readable explanation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Placement {
    pub stages: Vec<Stage>,
    /// One stream's predicted time per generated token, microseconds.
    pub predicted_token_latency_us: f64,
    pub explanation: String,
    /// Every predicted figure of this placement.
    #[serde(default)]
    pub prediction: Prediction,
    /// Why each node of the topology is in or out: on the first (chosen) placement of a plan, empty on the
    /// others.
    #[serde(default)]
    pub nodes: Vec<NodeVerdict>,
}

/// What the cost model predicts for one placement.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Prediction {
    /// The goal the placement was ranked for.
    pub goal: Goal,
    /// One stream's decode rate, tokens per second (`1e6 / token_latency_us`).
    pub decode_tok_s: f64,
    /// One stream's time per token: every stage, every forward hop, the token's way back.
    pub token_latency_us: f64,
    /// Aggregate decode rate with `batch` concurrent streams, one entry per predicted batch size.
    pub aggregate: Vec<BatchRate>,
    /// The prompt length `ttft_us` is for.
    pub prompt_tokens: usize,
    /// Time to first token of a lone request with a prompt of `prompt_tokens`.
    pub ttft_us: f64,
    pub stages: Vec<StagePrediction>,
    /// Forward hops, in stage order (empty for one stage).
    pub hops: Vec<HopPrediction>,
    /// The sampled token's way back from the last stage to the first (0 for one stage).
    pub return_us: f64,
    /// The context (tokens in the KV cache) one stream's decode figures price attention at.
    #[serde(default)]
    pub context_tokens: usize,
    /// What one more token of context adds to one stream's time per token, microseconds (attention on
    /// every stage): the figures at another context `c` are `token_latency_us + (c − context_tokens) ·
    /// this`. 0 when the nodes did not measure attention.
    #[serde(default)]
    pub attention_us_per_token_of_context: f64,
}

impl Prediction {
    /// The figure the goal ranks by, tokens per second: one stream's rate for latency, the largest
    /// batch's aggregate rate for throughput.
    pub fn goal_tok_s(&self) -> f64 {
        match self.goal {
            Goal::Latency => self.decode_tok_s,
            Goal::Throughput => self.aggregate.last().map_or(0.0, |r| r.tok_s),
        }
    }

    /// The predicted aggregate rate with `batch` concurrent streams, when that batch size was predicted.
    pub fn tok_s_at(&self, batch: usize) -> Option<f64> {
        self.aggregate
            .iter()
            .find(|r| r.batch == batch)
            .map(|r| r.tok_s)
    }
}

/// Aggregate decode rate with `batch` concurrent streams.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchRate {
    pub batch: usize,
    /// Micro-batches in flight (`min(batch, stages)`, as the engine splits its running streams).
    pub micro_batches: usize,
    pub tok_s: f64,
    /// What limits the rate: `round trip` (latency-bound), `stage <node>` or `link <a>→<b>`.
    pub bound: String,
}

/// One stage's predicted compute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StagePrediction {
    pub node: NodeId,
    pub layers: usize,
    /// One token of one stream, microseconds.
    pub token_us: f64,
    /// The whole prompt (all its chunks), microseconds.
    pub prompt_us: f64,
    /// The part of `token_us` that is attention over the priced context.
    #[serde(default)]
    pub attention_us: f64,
    /// The part of `token_us` that is the output head and sampling (0 except on the last stage).
    #[serde(default)]
    pub head_us: f64,
    /// A tensor-parallel stage: the part of `token_us` that is rank 0 sending the stage's input to
    /// the other members (0 for one node).
    #[serde(default)]
    pub fan_out_us: f64,
    /// A tensor-parallel stage: the part of `token_us` that is its reductions, two a layer, each one
    /// exchange of every member's partial sum (0 for one node).
    #[serde(default)]
    pub reduce_us: f64,
}

/// One forward hop's predicted cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HopPrediction {
    pub from: NodeId,
    pub to: NodeId,
    pub kind: LinkKind,
    /// One token's activations: `rtt/2 + hidden_bytes / bandwidth`, microseconds.
    pub token_us: f64,
    /// The prompt's activations (every chunk pays `rtt/2`), microseconds.
    pub prompt_us: f64,
}

/// Why a node is in or out of a placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeVerdict {
    pub node: NodeId,
    /// Whether the node runs a stage.
    pub used: bool,
    /// Human-readable reason, e.g. `left out: adding it predicts 41 tok/s vs 52 without`.
    pub reason: String,
}

/// Turns per-stage layer counts into contiguous stages starting at layer 0.
pub fn stages_from_counts(nodes: &[&NodeId], counts: &[usize]) -> Vec<Stage> {
    let mut start = 0;
    nodes
        .iter()
        .zip(counts)
        .map(|(node, &n)| {
            let stage = Stage::cpu((*node).clone(), start, start + n);
            start += n;
            stage
        })
        .collect()
}
