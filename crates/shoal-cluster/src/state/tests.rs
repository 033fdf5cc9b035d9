//! Tests of the cluster state: membership, facts, the instance table and placement on members.

use super::*;
use crate::facts::{LinkFacts, MemoryFacts};
use shoal_placement::LinkKind;

fn card() -> ModelCard {
    ModelCard {
        id: "m".parse().unwrap(),
        n_layers: 30,
        layer_bytes: 2_000_000,
        embed_bytes: 10_000_000,
        head_bytes: 10_000_000,
        active_head_bytes: 0,
        kv_bytes_per_token_per_layer: 1536,
        context_length: 8192,
        hidden_bytes_per_token: 1152,
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

pub(super) fn facts_of_test(id: &str, seq: u64) -> NodeFacts {
    facts(id, seq)
}

pub(super) fn link_of_test(peer: &str) -> LinkFacts {
    link(peer)
}

fn facts(id: &str, seq: u64) -> NodeFacts {
    NodeFacts {
        id: id.parse().unwrap(),
        name: id.into(),
        api_url: None,
        addrs: vec![],
        memory: MemoryFacts {
            total: 8 << 30,
            available: 4 << 30,
            pressure: 0.1,
            used: 0.5,
        },
        cpu_cores: 2,
        cpu_load: None,
        temperature_c: None,
        power_w: None,
        cpu_model: String::new(),
        machine: None,
        core_kinds: None,
        thermal: None,
        accelerator: "cpu".into(),
        gpus: Vec::new(),
        device: Default::default(),
        backend: "cpu".into(),
        speed: 5000.0,
        compute: Default::default(),
        models: vec![card()],
        links: vec![],
        instances: BTreeMap::new(),
        kv_capacity: BTreeMap::new(),
        downloads: Vec::new(),
        removed: Vec::new(),
        load: Default::default(),
        table_version: 0,
        seq,
        started: 1,
    }
}

fn link(peer: &str) -> LinkFacts {
    LinkFacts {
        peer: peer.parse().unwrap(),
        kind: LinkKind::Ethernet,
        rtt_us: None,
        bandwidth_bps: None,
        tx_bytes_per_s: 0.0,
        rx_bytes_per_s: 0.0,
        tx_bytes: 0,
        rx_bytes: 0,
        paths: Vec::new(),
    }
}

/// `me` and `peers`, every pair linked.
pub(super) fn cluster(me: &str, peers: &[&str]) -> ClusterState {
    let all: Vec<&str> = std::iter::once(me).chain(peers.iter().copied()).collect();
    let linked = |id: &str, seq| {
        let mut f = facts(id, seq);
        f.links = all.iter().filter(|x| **x != id).map(|x| link(x)).collect();
        f
    };
    let mut s = ClusterState::new(linked(me, 1));
    for p in peers {
        s.peer_connected(p);
        s.on_facts(linked(p, 1));
    }
    s
}

fn manual(nodes: &[&str], layers: &[usize]) -> PlaceRequest {
    PlaceRequest {
        nodes: Some(nodes.iter().map(|s| s.parse().unwrap()).collect()),
        layers: Some(layers.to_vec()),
        ..PlaceRequest::of("m".parse().unwrap())
    }
}

#[test]
fn members_need_facts_and_the_smallest_id_coordinates() {
    let mut s = ClusterState::new(facts("b", 1));
    s.peer_connected("a");
    assert_eq!(
        s.members(),
        ["b"],
        "a connection without facts is not a member"
    );
    assert!(s.is_coordinator());
    assert!(s.on_facts(facts("a", 1)), "first facts = joined");
    assert_eq!(s.members(), ["a", "b"]);
    assert_eq!(s.coordinator(), "a");
    assert!(!s.on_facts(facts("a", 2)));
    assert!(s.peer_gone("a"));
    assert!(s.is_coordinator());
    assert!(
        !s.on_facts(facts("a", 3)),
        "facts of a gone peer are ignored"
    );
    assert_eq!(s.members(), ["b"]);
}

#[test]
fn older_facts_never_replace_newer_ones_but_a_restart_does() {
    let mut s = cluster("a", &["b"]);
    s.on_facts(facts("b", 5));
    s.on_facts(facts("b", 3));
    assert_eq!(s.facts_of("b").unwrap().seq, 5);
    let mut restarted = facts("b", 1);
    restarted.started = 2;
    s.on_facts(restarted);
    assert_eq!(s.facts_of("b").unwrap().seq, 1);
}

#[test]
fn manual_placement_and_removal_bump_the_version() {
    let mut s = cluster("a", &["b", "c"]);
    let r = s
        .place(
            &manual(&["a", "b", "c"], &[10, 10, 10]),
            InstanceId::derived_from("i1"),
        )
        .unwrap();
    let got: Vec<(&str, usize, usize)> = r
        .stages
        .iter()
        .map(|x| (x.node.as_str(), x.start, x.end))
        .collect();
    assert_eq!(got, [("a", 0, 10), ("b", 10, 20), ("c", 20, 30)]);
    assert_eq!(r.driver().map(|d| d.as_str()), Some("a"));
    assert_eq!(s.table().version, 1);
    assert!(s.remove(&InstanceId::derived_from("i1")).unwrap());
    assert!(!s.remove(&InstanceId::derived_from("i1")).unwrap());
    assert_eq!(s.table().version, 2);
}

#[test]
fn only_the_coordinator_places() {
    let mut s = cluster("b", &["a"]);
    let err = s
        .place(
            &manual(&["a", "b"], &[15, 15]),
            InstanceId::derived_from("x"),
        )
        .unwrap_err();
    assert!(
        matches!(&err, ClusterError::NotCoordinator { coordinator } if coordinator == "a"),
        "{err}"
    );
    assert!(err.to_string().contains("a is the coordinator"), "{err}");
}

#[test]
fn bad_manual_requests_are_explained() {
    let s = cluster("a", &["b"]);
    let mut req = manual(&["a", "b"], &[10]);
    let err = s.previews(&req).unwrap_err();
    assert_eq!(
        err,
        PlaceError::LayerCounts {
            counts: 1,
            nodes: 2
        }
    );
    assert!(err.to_string().contains("1 counts for 2 nodes"));
    req.nodes = None;
    let err = s.previews(&req).unwrap_err();
    assert_eq!(err, PlaceError::LayersWithoutNodes);
    assert!(err.to_string().contains("needs 'nodes'"));
    let unknown = PlaceRequest::of("nope".parse().unwrap());
    let err = s.previews(&unknown).unwrap_err();
    assert!(matches!(err, PlaceError::UnknownModel { .. }));
    assert!(err.to_string().contains("no member has model"));
}

#[test]
fn a_node_leaving_re_places_its_instances_on_the_rest() {
    let mut s = cluster("a", &["b", "c"]);
    s.place(
        &manual(&["a", "b", "c"], &[10, 10, 10]),
        InstanceId::derived_from("i1"),
    )
    .unwrap();
    assert!(
        !s.reconcile(|| unreachable!()),
        "nothing to do while all are members"
    );
    s.peer_gone("c");
    assert!(s.reconcile(|| InstanceId::derived_from("i2")));
    let t = s.table();
    assert_eq!(t.instances.len(), 1);
    let inst = &t.instances[0];
    assert_eq!(inst.id, InstanceId::derived_from("i2"));
    assert_eq!(
        inst.driver().map(|d| d.as_str()),
        Some("a"),
        "the old driver keeps the instance"
    );
    assert!(inst.stages.iter().all(|st| st.node != "c"));
    assert_eq!(inst.stages.last().unwrap().end, 30);
}

#[test]
fn members_adopt_the_coordinators_table_and_the_coordinator_merges_newer_ones() {
    let mut member = cluster("b", &["a"]);
    let table = InstanceTable {
        version: 7,
        ..InstanceTable::default()
    };
    assert!(!member.on_table("a", table.clone()));
    assert_eq!(member.table().version, 7);
    assert!(
        !member.on_table("c", InstanceTable::default()),
        "not from the coordinator"
    );
    assert_eq!(member.table().version, 7);
    // A new coordinator with an older table is not adopted: the member offers its own instead.
    assert!(member.on_table("a", InstanceTable::default()));
    assert_eq!(member.table().version, 7);

    let mut coord = cluster("a", &["b"]);
    coord
        .place(&manual(&["a"], &[30]), InstanceId::derived_from("mine"))
        .unwrap();
    let mut theirs = InstanceTable {
        version: 4,
        ..InstanceTable::default()
    };
    theirs.instances.push(InstanceRecord {
        id: InstanceId::derived_from("theirs"),
        model: "m".parse().unwrap(),
        stages: vec![],
        predicted_token_latency_us: 0.0,
        explanation: String::new(),
        prediction: Default::default(),
        lineage: None,
    });
    assert!(coord.on_table("b", theirs));
    let ids: Vec<InstanceId> = coord.table().instances.iter().map(|i| i.id).collect();
    assert_eq!(ids, ["mine", "theirs"].map(InstanceId::derived_from));
    assert_eq!(coord.table().version, 5);
}

#[test]
fn links_are_one_per_pair_and_only_between_members() {
    let mut s = cluster("a", &["b"]);
    let link = |peer: &str, rtt| LinkFacts {
        rtt_us: Some(rtt),
        ..link(peer)
    };
    s.me_mut().links = vec![link("b", 100.0), link("ghost", 1.0)];
    let mut b = facts("b", 2);
    b.links = vec![link("a", 300.0)];
    s.on_facts(b);
    let links = s.links();
    assert_eq!(links.len(), 1);
    assert_eq!((links[0].a.as_str(), links[0].b.as_str()), ("a", "b"));
    assert_eq!(
        links[0].rtt_us,
        Some(100.0),
        "the smaller id's measurement wins"
    );
}

#[test]
fn view_reports_instance_status_from_each_stage_node() {
    let mut s = cluster("a", &["b"]);
    s.place(
        &manual(&["a", "b"], &[15, 15]),
        InstanceId::derived_from("i"),
    )
    .unwrap();
    assert_eq!(s.view().instances[0].status, InstanceState::Loading);
    assert!(s.view().instances[0].is_loading());
    s.me_mut()
        .instances
        .insert(InstanceId::derived_from("i"), InstanceStatus::Ready);
    let mut b = facts("b", 2);
    b.instances
        .insert(InstanceId::derived_from("i"), InstanceStatus::Ready);
    s.on_facts(b);
    assert_eq!(s.view().instances[0].status, InstanceState::Ready);
    assert!(s.view().instances[0].is_ready());
    let mut b = facts("b", 3);
    b.instances.insert(
        InstanceId::derived_from("i"),
        InstanceStatus::Failed {
            error: "oom".into(),
        },
    );
    s.on_facts(b);
    assert_eq!(s.view().instances[0].status, InstanceState::Failed);
    assert!(s.view().instances[0].is_failed());
    let json = serde_json::to_value(&s.view().instances[0]).unwrap();
    assert_eq!(json["status"], "failed", "a plain string in GET /state");
    assert_eq!(json["stage_status"][0]["state"], "ready");
    assert_eq!(s.view().instances_of("m").count(), 1);
    assert_eq!(s.view().instances_of("other").count(), 0);
}

#[test]
fn a_node_without_the_model_is_used_when_pinned_or_when_the_holders_cannot_hold_it() {
    let mut s = cluster("a", &["b"]);
    let mut b = s.facts_of("b").unwrap().clone();
    b.models.clear();
    b.seq += 1;
    s.on_facts(b);
    let auto = PlaceRequest::of("m".parse().unwrap());
    let placed = s.place(&auto, InstanceId::derived_from("i1")).unwrap();
    assert!(
        placed.stages.iter().all(|st| st.node == "a"),
        "auto placement stays on the node that has the model: {placed:?}"
    );
    let pinned = PlaceRequest {
        nodes: Some(vec!["b".parse().unwrap()]),
        ..PlaceRequest::of("m".parse().unwrap())
    };
    let placed = s.place(&pinned, InstanceId::derived_from("i2")).unwrap();
    assert_eq!(placed.stages.len(), 1);
    assert_eq!(
        placed.stages[0].node, "b",
        "a pinned node fetches the model"
    );

    // The only holder has too little memory: the node without the model takes part.
    s.me_mut().memory.available = 30_000_000;
    let placed = s.place(&auto, InstanceId::derived_from("i3")).unwrap();
    assert!(
        placed.stages.iter().any(|st| st.node == "b"),
        "the lacking node joins when the holders cannot hold the model: {placed:?}"
    );

    // No member has the model at all: unknown.
    let none = PlaceRequest::of("other".parse().unwrap());
    assert!(matches!(
        s.previews(&none),
        Err(PlaceError::UnknownModel { .. })
    ));
}

/// A card of `layers` layers of `layer_mib` MiB (1 MiB of KV per layer at the default reserve), with
/// 10 MiB of embeddings and 10 MiB of head.
fn sized_card(id: &str, layers: usize, layer_mib: u64) -> ModelCard {
    ModelCard {
        id: id.parse().unwrap(),
        n_layers: layers,
        layer_bytes: layer_mib << 20,
        embed_bytes: 10 << 20,
        head_bytes: 10 << 20,
        active_head_bytes: 0,
        kv_bytes_per_token_per_layer: 256,
        context_length: DEFAULT_KV_RESERVE_TOKENS,
        ..card()
    }
}

fn auto(model: &str) -> PlaceRequest {
    PlaceRequest::of(model.parse().unwrap())
}

const MIB: u64 = 1 << 20;

/// One node of 8 GiB (7 GiB available) with three models: `big` (3 GiB and 20 MiB of weights, 10 MiB
/// of KV), `small` (1 GiB and 20 MiB, 4 MiB of KV) and `big2` (as `big`).
fn one_node_three_models() -> ClusterState {
    let mut s = cluster("a", &[]);
    let me = s.me_mut();
    me.memory.available = 7 << 30;
    me.models = vec![
        sized_card("big", 10, 300),
        sized_card("small", 4, 256),
        sized_card("big2", 10, 300),
    ];
    s
}

#[test]
fn a_second_model_is_offered_what_the_first_leaves() {
    let mut s = one_node_three_models();
    let total = 8u64 << 30;
    let reserve = os_reserve(total);
    assert_eq!(reserve, total / 10);
    let fresh = s.topology("small", false).0;
    assert_eq!(fresh.nodes[0].mem_available, 7 << 30, "nothing hosted yet");

    s.place(&auto("big"), InstanceId::derived_from("b1"))
        .unwrap();
    let (weights, full) = ((3000 + 20) * MIB, (3000 + 20 + 10) * MIB);
    assert_eq!(
        s.hosted("a"),
        Hosted {
            bytes: full,
            pending: weights,
            gpu: 0
        }
    );
    // Loading: its weights are not in memory yet, so they come off what is available.
    let offered = |s: &ClusterState| s.topology("small", false).0.nodes[0].mem_available;
    assert_eq!(offered(&s), (7 << 30) - weights);
    // Loaded, with the OS not showing it (KV not touched, or memory measured before): the table's
    // full size still comes off the total.
    s.me_mut()
        .instances
        .insert(InstanceId::derived_from("b1"), InstanceStatus::Ready);
    assert_eq!(s.hosted("a").pending, 0);
    assert_eq!(offered(&s), total - full - reserve);
    // Loaded and seen by the OS: never counted twice.
    s.me_mut().memory.available = (7 << 30) - weights;
    assert_eq!(offered(&s), (7 << 30) - weights);

    // The second model goes in what is left, on the same node.
    let small = s
        .place(&auto("small"), InstanceId::derived_from("s1"))
        .unwrap();
    assert!(small.stages.iter().all(|st| st.node == "a"), "{small:?}");
    let hosted = s.hosted("a");
    assert_eq!(hosted.bytes, full + (1024 + 20 + 4) * MIB);
    assert_eq!(hosted.pending, (1024 + 20) * MIB, "small is still loading");
}

#[test]
fn a_model_that_does_not_fit_names_what_it_would_evict() {
    let mut s = one_node_three_models();
    s.place(&auto("big"), InstanceId::derived_from("b1"))
        .unwrap();
    s.place(&auto("small"), InstanceId::derived_from("s1"))
        .unwrap();
    // big2 needs 3030 MiB: with 5 GiB available and both instances still loading (4064 MiB of
    // weights to come), 1056 MiB are offered; without b1, 4076 MiB.
    s.me_mut().memory.available = 5 << 30;
    let err = s
        .place(&auto("big2"), InstanceId::derived_from("x"))
        .unwrap_err();
    let ClusterError::Place(PlaceError::NeedsEviction {
        model,
        instances,
        reason,
    }) = &err
    else {
        panic!("not an eviction: {err}");
    };
    assert_eq!(model, "big2");
    assert_eq!(
        instances,
        &[format!("{} (big)", InstanceId::derived_from("b1"))],
        "the one large enough suffices"
    );
    assert!(matches!(**reason, PlaceError::Plan(_)), "{reason}");
    let text = err.to_string();
    assert!(
        text.contains("'big2' does not fit beside the instances already placed")
            && text.contains(&format!(
                "it would fit after removing {} (big)",
                InstanceId::derived_from("b1")
            )),
        "{text}"
    );
    assert_eq!(err.error_type(), "placement");
    assert_eq!(
        PlaceError::NeedsEviction {
            model: model.clone(),
            instances: instances.clone(),
            reason: reason.clone()
        }
        .error_type(),
        "needs_eviction"
    );
    assert_eq!(s.table().instances.len(), 2, "nothing placed");

    // When only removing both would do, both are named (largest first).
    s.me_mut().memory.available = 3500 * MIB;
    let err = s
        .place(&auto("big2"), InstanceId::derived_from("x"))
        .unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "it would fit after removing {} (big), {} (small)",
            InstanceId::derived_from("b1"),
            InstanceId::derived_from("s1")
        )),
        "{err}"
    );

    // A model too big for the empty machine: the planner's error as it is.
    s.me_mut().models.push(sized_card("huge", 40, 300));
    let err = s
        .place(&auto("huge"), InstanceId::derived_from("x"))
        .unwrap_err();
    assert!(
        matches!(&err, ClusterError::Place(PlaceError::Plan(_))),
        "{err}"
    );
}

