//! Cost model v2 scenarios: layer counts for the goal, nodes left out (and why), pins that lose to a
//! node alone, predictions carried by the placement.

mod common;

use common::{card, link, node};
use shoal_placement::{Constraints, Goal, LinkKind, Placement, Topology, best, forecast, plan};

fn counts(p: &Placement) -> Vec<(&str, usize)> {
    p.stages
        .iter()
        .map(|s| (s.node.as_str(), s.layers()))
        .collect()
}

fn verdict<'p>(p: &'p Placement, node: &str) -> (bool, &'p str) {
    let v = p.nodes.iter().find(|v| v.node == node).unwrap();
    (v.used, v.reason.as_str())
}

fn goal(goal: Goal) -> Constraints {
    Constraints {
        goal,
        ..Constraints::default()
    }
}

fn mesh(nodes: &[&str], kind: LinkKind) -> Vec<shoal_placement::Link> {
    let mut links = Vec::new();
    for (i, a) in nodes.iter().enumerate() {
        for b in &nodes[i + 1..] {
            links.push(link(a, b, kind));
        }
    }
    links
}

#[test]
fn the_fastest_node_takes_as_many_layers_as_its_memory_holds() {
    // Neither holds the 30 GB model alone. Memory alone would split 15/15; fast is 4x faster, so it takes
    // all 20 layers it can hold.
    let topo = Topology {
        nodes: vec![node("slow", 20, 1000.0), node("fast", 20, 4000.0)],
        links: vec![link("slow", "fast", LinkKind::Thunderbolt)],
    };
    let p = best(&topo, &card(), &Constraints::default()).unwrap();
    let mut got = counts(&p);
    got.sort();
    assert_eq!(got, [("fast", 20), ("slow", 10)]);
    let compute = 20.0 / 4000.0 * 1e6 + 10.0 / 1000.0 * 1e6;
    let network = p.prediction.hops[0].token_us + p.prediction.return_us;
    assert!((p.predicted_token_latency_us - (compute + network)).abs() < 1e-6);
    assert!((p.prediction.token_latency_us - p.predicted_token_latency_us).abs() < 1e-6);
    assert!((p.prediction.decode_tok_s - 1e6 / p.predicted_token_latency_us).abs() < 1e-9);
}

#[test]
fn the_goal_decides_between_one_fast_node_and_a_balanced_pipeline() {
    // fast holds the model alone (30 ms → 15 ms per token at 2000 layer-steps/s); with slow it could
    // run two micro-batches at once.
    let topo = Topology {
        nodes: vec![node("fast", 40, 2000.0), node("slow", 40, 1000.0)],
        links: vec![link("fast", "slow", LinkKind::Thunderbolt)],
    };
    let latency = best(&topo, &card(), &goal(Goal::Latency)).unwrap();
    assert_eq!(counts(&latency), [("fast", 30)]);
    assert!((latency.predicted_token_latency_us - 15_000.0).abs() < 1e-6);

    let throughput = best(&topo, &card(), &goal(Goal::Throughput)).unwrap();
    let mut got = counts(&throughput);
    got.sort();
    // Balanced: 20 layers at 2000/s and 10 at 1000/s take the same time.
    assert_eq!(got, [("fast", 20), ("slow", 10)]);
    assert_eq!(throughput.prediction.goal, Goal::Throughput);
    let alone = forecast(&topo, &card(), &latency.stages, Goal::Throughput, 512).unwrap();
    assert!(
        throughput.prediction.goal_tok_s() > alone.goal_tok_s(),
        "{} vs {}",
        throughput.prediction.goal_tok_s(),
        alone.goal_tok_s()
    );
    assert!(
        throughput.explanation.contains("ranked for throughput"),
        "{}",
        throughput.explanation
    );
    assert!(
        throughput
            .explanation
            .contains("single-node options predicted slower: fast ("),
        "{}",
        throughput.explanation
    );
}

