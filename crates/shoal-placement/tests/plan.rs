//! Scenario tests of the planner: known inputs, exact outputs.

mod common;

use common::{GB, card, link, node};
use shoal_placement::{
    Constraints, LinkKind, NodeInfo, PlacementError, Stage, Topology, best, plan,
};

fn counts(stages: &[Stage]) -> Vec<(&str, usize)> {
    stages
        .iter()
        .map(|s| (s.node.as_str(), s.layers()))
        .collect()
}

fn auto() -> Constraints {
    Constraints::default()
}

#[test]
fn single_node_that_fits_gets_one_stage() {
    let topo = Topology {
        nodes: vec![node("big", 64, 1000.0), node("small", 8, 1000.0)],
        links: vec![link("big", "small", LinkKind::Ethernet)],
    };
    let p = best(&topo, &card(), &auto()).unwrap();
    assert_eq!(counts(&p.stages), [("big", 30)]);
    assert!((p.predicted_token_latency_us - 30_000.0).abs() < 1e-6);
    assert!(
        p.explanation
            .starts_with("1 stage: big layers 0–29 (30 layers, 30 GB of 64 GB"),
        "{}",
        p.explanation
    );
    assert!(p.explanation.contains("no network hops"));
    assert!(
        p.explanation
            .contains("single-node options rejected: small (needs 30 GB, has 8 GB)"),
        "{}",
        p.explanation
    );
}

#[test]
fn too_big_for_one_node_splits_by_memory_ratio() {
    let topo = Topology {
        nodes: vec![node("a", 24, 1000.0), node("b", 16, 1000.0)],
        links: vec![link("a", "b", LinkKind::Thunderbolt)],
    };
    let p = best(&topo, &card(), &auto()).unwrap();
    assert_eq!(counts(&p.stages), [("a", 18), ("b", 12)]);
    assert_eq!(p.stages[0], Stage::cpu("a".parse().unwrap(), 0, 18));
    assert_eq!(p.stages[1], Stage::cpu("b".parse().unwrap(), 18, 30));
    assert!(
        p.explanation
            .contains("2 stages: a layers 0–17 (18 layers, 18 GB of 24 GB"),
        "{}",
        p.explanation
    );
    assert!(
        p.explanation
            .contains("over thunderbolt (assumed 50 µs rtt"),
        "{}",
        p.explanation
    );
    assert!(p.explanation.contains(
        "single-node options rejected: a (needs 30 GB, has 24 GB), b (needs 30 GB, has 16 GB)"
    ));
}

#[test]
fn equal_nodes_split_with_deterministic_remainder() {
    let topo = Topology {
        nodes: vec![
            node("a", 11, 1000.0),
            node("b", 11, 1000.0),
            node("c", 11, 1000.0),
        ],
        links: vec![
            link("a", "b", LinkKind::Ethernet),
            link("b", "c", LinkKind::Ethernet),
            link("a", "c", LinkKind::Ethernet),
        ],
    };
    let mut c = card();
    c.n_layers = 31;
    let p = best(&topo, &c, &auto()).unwrap();
    assert_eq!(counts(&p.stages), [("a", 11), ("b", 10), ("c", 10)]);
    assert_eq!(
        plan(&topo, &c, &auto()).unwrap(),
        plan(&topo, &c, &auto()).unwrap()
    );
}

#[test]
fn faster_link_kind_is_preferred() {
    let topo = Topology {
        nodes: vec![
            node("a", 20, 1000.0),
            node("wifi-peer", 20, 1000.0),
            node("tb-peer", 20, 1000.0),
        ],
        links: vec![
            link("a", "wifi-peer", LinkKind::Wifi),
            link("a", "tb-peer", LinkKind::Thunderbolt),
            link("wifi-peer", "tb-peer", LinkKind::Ethernet),
        ],
    };
    let p = best(&topo, &card(), &auto()).unwrap();
    let mut nodes: Vec<&str> = p.stages.iter().map(|s| s.node.as_str()).collect();
    nodes.sort();
    assert_eq!(nodes, ["a", "tb-peer"]);
}

#[test]
fn measured_bandwidth_beats_kind_defaults() {
    let mut fast = link("a", "measured", LinkKind::Wifi);
    fast.bandwidth_bps = Some(5e9);
    fast.rtt_us = Some(30.0);
    let topo = Topology {
        nodes: vec![
            node("a", 20, 1000.0),
            node("default", 20, 1000.0),
            node("measured", 20, 1000.0),
        ],
        links: vec![link("a", "default", LinkKind::Ethernet), fast],
    };
    let p = best(&topo, &card(), &auto()).unwrap();
    assert!(p.stages.iter().any(|s| s.node == "measured"), "{p:?}");
    assert!(!p.stages.iter().any(|s| s.node == "default"));
    assert!(
        p.explanation
            .contains("measured 30 µs rtt, measured 5 GB/s"),
        "{}",
        p.explanation
    );
}

