//! Tensor-parallel candidates, offered beside the single-node and pipeline ones and ranked by the same
//! goal figure (so a group is chosen only when it is predicted faster).
//!
//! For a model whose card allows groups (`max_group >= 2`), every set of 2 to `min(max_group,
//! MAX_GROUP)` nodes that use no GPU and are all linked to each other (every pair has a link) is a
//! group: each rank weighted by its measured decode speed (and, holding every layer, also as far as each
//! rank's memory allows: `GroupSpec::within_memory`), every member tried as rank 0 (it holds the
//! head and the embedding, and the stage's input and output pass through it), holding every layer as
//! one stage; and the same group as one stage of a pipeline with other nodes (a model too big for the
//! group alone): with each of the [`PARTNERS`] largest other nodes before or after it, and with the
//! largest two, three, … of them (as many as the stage limit allows) with the group at every place in
//! their line. Up to [`GROUP_POOL`] eligible nodes
//! every set is tried; above, every set of the [`GROUP_POOL`] fastest, and from every node the group
//! grown by the member behind the cheapest worst link — polynomial: at most
//! `C(8,2) + C(8,3) + C(8,4) = 154` sets and `3n` more, each tried with every rank 0.

use std::collections::BTreeSet;

use crate::group::GroupSpec;
use crate::model::MAX_GROUP;
use crate::search::{BestPerSet, Candidate, Ctx};

/// Eligible nodes up to this many have every set tried as a group.
pub(crate) const GROUP_POOL: usize = 8;
/// Nodes tried as the other stage of a pipeline with a group (the largest by memory).
const PARTNERS: usize = 4;

/// The group sizes `ctx`'s model allows (empty: no groups).
pub(crate) fn group_sizes(ctx: &Ctx) -> std::ops::RangeInclusive<usize> {
    2..=ctx.card.max_group.min(MAX_GROUP)
}

/// Whether node `i` may join a group: its stages run on its CPU.
pub(crate) fn eligible(ctx: &Ctx, i: usize) -> bool {
    ctx.topo.nodes[i].used_gpu().is_none()
}

/// Whether every pair of `set` has a link.
pub(crate) fn all_linked(ctx: &Ctx, set: &[usize]) -> bool {
    (0..set.len()).all(|a| (a + 1..set.len()).all(|b| ctx.linked(set[a], set[b])))
}

/// Offers every group candidate of `pool` (at most `max_k` stages) to `best`.
pub(crate) fn offer_groups(ctx: &Ctx, pool: &[usize], max_k: usize, best: &mut BestPerSet) {
    for set in group_sets(ctx, pool) {
        for cand in group_candidates(ctx, &set, pool, max_k) {
            best.offer(ctx, cand);
        }
    }
}

/// The candidates of one set of nodes as a group: each member as rank 0 holding every layer, and (with
/// room for more stages) the group as one stage of a pipeline with the largest nodes of `pool` outside
/// it ([`pipelines_with`]).
pub(crate) fn group_candidates(
    ctx: &Ctx,
    set: &[usize],
    pool: &[usize],
    max_k: usize,
) -> Vec<Candidate> {
    if !group_sizes(ctx).contains(&set.len())
        || !set.iter().all(|&i| eligible(ctx, i))
        || !all_linked(ctx, set)
    {
        return Vec::new();
    }
    let mut found = Vec::new();
    for &rank0 in set {
        let members: Vec<usize> = set.iter().copied().filter(|&m| m != rank0).collect();
        let spec = GroupSpec::by_speed(ctx.topo, rank0, &members);
        let whole = (ctx.card.n_layers, (true, true));
        let fitted = spec.within_memory((ctx.topo, ctx.card), rank0, whole, ctx.kv_tokens);
        for s in std::iter::once(&spec).chain(&fitted) {
            if let Some(c) = ctx.evaluate_grouped(&[rank0], &[Some(s.clone())]) {
                found.push(c);
            }
        }
        for (order, groups) in pipelines_with(rank0, &spec, &partners(ctx, pool, set), max_k) {
            if let Some(c) = ctx.evaluate_grouped(&order, &groups) {
                found.push(c);
            }
        }
    }
    found
}

