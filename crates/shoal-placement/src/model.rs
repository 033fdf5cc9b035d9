//! Input types of the planner: what the cluster looks like ([`Topology`] of [`NodeInfo`]s and [`Link`]s),
//! what the model needs ([`ModelCard`]) and what the operator asked for ([`Constraints`], [`Goal`]).
//! The placements that come out are in `output`.

use serde::{Deserialize, Serialize};
use shoal_ids::{ModelId, NodeId};

/// Size of a sampled token id on the wire.
pub const TOKEN_BYTES: u64 = 4;
/// Prompt length the time to first token is predicted for when the constraints name none.
pub const DEFAULT_PROMPT_TOKENS: usize = 512;
/// Tokens a request is assumed to generate when pricing attention: a decode step reads the prompt plus
/// half of them on average.
pub const DEFAULT_GENERATED_TOKENS: usize = 256;

/// The context a decode step's attention is priced at for a prompt of `prompt_tokens`: the prompt plus
/// half of [`DEFAULT_GENERATED_TOKENS`] (the average position of a generated token).
pub fn decode_context(prompt_tokens: usize) -> usize {
    prompt_tokens.saturating_add(DEFAULT_GENERATED_TOKENS / 2)
}

/// One machine that can host a pipeline stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: NodeId,
    /// Bytes of memory the node offers for weights and KV cache.
    pub mem_available: u64,
    /// Relative compute speed in **layer-steps per second**: how many single-layer forward passes for one
    /// decode token the node runs per second. A stage of `n` layers costs `n / speed` seconds per token.
    /// Must be finite and > 0.
    pub speed: f64,
    /// Compute-bound rate in **layer-tokens per second**: how many tokens one layer processes per second
    /// when many are batched (prompt processing, large decode batches). A stage of `n` layers takes
    /// `max(n / speed, b · n / prefill_speed)` seconds for a batch of `b` tokens. `None`: not measured
    /// (batches are then assumed to cost as much per token as one).
    #[serde(default)]
    pub prefill_speed: Option<f64>,
    /// Microseconds the output head (final norm + the vocabulary matrix) takes for one token on this node,
    /// streaming its weights at the node's measured rate for the head's type. `None`: the head is priced as
    /// `head_bytes / layer_bytes` layers at `speed`.
    #[serde(default)]
    pub head_us: Option<f64>,
    /// Microseconds one token's attention takes per layer per cached position (the context it reads).
    /// `None`: not measured, attention not priced.
    #[serde(default)]
    pub attention_us: Option<f64>,
    /// Microseconds the last stage takes to sample one token from the vocabulary's logits. `None`: not
    /// measured, sampling not priced.
    #[serde(default)]
    pub sample_us: Option<f64>,
    /// The GPU this node offers for its stages' first layers, when its device policy offers one
    /// (nodes that predate it, and CPU-only nodes: `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuInfo>,
    /// The machine the node runs on, when known: nodes on the same one share its cores and memory
    /// bus, so a tensor-parallel group's members on one machine are priced as sharing it (`None`:
    /// its own machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
}

/// A node's GPU as the planner sees it: a device with its own memory and its own measured speeds,
/// in the units of [`NodeInfo`]'s. A stage on the node puts its first layers here — as many as
/// [`NodeInfo::gpu_layers`] says — and the rest on the CPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The GPU's index on its node (its position in the node's published GPUs).
    pub index: usize,
    /// Bytes of device memory it offers for layers' weights and their KV cache.
    pub mem_available: u64,
    /// Decode layer-steps per second of the model's layers on this GPU (as [`NodeInfo::speed`]).
    pub speed: f64,
    /// Batched layer-tokens per second (as [`NodeInfo::prefill_speed`]).
    #[serde(default)]
    pub prefill_speed: Option<f64>,
    /// The output head for one token on this GPU, microseconds (as [`NodeInfo::head_us`]).
    #[serde(default)]
    pub head_us: Option<f64>,
    /// One token's attention per layer and cached position, microseconds (as
    /// [`NodeInfo::attention_us`]).
    #[serde(default)]
    pub attention_us: Option<f64>,
    /// Used whatever it measured (the node's policy names this GPU: `--device gpu[:N]`); otherwise
    /// only when its decode speed beats the CPU's (`--device auto`).
    #[serde(default)]
    pub always: bool,
}

