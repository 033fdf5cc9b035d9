//! Candidate search: which nodes, in which order.
//!
//! Up to [`EXHAUSTIVE_NODES`] nodes: every subset (up to the stage limit) and every linked order of it,
//! keeping the fastest order per subset. Bigger pools: greedy chains — from every seed, repeatedly append
//! the node behind the cheapest link from the chain's tail, and a memory-first set (largest nodes until the
//! model fits) ordered by nearest neighbour from each of its members.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use crate::cost::{CostBreakdown, predict};
use crate::error::PlacementError;
use crate::model::{ModelCard, Stage, Topology, stages_from_counts};
use crate::split::split_layers;

/// Pools up to this size are searched exhaustively (Σ C(6,k)·k! = 1956 orders at most).
pub const EXHAUSTIVE_NODES: usize = 6;
/// Pinned sets up to this size have all their orders tried (7! = 5040).
pub const EXHAUSTIVE_ORDER_NODES: usize = 7;

/// A feasible placement before it is explained.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    /// Node indices into the topology, in stage order.
    pub order: Vec<usize>,
    pub stages: Vec<Stage>,
    pub cost: CostBreakdown,
}

/// Best first: lower latency, then fewer stages, then better worst link, then node ids, then layer ranges.
pub(crate) fn compare(a: &Candidate, b: &Candidate) -> Ordering {
    a.cost
        .total_us
        .total_cmp(&b.cost.total_us)
        .then(a.stages.len().cmp(&b.stages.len()))
        .then(a.cost.worst_kind().cmp(&b.cost.worst_kind()))
        .then_with(|| {
            let ka = a.stages.iter().map(|s| (&s.node, s.start, s.end));
            let kb = b.stages.iter().map(|s| (&s.node, s.start, s.end));
            ka.cmp(kb)
        })
}

pub(crate) struct Ctx<'a> {
    pub topo: &'a Topology,
    pub card: &'a ModelCard,
    pub kv_tokens: usize,
    linked: Vec<Vec<bool>>,
}

impl<'a> Ctx<'a> {
    pub fn new(topo: &'a Topology, card: &'a ModelCard, kv_tokens: usize) -> Self {
        let n = topo.nodes.len();
        let mut linked = vec![vec![false; n]; n];
        for (i, row) in linked.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                *cell = i != j
                    && topo
                        .links
                        .iter()
                        .any(|l| l.connects(&topo.nodes[i].id, &topo.nodes[j].id));
            }
        }
        Ctx {
            topo,
            card,
            kv_tokens,
            linked,
        }
    }

    pub fn linked(&self, i: usize, j: usize) -> bool {
        self.linked[i][j]
    }

    fn id(&self, i: usize) -> &str {
        &self.topo.nodes[i].id
    }

    fn mem(&self, i: usize) -> u64 {
        self.topo.nodes[i].mem_available
    }

    /// Splits and costs one order, with the precise reason when it is infeasible.
    pub fn evaluate_strict(&self, order: &[usize]) -> Result<Candidate, PlacementError> {
        for pair in order.windows(2) {
            if !self.linked(pair[0], pair[1]) {
                return Err(PlacementError::NoLink {
                    a: self.id(pair[0]).to_string(),
                    b: self.id(pair[1]).to_string(),
                });
            }
        }
        let names: Vec<&str> = order.iter().map(|&i| self.id(i)).collect();
        let mems: Vec<u64> = order.iter().map(|&i| self.mem(i)).collect();
        let counts = split_layers(self.card, &names, &mems, self.kv_tokens)?;
        self.costed(order, &counts)
    }

    /// Costs an order with given layer counts (links already checked).
    pub fn costed(&self, order: &[usize], counts: &[usize]) -> Result<Candidate, PlacementError> {
        let names: Vec<&str> = order.iter().map(|&i| self.id(i)).collect();
        let stages = stages_from_counts(&names, counts);
        let cost =
            predict(self.topo, self.card, &stages).ok_or_else(|| PlacementError::NoRoute {
                nodes: names.iter().map(|s| s.to_string()).collect(),
            })?;
        Ok(Candidate {
            order: order.to_vec(),
            stages,
            cost,
        })
    }

    fn evaluate(&self, order: &[usize]) -> Option<Candidate> {
        let total: u64 = order
            .iter()
            .map(|&i| self.mem(i))
            .fold(0, u64::saturating_add);
        if total < self.card.total_bytes(self.kv_tokens) {
            return None;
        }
        self.evaluate_strict(order).ok()
    }

    /// Calls `f` with every order of `nodes` in which adjacent nodes are linked.
    fn each_linked_order(&self, nodes: &[usize], f: &mut dyn FnMut(&[usize])) {
        fn rec(
            ctx: &Ctx,
            nodes: &[usize],
            used: &mut [bool],
            order: &mut Vec<usize>,
            f: &mut dyn FnMut(&[usize]),
        ) {
            if order.len() == nodes.len() {
                f(order);
                return;
            }
            for (k, &n) in nodes.iter().enumerate() {
                if used[k] || order.last().is_some_and(|&t| !ctx.linked(t, n)) {
                    continue;
                }
                used[k] = true;
                order.push(n);
                rec(ctx, nodes, used, order, f);
                order.pop();
                used[k] = false;
            }
        }
        let mut used = vec![false; nodes.len()];
        rec(self, nodes, &mut used, &mut Vec::new(), f);
    }

    /// Nearest-neighbour chain through `nodes` from `start`: `None` when it gets stuck.
    fn nearest_neighbour(&self, nodes: &[usize], start: usize) -> Option<Vec<usize>> {
        let mut chain = vec![start];
        while chain.len() < nodes.len() {
            let tail = *chain.last()?;
            let next =
                self.cheapest_next(tail, nodes.iter().copied().filter(|n| !chain.contains(n)))?;
            chain.push(next);
        }
        Some(chain)
    }

    /// The linked node behind the cheapest hop from `tail` (ties: more memory, then lower index).
    fn cheapest_next(&self, tail: usize, pool: impl Iterator<Item = usize>) -> Option<usize> {
        let bytes = self.card.hidden_bytes_per_token;
        pool.filter(|&j| self.linked(tail, j))
            .filter_map(|j| {
                let link = self.topo.best_link(self.id(tail), self.id(j), bytes)?;
                Some((link.hop_us(bytes), j))
            })
            .min_by(|x, y| {
                x.0.total_cmp(&y.0)
                    .then(self.mem(y.1).cmp(&self.mem(x.1)))
                    .then(x.1.cmp(&y.1))
            })
            .map(|(_, j)| j)
    }
}

