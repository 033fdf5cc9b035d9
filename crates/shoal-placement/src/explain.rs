//! Human-readable explanations of placements: the stages, hops and the token's way back with their
//! costs, the predicted rates, which single nodes could or could not run the model alone, a note when
//! pins or manual counts are predicted slower than a node alone, and (on the chosen placement) why each
//! node is in or out.

use shoal_ids::NodeId;
use std::fmt::Write;

use crate::cost::{CostBreakdown, Hop};
use crate::fmt::{fmt_bandwidth, fmt_bytes, fmt_tok_s, fmt_us};
use crate::group::{GroupCompute, GroupSpec, rank_bytes};
use crate::model::Goal;
use crate::output::{NodeVerdict, Prediction};
use crate::search::{Candidate, Ctx, Mode};
use crate::tensor::group_name;
use crate::verdict::figure;

/// What each node of the pool could do alone.
pub(crate) struct SingleNode {
    pub id: NodeId,
    pub needed: u64,
    pub has: u64,
    /// Predicted one-stream latency and goal figure (µs per token) when the node fits alone.
    pub alone: Option<(f64, f64)>,
}

pub(crate) fn single_nodes(ctx: &Ctx, pool: &[usize]) -> Vec<SingleNode> {
    let needed = ctx.card.total_bytes(ctx.kv_tokens);
    pool.iter()
        .map(|&i| {
            let node = &ctx.topo.nodes[i];
            let alone = (needed <= ctx.mem(i))
                .then(|| ctx.costed(&[i], &[ctx.card.n_layers]).ok())
                .flatten()
                .map(|c| (c.timing.token_latency_us(), c.score));
            SingleNode {
                id: node.id.clone(),
                needed,
                has: ctx.mem(i),
                alone,
            }
        })
        .collect()
}

fn fmt_hop(hop: &Hop) -> String {
    let kind = hop.kind;
    let rtt = match hop.measured_rtt_us {
        Some(r) => format!("measured {} rtt", fmt_us(r)),
        None => format!("assumed {} rtt", fmt_us(kind.default_rtt_us())),
    };
    let bw = match hop.measured_bandwidth_bps {
        Some(b) => format!("measured {}", fmt_bandwidth(b)),
        None => format!("assumed {}", fmt_bandwidth(kind.default_bandwidth_bps())),
    };
    format!(
        "{}→{} over {} ({rtt}, {bw}): {}",
        hop.from,
        hop.to,
        kind.name(),
        fmt_us(hop.us)
    )
}

/// Everything an explanation says about one placement.
pub(crate) struct Facts<'a> {
    pub cand: &'a Candidate,
    pub cost: &'a CostBreakdown,
    pub prediction: &'a Prediction,
    pub mode: Mode,
    pub singles: &'a [SingleNode],
    /// The best candidate with a tensor-parallel group, when one was costed.
    pub best_group: Option<&'a Candidate>,
    /// Why each node is in or out (the chosen placement only).
    pub verdicts: &'a [NodeVerdict],
}

pub(crate) fn explain(ctx: &Ctx, f: &Facts) -> String {
    let mut out = String::new();
    match f.mode {
        Mode::Auto => {}
        Mode::Pinned => out.push_str("pinned nodes; "),
        Mode::Manual => out.push_str("manual layer counts; "),
    }
    stages_and_hops(ctx, f, &mut out);
    rates(f.prediction, &mut out);
    singles(ctx, f, &mut out);
    group_lost(ctx, f, &mut out);
    if f.mode != Mode::Auto
        && let Some(s) = faster_alone(f)
    {
        let _ = write!(
            out,
            "; predicted slower than {} alone ({} vs {})",
            s.id,
            figure(ctx, f.cand.score),
            figure(ctx, s.alone.map_or(f64::INFINITY, |a| a.1))
        );
    }
    if ctx.goal == Goal::Throughput {
        out.push_str("; ranked for throughput");
    }
    for v in f.verdicts {
        let _ = write!(out, "; {} {}", v.node, v.reason);
    }
    out
}

