//! Seeded randomized property tests over random topologies, model cards and constraints.

use shoal_placement::{
    Constraints, Link, LinkKind, ModelCard, NodeId, NodeInfo, PlacementError, Topology, plan,
    predict, split_layers,
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
        tied_embeddings: false,
        weight_type: String::new(),
        layer_params: 0,
        active_layer_bytes: 0,
        active_layer_params: 0,
        head_type: String::new(),
        head_params: 0,
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
    let n = rng.range(1, 9) as usize;
    let model = card.total_bytes(0).max(1);
    let nodes: Vec<NodeInfo> = (0..n)
        .map(|i| NodeInfo {
            id: format!("node-{i}").parse().unwrap(),
            // between 5% and 120% of the model
            mem_available: model / 100 * rng.range(5, 120),
            speed: rng.range(10, 5000) as f64,
            prefill_speed: None,
            head_us: None,
            attention_us: None,
            sample_us: None,
            gpu: None,
            machine: None,
        })
        .collect();
    let mut links = Vec::new();
    for i in 0..n {
        for j in i + 1..n {
            if rng.chance(35) {
                continue;
            }
            let kind = LinkKind::ALL[rng.range(0, 4) as usize];
            links.push(Link {
                a: nodes[i].id.clone(),
                b: nodes[j].id.clone(),
                kind,
                rtt_us: rng.chance(50).then(|| rng.range(10, 5000) as f64),
                bandwidth_bps: rng.chance(50).then(|| rng.range(1, 10_000) as f64 * 1e6),
            });
        }
    }
    Topology { nodes, links }
}

fn random_constraints(rng: &mut Rng, card: &ModelCard) -> Constraints {
    Constraints {
        kv_reserve_tokens: if rng.chance(50) {
            0
        } else {
            rng.range(0, card.context_length as u64) as usize
        },
        max_stages: rng.chance(30).then(|| rng.range(1, 4) as usize),
        ..Constraints::default()
    }
}

fn linked(topo: &Topology, a: &str, b: &str) -> bool {
    topo.links.iter().any(|l| l.connects(a, b))
}

