//! Tests of the routing decision: loads, speeds, prefix affinity and its margin, the prefix memory, the
//! in-flight book, and the candidates read from a cluster snapshot.

use shoal_cluster::facts::{InstanceLoad, InstanceStatus, NodeFacts};
use shoal_cluster::state::ClusterState;
use shoal_cluster::{InstanceRecord, InstanceTable};

use super::*;

fn cand(instance: &str, work: f64, speed: f64, prefix_match: usize) -> Candidate {
    Candidate {
        instance: instance.into(),
        target: Target::Remote {
            api_url: format!("http://{instance}"),
        },
        work,
        speed,
        prefix_match,
    }
}

fn local(instance: &str, work: f64, speed: f64) -> Candidate {
    Candidate {
        target: Target::Local,
        ..cand(instance, work, speed, 0)
    }
}

fn pick(cands: &[Candidate]) -> &str {
    &cands[choose(cands, Policy::default()).unwrap()].instance
}

#[test]
fn the_least_queued_work_wins_measured_against_speed() {
    assert_eq!(choose(&[], Policy::default()), None);
    assert_eq!(
        pick(&[cand("a", 3.0, 100.0, 0), cand("b", 2.0, 100.0, 0)]),
        "b"
    );
    // Twice as fast: (5+1)/200 = 0.03 s per token beats (2+1)/50 = 0.06.
    assert_eq!(
        pick(&[cand("a", 5.0, 200.0, 0), cand("b", 2.0, 50.0, 0)]),
        "a"
    );
    // Idle instances: the faster one.
    assert_eq!(
        pick(&[cand("a", 0.0, 50.0, 0), cand("b", 0.0, 80.0, 0)]),
        "b"
    );
}

#[test]
fn ties_go_to_this_nodes_engine_then_the_instance_id() {
    assert_eq!(
        pick(&[cand("a", 1.0, 100.0, 0), local("z", 1.0, 100.0)]),
        "z"
    );
    assert_eq!(
        pick(&[cand("b", 1.0, 100.0, 0), cand("a", 1.0, 100.0, 0)]),
        "a"
    );
}

#[test]
fn a_cached_prefix_wins_while_loads_are_close() {
    // b holds 2 KiB of this prompt, c 1 KiB; a is idle but has none.
    let cands = [
        cand("a", 0.0, 100.0, 0),
        cand("b", 2.0, 100.0, 2048),
        cand("c", 0.0, 100.0, 1024),
    ];
    assert_eq!(pick(&cands), "b", "the longest match, two requests behind");
    // Three requests behind and 4× the work: imbalanced, the least loaded takes it.
    let cands = [cand("a", 0.0, 100.0, 0), cand("b", 3.0, 100.0, 2048)];
    assert_eq!(pick(&cands), "a");
    // Far behind in requests but not by the ratio (20 vs 17 running): affinity holds.
    let cands = [cand("a", 17.0, 100.0, 0), cand("b", 20.0, 100.0, 2048)];
    assert_eq!(pick(&cands), "b");
    // Equal matches: the less loaded of them.
    let cands = [cand("a", 1.0, 100.0, 1024), cand("b", 0.0, 100.0, 1024)];
    assert_eq!(pick(&cands), "b");
}

#[test]
fn the_margin_is_counted_in_requests_at_the_affine_instances_speed() {
    // b is twice as fast and holds this prompt's prefix; a is idle.
    let slow_idle = cand("a", 0.0, 100.0, 0);
    let fast_busy = cand("b", 4.0, 200.0, 4096);
    // cost a = 0.01, b = 0.025: behind = 0.015 · 200 = 3 requests > 2, ratio 2.5 > 1.5 → imbalanced.
    assert_eq!(pick(&[slow_idle.clone(), fast_busy]), "a");
    let fast_less_busy = cand("b", 2.0, 200.0, 4096);
    // cost b = 0.015: behind = 1 request → affinity.
    assert_eq!(pick(&[slow_idle, fast_less_busy]), "b");
}

