//! The one-stream latency model: what one generated token costs, term by term ([`CostBreakdown`]).
//!
//! `latency = Σ stage compute + Σ forward hops + return hop`, in microseconds:
//! - stage compute ([`Compute::stage_us`]): per layer the weights' decode step `1/speed` (the decode probe's
//!   rate, arithmetic included; a batch takes the roofline with the batched rate, see [`Compute`])
//!   plus attention over the context (`attention_us` per cached position); on the last stage the output
//!   head (its weights streamed once, at the node's rate for the head's type) and sampling;
//! - forward hop between adjacent stages: `rtt/2 + hidden_bytes_per_token / bandwidth` over the cheapest
//!   link of the pair (measured values when present, otherwise the link kind's defaults);
//! - return hop: the sampled token ([`TOKEN_BYTES`]) goes from the last stage back to the first, over a
//!   direct link when there is one, otherwise back along the pipeline's own links. A single stage has no hop.
//!
//! Batches, prompts and aggregate rates build on the same terms in `rates`.

use serde::{Deserialize, Serialize};
use shoal_ids::NodeId;

use crate::links::LinkIndex;
use crate::model::{
    DEFAULT_PROMPT_TOKENS, Link, LinkKind, ModelCard, NodeInfo, TOKEN_BYTES, Topology,
    decode_context,
};
use crate::output::Stage;

/// One message crossing one link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hop {
    pub from: NodeId,
    pub to: NodeId,
    pub kind: LinkKind,
    /// Whether the link's round trip was measured (otherwise the kind's default was used).
    pub measured_rtt_us: Option<f64>,
    pub measured_bandwidth_bps: Option<f64>,
    /// The round trip and bandwidth the cost was computed with (measured or the kind's default).
    #[serde(default)]
    pub rtt_us: f64,
    #[serde(default)]
    pub bandwidth_bps: f64,
    pub us: f64,
}

/// The predicted latency of one placement, term by term.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostBreakdown {
    /// Compute per stage, microseconds.
    pub compute_us: Vec<f64>,
    pub hops: Vec<Hop>,
    /// Path of the sampled token back to the first stage (empty for one stage).
    pub return_path: Vec<Hop>,
    pub total_us: f64,
}

impl CostBreakdown {
    /// The worst (highest-rank) link kind used anywhere, `Loopback` for a single stage.
    pub fn worst_kind(&self) -> LinkKind {
        self.hops
            .iter()
            .chain(&self.return_path)
            .map(|h| h.kind)
            .max()
            .unwrap_or(LinkKind::Loopback)
    }
}

/// What one model costs on one node, per term of [`Compute::stage_us`] (microseconds):
/// - a layer's weights: the roofline `max(1/speed, tokens/max(prefill_speed, speed))` (one token costs
///   exactly its measured decode step: the batched rate never makes a lone token compute-bound), or
///   `tokens/speed` (every token a full step) when the compute-bound rate was not measured (or is not a
///   finite positive number);
/// - attention: `attention_us` per layer per cached position each token reads (0 when not measured);
/// - on the last stage, the output head: its weights streamed once (`head_us`, or `head_bytes /
///   read_layer_bytes` layers at `speed` when not measured), or `2 · head_params` flops per token at the node's
///   batched rate when a batch makes that larger; and sampling, `sample_us` per sampled token (0 when not
///   measured).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Compute {
    speed: f64,
    prefill_speed: Option<f64>,
    attention_us: f64,
    /// The head's weights streamed once.
    head_stream_us: f64,
    /// The head's products for one token when compute-bound; `None`: each token streams it again.
    head_token_us: Option<f64>,
    sample_us: f64,
}

/// `v` when it is a finite number `>= 0`.
fn usable(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite() && *x >= 0.0)
}

