//! Times the planner on 64 simulated heterogeneous nodes (memory, speed, links) with a 70B-class card:
//! `cargo run --release -p shoal-placement --example plan64 [runs] [max_group]` (the card's
//! `max_group`, 1 by default: no tensor-parallel groups). Prints the best, median and worst
//! wall time of `plan` for each goal, of `plan_replicas` for 4 replicas, and what was chosen.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use shoal_placement::{Constraints, Goal, fmt_tok_s, plan, plan_replicas};

fn timed<T>(runs: usize, mut f: impl FnMut() -> T) -> (T, Vec<Duration>) {
    let mut times = Vec::with_capacity(runs);
    let mut out = f();
    for _ in 0..runs {
        let start = Instant::now();
        out = f();
        times.push(start.elapsed());
    }
    times.sort();
    (out, times)
}

fn report(what: &str, times: &[Duration]) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{what}: best {:.1} ms, median {:.1} ms, worst {:.1} ms ({} runs)",
        ms(times[0]),
        ms(times[times.len() / 2]),
        ms(times[times.len() - 1]),
        times.len()
    );
}

fn main() {
    let runs = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20usize)
        .max(1);
    let topo = common::heterogeneous(64, 64);
    let mut card = common::card_70b();
    card.max_group = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    println!(
        "64 nodes, {} links, model {} layers of {} MB, groups of up to {}",
        topo.links.len(),
        card.n_layers,
        card.layer_bytes / 1_000_000,
        card.max_group
    );
    for goal in [Goal::Latency, Goal::Throughput] {
        let cons = Constraints {
            kv_reserve_tokens: 2048,
            goal,
            ..Constraints::default()
        };
        let (all, times) = timed(runs, || plan(&topo, &card, &cons));
        report(&format!("plan ({})", goal.name()), &times);
        match all {
            Ok(all) => {
                let p = &all[0];
                let nodes: Vec<String> = p
                    .stages
                    .iter()
                    .map(|s| {
                        let nodes: Vec<&str> = s.nodes().map(|n| n.as_str()).collect();
                        format!("{}×{}", nodes.join("+"), s.layers())
                    })
                    .collect();
                println!(
                    "  chosen: {} ({} one stream, {} at batch 32, TTFT {:.0} ms for 512 tokens)",
                    nodes.join(" → "),
                    fmt_tok_s(p.prediction.decode_tok_s),
                    fmt_tok_s(p.prediction.tok_s_at(32).unwrap_or(0.0)),
                    p.prediction.ttft_us / 1e3
                );
                let mut seen = std::collections::BTreeSet::new();
                for v in &p.nodes {
                    // One example of each kind of reason.
                    let kind = v.reason.split([':', ',']).next().unwrap_or("");
                    if seen.insert(kind.to_string()) {
                        println!("  {} {}", v.node, v.reason);
                    }
                }
            }
            Err(e) => println!("  no placement: {e}"),
        }
    }
    let cons = Constraints {
        kv_reserve_tokens: 2048,
        ..Constraints::default()
    };
    let (replicas, times) = timed(runs, || plan_replicas(&topo, &card, &cons, 4));
    report("plan_replicas (4, latency)", &times);
    if let Ok(r) = replicas {
        println!(
            "  {} replicas, {} at batch 32 together",
            r.len(),
            fmt_tok_s(shoal_placement::group_tok_s(&r, 32))
        );
    }
}
