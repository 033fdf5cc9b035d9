//! Candidate search: which nodes, in which order, with layer counts chosen for the goal (`assign`),
//! ranked by the goal's figure (`rates`).
//!
//! Up to [`EXHAUSTIVE_NODES`] nodes: every subset (up to the stage limit) and every linked order of it,
//! keeping the best order per subset — so the best candidate never holds a node whose removal would be
//! predicted better (that subset was costed too). Bigger pools, polynomial: greedy chains (from every
//! seed, append the node behind the cheapest link until the model fits), a memory-first and a speed-first
//! set (largest / fastest-per-layer nodes until the model fits, each ordered by nearest neighbour from
//! each of its members), which the planner then improves with `refine`'s local search. A candidate's
//! stages may be tensor-parallel groups (`Candidate::groups`, offered by `tensor`, split and costed by
//! `Ctx::evaluate_grouped`); the best per node set is kept with and without one.

use shoal_ids::NodeId;
use std::cmp::Ordering;
use std::collections::BTreeMap;

use crate::compute::Compute;
use crate::cost::Layout;
use crate::error::PlacementError;
use crate::group::{GroupCompute, GroupSpec, group_capacity};
use crate::links::LinkIndex;
use crate::model::{Goal, ModelCard, Topology};
use crate::rates::{BATCH_SIZES, Timing};

/// Pools up to this size are searched exhaustively (Σ C(6,k)·k! = 1956 orders at most).
pub const EXHAUSTIVE_NODES: usize = 6;
/// Pinned sets up to this size have all their orders tried (7! = 5040).
pub const EXHAUSTIVE_ORDER_NODES: usize = 7;

/// How the node set of a placement was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Auto,
    Pinned,
    Manual,
}

/// A feasible placement before it is explained.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    /// Node indices into the topology, in stage order.
    pub order: Vec<usize>,
    /// Layers per stage.
    pub counts: Vec<usize>,
    /// Of those, the first ones on the stage's node's GPU (0: all on the CPU).
    pub gpu: Vec<usize>,
    /// Each stage's tensor-parallel group (`None`: its node alone), in stage order.
    pub groups: Vec<Option<GroupSpec>>,
    pub timing: Timing,
    /// The goal's figure in microseconds per token (lower is better).
    pub score: f64,
}

impl Candidate {
    pub fn layout(&self) -> Layout<'_> {
        Layout {
            order: &self.order,
            counts: &self.counts,
            gpu: &self.gpu,
            groups: &self.groups,
        }
    }

    /// Stage `s`'s group, when it has one.
    pub fn group(&self, s: usize) -> Option<&GroupSpec> {
        self.groups.get(s).and_then(Option::as_ref)
    }

    /// Every node computing a stage, stage by stage (a group's rank 0 first).
    pub fn nodes(&self) -> Vec<usize> {
        (self.order.iter().enumerate())
            .flat_map(|(s, &i)| {
                let members = self.group(s).map_or(&[][..], |g| &g.members[..]);
                std::iter::once(i).chain(members.iter().copied())
            })
            .collect()
    }

    /// The stage and rank node `i` computes in, when it is in this placement.
    pub fn rank_of(&self, i: usize) -> Option<(usize, usize)> {
        (self.order.iter().enumerate()).find_map(|(s, &x)| {
            if x == i {
                return Some((s, 0));
            }
            let r = self.group(s)?.members.iter().position(|&m| m == i)?;
            Some((s, r + 1))
        })
    }
}

pub(crate) struct Ctx<'a> {
    pub topo: &'a Topology,
    pub card: &'a ModelCard,
    pub kv_tokens: usize,
    pub goal: Goal,
    /// The context decode attention is priced at.
    pub context: usize,
    pub links: LinkIndex,
    /// Each node's position in id order (the last tie-break).
    rank: Vec<usize>,
}

impl<'a> Ctx<'a> {
    pub fn new(
        topo: &'a Topology,
        card: &'a ModelCard,
        kv_tokens: usize,
        goal: Goal,
        context: usize,
    ) -> Self {
        let mut by_id: Vec<usize> = (0..topo.nodes.len()).collect();
        by_id.sort_by(|&a, &b| topo.nodes[a].id.cmp(&topo.nodes[b].id).then(a.cmp(&b)));
        let mut rank = vec![0; by_id.len()];
        for (r, &i) in by_id.iter().enumerate() {
            rank[i] = r;
        }
        Ctx {
            topo,
            card,
            kv_tokens,
            goal,
            context,
            links: LinkIndex::new(topo, card.hidden_bytes_per_token),
            rank,
        }
    }