#[test]
fn a_split_instance_takes_its_own_stage_on_each_node() {
    let mut s = cluster("a", &["b"]);
    for id in ["a", "b"] {
        let mut f = s.facts_of(id).unwrap().clone();
        f.models = vec![sized_card("big", 10, 300)];
        f.seq += 1;
        if id == "a" {
            *s.me_mut() = f;
        } else {
            s.on_facts(f);
        }
    }
    let mut req = auto("big");
    req.nodes = Some(vec!["a".parse().unwrap(), "b".parse().unwrap()]);
    req.layers = Some(vec![4, 6]);
    s.place(&req, InstanceId::derived_from("i")).unwrap();
    // First stage: 4 layers + embeddings; last: 6 layers + head; 1 MiB of KV per layer each.
    assert_eq!(s.hosted("a").bytes, (4 * 301 + 10) * MIB);
    assert_eq!(s.hosted("b").bytes, (6 * 301 + 10) * MIB);
    // A node publishing a smaller KV reserve for the instance counts that one.
    let mut b = s.facts_of("b").unwrap().clone();
    b.kv_capacity.insert(InstanceId::derived_from("i"), 1024);
    b.seq += 1;
    s.on_facts(b);
    assert_eq!(s.hosted("b").bytes, (6 * 300 + 10) * MIB + 6 * (MIB / 4));
}

