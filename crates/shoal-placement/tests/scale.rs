//! Planning 64 heterogeneous nodes: a valid, deterministic, explained placement that beats every node
//! alone and every drop of one of its nodes. How long it takes is measured by
//! `cargo run --release -p shoal-placement --example plan64`, never asserted here.

mod common;

use common::{card_70b, heterogeneous};
use shoal_placement::{Constraints, Goal, plan, plan_replicas};

/// The constraints for `goal` (2048 tokens of KV reserved) and the plan under them, checked to be
/// deterministic.
fn planned(
    topo: &shoal_placement::Topology,
    card: &shoal_placement::ModelCard,
    goal: Goal,
) -> (Constraints, Vec<shoal_placement::Placement>) {
    let cons = Constraints {
        kv_reserve_tokens: 2048,
        goal,
        ..Constraints::default()
    };
    let all = plan(topo, card, &cons).unwrap();
    assert_eq!(all, plan(topo, card, &cons).unwrap(), "deterministic");
    (cons, all)
}

#[test]
fn sixty_four_nodes_get_an_explained_placement_that_no_drop_improves() {
    let topo = heterogeneous(64, 64);
    let card = card_70b();
    for goal in [Goal::Latency, Goal::Throughput] {
        let (cons, all) = planned(&topo, &card, goal);
        let chosen = &all[0];
        assert_eq!(chosen.stages.last().unwrap().end, 80);
        assert_eq!(chosen.nodes.len(), 64);
        let k = chosen.stages.len();
        assert!(k > 1, "no node holds 80 × 0.45 GB + KV alone: {k}");
        for (i, s) in chosen.stages.iter().enumerate() {
            let need = card.stage_bytes(s.layers(), i == 0, i + 1 == k, 2048);
            assert!(need <= topo.node(&s.node).unwrap().mem_available);
        }
        let figure = |p: &shoal_placement::Placement| p.prediction.goal_tok_s();
        for (node, without) in common::drops(&topo, &card, &cons, chosen) {
            assert!(
                figure(&without) <= figure(chosen) * (1.0 + 1e-12),
                "dropping {node} is predicted better"
            );
        }
        let left_out = chosen
            .nodes
            .iter()
            .filter(|v| v.reason.starts_with("left out: adding it predicts"))
            .count();
        assert!(left_out > 0, "{:?}", chosen.nodes);
    }
    let replicas = plan_replicas(&topo, &card, &Constraints::default(), 4).unwrap();
    assert_eq!(replicas.len(), 4);
}

/// The same 64 nodes with a card allowing groups of up to 4: still deterministic and explained, every
/// node in one place, and never worse than without groups (every candidate without one is still offered).
#[test]
fn sixty_four_nodes_with_groups_allowed() {
    let topo = heterogeneous(64, 64);
    let plain = card_70b();
    let card = shoal_placement::ModelCard {
        max_group: 4,
        ..card_70b()
    };
    for goal in [Goal::Latency, Goal::Throughput] {
        let (cons, all) = planned(&topo, &card, goal);
        let chosen = &all[0];
        assert_eq!(chosen.nodes.len(), 64);
        let mut ids: Vec<&str> = (chosen.stages.iter().flat_map(|s| s.nodes()))
            .map(|n| n.as_str())
            .collect();
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n, "a node in two places");
        for v in &chosen.nodes {
            assert_eq!(v.used, ids.contains(&v.node.as_str()), "{v:?}");
        }
        let without = plan(&topo, &plain, &cons).unwrap();
        let figure = |p: &shoal_placement::Placement| p.prediction.goal_tok_s();
        assert!(
            figure(chosen) >= figure(&without[0]) * (1.0 - 1e-12),
            "{goal:?}"
        );
    }
}