impl Compute {
    pub fn of(node: &NodeInfo, card: &ModelCard) -> Self {
        // A batch is never slower per token than its tokens decoded one at a time: the decode rate was
        // measured on the decode kernel, its arithmetic included, while the batched rate comes from
        // one format's batched kernel (a slower format's, on some CPUs, than the model's own).
        let prefill_speed = node
            .prefill_speed
            .filter(|p| p.is_finite() && *p > 0.0)
            .map(|p| p.max(node.speed));
        let ratio = |a: u64, b: u64| {
            if a > 0 && b > 0 {
                a as f64 / b as f64
            } else {
                0.0
            }
        };
        // The head in layers: by bytes for streaming, by parameters (else bytes) for flops.
        // (A layer here is what a token reads of it: the active experts of a mixture-of-experts one.)
        let head_layers = ratio(card.head_bytes, card.read_layer_bytes());
        let head_flop_layers = match ratio(card.head_params, card.read_layer_params()) {
            0.0 => head_layers,
            r => r,
        };
        Compute {
            speed: node.speed,
            prefill_speed,
            attention_us: usable(node.attention_us).unwrap_or(0.0),
            head_stream_us: usable(node.head_us).unwrap_or(head_layers * 1e6 / node.speed),
            head_token_us: prefill_speed.map(|p| head_flop_layers * 1e6 / p),
            sample_us: usable(node.sample_us).unwrap_or(0.0),
        }
    }

    /// One layer's weights for a batch of `tokens` tokens (the roofline).
    pub fn layer_us(self, tokens: usize) -> f64 {
        let step = 1e6 / self.speed;
        match self.prefill_speed {
            Some(p) => step.max(tokens as f64 * 1e6 / p),
            None => tokens as f64 * step,
        }
    }

    /// One layer of a decode step of `tokens` tokens, each attending over `context` cached positions.
    pub fn decode_layer_us(self, tokens: usize, context: usize) -> f64 {
        self.layer_us(tokens) + (tokens * context) as f64 * self.attention_us
    }

    /// The output head for `tokens` rows, `sampled` of them sampled.
    pub fn head_us(self, tokens: usize, sampled: usize) -> f64 {
        let t = tokens as f64;
        let products = match self.head_token_us {
            Some(c) => self.head_stream_us.max(t * c),
            None => t * self.head_stream_us,
        };
        products + sampled as f64 * self.sample_us
    }

    /// A stage of `layers` layers for a decode step of `tokens` tokens at `context` (the head and
    /// sampling too when it is the `last` stage).
    pub fn stage_us(self, layers: usize, tokens: usize, context: usize, last: bool) -> f64 {
        let head = if last {
            self.head_us(tokens, tokens)
        } else {
            0.0
        };
        layers as f64 * self.decode_layer_us(tokens, context) + head
    }

    /// A stage of `layers` layers for a prompt chunk of `tokens` tokens after `offset` earlier ones
    /// (each attends over the positions before it and itself); with `sample` (the last stage, the
    /// prompt's last chunk) the head and sampling for the chunk's last row.
    pub fn chunk_us(self, layers: usize, offset: usize, tokens: usize, sample: bool) -> f64 {
        let (p, c) = (offset as f64, tokens as f64);
        let positions = c * p + c * (c + 1.0) / 2.0;
        let head = if sample { self.head_us(1, 1) } else { 0.0 };
        layers as f64 * (self.layer_us(tokens) + positions * self.attention_us) + head
    }

    /// What one more cached position adds to one token's time on a stage of `layers` layers.
    pub fn attention_per_position_us(self, layers: usize) -> f64 {
        layers as f64 * self.attention_us
    }
}

/// What one stage costs on its node when its first `gpu_layers` layers run on the node's GPU and the
/// rest on its CPU: the sum of the two parts, each at its own device's [`Compute`]; the head and
/// sampling on the GPU's part only when it holds every layer of a last stage.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Split {
    cpu: Compute,
    /// The GPU's compute and the layers a stage puts there at most.
    gpu: Option<(Compute, usize)>,
}