#[test]
fn the_topology_prices_nodes_from_their_measured_compute() {
    let mut s = cluster("a", &["b"]);
    let mut m = card();
    m.weight_type = "q4_0".into();
    m.layer_params = 1_000_000;
    s.me_mut().models = vec![m.clone()];
    s.me_mut().compute = crate::facts::ComputeFacts {
        weight_bytes_per_s: [("q4_0".to_string(), 4e9)].into(),
        flops_per_s: 20e9,
        attention_flops_per_s: 10e9,
        sample_entries_per_s: 1e9,
        threads: 2,
        key: "k".into(),
    };
    m.head_type = "q4_0".into();
    m.attention_flops_per_position = 1000;
    m.vocab_size = 50_000;
    s.me_mut().models = vec![m.clone()];
    let (topo, _) = s.topology("m", true);
    let a = topo.node("a").unwrap();
    // 2 MB layers at 4 GB/s; 2 Mflop per layer-token at 20 Gflop/s.
    assert_eq!((a.speed, a.prefill_speed), (2000.0, Some(10_000.0)));
    // 10 MB of head at 4 GB/s, 1000 flops per position at 10 Gflop/s, 50 000 entries at 1 G/s.
    assert_eq!(
        (a.head_us, a.attention_us, a.sample_us),
        (Some(2500.0), Some(0.1), Some(50.0))
    );
    // b measured nothing: its published estimate, scaled from the reference layer to this one.
    let b = topo.node("b").unwrap();
    let reference = crate::facts::REFERENCE_LAYER.1 as f64;
    assert_eq!((b.speed, b.prefill_speed), (5000.0 * reference / 2e6, None));
    assert_eq!((b.head_us, b.attention_us, b.sample_us), (None, None, None));
}

