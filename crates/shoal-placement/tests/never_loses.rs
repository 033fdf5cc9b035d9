//! Seeded property tests of cost model v2 over random heterogeneous topologies (1–12 nodes, so both the
//! exhaustive and the greedy + local search paths run): the chosen placement is never predicted slower
//! than a node alone that fits (half the cards allow tensor-parallel groups, so groups are held to it
//! too), never holds a node whose removal would be predicted faster, and its
//! predictions agree with each other.

mod common;

use shoal_placement::{
    Constraints, DEFAULT_PROMPT_TOKENS, Goal, Link, LinkKind, ModelCard, NodeInfo, Placement,
    Topology, decode_context, forecast, plan,
};
use shoal_testkit::rng::{Draw, SplitMix64 as Rng};

fn random_card(rng: &mut Rng) -> ModelCard {
    ModelCard {
        id: "random".parse().unwrap(),
        n_layers: rng.range(1, 48) as usize,
        layer_bytes: rng.range(1, 1000) * 1_000_000,
        embed_bytes: rng.range(0, 500) * 1_000_000,
        head_bytes: rng.range(0, 500) * 1_000_000,
        active_head_bytes: 0,
        kv_bytes_per_token_per_layer: rng.range(0, 4096),
        context_length: rng.range(128, 8192) as usize,
        hidden_bytes_per_token: rng.range(256, 16384),
        tied_embeddings: rng.chance(30),
        weight_type: String::new(),
        layer_params: if rng.chance(50) {
            rng.range(1, 1000) * 1_000_000
        } else {
            0
        },
        active_layer_bytes: 0,
        active_layer_params: 0,
        head_type: String::new(),
        head_params: if rng.chance(50) {
            rng.range(1, 1000) * 1_000_000
        } else {
            0
        },
        vocab_size: 0,
        attention_flops_per_position: 0,
        // Half the cards allow tensor-parallel groups of 2 to 4 nodes.
        max_group: if rng.chance(50) {
            1
        } else {
            rng.range(2, 4) as usize
        },
    }
}

fn random_topology(rng: &mut Rng, card: &ModelCard) -> Topology {
    let n = rng.range(1, 12) as usize;
    let model = card.total_bytes(0).max(1);
    let nodes: Vec<NodeInfo> = (0..n)
        .map(|i| {
            let speed = rng.range(10, 5000) as f64;
            NodeInfo {
                id: format!("node-{i}").parse().unwrap(),
                mem_available: model / 100 * rng.range(5, 120),
                speed,
                prefill_speed: rng.chance(50).then(|| speed * rng.range(1, 64) as f64),
                head_us: rng.chance(50).then(|| rng.range(0, 200_000) as f64 / speed),
                attention_us: rng.chance(50).then(|| rng.range(0, 1000) as f64 / speed),
                sample_us: rng.chance(50).then(|| rng.range(0, 100_000) as f64 / speed),
                gpu: None,
                machine: None,
            }
        })
        .collect();
    let mut links = Vec::new();
    for i in 0..n {
        for j in i + 1..n {
            if rng.chance(35) {
                continue;
            }
            links.push(Link {
                a: nodes[i].id.clone(),
                b: nodes[j].id.clone(),
                kind: LinkKind::ALL[rng.range(0, 4) as usize],
                rtt_us: rng.chance(50).then(|| rng.range(10, 5000) as f64),
                bandwidth_bps: rng.chance(50).then(|| rng.range(1, 10_000) as f64 * 1e6),
            });
        }
    }
    Topology { nodes, links }
}

/// The goal's figure in µs per token (lower is better).
fn score(p: &Placement, goal: Goal) -> f64 {
    match goal {
        Goal::Latency => p.predicted_token_latency_us,
        Goal::Throughput => 1e6 / p.prediction.goal_tok_s(),
    }
}

/// A node alone, computed from the formulas (not the planner), per step of `b` tokens at the default
/// context `C`: `n · (max(1/s, b/p) + b·C·attention) + head(b) + b·sample`, the head streamed once or its
/// flops per token at the batched rate.
fn alone(node: &NodeInfo, card: &ModelCard, goal: Goal) -> f64 {
    let ctx = decode_context(DEFAULT_PROMPT_TOKENS) as f64;
    let ratio = |a: u64, b: u64| {
        if a > 0 && b > 0 {
            a as f64 / b as f64
        } else {
            0.0
        }
    };
    let layer = |b: f64| {
        let weights = match node.prefill_speed {
            Some(p) => (1e6 / node.speed).max(b * 1e6 / p),
            None => b * 1e6 / node.speed,
        };
        weights + b * ctx * node.attention_us.unwrap_or(0.0)
    };
    let head_layers = ratio(card.head_bytes, card.read_layer_bytes());
    let stream = node.head_us.unwrap_or(head_layers * 1e6 / node.speed);
    let flop_layers = match ratio(card.head_params, card.read_layer_params()) {
        0.0 => head_layers,
        r => r,
    };
    let head = |b: f64| {
        let products = match node.prefill_speed {
            Some(p) => stream.max(b * flop_layers * 1e6 / p),
            None => b * stream,
        };
        products + b * node.sample_us.unwrap_or(0.0)
    };
    let n = card.n_layers as f64;
    match goal {
        Goal::Latency => n * layer(1.0) + head(1.0),
        Goal::Throughput => (n * layer(32.0) + head(32.0)) / 32.0,
    }
}