#[test]
fn fewer_stages_win_when_memory_allows() {
    let nodes: Vec<NodeInfo> = (0..4).map(|i| node(&format!("n{i}"), 16, 1000.0)).collect();
    let mut links = Vec::new();
    for i in 0..4 {
        for j in i + 1..4 {
            links.push(link(&format!("n{i}"), &format!("n{j}"), LinkKind::Ethernet));
        }
    }
    let p = best(&Topology { nodes, links }, &card(), &auto()).unwrap();
    assert_eq!(p.stages.len(), 2);
}

#[test]
fn slow_single_node_loses_to_fast_pipeline() {
    let topo = Topology {
        nodes: vec![
            node("slow", 64, 10.0),
            node("f1", 16, 10_000.0),
            node("f2", 16, 10_000.0),
        ],
        links: vec![
            link("f1", "f2", LinkKind::Thunderbolt),
            link("slow", "f1", LinkKind::Ethernet),
        ],
    };
    let all = plan(&topo, &card(), &auto()).unwrap();
    assert_eq!(all[0].stages.len(), 2);
    assert!(all.iter().any(|p| counts(&p.stages) == [("slow", 30)]));
    assert!(
        all[0]
            .explanation
            .contains("single-node options predicted slower: slow (3000.0 ms/token)"),
        "{}",
        all[0].explanation
    );
    for pair in all.windows(2) {
        assert!(pair[0].predicted_token_latency_us <= pair[1].predicted_token_latency_us);
    }
}

#[test]
fn fast_single_node_beats_pipeline() {
    let topo = Topology {
        nodes: vec![node("x", 64, 1000.0), node("y", 64, 1000.0)],
        links: vec![link("x", "y", LinkKind::Thunderbolt)],
    };
    let all = plan(&topo, &card(), &auto()).unwrap();
    assert_eq!(all[0].stages.len(), 1);
    assert_eq!(all[1].stages.len(), 1);
    assert!(all.iter().any(|p| p.stages.len() == 2));
}

#[test]
fn unlinked_nodes_are_never_adjacent() {
    // a-c has no link: a chain must go a-b-c or c-b-a.
    let topo = Topology {
        nodes: vec![
            node("a", 12, 1000.0),
            node("b", 12, 1000.0),
            node("c", 12, 1000.0),
        ],
        links: vec![
            link("a", "b", LinkKind::Ethernet),
            link("b", "c", LinkKind::Ethernet),
        ],
    };
    let all = plan(&topo, &card(), &auto()).unwrap();
    for p in &all {
        assert_eq!(p.stages[1].node, "b", "{:?}", p.stages);
        assert!(p.explanation.contains("token returns"));
    }
}

#[test]
fn disconnected_nodes_with_enough_memory_is_no_route() {
    let topo = Topology {
        nodes: vec![node("a", 20, 1000.0), node("b", 20, 1000.0)],
        links: vec![],
    };
    let err = plan(&topo, &card(), &auto()).unwrap_err();
    assert_eq!(err.error_type(), "no_route");
}

#[test]
fn not_enough_memory_reports_numbers() {
    let topo = Topology {
        nodes: vec![node("a", 10, 1000.0), node("b", 12, 1000.0)],
        links: vec![link("a", "b", LinkKind::Ethernet)],
    };
    let err = plan(&topo, &card(), &auto()).unwrap_err();
    assert_eq!(
        err,
        PlacementError::DoesNotFit {
            needed: 30 * GB,
            available: 22 * GB
        }
    );
    assert!(err.to_string().contains("needs 30000000000 bytes"));
}

#[test]
fn kv_reserve_counts_against_memory() {
    let topo = Topology {
        nodes: vec![node("a", 32, 1000.0)],
        links: vec![],
    };
    let mut c = card();
    c.kv_bytes_per_token_per_layer = 50_000; // 2048 tokens → ~102 MB per layer
    assert!(best(&topo, &c, &auto()).is_ok());
    let err = best(&topo, &c, &Constraints::full_context(&c)).unwrap_err();
    assert_eq!(err.error_type(), "does_not_fit");
}