impl NodeInfo {
    /// The GPU this node's stages use for the model of `card`: offered, and faster than the CPU
    /// (or named by the node's policy).
    pub fn used_gpu(&self) -> Option<&GpuInfo> {
        self.gpu
            .as_ref()
            .filter(|g| g.always || (g.speed.is_finite() && g.speed > self.speed))
    }

    /// Layers of the model of `card` a stage on this node puts on its GPU at most: as many as the
    /// GPU's memory holds with their KV reserve of `kv_tokens` tokens each, after keeping room for
    /// the embedding and the head (which the GPU holds when the stage is first, or last with every
    /// layer on it); 0 when no GPU is used. A stage of `n` layers runs `min(n, this)` of them there.
    pub fn gpu_layers(&self, card: &ModelCard, kv_tokens: usize) -> usize {
        let Some(g) = self.used_gpu() else {
            return 0;
        };
        let extras = card.embed_bytes.saturating_add(card.head_bytes);
        let usable = g.mem_available.saturating_sub(extras);
        let per_layer = card.per_layer_bytes(kv_tokens);
        usable.checked_div(per_layer).map_or(card.n_layers, |c| {
            usize::try_from(c).unwrap_or(usize::MAX).min(card.n_layers)
        })
    }

    /// Memory a stage of the model of `card` has on this node: the host's, plus the whole layers its
    /// GPU holds ([`NodeInfo::gpu_layers`]; the embedding and the head are counted on the host).
    pub fn stage_mem(&self, card: &ModelCard, kv_tokens: usize) -> u64 {
        let gpu = (self.gpu_layers(card, kv_tokens) as u64)
            .saturating_mul(card.per_layer_bytes(kv_tokens));
        self.mem_available.saturating_add(gpu)
    }

    /// The node as its GPU alone: the GPU's memory and speeds, sampling on the host (whether or not
    /// the planner would use it: a stage record may say it runs there).
    pub(crate) fn gpu_node(&self) -> Option<NodeInfo> {
        let g = self.gpu.as_ref()?;
        Some(NodeInfo {
            id: self.id.clone(),
            mem_available: g.mem_available,
            speed: g.speed,
            prefill_speed: g.prefill_speed,
            head_us: g.head_us,
            attention_us: g.attention_us,
            sample_us: self.sample_us,
            gpu: None,
            machine: self.machine.clone(),
        })
    }
}

/// The physical kind of a link, in preference order (best first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum LinkKind {
    Loopback,
    Thunderbolt,
    Ethernet,
    Wifi,
    Unknown,
}

impl LinkKind {
    /// All kinds, best first.
    pub const ALL: [LinkKind; 5] = [
        LinkKind::Loopback,
        LinkKind::Thunderbolt,
        LinkKind::Ethernet,
        LinkKind::Wifi,
        LinkKind::Unknown,
    ];

    /// Preference rank: 0 is best (loopback), 4 is worst (unknown).
    pub fn rank(self) -> u8 {
        self as u8
    }

    /// Round-trip time assumed when none was measured, in microseconds.
    pub fn default_rtt_us(self) -> f64 {
        match self {
            LinkKind::Loopback => 20.0,
            LinkKind::Thunderbolt => 50.0,
            LinkKind::Ethernet => 200.0,
            LinkKind::Wifi => 2_000.0,
            LinkKind::Unknown => 5_000.0,
        }
    }

    /// Bandwidth assumed when none was measured, in bytes per second.
    pub fn default_bandwidth_bps(self) -> f64 {
        match self {
            LinkKind::Loopback => 10e9,
            LinkKind::Thunderbolt => 2.5e9,
            LinkKind::Ethernet => 120e6,
            LinkKind::Wifi => 20e6,
            LinkKind::Unknown => 10e6,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Loopback => "loopback",
            LinkKind::Thunderbolt => "thunderbolt",
            LinkKind::Ethernet => "ethernet",
            LinkKind::Wifi => "wifi",
            LinkKind::Unknown => "unknown link",
        }
    }
}