/// The pipelines of at most `max_k` stages with the group of `rank0` (`spec`) as one stage and
/// `partners` (largest first) as the others: each partner alone before or after the group, then the
/// largest `m` (2 ≤ m < `max_k`) in that order with the group at each of the `m + 1` places.
fn pipelines_with(
    rank0: usize,
    spec: &GroupSpec,
    partners: &[usize],
    max_k: usize,
) -> Vec<(Vec<usize>, Vec<Option<GroupSpec>>)> {
    let line = |others: &[usize], at: usize| {
        let mut order = others.to_vec();
        order.insert(at, rank0);
        let groups = (0..order.len())
            .map(|s| (s == at).then(|| spec.clone()))
            .collect();
        (order, groups)
    };
    let mut out = Vec::new();
    if max_k < 2 {
        return out;
    }
    for &x in partners {
        out.extend([line(&[x], 0), line(&[x], 1)]);
    }
    for m in 2..max_k.min(partners.len() + 1) {
        out.extend((0..=m).map(|at| line(&partners[..m], at)));
    }
    out
}

/// The largest nodes of `pool` outside `set` (ties: the lower index).
fn partners(ctx: &Ctx, pool: &[usize], set: &[usize]) -> Vec<usize> {
    let mut rest: Vec<usize> = pool.iter().copied().filter(|i| !set.contains(i)).collect();
    rest.sort_by(|&x, &y| ctx.mem(y).cmp(&ctx.mem(x)).then(x.cmp(&y)));
    rest.truncate(PARTNERS);
    rest
}

/// The node sets tried as groups, each sorted, without repeats.
fn group_sets(ctx: &Ctx, pool: &[usize]) -> BTreeSet<Vec<usize>> {
    let sizes = group_sizes(ctx);
    let mut sets = BTreeSet::new();
    if sizes.is_empty() {
        return sets;
    }
    let mut able: Vec<usize> = pool.iter().copied().filter(|&i| eligible(ctx, i)).collect();
    // Fastest first (one layer for one token), then more memory, then index.
    able.sort_by(|&x, &y| {
        ctx.layer_cost(x, 1)
            .total_cmp(&ctx.layer_cost(y, 1))
            .then(ctx.mem(y).cmp(&ctx.mem(x)))
            .then(x.cmp(&y))
    });
    let fastest = &able[..able.len().min(GROUP_POOL)];
    for mask in 1u32..(1 << fastest.len()) {
        if sizes.contains(&(mask.count_ones() as usize)) {
            let mut set: Vec<usize> = (0..fastest.len())
                .filter(|b| mask & (1 << b) != 0)
                .map(|b| fastest[b])
                .collect();
            set.sort_unstable();
            sets.insert(set);
        }
    }
    if able.len() > GROUP_POOL {
        for &seed in &able {
            grow(ctx, &able, seed, *sizes.end(), &mut sets);
        }
    }
    sets
}

/// From `seed`, add the node linked to every member whose worst link to them is cheapest (ties: the
/// faster), recording the set at every size.
fn grow(ctx: &Ctx, able: &[usize], seed: usize, max: usize, sets: &mut BTreeSet<Vec<usize>>) {
    let bytes = ctx.card.hidden_bytes_per_token;
    let mut set = vec![seed];
    while set.len() < max {
        let worst = |j: usize| -> Option<f64> {
            set.iter().try_fold(0.0f64, |w, &m| {
                let link = &ctx.topo.links[ctx.links.fwd(m, j)?];
                Some(w.max(link.hop_us(bytes)))
            })
        };
        let next = (able.iter().copied())
            .filter(|j| !set.contains(j))
            .filter_map(|j| Some((worst(j)?, j)))
            .min_by(|a, b| {
                a.0.total_cmp(&b.0)
                    .then(ctx.layer_cost(a.1, 1).total_cmp(&ctx.layer_cost(b.1, 1)))
                    .then(a.1.cmp(&b.1))
            });
        let Some((_, j)) = next else {
            return;
        };
        set.push(j);
        let mut sorted = set.clone();
        sorted.sort_unstable();
        sets.insert(sorted);
    }
}

/// `a+b+c`: a group's nodes, rank 0 first.
pub(crate) fn group_name(ctx: &Ctx, rank0: usize, g: &GroupSpec) -> String {
    let names: Vec<&str> = g.ranks(rank0).iter().map(|&i| ctx.id(i).as_str()).collect();
    names.join("+")
}