#[test]
fn embed_and_head_extras_land_on_first_and_last() {
    let topo = Topology {
        nodes: vec![node("a", 20, 1000.0), node("b", 20, 1000.0)],
        links: vec![link("a", "b", LinkKind::Ethernet)],
    };
    let mut c = card();
    c.n_layers = 36;
    c.embed_bytes = 4 * GB; // a usable 16, b usable 20 → 16:20 of 36 layers
    let p = best(&topo, &c, &auto()).unwrap();
    let cs = counts(&p.stages);
    assert!(
        cs == [("a", 16), ("b", 20)] || cs == [("b", 16), ("a", 20)],
        "{cs:?}"
    );
}

#[test]
fn max_stages_is_respected() {
    let topo = Topology {
        nodes: vec![
            node("a", 12, 1000.0),
            node("b", 12, 1000.0),
            node("c", 12, 1000.0),
        ],
        links: vec![
            link("a", "b", LinkKind::Ethernet),
            link("b", "c", LinkKind::Ethernet),
            link("a", "c", LinkKind::Ethernet),
        ],
    };
    let cons = Constraints {
        max_stages: Some(2),
        ..auto()
    };
    assert_eq!(
        plan(&topo, &card(), &cons).unwrap_err().error_type(),
        "does_not_fit"
    );
    let cons = Constraints {
        max_stages: Some(0),
        ..auto()
    };
    assert_eq!(
        plan(&topo, &card(), &cons).unwrap_err().error_type(),
        "invalid_constraints"
    );
}

#[test]
fn greedy_search_handles_many_nodes() {
    let nodes: Vec<NodeInfo> = (0..12)
        .map(|i| node(&format!("n{i:02}"), 4 + i, 1000.0))
        .collect();
    let mut links = Vec::new();
    for i in 0..12u64 {
        for j in i + 1..12 {
            let kind = if (i + j) % 3 == 0 {
                LinkKind::Thunderbolt
            } else {
                LinkKind::Wifi
            };
            links.push(link(&format!("n{i:02}"), &format!("n{j:02}"), kind));
        }
    }
    let topo = Topology { nodes, links };
    let all = plan(&topo, &card(), &auto()).unwrap();
    assert!(!all.is_empty() && all.len() <= shoal_placement::MAX_CANDIDATES);
    assert_eq!(all, plan(&topo, &card(), &auto()).unwrap());
}

#[test]
fn invalid_inputs_are_rejected() {
    let topo = Topology {
        nodes: vec![node("a", 64, 0.0)],
        links: vec![],
    };
    assert_eq!(
        plan(&topo, &card(), &auto()).unwrap_err().error_type(),
        "invalid_node"
    );
    let topo = Topology {
        nodes: vec![node("a", 64, 1.0), node("a", 64, 1.0)],
        links: vec![],
    };
    assert_eq!(
        plan(&topo, &card(), &auto()).unwrap_err().error_type(),
        "duplicate_node"
    );
    let topo = Topology::default();
    assert_eq!(
        plan(&topo, &card(), &auto()).unwrap_err(),
        PlacementError::NoNodes
    );
    let topo = Topology {
        nodes: vec![node("a", 64, 1.0)],
        links: vec![],
    };
    let mut c = card();
    c.n_layers = 0;
    assert_eq!(
        plan(&topo, &c, &auto()).unwrap_err().error_type(),
        "empty_model"
    );
}

/// The output head runs on the last stage: of two equal nodes, the one that runs it faster ends the
/// pipeline, and its prediction shows the head there only.
#[test]
fn the_last_stage_is_the_node_that_runs_the_head_fastest() {
    let mut c = card();
    c.head_bytes = 5 * GB;
    let mut slow_head = node("a", 20, 1000.0);
    slow_head.head_us = Some(50_000.0);
    let mut fast_head = node("b", 20, 1000.0);
    fast_head.head_us = Some(5_000.0);
    let topo = Topology {
        nodes: vec![slow_head, fast_head],
        links: vec![link("a", "b", LinkKind::Ethernet)],
    };
    let p = best(&topo, &c, &auto()).unwrap();
    assert_eq!(p.stages.last().map(|s| s.node.as_str()), Some("b"));
    let heads: Vec<f64> = p.prediction.stages.iter().map(|s| s.head_us).collect();
    assert_eq!(heads, [0.0, 5_000.0]);
    // 30 layers at 1 ms, the head 5 ms, one hop and the token back.
    let hops = p.prediction.hops[0].token_us + p.prediction.return_us;
    assert!((p.predicted_token_latency_us - (35_000.0 + hops)).abs() < 1e-6);
}