/// An undirected link between two nodes. A pair with no link cannot talk and is never made adjacent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Link {
    pub a: NodeId,
    pub b: NodeId,
    pub kind: LinkKind,
    /// Measured round-trip time in microseconds; the kind's default when `None` (or not finite / < 0).
    pub rtt_us: Option<f64>,
    /// Measured bandwidth in **bytes** per second; the kind's default when `None` (or not finite / <= 0).
    pub bandwidth_bps: Option<f64>,
}

impl Link {
    pub fn connects(&self, x: &str, y: &str) -> bool {
        (self.a == x && self.b == y) || (self.a == y && self.b == x)
    }

    /// The measured round trip when usable.
    pub fn measured_rtt_us(&self) -> Option<f64> {
        self.rtt_us.filter(|r| r.is_finite() && *r >= 0.0)
    }

    /// The measured bandwidth when usable.
    pub fn measured_bandwidth_bps(&self) -> Option<f64> {
        self.bandwidth_bps.filter(|b| b.is_finite() && *b > 0.0)
    }

    pub fn rtt_us(&self) -> f64 {
        self.measured_rtt_us()
            .unwrap_or_else(|| self.kind.default_rtt_us())
    }

    pub fn bandwidth(&self) -> f64 {
        self.measured_bandwidth_bps()
            .unwrap_or_else(|| self.kind.default_bandwidth_bps())
    }

    /// One-way cost of sending `bytes` over this link, in microseconds: `rtt/2 + bytes/bandwidth`.
    pub fn hop_us(&self, bytes: u64) -> f64 {
        self.rtt_us() / 2.0 + bytes as f64 / self.bandwidth() * 1e6
    }
}

/// The cluster as the planner sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    pub nodes: Vec<NodeInfo>,
    pub links: Vec<Link>,
}

impl Topology {
    pub fn node(&self, id: &str) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The cheapest link between `x` and `y` for a message of `bytes` (ties: better kind, then first
    /// listed). `None` when the pair has no link.
    pub fn best_link(&self, x: &str, y: &str, bytes: u64) -> Option<&Link> {
        let mut best: Option<&Link> = None;
        for link in self.links.iter().filter(|l| l.connects(x, y)) {
            if best.is_none_or(|b| link.beats(b, bytes)) {
                best = Some(link);
            }
        }
        best
    }
}

impl Link {
    /// Whether this link carries `bytes` strictly better than `other` (cheaper, then a better kind).
    pub(crate) fn beats(&self, other: &Link, bytes: u64) -> bool {
        self.hop_us(bytes)
            .total_cmp(&other.hop_us(bytes))
            .then(self.kind.cmp(&other.kind))
            .is_lt()
    }
}

/// What the planner needs to know about a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    pub id: ModelId,
    pub n_layers: usize,
    /// Weight bytes of one transformer layer.
    pub layer_bytes: u64,
    /// Extra bytes on the first stage (token embeddings).
    pub embed_bytes: u64,
    /// Extra bytes on the last stage (final norm + lm head).
    pub head_bytes: u64,
    /// KV-cache bytes one token occupies in one layer.
    pub kv_bytes_per_token_per_layer: u64,
    pub context_length: usize,
    /// Activation bytes per token sent from one stage to the next (f16 hidden state).
    pub hidden_bytes_per_token: u64,
    /// The output head is the token embedding matrix: a stage that is both first and last holds it once
    /// (`head_bytes` then counts only on a last stage that is not also the first).
    #[serde(default)]
    pub tied_embeddings: bool,
    /// GGUF type name of most of the layers' weight bytes (`q4_k`, `q8_0`, `f16`, …): nodes publish their
    /// measured speed per type. Empty when unknown.
    #[serde(default)]
    pub weight_type: String,
    /// Weights (parameters) of one transformer layer: `2 · layer_params` floating-point operations per
    /// token and layer. 0 when unknown.
    #[serde(default)]
    pub layer_params: u64,
    /// Weight bytes one token reads in one layer, when that is less than `layer_bytes`: a
    /// mixture-of-experts layer holds every expert but a token reads only the router, attention, the
    /// shared expert and its top-k routed experts. Decode is priced by these bytes
    /// ([`ModelCard::read_layer_bytes`]); memory by `layer_bytes`. 0: the same as `layer_bytes`.
    #[serde(default)]
    pub active_layer_bytes: u64,
    /// The weights one token multiplies by in one layer (as `active_layer_bytes`, for flops). 0: the
    /// same as `layer_params`.
    #[serde(default)]
    pub active_layer_params: u64,
    /// Bytes of the last stage's extras one token reads (the final norm and the output head), when
    /// less than `head_bytes`: a multi-token-prediction block is held there but not run by the main
    /// pass. Decode is priced by these ([`ModelCard::read_head_bytes`]); memory by `head_bytes`. 0: the
    /// same as `head_bytes`.
    #[serde(default)]
    pub active_head_bytes: u64,
    /// GGUF type name of the output head's matrix (`output.weight`, or `token_embd.weight` when tied):
    /// nodes price the head at their measured speed for this type. Empty when unknown.
    #[serde(default)]
    pub head_type: String,
    /// Weights of the output head's matrix (vocabulary × hidden size): `2 · head_params` flops per token.
    /// 0 when unknown.
    #[serde(default)]
    pub head_params: u64,
    /// Entries of the vocabulary the last stage samples from. 0 when unknown.
    #[serde(default)]
    pub vocab_size: u64,
    /// Floating-point operations one token's attention takes per layer per cached position
    /// (`4 · n_heads · head_dim`: the `q·k` products and the weighted sum of values). 0 when unknown.
    #[serde(default)]
    pub attention_flops_per_position: u64,
    /// The most nodes one tensor-parallel group may split this model's layers over (the caller reads
    /// it from the model file: which cuts its heads and feed-forward allow, and whether the runtime
    /// splits its layers at all). 1 (the default, and records that predate groups): no groups. The
    /// planner offers groups of 2 to `min(max_group, MAX_GROUP)` nodes.
    #[serde(default = "no_groups")]
    pub max_group: usize,
}

