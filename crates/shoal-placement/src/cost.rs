//! The one-stream latency model: what one generated token costs, term by term ([`CostBreakdown`]).
//!
//! `latency = Σ stage compute + Σ group network + Σ forward hops + return hop`, in microseconds:
//! - stage compute (`compute::Compute::stage_us`): per layer the weights' decode step `1/speed` (the decode
//!   probe's rate, arithmetic included; a batch takes the roofline with the batched rate, see `Compute`)
//!   plus attention over the context (`attention_us` per cached position); on the last stage the output
//!   head (its weights streamed once, at the node's rate for the head's type) and sampling; a
//!   tensor-parallel stage takes its slowest rank's share of each layer and its network time apart
//!   ([`CostBreakdown::group_us`]: rank 0 fanning the input out and two exchanges a layer, `group`);
//! - forward hop between adjacent stages: `rtt/2 + hidden_bytes_per_token / bandwidth` over the cheapest
//!   link of the pair (measured values when present, otherwise the link kind's defaults);
//! - return hop: the sampled token ([`TOKEN_BYTES`]) goes from the last stage back to the first, over a
//!   direct link when there is one, otherwise back along the pipeline's own links. A single stage has no hop.
//!
//! Batches, prompts and aggregate rates build on the same terms in `rates`.

use serde::{Deserialize, Serialize};
use shoal_ids::NodeId;

use crate::group::{GroupSpec, StageCompute};
use crate::links::LinkIndex;
use crate::model::{
    DEFAULT_PROMPT_TOKENS, Link, LinkKind, ModelCard, TOKEN_BYTES, Topology, decode_context,
};
use crate::output::Stage;

/// Where a candidate's stages run: node indices (rank 0 of a group) in stage order, layers per
/// stage, each stage's GPU layers and each stage's tensor-parallel group (an empty slice: none).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout<'a> {
    pub order: &'a [usize],
    pub counts: &'a [usize],
    pub gpu: &'a [usize],
    pub groups: &'a [Option<GroupSpec>],
}

impl Layout<'_> {
    /// Each stage's pricing; `None` when a group's members lack a link.
    pub fn stage_computes(
        &self,
        ctx: (&Topology, &LinkIndex, &ModelCard),
    ) -> Option<Vec<StageCompute>> {
        (self.order.iter().enumerate())
            .map(|(s, &i)| {
                let group = self.groups.get(s).and_then(Option::as_ref);
                let on_gpu = self.gpu.get(s).copied().unwrap_or(0);
                StageCompute::of(ctx, i, on_gpu, group, s == 0)
            })
            .collect()
    }
}

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
    /// Compute per stage, microseconds (a tensor-parallel stage's slowest rank's share, and the head).
    pub compute_us: Vec<f64>,
    /// Per stage, a tensor-parallel group's time on the network: its input fanned out from rank 0 and
    /// its reductions (0 for one node; records that predate groups: empty).
    #[serde(default)]
    pub group_us: Vec<f64>,
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
    let resolved = resolve_stages(topology, stages)?;
    let context = decode_context(DEFAULT_PROMPT_TOKENS);
    breakdown(topology, &links, card, resolved.layout(), context)
}

/// Stage records as node indices: the owned form of a [`Layout`].
pub(crate) struct Resolved {
    order: Vec<usize>,
    counts: Vec<usize>,
    gpu: Vec<usize>,
    groups: Vec<Option<GroupSpec>>,
}

impl Resolved {
    pub fn layout(&self) -> Layout<'_> {
        Layout {
            order: &self.order,
            counts: &self.counts,
            gpu: &self.gpu,
            groups: &self.groups,
        }
    }
}

/// Node indices, layer counts, GPU layers and groups (members as node indices) of `stages`; `None`
/// when a node is unknown.
pub(crate) fn resolve_stages(topology: &Topology, stages: &[Stage]) -> Option<Resolved> {
    let index = |id: &NodeId| topology.nodes.iter().position(|n| n.id == *id);
    let order = stages
        .iter()
        .map(|s| index(&s.node))
        .collect::<Option<Vec<usize>>>()?;
    let groups = stages
        .iter()
        .map(|s| match &s.group {
            None => Some(None),
            Some(g) => Some(Some(GroupSpec {
                members: g.members.iter().map(index).collect::<Option<Vec<_>>>()?,
                weights: g.weights.clone(),
            })),
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Resolved {
        order,
        counts: stages.iter().map(Stage::layers).collect(),
        gpu: stages.iter().map(Stage::gpu_layers).collect(),
        groups,
    })
}

/// [`predict`] for node indices and layer counts with a prebuilt link index.
pub(crate) fn breakdown(
    topology: &Topology,
    links: &LinkIndex,
    card: &ModelCard,
    layout: Layout<'_>,
    context: usize,
) -> Option<CostBreakdown> {
    let order = layout.order;
    let node = |i: usize| &topology.nodes[i];
    let last = order.len().saturating_sub(1);
    let (mut compute_us, mut group_us) = (Vec::new(), Vec::new());
    let stages = layout.stage_computes((topology, links, card))?;
    for (s, (stage, &n)) in stages.iter().zip(layout.counts).enumerate() {
        let (fan_out, reduce) = stage.network_us(n, 1);
        let total = stage.stage_us(n, 1, context, s == last);
        compute_us.push(total - fan_out - reduce);
        group_us.push(fan_out + reduce);
    }
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
        + group_us.iter().sum::<f64>()
        + hops.iter().map(|h| h.us).sum::<f64>()
        + return_path.iter().map(|h| h.us).sum::<f64>();
    Some(CostBreakdown {
        compute_us,
        group_us,
        hops,
        return_path,
        total_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::tests::node;

    fn card() -> ModelCard {
        ModelCard {
            id: "m".parse().unwrap(),
            n_layers: 10,
            layer_bytes: 100,
            embed_bytes: 0,
            head_bytes: 0,
            active_head_bytes: 0,
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
}
