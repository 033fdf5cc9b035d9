//! Manual control: pinned nodes and per-node layer counts.

mod common;

use common::{GB, card, node};

/// A link with a measured round trip.
fn link(a: &str, b: &str, kind: LinkKind) -> Link {
    Link {
        rtt_us: Some(48.0),
        ..common::link(a, b, kind)
    }
}
use shoal_placement::{Constraints, Link, LinkKind, PlacementError, Topology, best, plan};

/// a (64 GB) could run everything alone; b and c are small. Full mesh except b–c.
fn topo() -> Topology {
    Topology {
        nodes: vec![
            node("a", 64, 1000.0),
            node("b", 16, 1000.0),
            node("c", 16, 1000.0),
        ],
        links: vec![
            link("a", "b", LinkKind::Thunderbolt),
            link("a", "c", LinkKind::Ethernet),
        ],
    }
}

fn pinned(ids: &[&str], keep_order: bool) -> Constraints {
    Constraints {
        pinned_nodes: Some(ids.iter().map(|s| s.parse().unwrap()).collect()),
        keep_order,
        ..Constraints::default()
    }
}

fn layer_counts(list: &[(&str, usize)]) -> Constraints {
    Constraints {
        layer_counts: Some(list.iter().map(|(n, c)| (n.parse().unwrap(), *c)).collect()),
        ..Constraints::default()
    }
}

fn nodes_of(p: &shoal_placement::Placement) -> Vec<&str> {
    p.stages.iter().map(|s| s.node.as_str()).collect()
}

#[test]
fn pinned_nodes_are_used_even_when_one_would_do() {
    let all = plan(&topo(), &card(), &pinned(&["b", "a"], false)).unwrap();
    for p in &all {
        let mut n = nodes_of(p);
        n.sort();
        assert_eq!(n, ["a", "b"]);
        assert!(
            p.explanation.starts_with("pinned nodes; 2 stages"),
            "{}",
            p.explanation
        );
    }
    // a holds 64/(64+16) of the layers whichever order is best.
    let first = &all[0];
    let a = first.stages.iter().find(|s| s.node == "a").unwrap();
    assert_eq!(a.layers(), 24);
    assert!(
        first.explanation.contains("measured 48 µs rtt"),
        "{}",
        first.explanation
    );
}

