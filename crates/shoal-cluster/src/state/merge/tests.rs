//! Tables meeting in every order: a member placed first, equal versions, a coordinator with a longer
//! history, coordinator changes, removals that must stay removed.

use super::super::tests::{facts_of_test as facts, link_of_test as link};
use super::*;
use crate::proto::PlaceRequest;

/// Node `id` alone (its own coordinator), linked to `peers` once they meet.
fn alone(id: &str, peers: &[&str]) -> ClusterState {
    let mut f = facts(id, 1);
    f.links = peers.iter().map(|p| link(p)).collect();
    ClusterState::new(f)
}

/// `s` meets `other`: connected, with its facts.
fn meet(s: &mut ClusterState, other: &ClusterState) {
    s.peer_connected(&other.me().id);
    s.on_facts(other.me().clone());
}

/// Places the whole model on `node` as instance `id` (pinned).
fn place_on(s: &mut ClusterState, node: &str, id: &str) {
    let req = PlaceRequest {
        nodes: Some(vec![node.parse().unwrap()]),
        layers: Some(vec![30]),
        ..PlaceRequest::of("m".parse().unwrap())
    };
    s.place(&req, InstanceId::derived_from(id)).unwrap();
}

/// The table's instance ids, sorted.
fn ids(s: &ClusterState) -> Vec<InstanceId> {
    let mut v: Vec<InstanceId> = s.table().instances.iter().map(|i| i.id).collect();
    v.sort_unstable();
    v
}

/// The ids of test instances named `names`, sorted as [`ids`] sorts.
fn named(names: &[&str]) -> Vec<InstanceId> {
    let mut v: Vec<InstanceId> = names.iter().map(|n| InstanceId::derived_from(n)).collect();
    v.sort_unstable();
    v
}

/// Each sends its table to the other until neither has news (four exchanges at most).
fn settle(x: &mut ClusterState, y: &mut ClusterState) {
    for _ in 0..4 {
        let from_x = x.on_table(&y.me().id.clone(), y.table().clone());
        let from_y = y.on_table(&x.me().id.clone(), x.table().clone());
        if !from_x && !from_y {
            return;
        }
    }
    panic!("tables did not settle: {:?} vs {:?}", x.table(), y.table());
}

#[test]
fn regression_a_member_adopting_a_table_of_the_same_version_keeps_its_own_instance() {
    // `b` placed its own instance as its own coordinator; `a` (smaller id: the coordinator once they
    // meet) did the same: both tables are at version 1.
    let mut a = alone("a", &["b"]);
    let mut b = alone("b", &["a"]);
    place_on(&mut a, "a", "a-own");
    place_on(&mut b, "b", "b-own");
    meet(&mut a, &b);
    meet(&mut b, &a);
    assert_eq!(a.table().version, b.table().version);

    // The coordinator's table reaches `b` first: `b` keeps its instance and offers its table back.
    assert!(b.on_table("a", a.table().clone()));
    assert_eq!(ids(&b), named(&["a-own", "b-own"]));
    assert!(a.on_table("b", b.table().clone()));
    assert_eq!(ids(&a), named(&["a-own", "b-own"]));
    assert!(!b.on_table("a", a.table().clone()), "nothing left to offer");
    assert_eq!(b.table(), a.table());
}

/// `a` has placed and removed instances for a while (version 3); `b` placed its own alone (1); they meet.
fn history_and_newcomer() -> (ClusterState, ClusterState) {
    let mut a = alone("a", &["b"]);
    place_on(&mut a, "a", "gone");
    a.remove(&InstanceId::derived_from("gone")).unwrap();
    place_on(&mut a, "a", "a-own");
    let mut b = alone("b", &["a"]);
    place_on(&mut b, "b", "b-own");
    meet(&mut a, &b);
    meet(&mut b, &a);
    assert!(a.table().version > b.table().version);
    (a, b)
}