/// A node whose `--device gpu` offers a 2 GiB GPU: `big` puts the layers the GPU holds there (its
/// record says so), they count against the GPU's memory instead of the host's, and the next model is
/// offered what the GPU has left.
#[test]
fn layers_on_a_gpu_count_against_its_memory_not_the_hosts() {
    let mut s = one_node_three_models();
    let me = s.me_mut();
    me.device = crate::facts::DevicePolicy::Gpu(0);
    me.gpus = vec![crate::facts::GpuFacts {
        memory_total: Some(2 << 30),
        ..Default::default()
    }];
    let rec = s
        .place(&auto("big"), InstanceId::derived_from("b1"))
        .unwrap();
    // 301 MiB per layer with its KV reserve; 2 GiB less room for the 20 MiB of extras holds 6.
    let per_layer = 301 * MIB;
    let gpu = shoal_placement::GpuLayers {
        index: 0,
        layers: 6,
    };
    assert_eq!(rec.stages[0].gpu, Some(gpu), "{:?}", rec.stages);
    let (weights, full) = (
        (3000 + 20 - 6 * 300) * MIB,
        (3000 + 20 + 10) * MIB - 6 * per_layer,
    );
    assert_eq!(
        s.hosted("a"),
        Hosted {
            bytes: full,
            pending: weights,
            gpu: 6 * per_layer
        }
    );
    let small = s.topology("small", false).0;
    let offered = small.nodes[0].gpu.as_ref().expect("the GPU is offered");
    assert_eq!(offered.mem_available, (2 << 30) - 6 * per_layer);
}