#[test]
fn a_node_that_slows_the_pipeline_is_left_out_and_says_why() {
    // a and b hold the model together; c is 20x slower and only adds a stage.
    let topo = Topology {
        nodes: vec![
            node("a", 20, 1000.0),
            node("b", 20, 1000.0),
            node("c", 20, 50.0),
        ],
        links: mesh(&["a", "b", "c"], LinkKind::Ethernet),
    };
    let p = best(&topo, &card(), &Constraints::default()).unwrap();
    let mut nodes: Vec<&str> = p.stages.iter().map(|s| s.node.as_str()).collect();
    nodes.sort();
    assert_eq!(nodes, ["a", "b"]);
    let (used, reason) = verdict(&p, "c");
    assert!(!used);
    assert!(
        reason.starts_with("left out: adding it predicts ") && reason.ends_with(" without"),
        "{reason}"
    );
    let with_c = reason
        .trim_start_matches("left out: adding it predicts ")
        .split(" tok/s")
        .next()
        .unwrap();
    let with_c: f64 = with_c.parse().unwrap();
    assert!(with_c < p.prediction.decode_tok_s, "{reason}");
    let (used, reason) = verdict(&p, "a");
    assert!(used);
    assert!(
        reason.contains("the others cannot hold the model without it"),
        "{reason}"
    );
    assert!(
        p.explanation
            .contains(&format!("; c {reason_c}", reason_c = verdict(&p, "c").1))
    );
    // Only the chosen placement carries verdicts.
    let all = plan(&topo, &card(), &Constraints::default()).unwrap();
    assert_eq!(all[0].nodes.len(), 3);
    assert!(all[1..].iter().all(|p| p.nodes.is_empty()));
}

#[test]
fn a_node_in_the_pipeline_says_what_it_is_worth() {
    // big holds the model alone but slowly (60 ms per token); small is 8x faster and takes the 20 layers
    // its memory holds: 5 ms + 20 ms.
    let topo = Topology {
        nodes: vec![node("big", 40, 500.0), node("small", 20, 4000.0)],
        links: vec![link("big", "small", LinkKind::Loopback)],
    };
    let p = best(&topo, &card(), &Constraints::default()).unwrap();
    assert_eq!(counts(&p), [("big", 10), ("small", 20)]);
    let (used, reason) = verdict(&p, "small");
    let expected = format!(
        "in: 20 layers, without it 16.7 tok/s vs {:.1} tok/s",
        p.prediction.decode_tok_s
    );
    assert!(used);
    assert_eq!(reason, expected);
    assert_eq!(
        verdict(&p, "big"),
        (
            true,
            "in: 10 layers, the others cannot hold the model without it"
        )
    );
    // One node alone that is the best says so.
    let topo = Topology {
        nodes: vec![node("d", 40, 4000.0), node("e", 40, 1000.0)],
        links: vec![link("d", "e", LinkKind::Loopback)],
    };
    let p = best(&topo, &card(), &Constraints::default()).unwrap();
    assert_eq!(counts(&p), [("d", 30)]);
    assert_eq!(verdict(&p, "d"), (true, "in: holds all 30 layers alone"));
    let (used, reason) = verdict(&p, "e");
    assert!(
        !used && reason.starts_with("left out: adding it predicts"),
        "{reason}"
    );
}

#[test]
fn out_of_reach_nodes_say_memory_link_or_stage_limit() {
    let topo = Topology {
        nodes: vec![
            node("a", 40, 1000.0),
            node("tiny", 0, 1000.0),
            node("island", 40, 1000.0),
        ],
        links: vec![link("a", "tiny", LinkKind::Ethernet)],
    };
    let p = best(&topo, &card(), &Constraints::default()).unwrap();
    assert_eq!(counts(&p), [("a", 30)]);
    let (_, tiny) = verdict(&p, "tiny");
    assert!(
        tiny.starts_with("out: not enough memory (has 0 B"),
        "{tiny}"
    );
    let (_, island) = verdict(&p, "island");
    assert_eq!(island, "out: no link to a where it could join");
    let limited = Constraints {
        max_stages: Some(1),
        ..Constraints::default()
    };
    let p = best(&topo, &card(), &limited).unwrap();
    let (_, tiny) = verdict(&p, "tiny");
    assert_eq!(tiny, "out: the placement is at the stage limit (1)");
}