    pub fn linked(&self, i: usize, j: usize) -> bool {
        self.links.linked(i, j)
    }

    pub fn id(&self, i: usize) -> &NodeId {
        &self.topo.nodes[i].id
    }

    /// Memory node `i` offers a stage: the host's and the whole layers its GPU holds.
    pub fn mem(&self, i: usize) -> u64 {
        self.topo.nodes[i].stage_mem(self.card, self.kv_tokens)
    }

    /// Layers a stage on node `i` puts on its GPU at most (0 without one).
    pub fn gpu_cap(&self, i: usize) -> usize {
        self.topo.nodes[i].gpu_layers(self.card, self.kv_tokens)
    }

    pub fn names(&self, order: &[usize]) -> Vec<&NodeId> {
        order.iter().map(|&i| self.id(i)).collect()
    }

    /// Tokens of one micro-batch for the goal in a pipeline of `k` stages: one for latency, one
    /// micro-batch of the largest predicted batch for throughput.
    pub fn goal_tokens(&self, k: usize) -> usize {
        match self.goal {
            Goal::Latency => 1,
            Goal::Throughput => {
                let batch = BATCH_SIZES[BATCH_SIZES.len() - 1];
                batch.div_ceil(batch.min(k).max(1))
            }
        }
    }

    fn compute(&self, i: usize) -> Compute {
        Compute::of(&self.topo.nodes[i], self.card)
    }

    /// What one layer on node `i`'s CPU costs for the goal in a pipeline of `k` stages (its weights
    /// and its attention over the priced context).
    pub fn layer_cost(&self, i: usize, k: usize) -> f64 {
        (self.compute(i)).decode_layer_us(self.goal_tokens(k), self.context)
    }

    /// The layers node `i`'s GPU takes of a stage at most and what one of them costs there (as
    /// [`Ctx::layer_cost`]); `(0, 0.0)` without a GPU.
    pub fn gpu_layer_cost(&self, i: usize, k: usize) -> (usize, f64) {
        let node = &self.topo.nodes[i];
        match (self.gpu_cap(i), node.gpu_node()) {
            (cap, Some(g)) if cap > 0 => {
                let c = Compute::of(&g, self.card);
                (cap, c.decode_layer_us(self.goal_tokens(k), self.context))
            }
            _ => (0, 0.0),
        }
    }

    /// What node `i` pays besides its layers as stage `s` of `k`: the head and sampling on the last.
    pub fn fixed_cost(&self, i: usize, s: usize, k: usize) -> f64 {
        if s + 1 < k {
            return 0.0;
        }
        let tokens = self.goal_tokens(k);
        self.compute(i).head_us(tokens, tokens)
    }

    /// Best first: better goal figure, then fewer stages, then better worst link, then node ids, then
    /// layer ranges.
    pub fn compare(&self, a: &Candidate, b: &Candidate) -> Ordering {
        a.score
            .total_cmp(&b.score)
            .then(a.order.len().cmp(&b.order.len()))
            .then_with(|| a.nodes().len().cmp(&b.nodes().len()))
            .then(a.timing.worst_kind().cmp(&b.timing.worst_kind()))
            .then_with(|| self.key(a).cmp(self.key(b)))
    }