#[test]
fn prompt_prefixes_grow_with_a_conversation_and_skip_short_or_bad_bodies() {
    assert!(prompt_prefixes(b"not json").is_empty());
    assert!(prompt_prefixes(br#"{"model":"m","prompt":"short"}"#).is_empty());
    let system = "You are a careful assistant. ".repeat(40); // ~1.1 KiB
    let turn1 = serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "hi"}]});
    let turn2 = serde_json::json!({"model": "m", "max_tokens": 5, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]});
    let p1 = prompt_prefixes(&serde_json::to_vec(&turn1).unwrap());
    let p2 = prompt_prefixes(&serde_json::to_vec(&turn2).unwrap());
    assert_eq!(p1.iter().map(|p| p.0).collect::<Vec<_>>(), [512, 1024]);
    assert_eq!(
        p1[..],
        p2[..p1.len()],
        "the earlier turn's prefixes are shared"
    );
    let other = serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": system.replace("careful", "cheerful")}]});
    let p3 = prompt_prefixes(&serde_json::to_vec(&other).unwrap());
    assert_ne!(p1[0], p3[0]);
    // Completions and Anthropic's system field count too.
    let text = "x".repeat(600);
    let a = prompt_prefixes(format!(r#"{{"prompt":"{text}"}}"#).as_bytes());
    let b = prompt_prefixes(format!(r#"{{"system":"{text}","messages":[]}}"#).as_bytes());
    assert_eq!((a.len(), b.len()), (1, 1));
}

#[test]
fn the_prefix_memory_matches_the_longest_and_forgets_the_oldest() {
    let mut m = PrefixMemory::new(3);
    let p = [(512, 1), (1024, 2), (2048, 3)];
    m.remember("a", &p[..2]);
    assert_eq!(m.longest("a", &p), 1024);
    assert_eq!(m.longest("b", &p), 0);
    m.remember("b", &p[..1]);
    assert_eq!(m.len(), 3);
    // A fourth entry evicts a's 512-byte prefix (the oldest); its 1 KiB one stays.
    m.remember("b", &[(4096, 9)]);
    assert_eq!(m.len(), 3);
    assert_eq!(m.longest("a", &p[..1]), 0);
    assert_eq!(m.longest("a", &p), 1024);
    // Using an entry again makes it the newest.
    m.remember("a", &p[1..2]);
    m.remember("c", &[(512, 7)]);
    assert_eq!(m.longest("a", &p), 1024);
    assert_eq!(m.longest("b", &p), 0, "b's older entry went first");
}

#[test]
fn a_burst_spreads_over_equal_instances_and_guards_count_in_flight() {
    let balancer = Arc::new(Balancer::default());
    let both = || vec![local("a", 0.0, 100.0), cand("b", 0.0, 100.0, 0)];
    let guards: Vec<(Candidate, InFlight)> = (0..32)
        .map(|_| balancer.route(both(), &[]).unwrap())
        .collect();
    let stats = balancer.stats();
    assert_eq!(stats["a"].in_flight, 16);
    assert_eq!(stats["b"].in_flight, 16);
    drop(guards);
    let stats = balancer.stats();
    assert_eq!((stats["a"].routed, stats["a"].in_flight), (16, 0));
    assert_eq!((stats["b"].routed, stats["b"].in_flight), (16, 0));
    assert!(balancer.route(Vec::new(), &[]).is_none());
}

#[test]
fn the_book_takes_the_larger_of_published_and_own_work_and_remembers_prefixes() {
    let balancer = Arc::new(Balancer::default());
    let prefixes = [(512, 42)];
    // b published 3 running; this node has nothing there yet: a (idle) takes it.
    let (first, _g1) = balancer
        .route(
            vec![cand("a", 0.0, 100.0, 0), cand("b", 3.0, 100.0, 0)],
            &prefixes,
        )
        .unwrap();
    assert_eq!(first.instance, "a");
    // The same prompt again: a has its prefix and one in flight (published 0), b now looks idle: a
    // is one request behind, within the margin → still a.
    let (second, _g2) = balancer
        .route(
            vec![cand("a", 0.0, 100.0, 0), cand("b", 0.0, 100.0, 0)],
            &prefixes,
        )
        .unwrap();
    assert_eq!(
        (second.instance.as_str(), second.work, second.prefix_match),
        ("a", 1.0, 512)
    );
}

/// A node's facts (from JSON: the fields that have no default, so new ones need no change here).
fn facts(id: &str) -> NodeFacts {
    serde_json::from_value(serde_json::json!({
        "id": id, "name": id, "api_url": format!("http://{id}:1"), "addrs": [],
        "memory": {"total": 0, "available": 0, "pressure": 0.0}, "cpu_cores": 1,
        "accelerator": "cpu", "backend": "cpu", "speed": 1.0, "models": [], "links": [],
        "instances": {}, "seq": 1, "started": 1,
    }))
    .unwrap()
}

/// The instance id a test names `name`, as the balancer's candidates carry it.
fn iid(name: &str) -> String {
    shoal_cluster::InstanceId::derived_from(name).to_string()
}

fn record(id: &str, model: &str, node: &str, latency_us: f64) -> InstanceRecord {
    serde_json::from_value(serde_json::json!({
        "id": iid(id), "model": model, "stages": [{"node": node, "start": 0, "end": 30}],
        "predicted_token_latency_us": latency_us, "explanation": "",
    }))
    .unwrap()
}

/// `a` (this node) and `b`, with the instances of `records` ready on their drivers, which publish
/// `loads` (by instance id).
fn snapshot(records: Vec<InstanceRecord>, loads: &[(&str, InstanceLoad)]) -> Snapshot {
    let mut a = facts("a");
    let mut b = facts("b");
    for r in &records {
        let f = if r.driver().is_some_and(|d| d == "a") {
            &mut a
        } else {
            &mut b
        };
        f.instances.insert(r.id, InstanceStatus::Ready);
        if let Some((_, load)) = loads.iter().find(|(id, _)| iid(id) == r.id.to_string()) {
            f.load.insert(r.id, load.clone());
        }
    }
    let mut state = ClusterState::new(a);
    state.peer_connected("b");
    state.on_facts(b);
    state.on_table(
        "a",
        InstanceTable {
            version: 1,
            instances: records,
            ..InstanceTable::default()
        },
    );
    Snapshot {
        state,
        listen_addrs: vec![],
        static_peers: vec![],
    }
}

fn load(running: u32, queued: u32, decode_tok_s: Option<f64>) -> InstanceLoad {
    InstanceLoad {
        running,
        queued,
        decode_tok_s,
        ..InstanceLoad::default()
    }
}

#[test]
fn candidates_come_from_ready_instances_with_published_load_and_speed() {
    let records = vec![
        record("ia", "m", "a", 10_000.0),
        record("ib", "m", "b", 5_000.0),
        record("other", "n", "b", 10_000.0),
    ];
    // Only b's instance has a measured rate: both are compared by the planner's predictions.
    let snap = snapshot(records.clone(), &[("ib", load(2, 1, Some(150.0)))]);
    let c = candidates(&snap, "m", Some(4.0));
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!(
        (c[0].instance.as_str(), &c[0].target, c[0].work, c[0].speed),
        (iid("ia").as_str(), &Target::Local, 4.0, 100.0),
        "the local engine's live count; the predicted speed (1e6 / 10 ms)"
    );
    assert_eq!(
        c[1].target,
        Target::Remote {
            api_url: "http://b:1".into()
        }
    );
    assert_eq!(
        (c[1].work, c[1].speed),
        (3.0, 200.0),
        "published; predicted"
    );
    // Both measured: the measured rates; this node's own published (stale) count is not used.
    let snap = snapshot(
        records,
        &[
            ("ia", load(9, 0, Some(120.0))),
            ("ib", load(2, 1, Some(150.0))),
        ],
    );
    let c = candidates(&snap, "m", Some(4.0));
    assert_eq!(
        c.iter().map(|c| (c.work, c.speed)).collect::<Vec<_>>(),
        [(4.0, 120.0), (3.0, 150.0)]
    );
    // No engine registered here yet: only b.
    let c = candidates(&snap, "m", None);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].instance, iid("ib"));
    // An engine here with no instance of the table (local stages): it stands alone.
    let c = candidates(&snap, "n", Some(0.0));
    assert_eq!(c.len(), 2);
    assert_eq!(c[1].instance, LOCAL_ENGINE);
    assert_eq!(c[1].speed, 100.0, "the others' mean speed");
    assert!(candidates(&snap, "zzz", None).is_empty());
}