#[test]
fn pins_win_but_say_when_a_node_alone_is_faster() {
    let topo = Topology {
        nodes: vec![
            node("x", 64, 1000.0),
            node("y", 64, 1000.0),
            node("z", 8, 1.0),
        ],
        links: vec![link("x", "y", LinkKind::Wifi)],
    };
    let pinned = Constraints {
        pinned_nodes: Some(vec!["x".parse().unwrap(), "y".parse().unwrap()]),
        ..Constraints::default()
    };
    let p = best(&topo, &card(), &pinned).unwrap();
    assert_eq!(p.stages.len(), 2);
    assert!(
        p.explanation.contains("; predicted slower than x alone ("),
        "{}",
        p.explanation
    );
    assert_eq!(verdict(&p, "x"), (true, "in: pinned, 15 layers"));
    assert_eq!(verdict(&p, "z"), (false, "out: not pinned"));
    // A pin that is the best anyway gets no such note.
    let alone = Constraints {
        pinned_nodes: Some(vec!["x".parse().unwrap()]),
        ..Constraints::default()
    };
    let p = best(&topo, &card(), &alone).unwrap();
    assert!(
        !p.explanation.contains("predicted slower than"),
        "{}",
        p.explanation
    );
}

#[test]
fn predictions_are_in_the_explanation_and_the_json() {
    let mut fast = node("a", 40, 1000.0);
    fast.prefill_speed = Some(64_000.0);
    let topo = Topology {
        nodes: vec![fast],
        links: vec![],
    };
    let cons = Constraints {
        prompt_tokens: Some(300),
        ..Constraints::default()
    };
    let p = best(&topo, &card(), &cons).unwrap();
    let batches: Vec<usize> = p.prediction.aggregate.iter().map(|r| r.batch).collect();
    assert_eq!(batches, shoal_placement::BATCH_SIZES);
    assert_eq!(p.prediction.prompt_tokens, 300);
    // 30 layers, chunks of 256 and 44 tokens: max(30 ms, 256·30/64 000 s = 120 ms) + max(30, 20.6) ms.
    assert!(
        (p.prediction.ttft_us - 150_000.0).abs() < 1e-6,
        "{}",
        p.prediction.ttft_us
    );
    assert!(
        p.explanation.contains(
            "; one stream 33.3 tok/s, aggregate 33.3/133.3/533.3/1066.7 tok/s at batch 1/4/16/32 \
             (batch 32 bound by stage a), TTFT 150.0 ms for 300 tokens"
        ),
        "{}",
        p.explanation
    );
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["prediction"]["aggregate"][3]["batch"], 32);
    assert_eq!(json["nodes"][0]["reason"], "in: holds all 30 layers alone");
    // A placement from an older node (no prediction, no verdicts) still parses.
    let old = serde_json::json!({
        "stages": [{"node": "a", "start": 0, "end": 30}],
        "predicted_token_latency_us": 1.0,
        "explanation": "",
    });
    let parsed: Placement = serde_json::from_value(old).unwrap();
    assert!(parsed.nodes.is_empty() && parsed.prediction.aggregate.is_empty());
    let cons: Constraints = serde_json::from_value(serde_json::json!({
        "pinned_nodes": null, "keep_order": false, "layer_counts": null,
        "kv_reserve_tokens": 0, "max_stages": null,
    }))
    .unwrap();
    assert_eq!((cons.goal, cons.prompt_tokens), (Goal::Latency, None));
}