    /// Stage by stage: (node rank, start, end, group members' ranks).
    fn key<'c>(
        &'c self,
        c: &'c Candidate,
    ) -> impl Iterator<Item = (usize, usize, usize, Vec<usize>)> + 'c {
        let mut start = 0;
        (c.order.iter().zip(&c.counts).enumerate()).map(move |(st, (&i, &n))| {
            let s = start;
            start += n;
            let members = c.group(st).map_or(Vec::new(), |g| {
                g.members.iter().map(|&m| self.rank[m]).collect()
            });
            (self.rank[i], s, s + n, members)
        })
    }

    /// Splits (for the goal) and costs one order, with the precise reason when it is infeasible.
    pub fn evaluate_strict(&self, order: &[usize]) -> Result<Candidate, PlacementError> {
        self.evaluate_layout(order, &vec![None; order.len()])
    }

    /// Costs an order with given layer counts (links already checked).
    pub fn costed(&self, order: &[usize], counts: &[usize]) -> Result<Candidate, PlacementError> {
        self.costed_grouped(order, counts, &vec![None; order.len()])
    }

    /// [`Ctx::costed`] with each stage's tensor-parallel group (a group stage uses no GPU).
    pub fn costed_grouped(
        &self,
        order: &[usize],
        counts: &[usize],
        groups: &[Option<GroupSpec>],
    ) -> Result<Candidate, PlacementError> {
        let gpu: Vec<usize> = (order.iter().zip(counts).zip(groups))
            .map(|((&i, &n), g)| match g {
                Some(_) => 0,
                None => self.gpu_cap(i).min(n),
            })
            .collect();
        let layout = Layout {
            order,
            counts,
            gpu: &gpu,
            groups,
        };
        let timing = Timing::new(self.topo, &self.links, self.card, layout, self.context)
            .ok_or_else(|| PlacementError::NoRoute {
                nodes: order.iter().map(|&i| self.id(i).clone()).collect(),
            })?;
        Ok(Candidate {
            order: order.to_vec(),
            counts: counts.to_vec(),
            gpu,
            groups: groups.to_vec(),
            score: timing.score_us(self.goal),
            timing,
        })
    }

    /// Splits (for the goal) and costs an order whose stages may be tensor-parallel groups; `None`
    /// when infeasible (memory, links).
    pub fn evaluate_grouped(
        &self,
        order: &[usize],
        groups: &[Option<GroupSpec>],
    ) -> Option<Candidate> {
        if groups.iter().all(Option::is_none) {
            return self.evaluate(order);
        }
        self.evaluate_layout(order, groups).ok()
    }

    /// [`Ctx::evaluate_strict`] for stages that may be tensor-parallel groups: a group stage holds as
    /// many layers as its every rank's share fits, and a layer there costs the slowest rank's share
    /// plus two exchanges.
    fn evaluate_layout(
        &self,
        order: &[usize],
        groups: &[Option<GroupSpec>],
    ) -> Result<Candidate, PlacementError> {
        for pair in order.windows(2) {
            if !self.linked(pair[0], pair[1]) {
                return Err(PlacementError::NoLink {
                    a: self.id(pair[0]).clone(),
                    b: self.id(pair[1]).clone(),
                });
            }
        }
        let k = order.len();
        let tokens = self.goal_tokens(k);
        let per_layer = self.card.per_layer_bytes(self.kv_tokens);
        let (mut mems, mut costs, mut fixed, mut gpu) = (vec![], vec![], vec![], vec![]);
        for (s, &i) in order.iter().enumerate() {
            let (first, last) = (s == 0, s + 1 == k);
            let Some(g) = groups.get(s).and_then(Option::as_ref) else {
                mems.push(self.mem(i));
                costs.push(self.layer_cost(i, k));
                fixed.push(self.fixed_cost(i, s, k));
                gpu.push(self.gpu_layer_cost(i, k));
                continue;
            };
            let gc = GroupCompute::of((self.topo, &self.links, self.card), i, g, first)
                .ok_or_else(|| PlacementError::NoRoute {
                    nodes: g.ranks(i).iter().map(|&m| self.id(m).clone()).collect(),
                })?;
            let cap = group_capacity(self.topo, self.card, (i, g), (first, last), self.kv_tokens);
            // The memory one node would need to hold exactly `cap` layers as this stage.
            let extra = self.card.stage_bytes(0, first, last, self.kv_tokens);
            mems.push(match cap {
                0 => extra.saturating_add(per_layer).saturating_sub(1),
                c => extra.saturating_add(per_layer.saturating_mul(c as u64)),
            });
            costs.push(gc.layer_us(tokens, self.context));
            let head = if last {
                gc.head_us(tokens, tokens)
            } else {
                0.0
            };
            fixed.push(gc.fan_out_us(tokens) + head);
            gpu.push((0, 0.0));
        }
        let counts = crate::assign::assign_layers(
            self.card,
            &self.names(order),
            &mems,
            self.kv_tokens,
            crate::assign::Costs {
                cpu_us: &costs,
                gpu: &gpu,
                fixed_us: &fixed,
            },
            self.goal,
        )?;
        self.costed_grouped(order, &counts, groups)
    }

    /// [`Ctx::evaluate_strict`] after a cheap total-memory check; `None` when infeasible.
    pub fn evaluate(&self, order: &[usize]) -> Option<Candidate> {
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
        pool.filter_map(|j| {
            let link = &self.topo.links[self.links.fwd(tail, j)?];
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

/// Keeps the best candidate per node set (every node computing a stage, groups' members too) with
/// and without a tensor-parallel group, and
/// the best candidate with a tensor-parallel group (so an explanation can say what one would do).
#[derive(Default)]
pub(crate) struct BestPerSet {
    /// Keyed by the set and whether the candidate has a group (so a set's best pipeline is kept beside
    /// its best group: a caller may want one kind only).
    sets: BTreeMap<(Vec<usize>, bool), Candidate>,
    group: Option<Candidate>,
}

impl BestPerSet {
    pub fn offer(&mut self, ctx: &Ctx, cand: Candidate) {
        if cand.groups.iter().any(Option::is_some)
            && self
                .group
                .as_ref()
                .is_none_or(|g| ctx.compare(&cand, g).is_lt())
        {
            self.group = Some(cand.clone());
        }
        let mut nodes = cand.nodes();
        nodes.sort_unstable();
        let key = (nodes, cand.groups.iter().any(Option::is_some));
        match self.sets.get(&key) {
            Some(old) if ctx.compare(old, &cand).is_le() => {}
            _ => {
                self.sets.insert(key, cand);
            }
        }
    }

    /// The best candidate with a tensor-parallel group offered, if any was.
    pub fn best_group(&self) -> Option<&Candidate> {
        self.group.as_ref()
    }

    /// The best `n` candidates, best first.
    pub fn top(&self, ctx: &Ctx, n: usize) -> Vec<Candidate> {
        let mut all: Vec<&Candidate> = self.sets.values().collect();
        all.sort_by(|a, b| ctx.compare(a, b));
        all.into_iter().take(n).cloned().collect()
    }

    pub fn into_sorted(self, ctx: &Ctx) -> Vec<Candidate> {
        let mut all: Vec<Candidate> = self.sets.into_values().collect();
        all.sort_by(|a, b| ctx.compare(a, b));
        all
    }
}

/// Automatic search over `pool` (node indices) with at most `max_k` stages. Above [`EXHAUSTIVE_NODES`]
/// the caller refines the result (`refine`).
pub(crate) fn search_auto(ctx: &Ctx, pool: &[usize], max_k: usize) -> BestPerSet {
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
                    best.offer(ctx, c);
                }
            });
        }
    } else {
        greedy_chains(ctx, pool, max_k, &mut best);
        let by_mem = |x: usize, y: usize| ctx.mem(y).cmp(&ctx.mem(x));
        first_that_fit(ctx, pool, max_k, &mut best, &by_mem);
        let by_speed = |x: usize, y: usize| {
            let k = max_k.min(pool.len());
            ctx.layer_cost(x, k).total_cmp(&ctx.layer_cost(y, k))
        };
        first_that_fit(ctx, pool, max_k, &mut best, &by_speed);
    }
    best
}