#[test]
fn placements_are_valid_for_random_inputs() {
    let mut rng = Rng::new(0x5EED_0001);
    let (mut ok, mut multi, mut groups) = (0, 0, 0);
    for case in 0..400 {
        let card = random_card(&mut rng);
        let topo = random_topology(&mut rng, &card);
        let cons = random_constraints(&mut rng, &card);
        let kv = cons.kv_reserve_tokens;
        let result = plan(&topo, &card, &cons);
        assert_eq!(
            result,
            plan(&topo, &card, &cons),
            "case {case}: not deterministic"
        );
        let single_fits = topo
            .nodes
            .iter()
            .any(|n| card.total_bytes(kv) <= n.mem_available);
        let all = match result {
            Ok(all) => all,
            Err(e) => {
                assert!(
                    !single_fits,
                    "case {case}: a single node fits but plan failed: {e}"
                );
                assert!(
                    matches!(
                        e,
                        PlacementError::DoesNotFit { .. } | PlacementError::NoRoute { .. }
                    ),
                    "case {case}: unexpected {e}"
                );
                continue;
            }
        };
        ok += 1;
        assert!(!all.is_empty());
        for p in &all {
            let stages = &p.stages;
            // every layer exactly once, contiguous, ordered, >= 1 per stage
            assert_eq!(stages[0].start, 0, "case {case}");
            assert_eq!(stages.last().unwrap().end, card.n_layers, "case {case}");
            for s in stages {
                assert!(s.end > s.start, "case {case}: empty stage {s:?}");
            }
            for w in stages.windows(2) {
                assert_eq!(w[0].end, w[1].start, "case {case}");
                assert!(
                    linked(&topo, &w[0].node, &w[1].node),
                    "case {case}: unlinked neighbours"
                );
            }
            let mut ids: Vec<&str> = stages
                .iter()
                .flat_map(|s| s.nodes())
                .map(|n| n.as_str())
                .collect();
            let computing = ids.len();
            ids.sort();
            ids.dedup();
            assert_eq!(ids.len(), computing, "case {case}: node used twice");
            if let Some(max) = cons.max_stages {
                assert!(stages.len() <= max, "case {case}");
            }
            // per-node memory never exceeded
            let k = stages.len();
            for (i, s) in stages.iter().enumerate() {
                let node = topo.node(&s.node).unwrap();
                let (first, last) = (i == 0, i + 1 == k);
                let Some(g) = &s.group else {
                    let need = card.stage_bytes(s.layers(), first, last, kv);
                    assert!(
                        need <= node.mem_available,
                        "case {case}: {} over memory",
                        s.node
                    );
                    continue;
                };
                groups += 1;
                // A group: allowed by the card, its members all linked, each rank's share of the
                // layers and KV (every member the embedding on a first stage, and its share of the
                // head's rows on a last one) within its memory.
                let members: Vec<&NodeId> = s.nodes().collect();
                assert!(
                    (2..=card.max_group.min(4)).contains(&members.len()),
                    "case {case}"
                );
                assert_eq!(g.weights.len(), members.len(), "case {case}");
                let total: f64 = g.weights.iter().map(|&w| f64::from(w)).sum();
                for (r, (id, &w)) in members.iter().zip(&g.weights).enumerate() {
                    for other in &members[r + 1..] {
                        assert!(
                            linked(&topo, id, other),
                            "case {case}: {id}-{other} unlinked"
                        );
                    }
                    let share = f64::from(w) / total;
                    let layers =
                        (share * (s.layers() as u64 * card.per_layer_bytes(kv)) as f64).ceil();
                    // Every rank the embedding on a first stage and its share of the head's rows
                    // on a last one (the head is split by vocabulary).
                    let head = card.stage_bytes(0, first, last, kv)
                        - card.stage_bytes(0, first, false, kv);
                    let extras = if first { card.embed_bytes } else { 0 }
                        + (share * head as f64).ceil() as u64;
                    let mem = topo.node(id).unwrap().mem_available;
                    assert!(
                        layers as u64 + extras <= mem,
                        "case {case}: rank {r} {id} over memory"
                    );
                }
            }
            let cost = predict(&topo, &card, stages).unwrap();
            assert!((cost.total_us - p.predicted_token_latency_us).abs() < 1e-6);
            assert!(p.explanation.contains("predicted"));
            if k > 1 {
                multi += 1;
            }
        }
        for w in all.windows(2) {
            assert!(
                w[0].predicted_token_latency_us <= w[1].predicted_token_latency_us,
                "case {case}"
            );
        }
        // A single node that fits is always a candidate, so the best is never slower than it.
        for n in &topo.nodes {
            if card.total_bytes(kv) <= n.mem_available {
                // Its layers and the output head (as `head_bytes / layer_bytes` layers: not measured).
                let head = card.head_bytes as f64 / card.layer_bytes as f64;
                let alone = (card.n_layers as f64 + head) / n.speed * 1e6;
                assert!(
                    all[0].predicted_token_latency_us <= alone + 1e-6,
                    "case {case}"
                );
            }
        }
    }
    assert!(
        ok > 100 && multi > 50 && groups > 20,
        "too few interesting cases: ok {ok}, multi {multi}, groups {groups}"
    );
}

#[test]
fn split_is_exact_and_within_capacity() {
    let mut rng = Rng::new(0x5EED_0002);
    for case in 0..2000 {
        let card = random_card(&mut rng);
        let k = rng.range(1, 8) as usize;
        let kv = rng.range(0, 4096) as usize;
        let model = card.total_bytes(kv).max(1);
        let mems: Vec<u64> = (0..k).map(|_| model / 100 * rng.range(1, 100)).collect();
        let names: Vec<NodeId> = (0..k).map(|i| format!("n{i}").parse().unwrap()).collect();
        let names: Vec<&NodeId> = names.iter().collect();
        match split_layers(&card, &names, &mems, kv) {
            Ok(counts) => {
                assert_eq!(counts.iter().sum::<usize>(), card.n_layers, "case {case}");
                for (i, (&c, &m)) in counts.iter().zip(&mems).enumerate() {
                    assert!(c >= 1, "case {case}");
                    assert!(
                        card.stage_bytes(c, i == 0, i + 1 == k, kv) <= m,
                        "case {case}"
                    );
                }
                assert_eq!(split_layers(&card, &names, &mems, kv).unwrap(), counts);
            }
            Err(PlacementError::TooManyStages { .. }) => assert!(k > card.n_layers),
            Err(PlacementError::DoesNotFit { needed, available }) => {
                assert!(needed > available, "case {case}: {needed} <= {available}")
            }
            Err(PlacementError::NodeDoesNotFit {
                needed, available, ..
            }) => assert!(needed > available),
            Err(e) => panic!("case {case}: unexpected {e}"),
        }
    }
}