/// [`ModelCard::max_group`] of records that predate groups: one node per stage.
fn no_groups() -> usize {
    1
}

/// The most members a tensor-parallel group the planner offers has (a direct exchange beats a ring up
/// to about here; decision 024).
pub const MAX_GROUP: usize = 4;

impl ModelCard {
    /// Bytes a stage of `layers` layers needs: weights, the first/last extras, and a KV reserve of
    /// `kv_tokens` tokens for each of its layers. Saturates instead of overflowing.
    pub fn stage_bytes(&self, layers: usize, first: bool, last: bool, kv_tokens: usize) -> u64 {
        let per_layer = self.per_layer_bytes(kv_tokens);
        let mut total = per_layer.saturating_mul(layers as u64);
        if first {
            total = total.saturating_add(self.embed_bytes);
        }
        if last && !(first && self.tied_embeddings) {
            total = total.saturating_add(self.head_bytes);
        }
        total
    }

    /// Weights plus KV reserve of one layer.
    pub fn per_layer_bytes(&self, kv_tokens: usize) -> u64 {
        let kv = self
            .kv_bytes_per_token_per_layer
            .saturating_mul(kv_tokens as u64);
        self.layer_bytes.saturating_add(kv)
    }

    /// Weight bytes one decode token reads per layer (what its decode step streams): the active bytes
    /// of a mixture-of-experts layer, else the layer's bytes.
    pub fn read_layer_bytes(&self) -> u64 {
        match self.active_layer_bytes {
            0 => self.layer_bytes,
            b => b,
        }
    }

    /// Bytes of the last stage's extras one decode token reads: the active head bytes, else all of
    /// `head_bytes`.
    pub fn read_head_bytes(&self) -> u64 {
        match self.active_head_bytes {
            0 => self.head_bytes,
            b => b,
        }
    }

    /// A token reads less of a layer than the layer holds: a mixture of experts (which the GPU stage
    /// does not run, so `--device auto` keeps such a model on the CPU).
    pub fn has_experts(&self) -> bool {
        self.active_layer_bytes != 0 && self.active_layer_bytes < self.layer_bytes
    }