fn greedy_chains(ctx: &Ctx, pool: &[usize], max_k: usize, best: &mut BestPerSet) {
    for &seed in pool {
        let mut chain = vec![seed];
        let mut fitted = 0;
        loop {
            if let Some(c) = ctx.evaluate(&chain) {
                best.offer(ctx, c);
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

/// The first nodes in `preference` order until the model fits (and one more), each set ordered by
/// nearest neighbour from each of its members.
fn first_that_fit(
    ctx: &Ctx,
    pool: &[usize],
    max_k: usize,
    best: &mut BestPerSet,
    preference: &dyn Fn(usize, usize) -> Ordering,
) {
    let mut sorted = pool.to_vec();
    sorted.sort_by(|&x, &y| {
        preference(x, y)
            .then(ctx.mem(y).cmp(&ctx.mem(x)))
            .then(x.cmp(&y))
    });
    let needed = ctx.card.total_bytes(ctx.kv_tokens);
    let mut sum = 0u64;
    let mut k = 0;
    while k < sorted.len() && k < max_k && sum < needed {
        sum = sum.saturating_add(ctx.mem(sorted[k]));
        k += 1;
    }
    for size in [k, k + 1] {
        if size == 0 || size > max_k || size > sorted.len() {
            continue;
        }
        let set = &sorted[..size];
        for &start in set {
            if let Some(order) = ctx.nearest_neighbour(set, start)
                && let Some(c) = ctx.evaluate(&order)
            {
                best.offer(ctx, c);
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
    found.sort_by(|a, b| ctx.compare(a, b));
    found.dedup_by(|a, b| a.order == b.order && a.counts == b.counts);
    found
}
