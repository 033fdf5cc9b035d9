//! Moves without a network: a better node joins, the instance moves there make-before-break.

use std::time::{Duration, Instant};

use super::super::tests::{facts_of_test as facts, link_of_test as link};
use super::*;
use crate::facts::{InstanceLoad, InstanceStatus, NodeFacts};
use shoal_placement::LinkKind;

const SMALL: u64 = 200 << 20;

/// `a` (coordinator) and `b`, each too small to hold the model alone, linked over Wi-Fi.
fn small_pair() -> ClusterState {
    let node = |id: &str, peer: &str| {
        let mut f = facts(id, 1);
        f.memory.available = SMALL;
        let mut l = link(peer);
        l.kind = LinkKind::Wifi;
        f.links = vec![l];
        f
    };
    let mut s = ClusterState::new(node("a", "b"));
    s.peer_connected("b");
    s.on_facts(node("b", "a"));
    s
}

/// Publishes `facts` as a newer copy from its node (or as this node's own facts).
fn publish(s: &mut ClusterState, mut f: NodeFacts) {
    f.seq = s.facts_of(&f.id).map_or(1, |old| old.seq + 1);
    if f.id == s.me().id {
        *s.me_mut() = f;
    } else {
        s.on_facts(f);
    }
}

/// Node `node` reports `status` for instance `id`.
fn report(s: &mut ClusterState, node: &str, id: &str, status: InstanceStatus) {
    let mut f = s.facts_of(node).unwrap().clone();
    f.instances.insert(InstanceId::derived_from(id), status);
    publish(s, f);
}

/// Node `node` reports instance `id` running `running` requests.
fn report_load(s: &mut ClusterState, node: &str, id: &str, running: u32) {
    let mut f = s.facts_of(node).unwrap().clone();
    f.load.insert(
        InstanceId::derived_from(id),
        InstanceLoad {
            running,
            ..InstanceLoad::default()
        },
    );
    publish(s, f);
}

/// A big node `c` joins, linked to both.
fn join_big(s: &mut ClusterState) {
    s.peer_connected("c");
    let mut c = facts("c", 1);
    c.links = vec![link("a"), link("b")];
    s.on_facts(c);
}

fn auto() -> PlaceRequest {
    PlaceRequest::of("m".parse().unwrap())
}

fn ids(s: &ClusterState) -> Vec<InstanceId> {
    s.table().instances.iter().map(|i| i.id).collect()
}

#[test]
fn a_better_node_joining_moves_the_instance_make_before_break() {
    let mut s = small_pair();
    let old = s.place(&auto(), InstanceId::derived_from("old")).unwrap();
    assert_eq!(old.stages.len(), 2, "neither node holds the model alone");
    for n in ["a", "b"] {
        report(&mut s, n, "old", InstanceStatus::Ready);
    }
    assert!(
        !s.plan_moves(|| InstanceId::derived_from("x")),
        "nothing better yet"
    );

    join_big(&mut s);
    let mut next = 0;
    assert!(s.plan_moves(|| {
        next += 1;
        InstanceId::derived_from(&format!("new{next}"))
    }));
    let new = s
        .table()
        .instances
        .iter()
        .find(|i| i.id == InstanceId::derived_from("new1"))
        .unwrap()
        .clone();
    assert_eq!(new.stages.len(), 1);
    assert_eq!(new.stages[0].node, "c");
    assert!(new.predicted_token_latency_us < old.predicted_token_latency_us * (1.0 - MOVE_MARGIN));
    assert!(
        !s.plan_moves(|| InstanceId::derived_from("again")),
        "one move per model at a time"
    );

    // The new one loads: the old one keeps serving.
    let t0 = Instant::now();
    assert!(!s.advance_moves(t0));
    assert_eq!(s.view().instances[0].status, InstanceState::Ready);

    // Ready: the old one drains, still listed, while its driver reports requests running.
    report(&mut s, "c", "new1", InstanceStatus::Ready);
    report_load(&mut s, "a", "old", 2);
    assert!(s.advance_moves(t0));
    assert_eq!(s.view().instances[0].status, InstanceState::Draining);
    report_load(&mut s, "a", "old", 1);
    assert!(!s.advance_moves(t0 + Duration::from_secs(2)));
    assert_eq!(ids(&s), ["old", "new1"].map(InstanceId::derived_from));

    // Idle, reported after the drain began: it leaves, and the bookkeeping is swept.
    report_load(&mut s, "a", "old", 0);
    report_load(&mut s, "a", "old", 0);
    assert!(s.advance_moves(t0 + Duration::from_secs(3)));
    assert_eq!(ids(&s), ["new1"].map(InstanceId::derived_from));
    assert!(s.table().moves.is_empty() && s.table().draining.is_empty());
    assert_eq!(s.table().movable, ["new1"].map(InstanceId::derived_from));
}

#[test]
fn a_replacement_that_fails_is_dropped_and_the_old_instance_stays() {
    let mut s = small_pair();
    s.place(&auto(), InstanceId::derived_from("old")).unwrap();
    for n in ["a", "b"] {
        report(&mut s, n, "old", InstanceStatus::Ready);
    }
    join_big(&mut s);
    assert!(s.plan_moves(|| InstanceId::derived_from("new")));
    report(
        &mut s,
        "c",
        "new",
        InstanceStatus::Failed {
            error: "disk".into(),
        },
    );
    assert!(s.advance_moves(Instant::now()));
    assert_eq!(ids(&s), ["old"].map(InstanceId::derived_from));
    assert!(s.table().moves.is_empty());
    assert_eq!(s.view().instances[0].status, InstanceState::Ready);
}