fn stages_and_hops(ctx: &Ctx, f: &Facts, out: &mut String) {
    let k = f.cand.order.len();
    let _ = write!(out, "{k} stage{}: ", if k == 1 { "" } else { "s" });
    let mut start = 0;
    for (i, (&node_idx, &n)) in f.cand.order.iter().zip(&f.cand.counts).enumerate() {
        let node = &ctx.topo.nodes[node_idx];
        let used = ctx.card.stage_bytes(n, i == 0, i + 1 == k, ctx.kv_tokens);
        if i > 0 {
            out.push_str(", ");
        }
        if let Some(g) = f.cand.group(i) {
            let place = ((start, n), (i == 0, i + 1 == k));
            group_stage(ctx, (node_idx, g), place, f.cost.compute_us[i], out);
            start += n;
            continue;
        }
        let gpu = match f.cand.gpu.get(i).copied().unwrap_or(0) {
            0 => String::new(),
            g => format!(", {g} on its GPU"),
        };
        let _ = write!(
            out,
            "{} layers {}–{} ({} layer{}{gpu}, {} of {}, {})",
            node.id,
            start,
            start + n - 1,
            n,
            if n == 1 { "" } else { "s" },
            fmt_bytes(used),
            fmt_bytes(ctx.mem(node_idx)),
            fmt_us(f.cost.compute_us[i]),
        );
        start += n;
    }
    if f.cost.hops.is_empty() {
        out.push_str("; no network hops");
    }
    for hop in &f.cost.hops {
        let _ = write!(out, "; hop {}", fmt_hop(hop));
    }
    if !f.cost.return_path.is_empty() {
        let path: Vec<String> = f.cost.return_path.iter().map(fmt_hop).collect();
        let _ = write!(out, "; token returns {}", path.join(" then "));
    }
    let compute: f64 = f.cost.compute_us.iter().sum();
    let _ = write!(
        out,
        "; predicted {}/token (compute {}, network {})",
        fmt_us(f.cost.total_us),
        fmt_us(compute),
        fmt_us(f.cost.total_us - compute)
    );
}

fn rates(p: &Prediction, out: &mut String) {
    let batches: Vec<String> = p.aggregate.iter().map(|r| r.batch.to_string()).collect();
    let rates: Vec<String> = p
        .aggregate
        .iter()
        .map(|r| format!("{:.1}", r.tok_s))
        .collect();
    let _ = write!(
        out,
        "; one stream {}, aggregate {} tok/s at batch {}",
        fmt_tok_s(p.decode_tok_s),
        rates.join("/"),
        batches.join("/")
    );
    if let Some(last) = p.aggregate.last() {
        let _ = write!(out, " (batch {} bound by {})", last.batch, last.bound);
    }
    let _ = write!(
        out,
        ", TTFT {} for {} tokens",
        fmt_us(p.ttft_us),
        p.prompt_tokens
    );
}

fn singles(ctx: &Ctx, f: &Facts, out: &mut String) {
    if f.mode != Mode::Auto {
        return;
    }
    let rejected: Vec<String> = f
        .singles
        .iter()
        .filter(|s| s.alone.is_none())
        .map(|s| {
            format!(
                "{} (needs {}, has {})",
                s.id,
                fmt_bytes(s.needed),
                fmt_bytes(s.has)
            )
        })
        .collect();
    if !rejected.is_empty() {
        let _ = write!(
            out,
            "; single-node options rejected: {}",
            rejected.join(", ")
        );
    }
    if f.cand.nodes().len() > 1 {
        let slower: Vec<String> = f
            .singles
            .iter()
            .filter_map(|s| {
                let (latency, score) = s.alone?;
                Some(match ctx.goal {
                    Goal::Latency => format!("{} ({}/token)", s.id, fmt_us(latency)),
                    Goal::Throughput => format!("{} ({})", s.id, figure(ctx, score)),
                })
            })
            .collect();
        if !slower.is_empty() {
            let _ = write!(
                out,
                "; single-node options predicted slower: {}",
                slower.join(", ")
            );
        }
    }
}