#[test]
fn pinned_order_is_kept() {
    let p = best(&topo(), &card(), &pinned(&["b", "a"], true)).unwrap();
    assert_eq!(nodes_of(&p), ["b", "a"]);
    assert_eq!(p.stages[0].layers(), 6);
    assert_eq!(
        plan(&topo(), &card(), &pinned(&["b", "a"], true))
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn pinned_order_without_link_is_rejected() {
    let err = best(&topo(), &card(), &pinned(&["b", "c", "a"], true)).unwrap_err();
    assert_eq!(
        err,
        PlacementError::NoLink {
            a: "b".parse().unwrap(),
            b: "c".parse().unwrap()
        }
    );
    // Without keep_order the planner finds b-a-c.
    let p = best(&topo(), &card(), &pinned(&["b", "c", "a"], false)).unwrap();
    assert_eq!(nodes_of(&p)[1], "a");
}

#[test]
fn pinned_errors_are_clear() {
    let err = best(&topo(), &card(), &pinned(&["a", "zz"], false)).unwrap_err();
    assert_eq!(
        err,
        PlacementError::UnknownNode {
            node: "zz".parse().unwrap(),
            field: "pinned_nodes"
        }
    );
    let err = best(&topo(), &card(), &pinned(&["a", "a"], false)).unwrap_err();
    assert_eq!(err.error_type(), "duplicate_node");
    let err = best(&topo(), &card(), &pinned(&[], false)).unwrap_err();
    assert_eq!(err.error_type(), "invalid_constraints");
    let err = best(&topo(), &card(), &pinned(&["b"], false)).unwrap_err();
    assert_eq!(
        err,
        PlacementError::DoesNotFit {
            needed: 30 * GB,
            available: 16 * GB
        }
    );
    let mut cons = pinned(&["a", "b"], false);
    cons.max_stages = Some(1);
    assert_eq!(
        best(&topo(), &card(), &cons).unwrap_err(),
        PlacementError::TooManyStages {
            requested: 2,
            max: 1
        }
    );
}

#[test]
fn layer_counts_are_respected() {
    let p = best(&topo(), &card(), &layer_counts(&[("c", 5), ("a", 25)])).unwrap();
    let got: Vec<(&str, usize, usize)> = p
        .stages
        .iter()
        .map(|s| (s.node.as_str(), s.start, s.end))
        .collect();
    assert_eq!(got, [("c", 0, 5), ("a", 5, 30)]);
    assert!(
        p.explanation
            .starts_with("manual layer counts; 2 stages: c layers 0–4 (5 layers"),
        "{}",
        p.explanation
    );
    assert!(p.explanation.contains("over ethernet"));
}

#[test]
fn invalid_layer_counts_give_clear_errors() {
    let sum = best(&topo(), &card(), &layer_counts(&[("a", 10), ("b", 10)])).unwrap_err();
    assert_eq!(
        sum,
        PlacementError::LayerCountSum {
            sum: 20,
            n_layers: 30
        }
    );
    assert_eq!(
        sum.to_string(),
        "layer counts sum to 20 but the model has 30 layers"
    );

    let unknown = best(&topo(), &card(), &layer_counts(&[("a", 10), ("x", 20)])).unwrap_err();
    assert_eq!(
        unknown,
        PlacementError::UnknownNode {
            node: "x".parse().unwrap(),
            field: "layer_counts"
        }
    );

    let zero = best(&topo(), &card(), &layer_counts(&[("a", 30), ("b", 0)])).unwrap_err();
    assert_eq!(
        zero,
        PlacementError::ZeroLayers {
            node: "b".parse().unwrap()
        }
    );

    let dup = best(&topo(), &card(), &layer_counts(&[("a", 10), ("a", 20)])).unwrap_err();
    assert_eq!(dup.error_type(), "duplicate_node");

    let empty = best(&topo(), &card(), &layer_counts(&[])).unwrap_err();
    assert_eq!(empty.error_type(), "invalid_constraints");

    let too_big = best(&topo(), &card(), &layer_counts(&[("b", 20), ("a", 10)])).unwrap_err();
    assert_eq!(
        too_big,
        PlacementError::NodeDoesNotFit {
            node: "b".parse().unwrap(),
            needed: 20 * GB,
            available: 16 * GB
        }
    );

    let no_link = best(
        &topo(),
        &card(),
        &layer_counts(&[("b", 10), ("c", 10), ("a", 10)]),
    )
    .unwrap_err();
    assert_eq!(
        no_link,
        PlacementError::NoLink {
            a: "b".parse().unwrap(),
            b: "c".parse().unwrap()
        }
    );
}

#[test]
fn layer_counts_must_agree_with_pins() {
    let mut cons = layer_counts(&[("a", 20), ("b", 10)]);
    cons.pinned_nodes = Some(vec!["a".parse().unwrap(), "c".parse().unwrap()]);
    assert_eq!(
        best(&topo(), &card(), &cons).unwrap_err().error_type(),
        "invalid_constraints"
    );
    cons.pinned_nodes = Some(vec!["b".parse().unwrap(), "a".parse().unwrap()]);
    assert!(best(&topo(), &card(), &cons).is_ok());
    cons.keep_order = true;
    assert_eq!(
        best(&topo(), &card(), &cons).unwrap_err().error_type(),
        "invalid_constraints"
    );
}

#[test]
fn layer_counts_respect_max_stages() {
    let mut cons = layer_counts(&[("a", 20), ("b", 10)]);
    cons.max_stages = Some(1);
    assert_eq!(
        best(&topo(), &card(), &cons).unwrap_err(),
        PlacementError::TooManyStages {
            requested: 2,
            max: 1
        }
    );
}