fn grouped(nodes: &[&str], tensor_parallel: Option<bool>) -> PlaceRequest {
    PlaceRequest {
        nodes: (!nodes.is_empty()).then(|| nodes.iter().map(|s| s.parse().unwrap()).collect()),
        tensor_parallel,
        ..PlaceRequest::of("m".parse().unwrap())
    }
}

/// `a` and `b` with a model whose layers split over up to `max_group` nodes.
fn group_cluster(max_group: usize) -> ClusterState {
    let mut s = cluster("a", &["b"]);
    s.me_mut().models[0].max_group = max_group;
    let mut f = s.facts_of("b").unwrap().clone();
    f.models[0].max_group = max_group;
    f.seq += 1;
    s.on_facts(f);
    s
}

#[test]
fn tensor_parallel_places_one_group_of_the_named_nodes_or_none() {
    let mut s = group_cluster(2);
    // Asked for: one stage of every layer, b as rank 0 as named, a its other member.
    let rec = s
        .place(
            &grouped(&["b", "a"], Some(true)),
            InstanceId::derived_from("g"),
        )
        .unwrap();
    assert_eq!(rec.stages.len(), 1, "{rec:?}");
    let st = &rec.stages[0];
    assert_eq!((st.node.as_str(), st.start, st.end), ("b", 0, 30));
    let group = st.group.as_ref().unwrap();
    assert_eq!(group.members, ["a".parse::<NodeId>().unwrap()]);
    assert_eq!(group.weights.len(), 2);
    assert!(rec.uses("a") && rec.uses("b"));
    // Refused: no group.
    for p in s.previews(&grouped(&["a", "b"], Some(false))).unwrap() {
        assert!(p.stages.iter().all(|st| st.group.is_none()), "{p:?}");
    }
}

#[test]
fn impossible_groups_are_refused_with_why() {
    let s = group_cluster(1);
    let e = s.previews(&grouped(&["a", "b"], Some(true))).unwrap_err();
    assert!(
        matches!(
            e,
            PlaceError::NoGroup {
                nodes: 2,
                max_group: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("splits over at most 1"), "{e}");
    let s = group_cluster(2);
    let e = s.previews(&grouped(&[], Some(true))).unwrap_err();
    assert!(matches!(e, PlaceError::GroupWithoutNodes), "{e}");
    let mut req = grouped(&["a", "b"], Some(true));
    req.layers = Some(vec![15, 15]);
    assert!(matches!(
        s.previews(&req).unwrap_err(),
        PlaceError::GroupWithLayers
    ));
}