impl Split {
    /// `node` for the model of `card`, its first `gpu_layers` layers on its GPU (none when the node
    /// uses no GPU).
    pub fn of(node: &NodeInfo, card: &ModelCard, gpu_layers: usize) -> Self {
        let gpu = node
            .gpu_node()
            .filter(|_| gpu_layers > 0)
            .map(|g| (Compute::of(&g, card), gpu_layers));
        Split {
            cpu: Compute::of(node, card),
            gpu,
        }
    }

    /// The GPU's compute and the layers it takes of a stage of `layers`, when it takes any.
    fn gpu_part(self, layers: usize) -> Option<(Compute, usize)> {
        self.gpu
            .map(|(c, k)| (c, k.min(layers)))
            .filter(|p| p.1 > 0)
    }

    /// [`Compute::stage_us`] of both parts.
    pub fn stage_us(self, layers: usize, tokens: usize, context: usize, last: bool) -> f64 {
        match self.gpu_part(layers) {
            None => self.cpu.stage_us(layers, tokens, context, last),
            Some((g, k)) if k == layers => g.stage_us(k, tokens, context, last),
            Some((g, k)) => {
                g.stage_us(k, tokens, context, false)
                    + self.cpu.stage_us(layers - k, tokens, context, last)
            }
        }
    }

    /// [`Compute::chunk_us`] of both parts.
    pub fn chunk_us(self, layers: usize, offset: usize, tokens: usize, sample: bool) -> f64 {
        match self.gpu_part(layers) {
            None => self.cpu.chunk_us(layers, offset, tokens, sample),
            Some((g, k)) if k == layers => g.chunk_us(k, offset, tokens, sample),
            Some((g, k)) => {
                g.chunk_us(k, offset, tokens, false)
                    + self.cpu.chunk_us(layers - k, offset, tokens, sample)
            }
        }
    }

    /// [`Compute::head_us`] on the part that holds the head of a last stage of `layers` layers.
    pub fn head_us(self, layers: usize, tokens: usize, sampled: usize) -> f64 {
        match self.gpu_part(layers) {
            Some((g, k)) if k == layers => g.head_us(tokens, sampled),
            _ => self.cpu.head_us(tokens, sampled),
        }
    }

    /// [`Compute::attention_per_position_us`] of both parts.
    pub fn attention_per_position_us(self, layers: usize) -> f64 {
        match self.gpu_part(layers) {
            None => self.cpu.attention_per_position_us(layers),
            Some((g, k)) => {
                g.attention_per_position_us(k) + self.cpu.attention_per_position_us(layers - k)
            }
        }
    }
}

fn hop(from: &NodeId, to: &NodeId, link: &Link, bytes: u64) -> Hop {
    Hop {
        from: from.clone(),
        to: to.clone(),
        kind: link.kind,
        measured_rtt_us: link.measured_rtt_us(),
        measured_bandwidth_bps: link.measured_bandwidth_bps(),
        rtt_us: link.rtt_us(),
        bandwidth_bps: link.bandwidth(),
        us: link.hop_us(bytes),
    }
}

/// The nodes, in stage order, whose links carry the sampled token back from the last stage to the first:
/// `[last, first]` over a direct link, otherwise the pipeline backwards. Empty for one stage; `None` when a
/// pair on the way has no link.
pub(crate) fn return_route(links: &LinkIndex, order: &[usize]) -> Option<Vec<(usize, usize)>> {
    let (&first, &last) = (order.first()?, order.last()?);
    if order.len() == 1 {
        return Some(Vec::new());
    }
    if links.back(last, first).is_some() {
        return Some(vec![(last, first)]);
    }
    let route: Vec<(usize, usize)> = order.windows(2).rev().map(|w| (w[1], w[0])).collect();
    route
        .iter()
        .all(|&(a, b)| links.back(a, b).is_some())
        .then_some(route)
}

