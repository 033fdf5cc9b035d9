//! Local search for pools too big to search exhaustively: from a candidate, cost every one-node change —
//! drop a stage's node (the others keep their order), add an unused node at any position, or swap a
//! stage's node for an unused one — and move to the best change while it is better. It starts from the
//! best [`STARTS`] candidates of the other heuristics, then climbs again from whatever is best until
//! nothing improves, so the chosen candidate never holds a node whose removal would be predicted better.
//!
//! One round costs `k` drops + `(n − k)(k + 1)` adds + `k (n − k)` swaps, each a split and a costing:
//! polynomial in the pool size `n` and the stage count `k`.

use crate::search::{BestPerSet, Candidate, Ctx};

/// Candidates the local search starts from.
pub(crate) const STARTS: usize = 3;

pub(crate) fn refine(ctx: &Ctx, pool: &[usize], max_k: usize, best: &mut BestPerSet) {
    for start in best.top(ctx, STARTS) {
        climb(ctx, pool, max_k, start, best);
    }
    // Whatever ranks first must be a local optimum itself (each pass strictly improves the best).
    for _ in 0..pool.len() {
        let Some(top) = best.top(ctx, 1).pop() else {
            return;
        };
        match improve(ctx, pool, max_k, &top) {
            Some(better) => climb(ctx, pool, max_k, better, best),
            None => return,
        }
    }
}

/// Climbs from `cur` until no one-node change is better, offering every step.
fn climb(ctx: &Ctx, pool: &[usize], max_k: usize, mut cur: Candidate, best: &mut BestPerSet) {
    for _ in 0..2 * pool.len().max(1) {
        let next = improve(ctx, pool, max_k, &cur);
        best.offer(ctx, cur);
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    best.offer(ctx, cur);
}

/// The best one-node change of `cur` when it ranks before `cur`.
pub(crate) fn improve(
    ctx: &Ctx,
    pool: &[usize],
    max_k: usize,
    cur: &Candidate,
) -> Option<Candidate> {
    let order = &cur.order;
    let k = order.len();
    let mut best: Option<Candidate> = None;
    let mut consider = |cand: Option<Candidate>| {
        if let Some(c) = cand
            && ctx.compare(&c, cur).is_lt()
            && best.as_ref().is_none_or(|b| ctx.compare(&c, b).is_lt())
        {
            best = Some(c);
        }
    };
    let mut trial = Vec::with_capacity(k + 1);
    if k > 1 {
        for p in 0..k {
            trial.clear();
            trial.extend(
                order
                    .iter()
                    .enumerate()
                    .filter(|&(q, _)| q != p)
                    .map(|(_, &i)| i),
            );
            consider(ctx.evaluate(&trial));
        }
    }
    for &x in pool.iter().filter(|x| !order.contains(x)) {
        if k < max_k {
            for pos in 0..=k {
                let fits_links = (pos == 0 || ctx.linked(order[pos - 1], x))
                    && (pos == k || ctx.linked(x, order[pos]));
                if !fits_links {
                    continue;
                }
                trial.clear();
                trial.extend_from_slice(&order[..pos]);
                trial.push(x);
                trial.extend_from_slice(&order[pos..]);
                consider(ctx.evaluate(&trial));
            }
        }
        for p in 0..k {
            let fits_links = (p == 0 || ctx.linked(order[p - 1], x))
                && (p + 1 == k || ctx.linked(x, order[p + 1]));
            if !fits_links {
                continue;
            }
            trial.clear();
            trial.extend_from_slice(order);
            trial[p] = x;
            consider(ctx.evaluate(&trial));
        }
    }
    best
}
