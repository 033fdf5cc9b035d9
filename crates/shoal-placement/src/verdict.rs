//! Why each node is in or out of the chosen placement ([`NodeVerdict`]s), by costing the alternatives:
//! - a node in a pipeline: the placement without it (the others in the same order, layers split again for
//!   the goal) — "without it 41 tok/s vs 52", or the others cannot hold the model, or it links two nodes
//!   that have no link of their own;
//! - a node out (automatic placement): the placement with it added at its best position —
//!   "adding it predicts 41 tok/s vs 52 without" — or why it cannot be added at all: the stage limit, no
//!   link to the placement's nodes, not enough memory for a stage where it could link in.
//!
//! - a node in a tensor-parallel group: the group without it (the remaining node alone when two are
//!   left) — "in: rank 1 of the tensor-parallel group a+b (weight 1000 of 2000), without it 30 tok/s
//!   vs 52"; a node out also tries joining each group stage (or forming one with a single node's
//!   stage): "left out: a tensor-parallel group a+b predicts 20 tok/s vs 30 tok/s without".
//!
//! Figures are the goal's: one stream's tok/s for latency, the largest batch's aggregate for throughput.

use crate::fmt::{fmt_bytes, fmt_tok_s};
use crate::group::GroupSpec;
use crate::model::Goal;
use crate::output::NodeVerdict;
use crate::rates::BATCH_SIZES;
use crate::search::{Candidate, Ctx, Mode};
use crate::tensor::{all_linked, eligible, group_name, group_sizes};

/// The goal's figure of a candidate, readable.
pub(crate) fn figure(ctx: &Ctx, score_us: f64) -> String {
    let tok_s = fmt_tok_s(1e6 / score_us);
    match ctx.goal {
        Goal::Latency => tok_s,
        Goal::Throughput => format!("{tok_s} at batch {}", BATCH_SIZES[BATCH_SIZES.len() - 1]),
    }
}

/// One verdict per topology node, in topology order.
pub(crate) fn verdicts(
    ctx: &Ctx,
    chosen: &Candidate,
    mode: Mode,
    max_k: usize,
) -> Vec<NodeVerdict> {
    (0..ctx.topo.nodes.len())
        .map(|i| {
            let (used, reason) = match chosen.rank_of(i) {
                Some((s, r)) if chosen.group(s).is_some() => {
                    (true, why_in_group(ctx, chosen, mode, (s, r)))
                }
                Some((p, _)) => (true, why_in(ctx, chosen, mode, p)),
                None => (false, why_out(ctx, chosen, mode, max_k, i)),
            };
            NodeVerdict {
                node: ctx.id(i).clone(),
                used,
                reason,
            }
        })
        .collect()
}

fn why_in(ctx: &Ctx, chosen: &Candidate, mode: Mode, p: usize) -> String {
    let n = chosen.counts[p];
    let layers = format!("{n} layer{}", if n == 1 { "" } else { "s" });
    match mode {
        Mode::Pinned => return format!("in: pinned, {layers}"),
        Mode::Manual => return format!("in: manual layer counts, {layers}"),
        Mode::Auto => {}
    }
    let order = &chosen.order;
    if order.len() == 1 {
        return format!("in: holds all {layers} alone");
    }
    if p > 0 && p + 1 < order.len() && !ctx.linked(order[p - 1], order[p + 1]) {
        return format!(
            "in: {layers}, it links {} and {}, which have no link of their own",
            ctx.id(order[p - 1]),
            ctx.id(order[p + 1])
        );
    }
    let keep = |q: usize| q != p;
    let without: Vec<usize> = (0..order.len())
        .filter(|&q| keep(q))
        .map(|q| order[q])
        .collect();
    let groups: Vec<Option<GroupSpec>> = (0..order.len())
        .filter(|&q| keep(q))
        .map(|q| chosen.group(q).cloned())
        .collect();
    without_it(ctx, &format!("in: {layers}"), chosen, (&without, &groups))
}

/// `head`, then what `chosen` predicts against the placement `without` (node order and groups) it.
fn without_it(
    ctx: &Ctx,
    head: &str,
    chosen: &Candidate,
    (order, groups): (&[usize], &[Option<GroupSpec>]),
) -> String {
    match ctx.evaluate_grouped(order, groups) {
        Some(c) => format!(
            "{head}, without it {} vs {}",
            figure(ctx, c.score),
            figure(ctx, chosen.score)
        ),
        None => format!("{head}, the others cannot hold the model without it"),
    }
}