fn within(a: f64, b: f64) -> bool {
    a <= b + 1e-9 * b.abs().max(1.0)
}

#[test]
fn the_chosen_placement_never_loses_to_a_node_alone_or_to_dropping_a_node() {
    let mut rng = Rng::new(0x5EED_0015);
    let (mut ok, mut multi, mut greedy_multi, mut dropped) = (0, 0, 0, 0);
    let (mut grouped, mut greedy_grouped) = (0, 0);
    for case in 0..500 {
        let card = random_card(&mut rng);
        let topo = random_topology(&mut rng, &card);
        let goal = if rng.chance(50) {
            Goal::Latency
        } else {
            Goal::Throughput
        };
        let cons = Constraints {
            kv_reserve_tokens: if rng.chance(50) {
                0
            } else {
                rng.range(0, card.context_length as u64) as usize
            },
            max_stages: rng.chance(20).then(|| rng.range(1, 4) as usize),
            goal,
            ..Constraints::default()
        };
        let kv = cons.kv_reserve_tokens;
        let Ok(all) = plan(&topo, &card, &cons) else {
            assert!(
                !topo
                    .nodes
                    .iter()
                    .any(|n| card.total_bytes(kv) <= n.mem_available),
                "case {case}: a node holds the model alone but planning failed"
            );
            continue;
        };
        ok += 1;
        let chosen = &all[0];
        let s = score(chosen, goal);
        for w in all.windows(2) {
            assert!(
                within(score(&w[0], goal), score(&w[1], goal)),
                "case {case}: not ranked"
            );
        }
        // Never slower than a node alone that fits.
        for n in &topo.nodes {
            if card.total_bytes(kv) <= n.mem_available {
                let a = alone(n, &card, goal);
                assert!(
                    within(s, a),
                    "case {case}: {s} µs/token vs {} alone {a}",
                    n.id
                );
            }
        }
        if chosen.stages.iter().any(|st| st.group.is_some()) {
            grouped += 1;
            if topo.nodes.len() > shoal_placement::EXHAUSTIVE_NODES {
                greedy_grouped += 1;
            }
        }
        // Never a node whose removal (the others in the same order) would be predicted faster.
        let k = chosen.stages.len();
        if k > 1 {
            multi += 1;
            if topo.nodes.len() > shoal_placement::EXHAUSTIVE_NODES {
                greedy_multi += 1;
            }
            for (node, without) in common::drops(&topo, &card, &cons, chosen) {
                dropped += 1;
                let w = score(&without, goal);
                assert!(
                    within(s, w),
                    "case {case}: dropping {node} predicts {w} < {s}"
                );
            }
        }
        // Every node has a verdict, and it agrees with the stages.
        assert_eq!(chosen.nodes.len(), topo.nodes.len(), "case {case}");
        for v in &chosen.nodes {
            let in_stages = chosen
                .stages
                .iter()
                .any(|st| st.nodes().any(|n| *n == v.node));
            assert_eq!(v.used, in_stages, "case {case}: {v:?}");
            let prefix = if v.used { "in: " } else { "" };
            assert!(
                v.reason.starts_with(prefix) && !v.reason.is_empty(),
                "{v:?}"
            );
        }
        // The predictions agree with each other and with forecast().
        let pr = &chosen.prediction;
        assert_eq!(pr.goal, goal);
        assert!((pr.token_latency_us - chosen.predicted_token_latency_us).abs() < 1e-6);
        assert!((pr.aggregate[0].tok_s - pr.decode_tok_s).abs() <= 1e-9 * pr.decode_tok_s);
        for r in &pr.aggregate {
            assert!(
                r.tok_s <= r.batch as f64 * pr.decode_tok_s * (1.0 + 1e-9),
                "case {case}: {r:?}"
            );
            assert!(r.micro_batches == r.batch.min(k), "case {case}: {r:?}");
        }
        let prompt: f64 = pr.stages.iter().map(|st| st.prompt_us).sum::<f64>()
            + pr.hops.iter().map(|h| h.prompt_us).sum::<f64>();
        assert!(pr.ttft_us >= prompt - 1e-6, "case {case}");
        let again = forecast(&topo, &card, &chosen.stages, goal, pr.prompt_tokens).unwrap();
        assert_eq!(&again, pr, "case {case}");
        assert_eq!(all, plan(&topo, &card, &cons).unwrap(), "case {case}");
    }
    assert!(
        ok > 200
            && multi > 60
            && greedy_multi > 20
            && dropped > 20
            && grouped > 20
            && greedy_grouped > 5,
        "too few interesting cases: ok {ok}, multi {multi}, greedy {greedy_multi}, dropped {dropped}, \
         grouped {grouped} (greedy {greedy_grouped})"
    );
}