/// Predicts the per-token latency of `stages`, attention priced at the default context
/// ([`crate::decode_context`] of [`crate::DEFAULT_PROMPT_TOKENS`]). `None` when a node is unknown or
/// adjacent stages have no link.
pub fn predict(topology: &Topology, card: &ModelCard, stages: &[Stage]) -> Option<CostBreakdown> {
    let links = LinkIndex::new(topology, card.hidden_bytes_per_token);
    let (order, counts) = resolve_stages(topology, stages)?;
    let context = decode_context(DEFAULT_PROMPT_TOKENS);
    let gpu: Vec<usize> = stages.iter().map(Stage::gpu_layers).collect();
    breakdown(topology, &links, card, (&order, &counts, &gpu), context)
}

/// Node indices and layer counts of `stages`; `None` when a node is unknown.
pub(crate) fn resolve_stages(
    topology: &Topology,
    stages: &[Stage],
) -> Option<(Vec<usize>, Vec<usize>)> {
    let order = stages
        .iter()
        .map(|s| topology.nodes.iter().position(|n| n.id == s.node))
        .collect::<Option<Vec<usize>>>()?;
    Some((order, stages.iter().map(Stage::layers).collect()))
}

/// [`predict`] for node indices and layer counts with a prebuilt link index.
pub(crate) fn breakdown(
    topology: &Topology,
    links: &LinkIndex,
    card: &ModelCard,
    (order, counts, gpu): (&[usize], &[usize], &[usize]),
    context: usize,
) -> Option<CostBreakdown> {
    let node = |i: usize| &topology.nodes[i];
    let last = order.len().saturating_sub(1);
    let compute_us: Vec<f64> = (order.iter().zip(counts).enumerate())
        .map(|(s, (&i, &n))| {
            let on_gpu = gpu.get(s).copied().unwrap_or(0);
            Split::of(node(i), card, on_gpu).stage_us(n, 1, context, s == last)
        })
        .collect();
    let mut hops = Vec::with_capacity(order.len().saturating_sub(1));
    for w in order.windows(2) {
        let link = &topology.links[links.fwd(w[0], w[1])?];
        hops.push(hop(
            &node(w[0]).id,
            &node(w[1]).id,
            link,
            card.hidden_bytes_per_token,
        ));
    }
    let mut return_path = Vec::new();
    for (a, b) in return_route(links, order)? {
        let link = &topology.links[links.back(a, b)?];
        return_path.push(hop(&node(a).id, &node(b).id, link, TOKEN_BYTES));
    }
    let total_us = compute_us.iter().sum::<f64>()
        + hops.iter().map(|h| h.us).sum::<f64>()
        + return_path.iter().map(|h| h.us).sum::<f64>();
    Some(CostBreakdown {
        compute_us,
        hops,
        return_path,
        total_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card() -> ModelCard {
        ModelCard {
            id: "m".parse().unwrap(),
            n_layers: 10,
            layer_bytes: 100,
            embed_bytes: 0,
            head_bytes: 0,
            kv_bytes_per_token_per_layer: 0,
            context_length: 0,
            hidden_bytes_per_token: 1_000_000,
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
        }
    }

    fn node(id: &str, speed: f64) -> NodeInfo {
        NodeInfo {
            id: id.parse().unwrap(),
            mem_available: 1 << 30,
            speed,
            prefill_speed: None,
            head_us: None,
            attention_us: None,
            sample_us: None,
            gpu: None,
        }
    }

    fn link(a: &str, b: &str, kind: LinkKind) -> Link {
        Link {
            a: a.parse().unwrap(),
            b: b.parse().unwrap(),
            kind,
            rtt_us: None,
            bandwidth_bps: None,
        }
    }

    fn stage(node: &str, start: usize, end: usize) -> Stage {
        Stage::cpu(node.parse().unwrap(), start, end)
    }

    #[test]
    fn single_stage_is_compute_only() {
        let topo = Topology {
            nodes: vec![node("a", 1000.0)],
            links: vec![],
        };
        let c = predict(&topo, &card(), &[stage("a", 0, 10)]).unwrap();
        assert!((c.total_us - 10_000.0).abs() < 1e-6);
        assert!(c.hops.is_empty() && c.return_path.is_empty());
        assert_eq!(c.worst_kind(), LinkKind::Loopback);
    }

    #[test]
    fn two_stages_add_forward_and_return_hops() {
        let topo = Topology {
            nodes: vec![node("a", 1000.0), node("b", 1000.0)],
            links: vec![link("a", "b", LinkKind::Ethernet)],
        };
        let c = predict(&topo, &card(), &[stage("a", 0, 5), stage("b", 5, 10)]).unwrap();
        let forward = 100.0 + 1e6 / 120e6 * 1e6;
        let back = 100.0 + 4.0 / 120e6 * 1e6;
        assert!((c.total_us - (10_000.0 + forward + back)).abs() < 1e-6);
        assert_eq!(c.worst_kind(), LinkKind::Ethernet);
    }

    #[test]
    fn missing_link_means_no_prediction() {
        let topo = Topology {
            nodes: vec![node("a", 1.0), node("b", 1.0)],
            links: vec![],
        };
        assert!(predict(&topo, &card(), &[stage("a", 0, 5), stage("b", 5, 10)]).is_none());
    }

    #[test]
    fn return_goes_back_along_the_pipeline_without_direct_link() {
        let topo = Topology {
            nodes: vec![node("a", 1.0), node("b", 1.0), node("c", 1.0)],
            links: vec![
                link("a", "b", LinkKind::Thunderbolt),
                link("b", "c", LinkKind::Thunderbolt),
            ],
        };
        let stages = [stage("a", 0, 3), stage("b", 3, 6), stage("c", 6, 10)];
        let c = predict(&topo, &card(), &stages).unwrap();
        let path: Vec<_> = c
            .return_path
            .iter()
            .map(|h| (h.from.as_str(), h.to.as_str()))
            .collect();
        assert_eq!(path, [("c", "b"), ("b", "a")]);
    }

    #[test]
    fn measured_values_override_kind_defaults() {
        let mut l = link("a", "b", LinkKind::Wifi);
        let default = l.hop_us(1_000_000);
        l.bandwidth_bps = Some(1e9);
        l.rtt_us = Some(100.0);
        assert!(l.hop_us(1_000_000) < default);
        assert!((l.hop_us(1_000_000) - (50.0 + 1000.0)).abs() < 1e-6);
        l.bandwidth_bps = Some(f64::NAN);
        assert_eq!(l.bandwidth(), LinkKind::Wifi.default_bandwidth_bps());
    }

    #[test]
    fn kind_defaults_follow_preference_order() {
        for pair in LinkKind::ALL.windows(2) {
            assert!(pair[0].rank() < pair[1].rank());
            assert!(pair[0].default_rtt_us() < pair[1].default_rtt_us());
            assert!(pair[0].default_bandwidth_bps() > pair[1].default_bandwidth_bps());
        }
    }

    #[test]
    fn best_link_picks_cheapest_of_parallel_links() {
        let topo = Topology {
            nodes: vec![node("a", 1.0), node("b", 1.0)],
            links: vec![
                link("a", "b", LinkKind::Wifi),
                link("b", "a", LinkKind::Thunderbolt),
            ],
        };
        assert_eq!(
            topo.best_link("a", "b", 1000).unwrap().kind,
            LinkKind::Thunderbolt
        );
    }

    #[test]
    fn a_batch_costs_its_roofline() {
        let mut n = node("a", 1000.0);
        let layer_us = |n: &NodeInfo, t| Compute::of(n, &card()).layer_us(t);
        assert!((layer_us(&n, 1) - 1000.0).abs() < 1e-9);
        assert!(
            (layer_us(&n, 8) - 8000.0).abs() < 1e-9,
            "unmeasured: b× one token"
        );
        n.prefill_speed = Some(4000.0);
        assert!((layer_us(&n, 1) - 1000.0).abs() < 1e-9, "memory-bound");
        assert!((layer_us(&n, 4) - 1000.0).abs() < 1e-9);
        assert!((layer_us(&n, 16) - 4000.0).abs() < 1e-9, "compute-bound");
        // A batched rate below the decode rate (measured on a slower format's batched kernel): one
        // token is its decode step, a batch no slower than its tokens one at a time.
        n.prefill_speed = Some(500.0);
        assert!(
            (layer_us(&n, 1) - 1000.0).abs() < 1e-9,
            "one token: its decode step"
        );
        assert!(
            (layer_us(&n, 4) - 4000.0).abs() < 1e-9,
            "b tokens: b steps at most"
        );
    }

    /// The last stage pays the head (streamed at its measured time, or as `head_bytes / layer_bytes`
    /// layers when not measured) and sampling; every layer pays attention over the context.
    #[test]
    fn the_last_stage_pays_the_head_and_every_layer_its_attention() {
        let mut c = card();
        c.head_bytes = 300; // three layers' worth (layer_bytes 100)
        c.layer_params = 1000;
        c.head_params = 5000;
        let mut n = node("a", 1000.0);
        let us =
            |n: &NodeInfo, tokens, ctx, last| Compute::of(n, &c).stage_us(2, tokens, ctx, last);
        assert!(
            (us(&n, 1, 100, false) - 2000.0).abs() < 1e-9,
            "nothing measured"
        );
        assert!(
            (us(&n, 1, 100, true) - 5000.0).abs() < 1e-9,
            "the head as 3 layers"
        );
        n.head_us = Some(700.0);
        n.sample_us = Some(50.0);
        n.attention_us = Some(0.5);
        // 2 layers · (1000 + 100 positions · 0.5) + head 700 + sample 50.
        assert!((us(&n, 1, 100, true) - 2850.0).abs() < 1e-9);
        assert!((us(&n, 1, 100, false) - 2100.0).abs() < 1e-9);
        // A batch of 4 without a batched rate: every token streams everything again.
        assert!((us(&n, 4, 100, true) - 4.0 * 2850.0).abs() < 1e-9);
        // With one: the head's 5 layers of flops per token at 10 000 layer-tokens/s = 500 µs per token.
        n.prefill_speed = Some(10_000.0);
        let head = Compute::of(&n, &c).head_us(4, 4);
        assert!((head - (2000.0 + 200.0)).abs() < 1e-9, "{head}");
        assert!(
            (Compute::of(&n, &c).head_us(1, 0) - 700.0).abs() < 1e-9,
            "memory-bound"
        );
        // A prompt chunk of 4 after 10 tokens reads 4·10 + 1+2+3+4 = 50 positions per layer.
        let chunk = Compute::of(&n, &c).chunk_us(2, 10, 4, false);
        assert!((chunk - 2.0 * (1000.0 + 25.0)).abs() < 1e-9, "{chunk}");
        assert!((Compute::of(&n, &c).attention_per_position_us(2) - 1.0).abs() < 1e-12);
    }

    /// A mixture-of-experts card: the node's speed is per layer a token reads (its active bytes), so the
    /// unmeasured head is priced in those layers, and the head's flops in active parameters.
    #[test]
    fn an_moe_head_is_priced_in_the_layers_a_token_reads() {
        let mut c = card();
        c.layer_bytes = 1000; // every expert
        c.active_layer_bytes = 100; // what a token reads
        c.head_bytes = 300;
        c.layer_params = 10_000;
        c.active_layer_params = 1000;
        c.head_params = 5000;
        let mut n = node("a", 1000.0);
        let last = Compute::of(&n, &c).stage_us(2, 1, 0, true);
        assert!(
            (last - 5000.0).abs() < 1e-9,
            "2 layers + the head as 3: {last}"
        );
        n.prefill_speed = Some(10_000.0);
        n.head_us = Some(700.0);
        // The head's 5 active layers of flops per token at 10 000 layer-tokens/s: 500 µs a token.
        let head = Compute::of(&n, &c).head_us(4, 0);
        assert!((head - 2000.0).abs() < 1e-9, "{head}");
    }
}