#[test]
fn split_follows_memory_when_capacity_is_ample() {
    // With no extras and plenty of room, counts differ from the exact share by less than one layer.
    let mut rng = Rng::new(0x5EED_0003);
    for case in 0..1000 {
        let n = rng.range(1, 100) as usize;
        let k = rng.range(1, 6.min(n as u64)) as usize;
        let card = ModelCard {
            id: "m".parse().unwrap(),
            n_layers: n,
            layer_bytes: 1,
            embed_bytes: 0,
            head_bytes: 0,
            active_head_bytes: 0,
            kv_bytes_per_token_per_layer: 0,
            context_length: 0,
            hidden_bytes_per_token: 1,
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
        let mems: Vec<u64> = (0..k).map(|_| rng.range(1000, 100_000)).collect();
        let x: NodeId = "x".parse().unwrap();
        let names = vec![&x; k];
        let counts = split_layers(&card, &names, &mems, 0).unwrap();
        let total: u64 = mems.iter().sum();
        let shares: Vec<f64> = mems
            .iter()
            .map(|&m| n as f64 * m as f64 / total as f64)
            .collect();
        // A share below one layer is bumped to 1 at the fullest stage's expense; elsewhere exact rounding.
        let bumped = shares.iter().any(|&s| s < 1.0);
        for (&c, &share) in counts.iter().zip(&shares) {
            let tolerance = if bumped { k as f64 } else { 1.0 };
            assert!(
                (c as f64 - share).abs() < tolerance,
                "case {case}: {c} vs {share}"
            );
        }
    }
}

#[test]
fn random_manual_counts_are_taken_verbatim() {
    let mut rng = Rng::new(0x5EED_0004);
    for case in 0..300 {
        let mut card = random_card(&mut rng);
        card.n_layers = card.n_layers.max(3);
        let k = rng.range(1, 3) as usize;
        let nodes: Vec<NodeInfo> = (0..k)
            .map(|i| NodeInfo {
                id: format!("m{i}").parse().unwrap(),
                mem_available: u64::MAX / 4,
                speed: 100.0,
                prefill_speed: None,
                head_us: None,
                attention_us: None,
                sample_us: None,
                gpu: None,
                machine: None,
            })
            .collect();
        let links = (1..k)
            .map(|i| Link {
                a: format!("m{}", i - 1).parse().unwrap(),
                b: format!("m{i}").parse().unwrap(),
                kind: LinkKind::Ethernet,
                rtt_us: None,
                bandwidth_bps: None,
            })
            .collect();
        let topo = Topology { nodes, links };
        let mut left = card.n_layers;
        let mut counts = Vec::new();
        for i in 0..k {
            let c = if i + 1 == k {
                left
            } else {
                rng.range(1, (left - (k - i - 1)) as u64) as usize
            };
            left -= c;
            counts.push((format!("m{i}").parse().unwrap(), c));
        }
        let cons = Constraints {
            layer_counts: Some(counts.clone()),
            ..Constraints::default()
        };
        let all = plan(&topo, &card, &cons).unwrap();
        assert_eq!(all.len(), 1);
        let got: Vec<(NodeId, usize)> = all[0]
            .stages
            .iter()
            .map(|s| (s.node.clone(), s.layers()))
            .collect();
        assert_eq!(got, counts, "case {case}");
    }
}