/// A node computing stage `s` as rank `r` of its tensor-parallel group: what the group predicts
/// without it (the other node alone when two were left).
fn why_in_group(ctx: &Ctx, chosen: &Candidate, mode: Mode, (s, r): (usize, usize)) -> String {
    let Some(g) = chosen.group(s) else {
        return why_in(ctx, chosen, mode, s);
    };
    let rank0 = chosen.order[s];
    let weight = g.weights.get(r).copied().unwrap_or(0);
    let total: u64 = g.weights.iter().map(|&w| u64::from(w)).sum();
    let n = chosen.counts[s];
    let head = format!(
        "in: rank {r} of the tensor-parallel group {} (weight {weight} of {total}, its share of all {n} layer{})",
        group_name(ctx, rank0, g),
        if n == 1 { "" } else { "s" },
    );
    if mode == Mode::Pinned {
        return format!("{head}, pinned");
    }
    let all = g.ranks(rank0);
    let ranks: Vec<usize> = all.iter().copied().filter(|&i| i != all[r]).collect();
    let mut order = chosen.order.clone();
    let mut groups = chosen.groups.clone();
    order[s] = ranks[0];
    groups[s] = (ranks.len() > 1).then(|| GroupSpec::by_speed(ctx.topo, ranks[0], &ranks[1..]));
    without_it(ctx, &head, chosen, (&order, &groups))
}

/// The best placement with `x` joining one of `chosen`'s stages as a tensor-parallel rank (a single
/// node's stage becoming a group), when the model allows groups.
fn joined(ctx: &Ctx, chosen: &Candidate, x: usize) -> Option<(Candidate, String)> {
    if !eligible(ctx, x) {
        return None;
    }
    let mut best: Option<(Candidate, String)> = None;
    for s in 0..chosen.order.len() {
        let rank0 = chosen.order[s];
        let mut members = chosen.group(s).map_or(Vec::new(), |g| g.members.clone());
        if chosen.group(s).is_none() && chosen.gpu.get(s).copied().unwrap_or(0) > 0 {
            continue;
        }
        members.push(x);
        let spec = GroupSpec::by_speed(ctx.topo, rank0, &members);
        if !group_sizes(ctx).contains(&(members.len() + 1)) || !all_linked(ctx, &spec.ranks(rank0))
        {
            continue;
        }
        let mut groups = chosen.groups.clone();
        groups[s] = Some(spec.clone());
        if let Some(c) = ctx.evaluate_grouped(&chosen.order, &groups)
            && best.as_ref().is_none_or(|b| ctx.compare(&c, &b.0).is_lt())
        {
            best = Some((c, group_name(ctx, rank0, &spec)));
        }
    }
    best
}

fn why_out(ctx: &Ctx, chosen: &Candidate, mode: Mode, max_k: usize, x: usize) -> String {
    match mode {
        Mode::Pinned => return "out: not pinned".to_string(),
        Mode::Manual => return "out: not in the manual layer counts".to_string(),
        Mode::Auto => {}
    }
    let order = &chosen.order;
    let k = order.len();
    let join = joined(ctx, chosen, x);
    let join_text = |(c, name): &(Candidate, String)| {
        format!(
            "left out: the tensor-parallel group {name} predicts {} vs {} without",
            figure(ctx, c.score),
            figure(ctx, chosen.score)
        )
    };
    if k >= max_k || k >= ctx.card.n_layers {
        if let Some(j) = &join {
            return join_text(j);
        }
        if k >= max_k {
            return format!("out: the placement is at the stage limit ({max_k})");
        }
        return "out: every layer already has a stage of its own".to_string();
    }
    let linked_at: Vec<usize> = (0..=k)
        .filter(|&pos| {
            (pos == 0 || ctx.linked(order[pos - 1], x)) && (pos == k || ctx.linked(x, order[pos]))
        })
        .collect();
    if linked_at.is_empty() {
        if let Some(j) = &join {
            return join_text(j);
        }
        let names = ctx.names(order);
        let shown = if names.len() > 4 {
            format!(
                "{}, … {}",
                shoal_ids::join(&names[..3], ", "),
                names[names.len() - 1]
            )
        } else {
            shoal_ids::join(&names, ", ")
        };
        return format!("out: no link to {shown} where it could join");
    }
    let mut best: Option<Candidate> = None;
    let mut trial = Vec::with_capacity(k + 1);
    for &pos in &linked_at {
        trial.clear();
        trial.extend_from_slice(&order[..pos]);
        trial.push(x);
        trial.extend_from_slice(&order[pos..]);
        let mut groups = chosen.groups.clone();
        groups.insert(pos, None);
        if let Some(c) = ctx.evaluate_grouped(&trial, &groups)
            && best.as_ref().is_none_or(|b| ctx.compare(&c, b).is_lt())
        {
            best = Some(c);
        }
    }
    if let Some(j) = &join
        && best.as_ref().is_none_or(|b| ctx.compare(&j.0, b).is_lt())
    {
        return join_text(j);
    }
    match best {
        Some(with) => {
            let group = join.as_ref().map_or(String::new(), |(c, name)| {
                format!(
                    "; the tensor-parallel group {name} predicts {}",
                    figure(ctx, c.score)
                )
            });
            format!(
                "left out: adding it predicts {} vs {} without{group}",
                figure(ctx, with.score),
                figure(ctx, chosen.score)
            )
        }
        None => {
            let needed = linked_at
                .iter()
                .map(|&pos| ctx.card.stage_bytes(1, pos == 0, pos == k, ctx.kv_tokens))
                .min()
                .unwrap_or(0);
            format!(
                "out: not enough memory (has {}, a stage where it could join needs at least {})",
                fmt_bytes(ctx.mem(x)),
                fmt_bytes(needed)
            )
        }
    }
}