#[test]
fn a_coordinator_with_a_longer_history_merges_a_joining_members_older_table() {
    // b's older table reaches the coordinator first: it never knew `b-own`, so it is not stale.
    let (mut a, mut b) = history_and_newcomer();
    assert!(a.on_table("b", b.table().clone()));
    assert_eq!(ids(&a), named(&["a-own", "b-own"]));
    settle(&mut a, &mut b);
    assert_eq!(ids(&b), named(&["a-own", "b-own"]));

    // The other order: the coordinator's newer table reaches the member first.
    let (mut a, mut b) = history_and_newcomer();
    assert!(b.on_table("a", a.table().clone()), "b offers what a lacks");
    assert_eq!(ids(&b), named(&["a-own", "b-own"]));
    assert_eq!(b.table().version, a.table().version);
    settle(&mut a, &mut b);
    assert_eq!(ids(&a), named(&["a-own", "b-own"]));
    assert_eq!(a.table(), b.table());
}

#[test]
fn a_member_placed_first_and_a_coordinator_joining_later_with_nothing_keeps_it() {
    let mut b = alone("b", &["a"]);
    place_on(&mut b, "b", "b-own");
    let mut a = alone("a", &["b"]);
    meet(&mut a, &b);
    meet(&mut b, &a);
    assert!(
        b.on_table("a", a.table().clone()),
        "an older table: b offers its own"
    );
    assert_eq!(ids(&b), named(&["b-own"]));
    assert!(a.on_table("b", b.table().clone()));
    assert_eq!(ids(&a), named(&["b-own"]));
    settle(&mut a, &mut b);
    assert_eq!(a.table(), b.table());
}

#[test]
fn a_removed_instance_stays_removed_whatever_table_comes_later() {
    let mut a = alone("a", &["b"]);
    let mut b = alone("b", &["a"]);
    meet(&mut a, &b);
    meet(&mut b, &a);
    place_on(&mut a, "b", "x");
    assert!(!b.on_table("a", a.table().clone()));
    let stale = b.table().clone();
    assert!(a.remove(&InstanceId::derived_from("x")).unwrap());
    assert_eq!(a.table().removed, ["x"].map(InstanceId::derived_from));

    // The member's stale table never brings it back to the coordinator...
    assert!(!a.on_table("b", stale.clone()));
    assert!(ids(&a).is_empty());
    // ...and the member drops it when the coordinator's table arrives.
    assert!(!b.on_table("a", a.table().clone()));
    assert!(ids(&b).is_empty());

    // A new coordinator that never heard of the removal takes `x` from a stale table, and loses it
    // again to the table that remembers the removal.
    let mut c = alone("0c", &["a", "b"]);
    meet(&mut c, &b);
    assert!(c.on_table("b", stale));
    assert_eq!(ids(&c), named(&["x"]));
    meet(&mut b, &c);
    assert!(b.on_table("0c", c.table().clone()), "b knows x was removed");
    assert!(ids(&b).is_empty());
    assert!(c.on_table("b", b.table().clone()));
    assert!(ids(&c).is_empty());
    assert_eq!(c.table().removed, ["x"].map(InstanceId::derived_from));
}

#[test]
fn when_the_coordinator_changes_no_instance_is_lost() {
    // `b` coordinates `b` and `c`; a node with a smaller id, `a`, joins with instances of its own.
    let mut b = alone("b", &["a", "c"]);
    let mut c = alone("c", &["a", "b"]);
    meet(&mut b, &c);
    meet(&mut c, &b);
    place_on(&mut b, "c", "on-c");
    place_on(&mut b, "b", "on-b");
    assert!(!c.on_table("b", b.table().clone()));
    let mut a = alone("a", &["b", "c"]);
    place_on(&mut a, "a", "on-a");
    for s in [&mut b, &mut c] {
        meet(s, &a);
    }
    meet(&mut a, &b);
    meet(&mut a, &c);
    assert!(a.is_coordinator() && !b.is_coordinator());

    // a's table (version 1, older than theirs) reaches the members: they offer theirs, it merges.
    assert!(b.on_table("a", a.table().clone()));
    assert!(c.on_table("a", a.table().clone()));
    assert!(a.on_table("c", c.table().clone()));
    assert_eq!(ids(&a), named(&["on-a", "on-b", "on-c"]));
    for s in [&mut b, &mut c] {
        assert!(!s.on_table("a", a.table().clone()));
        assert_eq!(ids(s), named(&["on-a", "on-b", "on-c"]));
    }
    assert!(!a.on_table("b", b.table().clone()), "b has nothing a lacks");
    // Tables from a member that is not the coordinator are not adopted by other members.
    assert!(!b.on_table("c", InstanceTable::default()));
    assert_eq!(ids(&b), named(&["on-a", "on-b", "on-c"]));
}