/// A tensor-parallel stage of layers `start..start + n`: who holds what share, what its reductions
/// cost per token.
fn group_stage(
    ctx: &Ctx,
    (rank0, g): (usize, &GroupSpec),
    ((start, n), place): ((usize, usize), (bool, bool)),
    compute_us: f64,
    out: &mut String,
) {
    let shares = g.shares();
    let ranks: Vec<String> = (g.ranks(rank0).iter().zip(&shares).enumerate())
        .map(|(r, (&i, &share))| {
            let held = rank_bytes(ctx.card, share, n, place, ctx.kv_tokens);
            let weight = g.weights.get(r).copied().unwrap_or(0);
            format!(
                "{} weight {weight} ({:.0} %, {} of {})",
                ctx.id(i),
                share * 100.0,
                fmt_bytes(held),
                fmt_bytes(ctx.topo.nodes[i].mem_available)
            )
        })
        .collect();
    let _ = write!(
        out,
        "tensor-parallel group {} layers {}–{} ({} layer{} shared by {}; {} compute",
        group_name(ctx, rank0, g),
        start,
        start + n - 1,
        n,
        if n == 1 { "" } else { "s" },
        ranks.join(", "),
        fmt_us(compute_us),
    );
    if let Some(gc) = GroupCompute::of((ctx.topo, &ctx.links, ctx.card), rank0, g, place.0) {
        let over = gc
            .worst_kind()
            .map_or(String::new(), |k| format!(" over {}", k.name()));
        let _ = write!(
            out,
            ", reductions {}/token: {} exchanges of {}{over} at the slowest pair; input to the members {}",
            fmt_us(gc.reduce_us(n, 1)),
            2 * n,
            fmt_us(gc.exchange_us(1)),
            fmt_us(gc.fan_out_us(1)),
        );
        if gc.crowd() > 1 {
            let _ = write!(
                out,
                "; up to {} ranks share a machine, each priced at that share of it",
                gc.crowd()
            );
        }
    }
    out.push(')');
}

/// When a tensor-parallel group was costed but the placement has none: what the best group predicts.
fn group_lost(ctx: &Ctx, f: &Facts, out: &mut String) {
    let Some(g) = f.best_group else {
        return;
    };
    if f.cand.groups.iter().any(Option::is_some) {
        return;
    }
    let stage = (0..g.order.len()).find_map(|s| Some((s, g.group(s)?)));
    let Some((s, spec)) = stage else {
        return;
    };
    let gc = GroupCompute::of((ctx.topo, &ctx.links, ctx.card), g.order[s], spec, s == 0);
    let reduce = (gc.as_ref()).map_or(0.0, |gc| gc.reduce_us(g.counts[s], 1) + gc.fan_out_us(1));
    let _ = write!(
        out,
        "; tensor-parallel group {} predicted slower: {} vs {} (its reductions and input {}/token",
        group_name(ctx, g.order[s], spec),
        figure(ctx, g.score),
        figure(ctx, f.cand.score),
        fmt_us(reduce),
    );
    match gc.map_or(1, |gc| gc.crowd()) {
        1 => out.push(')'),
        crowd => {
            let _ = write!(out, "; up to {crowd} of its ranks share a machine)");
        }
    }
}

/// The best single node that fits alone and is predicted better than the (pinned or manual) placement.
fn faster_alone<'s>(f: &Facts<'s>) -> Option<&'s SingleNode> {
    f.singles
        .iter()
        .filter(|s| s.alone.is_some_and(|a| a.1 < f.cand.score))
        .min_by(|a, b| {
            let (x, y) = (
                a.alone.map_or(f64::INFINITY, |v| v.1),
                b.alone.map_or(f64::INFINITY, |v| v.1),
            );
            x.total_cmp(&y)
        })
}
