//! Replicas: disjoint placements of one model, greedy best-first.

mod common;

use common::{card, link, node};
use shoal_placement::{
    Constraints, LinkKind, PlacementError, Topology, group_tok_s, plan_replicas,
};
use shoal_testkit::rng::{Draw, SplitMix64 as Rng};

fn nodes_of(p: &shoal_placement::Placement) -> Vec<&str> {
    p.stages.iter().map(|s| s.node.as_str()).collect()
}

/// big1 holds the model alone at 30 ms/token, big2 alone at 60 ms; s1 + s2 only together, ~30 ms.
fn cluster() -> Topology {
    let ids = ["big1", "big2", "s1", "s2"];
    let mut links = Vec::new();
    for (i, a) in ids.iter().enumerate() {
        for b in &ids[i + 1..] {
            links.push(link(a, b, LinkKind::Ethernet));
        }
    }
    Topology {
        nodes: vec![
            node("big1", 40, 1000.0),
            node("big2", 40, 500.0),
            node("s1", 16, 1000.0),
            node("s2", 16, 1000.0),
        ],
        links,
    }
}

#[test]
fn replicas_take_the_best_nodes_left_in_turn() {
    let all = plan_replicas(&cluster(), &card(), &Constraints::default(), 3).unwrap();
    let sets: Vec<Vec<&str>> = all
        .iter()
        .map(|p| {
            let mut n = nodes_of(p);
            n.sort();
            n
        })
        .collect();
    assert_eq!(sets, [vec!["big1"], vec!["s1", "s2"], vec!["big2"]]);
    for (i, p) in all.iter().enumerate() {
        assert!(
            p.explanation
                .starts_with(&format!("replica {} of 3: ", i + 1)),
            "{}",
            p.explanation
        );
        assert!(!p.explanation.contains("only"), "{}", p.explanation);
    }
    let one: f64 = all.iter().map(|p| p.prediction.decode_tok_s).sum();
    assert!((group_tok_s(&all, 1) - one).abs() < 1e-9);
    assert!(group_tok_s(&all, 32) >= group_tok_s(&all, 1));
    assert_eq!(group_tok_s(&all, 7), 0.0, "7 is not a predicted batch size");
}

#[test]
fn fewer_replicas_when_the_nodes_run_out_and_it_says_why() {
    let all = plan_replicas(&cluster(), &card(), &Constraints::default(), 5).unwrap();
    assert_eq!(all.len(), 3);
    for p in &all {
        assert!(
            p.explanation
                .contains("; only 3 of 5 replicas fit: the topology has no nodes"),
            "{}",
            p.explanation
        );
    }
    // Two big nodes left in the pool: the second replica does not fit on 16 GB alone.
    let pool = Constraints {
        pinned_nodes: Some(vec!["big1".parse().unwrap(), "s1".parse().unwrap()]),
        ..Constraints::default()
    };
    let all = plan_replicas(&cluster(), &card(), &pool, 2).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(nodes_of(&all[0]), ["big1"]);
    assert!(
        all[0]
            .explanation
            .contains("; only 1 of 2 replicas fit: model does not fit"),
        "{}",
        all[0].explanation
    );
}

#[test]
fn replica_requests_that_cannot_work_are_errors() {
    let err = plan_replicas(&cluster(), &card(), &Constraints::default(), 0).unwrap_err();
    assert_eq!(err.error_type(), "invalid_constraints");
    let manual = Constraints {
        layer_counts: Some(vec![("big1".parse().unwrap(), 30)]),
        ..Constraints::default()
    };
    let err = plan_replicas(&cluster(), &card(), &manual, 2).unwrap_err();
    assert_eq!(err.error_type(), "invalid_constraints");
    // One replica with manual counts is just the plan.
    let one = plan_replicas(&cluster(), &card(), &manual, 1).unwrap();
    assert_eq!(nodes_of(&one[0]), ["big1"]);
    let small = Topology {
        nodes: vec![node("a", 10, 1.0)],
        links: vec![],
    };
    let err = plan_replicas(&small, &card(), &Constraints::default(), 2).unwrap_err();
    assert!(matches!(err, PlacementError::DoesNotFit { .. }), "{err}");
}

#[test]
fn random_replicas_are_disjoint_and_each_fits() {
    let mut rng = Rng::new(0x5EED_0016);
    let mut several = 0;
    for case in 0..200 {
        let n = rng.range(1, 10) as usize;
        let nodes: Vec<_> = (0..n)
            .map(|i| {
                node(
                    &format!("n{i}"),
                    rng.range(5, 40),
                    rng.range(10, 5000) as f64,
                )
            })
            .collect();
        let mut links = Vec::new();
        for i in 0..n {
            for j in i + 1..n {
                if rng.chance(70) {
                    links.push(link(
                        &nodes[i].id,
                        &nodes[j].id,
                        LinkKind::ALL[rng.range(0, 4) as usize],
                    ));
                }
            }
        }
        let topo = Topology { nodes, links };
        let count = rng.range(1, 5) as usize;
        let Ok(all) = plan_replicas(&topo, &card(), &Constraints::default(), count) else {
            continue;
        };
        assert!(!all.is_empty() && all.len() <= count, "case {case}");
        let mut used: Vec<&str> = all.iter().flat_map(nodes_of).collect();
        let total = used.len();
        used.sort();
        used.dedup();
        assert_eq!(used.len(), total, "case {case}: a node in two replicas");
        for p in &all {
            assert_eq!(p.stages.last().unwrap().end, 30, "case {case}");
            for (i, s) in p.stages.iter().enumerate() {
                let k = p.stages.len();
                let need = card().stage_bytes(s.layers(), i == 0, i + 1 == k, 0);
                assert!(
                    need <= topo.node(&s.node).unwrap().mem_available,
                    "case {case}"
                );
            }
        }
        if all.len() < count {
            assert!(
                all[0]
                    .explanation
                    .contains(&format!("only {} of {count}", all.len()))
            );
        }
        if all.len() > 1 {
            several += 1;
        }
    }
    assert!(
        several > 30,
        "too few cases with several replicas: {several}"
    );
}