    /// Weights one token multiplies by per layer (`2 ·` that in flops): the active parameters of a
    /// mixture-of-experts layer, else the layer's.
    pub fn read_layer_params(&self) -> u64 {
        match self.active_layer_params {
            0 => self.layer_params,
            p => p,
        }
    }

    /// Bytes the whole model needs (all layers, both extras, KV reserve).
    pub fn total_bytes(&self, kv_tokens: usize) -> u64 {
        self.stage_bytes(self.n_layers, true, true, kv_tokens)
    }
}

/// What the planner optimises; candidates are ranked by the goal's figure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Goal {
    /// One stream's decode rate (the lowest per-token latency of a lone request).
    #[default]
    Latency,
    /// Aggregate decode rate of many concurrent streams (at the largest of the predicted batch sizes).
    Throughput,
}

impl Goal {
    pub fn name(self) -> &'static str {
        match self {
            Goal::Latency => "latency",
            Goal::Throughput => "throughput",
        }
    }
}

/// What the operator asked for. `Default` is fully automatic with no KV reserve, ranked for latency.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Constraints {
    /// Use exactly these nodes (all of them).
    pub pinned_nodes: Option<Vec<NodeId>>,
    /// With `pinned_nodes`: keep the given order as the stage order instead of searching orders.
    pub keep_order: bool,
    /// Manual split: stage order and layer count per node. Counts must be >= 1 and sum to `n_layers`.
    pub layer_counts: Option<Vec<(NodeId, usize)>>,
    /// Tokens of KV cache reserved on every node for each of its layers.
    pub kv_reserve_tokens: usize,
    /// Upper bound on the number of stages.
    pub max_stages: Option<usize>,
    /// What candidates are ranked by.
    #[serde(default)]
    pub goal: Goal,
    /// Prompt length (tokens) the predicted time to first token is for; `None`: 512.
    #[serde(default)]
    pub prompt_tokens: Option<usize>,
    /// Context (tokens already in the KV cache) a decode step's attention is priced at; `None`: the
    /// prompt plus half of [`crate::DEFAULT_GENERATED_TOKENS`] (see [`crate::decode_context`]).
    #[serde(default)]
    pub context_tokens: Option<usize>,
}

impl Constraints {
    /// The prompt length of the TTFT prediction ([`DEFAULT_PROMPT_TOKENS`] when unset, at least 1).
    pub fn prompt(&self) -> usize {
        self.prompt_tokens.unwrap_or(DEFAULT_PROMPT_TOKENS).max(1)
    }

    /// The context decode attention is priced at (`context_tokens`, else [`decode_context`] of the prompt).
    pub fn context(&self) -> usize {
        self.context_tokens
            .unwrap_or_else(|| decode_context(self.prompt()))
    }

    /// Automatic placement reserving KV cache for the model's full context.
    pub fn full_context(card: &ModelCard) -> Self {
        Constraints {
            kv_reserve_tokens: card.context_length,
            ..Constraints::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tied_head_costs_once_on_a_stage_that_is_first_and_last() {
        let mut c = ModelCard {
            id: "m".parse().unwrap(),
            n_layers: 2,
            layer_bytes: 10,
            embed_bytes: 100,
            head_bytes: 101,
            active_head_bytes: 0,
            kv_bytes_per_token_per_layer: 1,
            context_length: 8,
            hidden_bytes_per_token: 2,
            tied_embeddings: false,
            weight_type: String::new(),
            layer_params: 0,
            active_layer_bytes: 0,
            active_layer_params: 0,
            head_type: String::new(),
            head_params: 0,
            vocab_size: 0,
            attention_flops_per_position: 0,
            max_group: 1,
        };
        assert_eq!(c.total_bytes(0), 20 + 100 + 101);
        c.tied_embeddings = true;
        assert_eq!(c.total_bytes(0), 20 + 100);
        // Split: the last stage holds its own copy of the tied matrix as the head.
        assert_eq!(c.stage_bytes(1, false, true, 0), 10 + 101);
        assert_eq!(c.stage_bytes(1, true, false, 4), 14 + 100);
    }
}
