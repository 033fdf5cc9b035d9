//! Builders shared by the scenario tests.
#![allow(dead_code)] // each test binary uses a different subset

use shoal_placement::{
    Constraints, Link, LinkKind, ModelCard, NodeId, NodeInfo, Placement, Topology, best,
};

pub const GB: u64 = 1_000_000_000;

pub fn node(id: &str, mem_gb: u64, speed: f64) -> NodeInfo {
    NodeInfo {
        id: id.parse().unwrap(),
        mem_available: mem_gb * GB,
        speed,
        prefill_speed: None,
        head_us: None,
        attention_us: None,
        sample_us: None,
        gpu: None,
        machine: None,
    }
}

/// A link with nothing measured (the kind's defaults apply).
pub fn link(a: &str, b: &str, kind: LinkKind) -> Link {
    Link {
        a: a.parse().unwrap(),
        b: b.parse().unwrap(),
        kind,
        rtt_us: None,
        bandwidth_bps: None,
    }
}

/// 30 layers of 1 GB, no extras, 8 KB activations.
pub fn card() -> ModelCard {
    ModelCard {
        id: "test-30".parse().unwrap(),
        n_layers: 30,
        layer_bytes: GB,
        embed_bytes: 0,
        head_bytes: 0,
        active_head_bytes: 0,
        kv_bytes_per_token_per_layer: 0,
        context_length: 2048,
        hidden_bytes_per_token: 8192,
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

/// A 70B-class card: 80 layers of 450 MB (q4), 1 GB embeddings and head, 160 KB of KV per token and
/// layer, 16 KB activations (8192 f16).
pub fn card_70b() -> ModelCard {
    ModelCard {
        id: "test-70b".parse().unwrap(),
        n_layers: 80,
        layer_bytes: 450_000_000,
        embed_bytes: GB,
        head_bytes: GB,
        active_head_bytes: 0,
        kv_bytes_per_token_per_layer: 160 * 1024,
        context_length: 8192,
        hidden_bytes_per_token: 16_384,
        tied_embeddings: false,
        weight_type: "q4_k".into(),
        layer_params: 800_000_000,
        active_layer_bytes: 0,
        active_layer_params: 0,
        head_type: String::new(),
        head_params: 0,
        vocab_size: 0,
        attention_flops_per_position: 0,
        max_group: 1,
    }
}

/// `n` heterogeneous simulated nodes from `seed`: 4–64 GB, decode speeds over two orders of magnitude,
/// a measured compute-bound rate on half of them, a full mesh of links of every kind, most of them
/// measured (a slower second path on some pairs).
pub fn heterogeneous(n: usize, seed: u64) -> Topology {
    use shoal_testkit::rng::{Draw, SplitMix64};
    let mut rng = SplitMix64::new(seed);
    let nodes: Vec<NodeInfo> = (0..n)
        .map(|i| {
            let speed = rng.range(20, 4000) as f64;
            NodeInfo {
                id: format!("node-{i:02}").parse().unwrap(),
                mem_available: rng.range(4, 64) * GB,
                speed,
                prefill_speed: rng.chance(50).then(|| speed * rng.range(4, 64) as f64),
                head_us: None,
                attention_us: None,
                sample_us: None,
                gpu: None,
                machine: None,
            }
        })
        .collect();
    let mut links = Vec::new();
    for i in 0..n {
        for j in i + 1..n {
            let paths = if rng.chance(10) { 2 } else { 1 };
            for _ in 0..paths {
                let kind = LinkKind::ALL[rng.range(1, 4) as usize];
                links.push(Link {
                    a: nodes[i].id.clone(),
                    b: nodes[j].id.clone(),
                    kind,
                    rtt_us: rng
                        .chance(80)
                        .then(|| kind.default_rtt_us() * rng.range(50, 300) as f64 / 100.0),
                    bandwidth_bps: rng
                        .chance(80)
                        .then(|| kind.default_bandwidth_bps() * rng.range(20, 120) as f64 / 100.0),
                });
            }
        }
    }
    Topology { nodes, links }
}

/// `chosen` with the node of each stage dropped in turn (the others in the same order, layers split
/// again for the goal of `cons`): (dropped node, the placement) for each drop that still fits.
pub fn drops(
    topo: &Topology,
    card: &ModelCard,
    cons: &Constraints,
    chosen: &Placement,
) -> Vec<(NodeId, Placement)> {
    let k = chosen.stages.len();
    (0..k)
        .filter(|_| k > 1)
        .filter_map(|p| {
            let rest: Vec<NodeId> = (chosen.stages.iter().enumerate())
                .filter(|&(q, _)| q != p)
                .map(|(_, s)| s.node.clone())
                .collect();
            let pinned = Constraints {
                pinned_nodes: Some(rest),
                keep_order: true,
                ..cons.clone()
            };
            let without = best(topo, card, &pinned).ok()?;
            Some((chosen.stages[p].node.clone(), without))
        })
        .collect()
}
