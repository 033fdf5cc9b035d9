//! Why each node is in or out of the chosen placement ([`NodeVerdict`]s), by costing the alternatives:
//! - a node in a pipeline: the placement without it (the others in the same order, layers split again for
//!   the goal) — "without it 41 tok/s vs 52", or the others cannot hold the model, or it links two nodes
//!   that have no link of their own;
//! - a node out (automatic placement): the placement with it added at its best position —
//!   "adding it predicts 41 tok/s vs 52 without" — or why it cannot be added at all: the stage limit, no
//!   link to the placement's nodes, not enough memory for a stage where it could link in.
//!
//! Figures are the goal's: one stream's tok/s for latency, the largest batch's aggregate for throughput.

use crate::fmt::{fmt_bytes, fmt_tok_s};
use crate::model::Goal;
use crate::output::NodeVerdict;
use crate::rates::BATCH_SIZES;
use crate::search::{Candidate, Ctx, Mode};

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
            let (used, reason) = match chosen.order.iter().position(|&x| x == i) {
                Some(p) => (true, why_in(ctx, chosen, mode, p)),
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
    let without: Vec<usize> = order
        .iter()
        .enumerate()
        .filter(|&(q, _)| q != p)
        .map(|(_, &i)| i)
        .collect();
    match ctx.evaluate_strict(&without) {
        Ok(c) => format!(
            "in: {layers}, without it {} vs {}",
            figure(ctx, c.score),
            figure(ctx, chosen.score)
        ),
        Err(_) => format!("in: {layers}, the others cannot hold the model without it"),
    }
}

fn why_out(ctx: &Ctx, chosen: &Candidate, mode: Mode, max_k: usize, x: usize) -> String {
    match mode {
        Mode::Pinned => return "out: not pinned".to_string(),
        Mode::Manual => return "out: not in the manual layer counts".to_string(),
        Mode::Auto => {}
    }
    let order = &chosen.order;
    let k = order.len();
    if k >= max_k {
        return format!("out: the placement is at the stage limit ({max_k})");
    }
    if k >= ctx.card.n_layers {
        return "out: every layer already has a stage of its own".to_string();
    }
    let linked_at: Vec<usize> = (0..=k)
        .filter(|&pos| {
            (pos == 0 || ctx.linked(order[pos - 1], x)) && (pos == k || ctx.linked(x, order[pos]))
        })
        .collect();
    if linked_at.is_empty() {
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
        if let Ok(c) = ctx.evaluate_strict(&trial)
            && best.as_ref().is_none_or(|b| ctx.compare(&c, b).is_lt())
        {
            best = Some(c);
        }
    }
    match best {
        Some(with) => format!(
            "left out: adding it predicts {} vs {} without",
            figure(ctx, with.score),
            figure(ctx, chosen.score)
        ),
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