#[test]
fn a_move_in_progress_keeps_its_bookkeeping_through_a_merge_and_a_removal_clears_it() {
    let mut b = alone("b", &["a"]);
    place_on(&mut b, "b", "old");
    place_on(&mut b, "b", "new");
    b.mark_movable(&InstanceId::derived_from("new"));
    b.table.moves.push(crate::proto::Move {
        old: InstanceId::derived_from("old"),
        new: InstanceId::derived_from("new"),
    });
    b.table.draining.push(InstanceId::derived_from("old"));
    let mut a = alone("a", &["b"]);
    meet(&mut a, &b);
    assert!(a.on_table("b", b.table().clone()));
    assert_eq!(a.table().movable, named(&["new"]));
    assert_eq!(a.table().draining, named(&["old"]));
    assert_eq!(a.table().moves.len(), 1);
    assert!(a.remove(&InstanceId::derived_from("old")).unwrap());
    assert!(a.table().draining.is_empty() && a.table().moves.is_empty());
    assert_eq!(a.table().movable, named(&["new"]));
}

#[test]
fn a_table_remembers_the_last_removals_only() {
    let mut a = alone("a", &[]);
    for i in 0..REMEMBERED_REMOVALS + 5 {
        let id = format!("i{i}");
        place_on(&mut a, "a", &id);
        assert!(a.remove(&InstanceId::derived_from(&id)).unwrap());
    }
    let removed = &a.table().removed;
    assert_eq!(removed.len(), REMEMBERED_REMOVALS);
    assert_eq!(removed.first(), Some(&InstanceId::derived_from("i5")));
    assert_eq!(
        removed.last().copied(),
        Some(InstanceId::derived_from(&format!(
            "i{}",
            REMEMBERED_REMOVALS + 4
        )))
    );
}

/// `a`, `b` and `c` (every pair linked), coordinated by `a`, which placed `x` over the three (10 layers
/// each, `a` driving); every table holds it.
fn three_with_x() -> [ClusterState; 3] {
    three_with_x_over(["a", "b", "c"])
}

/// [`three_with_x`] with `x`'s stages on `order` (the first drives).
fn three_with_x_over(order: [&str; 3]) -> [ClusterState; 3] {
    use super::super::tests::cluster;
    let mut a = cluster("a", &["b", "c"]);
    let req = PlaceRequest {
        nodes: Some(order.map(|n| n.parse().unwrap()).to_vec()),
        layers: Some(vec![10, 10, 10]),
        ..PlaceRequest::of("m".parse().unwrap())
    };
    a.place(&req, InstanceId::derived_from("x")).unwrap();
    let mut b = cluster("b", &["a", "c"]);
    let mut c = cluster("c", &["a", "b"]);
    assert!(!b.on_table("a", a.table().clone()));
    assert!(!c.on_table("a", a.table().clone()));
    [a, b, c]
}

/// `s` loses `gone` and, as the coordinator of what is left, places again what used them.
fn lose(s: &mut ClusterState, gone: &[&str], new_id: &str) {
    for g in gone {
        s.peer_gone(g);
    }
    s.reconcile(|| InstanceId::derived_from(new_id));
}