#[test]
fn a_drain_without_load_reports_ends_after_its_limit() {
    let mut s = small_pair();
    s.place(&auto(), InstanceId::derived_from("old")).unwrap();
    for n in ["a", "b"] {
        report(&mut s, n, "old", InstanceStatus::Ready);
    }
    join_big(&mut s);
    assert!(s.plan_moves(|| InstanceId::derived_from("new")));
    report(&mut s, "c", "new", InstanceStatus::Ready);
    let t0 = Instant::now();
    assert!(s.advance_moves(t0));
    assert!(!s.advance_moves(t0 + DRAIN_UNREPORTED / 2));
    assert!(s.advance_moves(t0 + DRAIN_UNREPORTED));
    assert_eq!(ids(&s), ["new"].map(InstanceId::derived_from));

    // A driver that keeps reporting work is cut off at the hard limit.
    let mut s = small_pair();
    s.place(&auto(), InstanceId::derived_from("old")).unwrap();
    for n in ["a", "b"] {
        report(&mut s, n, "old", InstanceStatus::Ready);
    }
    join_big(&mut s);
    assert!(s.plan_moves(|| InstanceId::derived_from("new")));
    report(&mut s, "c", "new", InstanceStatus::Ready);
    report_load(&mut s, "a", "old", 3);
    assert!(s.advance_moves(t0));
    report_load(&mut s, "a", "old", 3);
    report_load(&mut s, "a", "old", 3);
    assert!(!s.advance_moves(t0 + DRAIN_LIMIT / 2));
    assert!(s.advance_moves(t0 + DRAIN_LIMIT));
    assert_eq!(ids(&s), ["new"].map(InstanceId::derived_from));
}

#[test]
fn pinned_instances_and_small_gains_never_move() {
    let mut s = small_pair();
    let pinned = PlaceRequest {
        nodes: Some(vec!["a".parse().unwrap(), "b".parse().unwrap()]),
        ..auto()
    };
    s.place(&pinned, InstanceId::derived_from("pinned"))
        .unwrap();
    for n in ["a", "b"] {
        report(&mut s, n, "pinned", InstanceStatus::Ready);
    }
    join_big(&mut s);
    assert!(
        !s.plan_moves(|| InstanceId::derived_from("x")),
        "the user's pins win"
    );

    // Over fast links the pipeline is within the margin of one node: no move.
    let mut s = ClusterState::new({
        let mut f = facts("a", 1);
        f.memory.available = SMALL;
        f.links = vec![link("b"), link("c")];
        f
    });
    s.peer_connected("b");
    let mut b = facts("b", 1);
    b.memory.available = SMALL;
    b.links = vec![link("a")];
    s.on_facts(b);
    s.place(&auto(), InstanceId::derived_from("old")).unwrap();
    for n in ["a", "b"] {
        report(&mut s, n, "old", InstanceStatus::Ready);
    }
    join_big(&mut s);
    assert!(
        !s.plan_moves(|| InstanceId::derived_from("x")),
        "ethernet hops cost less than the margin"
    );
}

/// The coordinator may be the node that joins (a member placed the instance before it knew it): the
/// member's table, of a version as new as the coordinator's, brings the instance in still movable, so a
/// better placement moves it.
#[test]
fn an_instance_placed_before_the_coordinator_joined_stays_movable() {
    // `b` alone places the model on itself (it is its own coordinator), automatically.
    let mut member = {
        let mut f = facts("b", 1);
        f.links = vec![link("a")];
        ClusterState::new(f)
    };
    member
        .place(&auto(), InstanceId::derived_from("old"))
        .unwrap();
    report(&mut member, "b", "old", InstanceStatus::Ready);
    assert_eq!(
        member.table().movable,
        ["old"].map(InstanceId::derived_from)
    );
    let theirs = member.table().clone();

    // `a` (four times faster, and the coordinator once they meet: the smaller id) placed a pinned
    // instance of its own: a table of the same version that lacks `old`.
    let mut coord = ClusterState::new({
        let mut f = facts("a", 1);
        f.speed *= 4.0;
        f.links = vec![link("b")];
        f
    });
    let pinned = PlaceRequest {
        nodes: Some(vec!["a".parse().unwrap()]),
        layers: Some(vec![30]),
        ..auto()
    };
    coord
        .place(&pinned, InstanceId::derived_from("pinned"))
        .unwrap();
    assert_eq!(coord.table().version, theirs.version);
    coord.peer_connected("b");
    coord.on_facts(member.me().clone());
    assert!(coord.is_coordinator());
    assert!(coord.on_table("b", theirs.clone()));
    assert_eq!(ids(&coord), ["pinned", "old"].map(InstanceId::derived_from));
    assert_eq!(coord.table().movable, ["old"].map(InstanceId::derived_from));
    assert!(coord.table().version > theirs.version);
    assert!(!coord.on_table("b", theirs), "nothing new: no new version");

    assert!(coord.plan_moves(|| InstanceId::derived_from("new")));
    let new = coord
        .table()
        .instances
        .iter()
        .find(|i| i.id == InstanceId::derived_from("new"))
        .unwrap();
    assert_eq!(new.stages[0].node, "a");
}
