//! The per-token latency model.
//!
//! `latency = Σ stage compute + Σ forward hops + return hop`, in microseconds:
//! - stage compute: `layers / node.speed` seconds;
//! - forward hop between adjacent stages: `rtt/2 + hidden_bytes_per_token / bandwidth` over the cheapest
//!   link of the pair (measured values when present, otherwise the link kind's defaults);
//! - return hop: the sampled token ([`TOKEN_BYTES`]) goes from the last stage back to the first, over a
//!   direct link when there is one, otherwise back along the pipeline's own links. A single stage has no hop.

use serde::{Deserialize, Serialize};

use crate::model::{LinkKind, ModelCard, Stage, Topology};

/// Size of a sampled token id on the wire.
pub const TOKEN_BYTES: u64 = 4;

/// One message crossing one link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hop {
    pub from: String,
    pub to: String,
    pub kind: LinkKind,
    /// Whether the link's round trip was measured (otherwise the kind's default was used).
    pub measured_rtt_us: Option<f64>,
    pub measured_bandwidth_bps: Option<f64>,
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

fn hop(topology: &Topology, from: &str, to: &str, bytes: u64) -> Option<Hop> {
    let link = topology.best_link(from, to, bytes)?;
    Some(Hop {
        from: from.to_string(),
        to: to.to_string(),
        kind: link.kind,
        measured_rtt_us: link.measured_rtt_us(),
        measured_bandwidth_bps: link.measured_bandwidth_bps(),
        us: link.hop_us(bytes),
    })
}

/// Predicts the per-token latency of `stages`. `None` when a node is unknown or adjacent stages have no
/// link.
pub fn predict(topology: &Topology, card: &ModelCard, stages: &[Stage]) -> Option<CostBreakdown> {
    let mut compute_us = Vec::with_capacity(stages.len());
    for stage in stages {
        let node = topology.node(&stage.node)?;
        compute_us.push(stage.layers() as f64 / node.speed * 1e6);
    }
    let mut hops = Vec::new();
    for pair in stages.windows(2) {
        hops.push(hop(
            topology,
            &pair[0].node,
            &pair[1].node,
            card.hidden_bytes_per_token,
        )?);
    }
    let mut return_path = Vec::new();
    if let (Some(first), Some(last)) = (stages.first(), stages.last())
        && stages.len() > 1
    {
        match hop(topology, &last.node, &first.node, TOKEN_BYTES) {
            Some(direct) => return_path.push(direct),
            None => {
                for pair in stages.windows(2).rev() {
                    return_path.push(hop(topology, &pair[1].node, &pair[0].node, TOKEN_BYTES)?);
                }
            }
        }
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
    use crate::model::{Link, NodeInfo};

    fn card() -> ModelCard {
        ModelCard {
            id: "m".into(),
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
        }
    }

    fn node(id: &str, speed: f64) -> NodeInfo {
        NodeInfo {
            id: id.into(),
            mem_available: 1 << 30,
            speed,
            prefill_speed: None,
        }
    }

    fn link(a: &str, b: &str, kind: LinkKind) -> Link {
        Link {
            a: a.into(),
            b: b.into(),
            kind,
            rtt_us: None,
            bandwidth_bps: None,
        }
    }

    fn stage(node: &str, start: usize, end: usize) -> Stage {
        Stage {
            node: node.into(),
            start,
            end,
        }
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