/// Every state's table holds exactly `want`, the same records.
fn all_hold(states: &[&ClusterState], want: &[&str]) {
    for s in states {
        assert_eq!(
            ids(s),
            named(want),
            "{}'s table: {:?}",
            s.me().id,
            s.table()
        );
    }
    assert!(
        states
            .windows(2)
            .all(|w| w[0].table().instances == w[1].table().instances)
    );
}

#[test]
fn regression_a_healed_partition_keeps_one_re_placement_of_an_instance_the_one_its_driver_drives() {
    // c's link is cut: a and b place x again on themselves (x-ab, driven by a as x was); c, alone and its
    // own coordinator, places x again on itself (x-c). Before lineages both survived the heal: two
    // instances of the model, one nobody asked for.
    let [mut a, mut b, mut c] = three_with_x();
    lose(&mut a, &["c"], "x-ab");
    b.peer_gone("c");
    assert!(!b.on_table("a", a.table().clone()));
    lose(&mut c, &["a", "b"], "x-c");
    assert_eq!(ids(&a), named(&["x-ab"]));
    assert_eq!(ids(&c), named(&["x-c"]));
    let lineage = c.table().instances[0].lineage.clone().unwrap();
    assert_eq!(
        (lineage.origin, lineage.driver.as_str(), lineage.generation),
        (InstanceId::derived_from("x"), "a", 1)
    );

    // The link comes back; c's table reaches the coordinator first, or the coordinator's reaches c first.
    for c_first in [true, false] {
        let (mut a, mut b, mut c) = (a.clone(), b.clone(), c.clone());
        meet(&mut a, &c);
        meet(&mut b, &c);
        meet(&mut c, &a);
        meet(&mut c, &b);
        if c_first {
            a.on_table("c", c.table().clone());
            assert_eq!(
                ids(&a),
                named(&["x-ab"]),
                "the coordinator keeps the instance its driver drives"
            );
        }
        settle(&mut a, &mut c);
        settle(&mut a, &mut b);
        all_hold(&[&a, &b, &c], &["x-ab"]);
        assert!(a.table().removed.contains(&InstanceId::derived_from("x-c")));
    }
}

#[test]
fn regression_a_node_cut_off_alone_does_not_take_over_an_instance_of_the_others_when_it_returns() {
    // x runs on a and b; `0c` (the smallest id: the coordinator once back) has no part in it. Cut off
    // alone, 0c placed x again on itself and removed x. Before lineages, that removal reached a and b when
    // the link came back and took the healthy x from them.
    let [mut a, mut b, _] = three_with_x();
    let req = PlaceRequest {
        nodes: Some(["a", "b"].map(|n| n.parse().unwrap()).to_vec()),
        layers: Some(vec![15, 15]),
        ..PlaceRequest::of("m".parse().unwrap())
    };
    a.remove(&InstanceId::derived_from("x")).unwrap();
    a.place(&req, InstanceId::derived_from("y")).unwrap();
    assert!(!b.on_table("a", a.table().clone()));
    let mut c = alone("0c", &["a", "b"]);
    meet(&mut c, &a);
    meet(&mut c, &b);
    assert!(c.on_table("a", a.table().clone()));
    assert_eq!(ids(&c), named(&["y"]));
    lose(&mut c, &["a", "b"], "y-c");
    assert_eq!(ids(&c), named(&["y-c"]));

    for (s, other) in [(&mut a, &c), (&mut b, &c)] {
        meet(s, other);
    }
    meet(&mut c, &a);
    meet(&mut c, &b);
    assert!(c.is_coordinator());
    assert!(
        b.on_table("0c", c.table().clone()),
        "b offers the y it keeps"
    );
    assert!(c.on_table("b", b.table().clone()));
    assert_eq!(
        ids(&c),
        named(&["y"]),
        "the coordinator keeps y, driven by its own driver"
    );
    settle(&mut c, &mut a);
    settle(&mut c, &mut b);
    all_hold(&[&a, &b, &c], &["y"]);
}