/// Keeps the best candidate per node set.
#[derive(Default)]
struct BestPerSet(BTreeMap<Vec<usize>, Candidate>);

impl BestPerSet {
    fn offer(&mut self, cand: Candidate) {
        let mut key = cand.order.clone();
        key.sort_unstable();
        match self.0.get(&key) {
            Some(old) if compare(old, &cand).is_le() => {}
            _ => {
                self.0.insert(key, cand);
            }
        }
    }

    fn into_sorted(self) -> Vec<Candidate> {
        let mut all: Vec<Candidate> = self.0.into_values().collect();
        all.sort_by(compare);
        all
    }
}

/// Automatic search over `pool` (node indices) with at most `max_k` stages.
pub(crate) fn search_auto(ctx: &Ctx, pool: &[usize], max_k: usize) -> Vec<Candidate> {
    let mut best = BestPerSet::default();
    if pool.len() <= EXHAUSTIVE_NODES {
        for mask in 1u32..(1 << pool.len()) {
            if mask.count_ones() as usize > max_k {
                continue;
            }
            let subset: Vec<usize> = (0..pool.len())
                .filter(|b| mask & (1 << b) != 0)
                .map(|b| pool[b])
                .collect();
            ctx.each_linked_order(&subset, &mut |order| {
                if let Some(c) = ctx.evaluate(order) {
                    best.offer(c);
                }
            });
        }
    } else {
        greedy_chains(ctx, pool, max_k, &mut best);
        memory_first(ctx, pool, max_k, &mut best);
    }
    best.into_sorted()
}

fn greedy_chains(ctx: &Ctx, pool: &[usize], max_k: usize, best: &mut BestPerSet) {
    for &seed in pool {
        let mut chain = vec![seed];
        let mut fitted = 0;
        loop {
            if let Some(c) = ctx.evaluate(&chain) {
                best.offer(c);
                fitted += 1;
                if fitted >= 2 {
                    break;
                }
            }
            if chain.len() >= max_k {
                break;
            }
            let tail = chain[chain.len() - 1];
            let rest = pool.iter().copied().filter(|n| !chain.contains(n));
            match ctx.cheapest_next(tail, rest) {
                Some(next) => chain.push(next),
                None => break,
            }
        }
    }
}

fn memory_first(ctx: &Ctx, pool: &[usize], max_k: usize, best: &mut BestPerSet) {
    let mut by_mem = pool.to_vec();
    by_mem.sort_by(|&x, &y| {
        ctx.mem(y)
            .cmp(&ctx.mem(x))
            .then(ctx.topo.nodes[y].speed.total_cmp(&ctx.topo.nodes[x].speed))
            .then(x.cmp(&y))
    });
    let needed = ctx.card.total_bytes(ctx.kv_tokens);
    let mut sum = 0u64;
    let mut k = 0;
    while k < by_mem.len() && k < max_k && sum < needed {
        sum = sum.saturating_add(ctx.mem(by_mem[k]));
        k += 1;
    }
    for size in [k, k + 1] {
        if size == 0 || size > max_k || size > by_mem.len() {
            continue;
        }
        let set = &by_mem[..size];
        for &start in set {
            if let Some(order) = ctx.nearest_neighbour(set, start)
                && let Some(c) = ctx.evaluate(&order)
            {
                best.offer(c);
            }
        }
    }
}

/// All feasible orders of exactly `nodes` (pinned without a fixed order), best first.
pub(crate) fn search_orders(ctx: &Ctx, nodes: &[usize]) -> Vec<Candidate> {
    let mut found = Vec::new();
    if nodes.len() <= EXHAUSTIVE_ORDER_NODES {
        ctx.each_linked_order(nodes, &mut |order| {
            if let Some(c) = ctx.evaluate(order) {
                found.push(c);
            }
        });
    } else {
        for &start in nodes {
            if let Some(order) = ctx.nearest_neighbour(nodes, start)
                && let Some(c) = ctx.evaluate(&order)
            {
                found.push(c);
            }
        }
    }
    found.sort_by(compare);
    found.dedup_by(|a, b| a.stages == b.stages);
    found
}