#[test]
fn a_stale_table_naming_an_instance_placed_again_does_not_bring_it_back_when_its_node_returns() {
    // c dies: a places x again on a and b (x-ab). c restarts (a member again, all of x's nodes live) while
    // b's table from before is still on its way: x stays removed; x-ab is the later re-placement.
    let [mut a, b, c] = three_with_x();
    let stale = b.table().clone();
    lose(&mut a, &["c"], "x-ab");
    meet(&mut a, &c);
    assert!(!a.on_table("b", stale));
    assert_eq!(ids(&a), named(&["x-ab"]));
    // A user's removal of the re-placement is a removal like any other.
    assert!(a.remove(&InstanceId::derived_from("x-ab")).unwrap());
    let mut b = b;
    b.peer_gone("c");
    assert!(!b.on_table("a", a.table().clone()));
    assert!(ids(&b).is_empty() && ids(&a).is_empty());
}

#[test]
fn regression_a_table_that_arrives_before_its_senders_facts_does_not_remove_the_drivers_re_placement()
 {
    // A 1 s link cut in the lab: nodes dropped each other at different moments. `a` (the smallest id)
    // placed again, while b was out of its sight, b's own re-placement of x (x-b, driven by b as x was)
    // on itself and c (x-a, removing x-b). b, the driver, got a's table before a's facts: a was not yet
    // a member, so x-a looked dead, and its removal of x-b was applied — the driver lost the instance
    // its streams were waiting for, and they ended.
    let [_, mut b, mut c] = three_with_x_over(["b", "c", "a"]);
    b.peer_gone("a");
    c.peer_gone("a");
    lose(&mut b, &[], "x-b");
    assert_eq!(ids(&b), named(&["x-b"]));
    assert_eq!(
        b.table().instances[0].driver().map(|d| d.as_str()),
        Some("b")
    );
    assert!(!c.on_table("b", b.table().clone()));
    let mut a = alone("a", &["b", "c"]);
    meet(&mut a, &c);
    assert!(a.on_table("c", c.table().clone()));
    lose(&mut a, &["b"], "x-a");
    assert_eq!(ids(&a), named(&["x-a"]));
    assert!(a.table().removed.contains(&InstanceId::derived_from("x-b")));

    b.peer_connected("a");
    b.on_table("a", a.table().clone());
    assert_eq!(
        ids(&b),
        named(&["x-b"]),
        "the driver keeps its re-placement"
    );
    b.on_facts(a.me().clone());
    meet(&mut a, &b);
    settle(&mut a, &mut b);
    settle(&mut a, &mut c);
    all_hold(&[&a, &b, &c], &["x-b"]);
}

#[test]
fn regression_a_member_whose_view_lags_keeps_the_coordinators_instance_and_the_coordinator_decides()
{
    // x over b (driving), c and a; c slept and, alone, placed x again on itself (x-c). Back, c gets the
    // coordinator a's table before b's facts: x looks dead to it, x-c live. It used to drop x there and
    // then, which unloaded its stage of x under the driver (64 streams: a wedged pipeline).
    let [mut a, b, mut c] = three_with_x_over(["b", "c", "a"]);
    lose(&mut c, &["a", "b"], "x-c");
    assert_eq!(ids(&c), named(&["x-c"]));
    // Meanwhile the coordinator's table moved on (a newer version than c's).
    place_on(&mut a, "a", "other");
    a.remove(&InstanceId::derived_from("other")).unwrap();
    assert!(a.table().version > c.table().version);
    c.peer_connected("a");
    c.on_facts(a.me().clone());
    assert!(c.on_table("a", a.table().clone()), "c offers its x-c back");
    assert_eq!(ids(&c), named(&["x", "x-c"]), "c keeps the coordinator's x");
    let mut b = b;
    meet(&mut c, &b);
    meet(&mut a, &c);
    meet(&mut b, &c);
    a.on_table("c", c.table().clone());
    assert_eq!(
        ids(&a),
        named(&["x"]),
        "the coordinator keeps x, driven by its own driver"
    );
    settle(&mut a, &mut c);
    settle(&mut a, &mut b);
    all_hold(&[&a, &b, &c], &["x"]);
}
