//! Tensor-parallel stages: what a stage computed by a group of nodes costs, holds and is made of
//! (decision 024), and [`StageCompute`], the one pricing every stage kind goes through.
//!
//! A group of `n` layers on ranks `0..g` (rank 0 the stage's node: input in, output out, the head and
//! sampling; each rank `r` reads `s_r = w_r / Σ w` of every layer's heads and feed-forward columns, `w`
//! the group's weights), for a micro-batch of `b` tokens at a context of `C` cached tokens:
//!
//! `t(b) = fan_out(b) + n · (max_r s_r · layer_r(b, C) + 2 · exchange(b)) [+ head(b) on a last stage]`
//!
//! - `layer_r(b, C)`: one whole layer on rank `r`'s CPU at its own measured rates (`compute::Compute`:
//!   the weights' roofline and attention over the context); a rank reads its share of both, so the
//!   slowest share bounds every layer (the ranks meet at each reduction);
//! - `exchange(b) = max over member pairs of rtt/2 + b · 2H / bandwidth` on the pair's link: after
//!   attention's output and after the feed-forward's down projection every member sends its partial
//!   (the hidden state in f32, twice the card's f16 `H`) to every other at once, so one one-way hop, the
//!   slowest pair bounding it;
//! - `fan_out(b) = max over members of rtt/2 + b · bytes / bandwidth` from rank 0: the stage's input
//!   (token ids, 4 bytes a token, on a first stage — every member embeds them itself — else the hidden
//!   state in f32, `2H` a token, as the runtime sends it);
//! - the head is split by vocabulary too: each rank streams `s_r` of its rows (`head_r`), the
//!   logits are made whole by one more exchange of `b · V · 4` bytes (every rank's rows, f32; `V` the
//!   card's vocabulary), and rank 0 samples: `head(b) = max_r s_r · head_r(b) + logits(b) + sampling`.
//!
//! Memory: rank `r` holds `⌈s_r · n · (layer bytes + KV reserve)⌉`, every member the token embedding
//! when the stage is first and `⌈s_r · head bytes⌉` of the head when it is last. A group's ranks run on their CPUs
//! (a node whose stages use a GPU never joins one).

use crate::compute::{Compute, Split};
use crate::links::{LinkCost, LinkIndex};
use crate::model::{ModelCard, NodeInfo, TOKEN_BYTES, Topology};

/// A group as the planner handles it: ranks 1.. as node indices and one weight per rank, rank 0
/// first (rank 0 is the stage's node).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct GroupSpec {
    pub members: Vec<usize>,
    pub weights: Vec<u32>,
}

/// A rank's weight from its measured decode speed (layer-steps/s × 1000, at least 1).
pub(crate) fn weight_of(node: &NodeInfo) -> u32 {
    let w = (node.speed * 1000.0).round();
    if w.is_finite() {
        w.clamp(1.0, f64::from(u32::MAX)) as u32
    } else {
        1
    }
}

impl GroupSpec {
    /// `rank0` with `members`, each weighted by its measured decode speed.
    pub fn by_speed(topo: &Topology, rank0: usize, members: &[usize]) -> Self {
        let weights = std::iter::once(rank0)
            .chain(members.iter().copied())
            .map(|i| weight_of(&topo.nodes[i]))
            .collect();
        GroupSpec {
            members: members.to_vec(),
            weights,
        }
    }

    /// This group's ranks with weights that follow their speed as far as each rank's memory allows
    /// for a stage of `layers` layers: a rank whose speed share does not fit takes what fits, the others
    /// share the rest by speed (a fast node with little memory beside a slow big one). `None` when the
    /// ranks cannot hold the stage together, or when every speed share already fits.
    pub fn within_memory(
        &self,
        (topo, card): (&Topology, &ModelCard),
        rank0: usize,
        (layers, place): (usize, (bool, bool)),
        kv_tokens: usize,
    ) -> Option<Self> {
        // A whole share: every layer and the head's rows (a rank holds its share of both).
        let stage = layers as f64 * card.per_layer_bytes(kv_tokens) as f64
            + head_bytes(card, place, kv_tokens) as f64;
        let ranks = self.ranks(rank0);
        // The largest share each rank holds (a hair under, so rounding the weights keeps it within).
        let extras = rank_bytes(card, 0.0, 0, place, kv_tokens);
        let caps: Vec<f64> = ranks
            .iter()
            .map(|&i| {
                let room = topo.nodes[i].mem_available.saturating_sub(extras) as f64;
                if stage > 0.0 {
                    room / stage * (1.0 - 1e-4)
                } else {
                    1.0
                }
            })
            .collect();
        let speed = self.shares();
        if caps.iter().sum::<f64>() < 1.0 || speed.iter().zip(&caps).all(|(s, c)| s <= c) {
            return None;
        }
        let mut capped = vec![false; ranks.len()];
        let shares = loop {
            let left = 1.0
                - (0..ranks.len())
                    .filter(|&r| capped[r])
                    .map(|r| caps[r])
                    .sum::<f64>();
            let free: f64 = (0..ranks.len())
                .filter(|&r| !capped[r])
                .map(|r| speed[r])
                .sum();
            let share = |r: usize| {
                if capped[r] {
                    caps[r]
                } else {
                    left * speed[r] / free
                }
            };
            match (0..ranks.len()).find(|&r| !capped[r] && share(r) > caps[r]) {
                Some(r) => capped[r] = true,
                None => break (0..ranks.len()).map(share).collect::<Vec<f64>>(),
            }
        };
        let weights = shares
            .iter()
            .map(|&s| ((s * 1e6).floor() as u32).max(1))
            .collect();
        Some(GroupSpec {
            members: self.members.clone(),
            weights,
        })
    }

    /// Each rank's share of every layer, rank 0 first (equal shares when the weights do not say).
    pub fn shares(&self) -> Vec<f64> {
        let g = self.members.len() + 1;
        let sum: f64 = self.weights.iter().map(|&w| f64::from(w)).sum();
        if self.weights.len() != g || sum <= 0.0 {
            return vec![1.0 / g as f64; g];
        }
        self.weights.iter().map(|&w| f64::from(w) / sum).collect()
    }

    /// Every rank's node, rank 0 (`rank0`) first.
    pub fn ranks(&self, rank0: usize) -> Vec<usize> {
        std::iter::once(rank0)
            .chain(self.members.iter().copied())
            .collect()
    }
}

/// Bytes a rank holding `share` of a group stage of `layers` layers holds: its share of the layers and
/// of the head's rows, and the whole embedding on a first stage.
pub(crate) fn rank_bytes(
    card: &ModelCard,
    share: f64,
    layers: usize,
    (first, last): (bool, bool),
    kv_tokens: usize,
) -> u64 {
    let per_layer = card.per_layer_bytes(kv_tokens) as f64;
    let layers_bytes = (share * layers as f64 * per_layer).ceil() as u64;
    let extras = if first { card.embed_bytes } else { 0 };
    let head = head_bytes(card, (first, last), kv_tokens) as f64;
    layers_bytes
        .saturating_add(extras)
        .saturating_add((share * head).ceil() as u64)
}

/// The head's bytes a group stage splits by vocabulary (none apart from the embedding when tied to it
/// on a stage that is first and last; none on a stage that is not last).
fn head_bytes(card: &ModelCard, (first, last): (bool, bool), kv_tokens: usize) -> u64 {
    card.stage_bytes(0, first, last, kv_tokens) - card.stage_bytes(0, first, false, kv_tokens)
}

/// The layers a group stage can hold at most (every rank its share of each, with its extras).
pub(crate) fn group_capacity(
    topo: &Topology,
    card: &ModelCard,
    (rank0, spec): (usize, &GroupSpec),
    (first, last): (bool, bool),
    kv_tokens: usize,
) -> usize {
    let shares = spec.shares();
    (spec.ranks(rank0).iter().zip(&shares))
        .map(|(&i, &share)| {
            let mem = topo.nodes[i].mem_available;
            let extras = rank_bytes(card, share, 0, (first, last), kv_tokens);
            if mem < extras {
                return 0;
            }
            let per_layer = share * card.per_layer_bytes(kv_tokens) as f64;
            if per_layer <= 0.0 {
                return card.n_layers;
            }
            let fit = ((mem - extras) as f64 / per_layer).floor();
            (fit.min(card.n_layers as f64)) as usize
        })
        .min()
        .unwrap_or(0)
}

/// The pricing of one group stage (see the module's formula).
#[derive(Debug, Clone)]
pub(crate) struct GroupCompute {
    /// Every rank's CPU, rank 0 first.
    ranks: Vec<Compute>,
    shares: Vec<f64>,
    /// How many of the group's ranks run on each rank's machine (1 when it is not known): ranks on
    /// one machine share its cores and memory bus, so each computes at that fraction of its
    /// measured speed (which it measured alone).
    crowds: Vec<f64>,
    /// Every member pair's link.
    exchange: Vec<LinkCost>,
    /// Rank 0's link to each other member.
    fan_out: Vec<LinkCost>,
    /// A token's partial sum on the wire (f32).
    partial_bytes: f64,
    /// A token's input on the wire (its id on a first stage, else its hidden state in f32).
    input_bytes: f64,
    /// A token's logits on the wire (f32), when the head is split.
    logits_bytes: f64,
}

impl GroupCompute {
    /// `None` when a pair of the group has no link.
    pub fn of(
        (topo, links, card): (&Topology, &LinkIndex, &ModelCard),
        rank0: usize,
        spec: &GroupSpec,
        first: bool,
    ) -> Option<Self> {
        let ranks = spec.ranks(rank0);
        let link = |a: usize, b: usize| Some(LinkCost::of(&topo.links[links.fwd(a, b)?]));
        let mut exchange = Vec::new();
        for (x, &a) in ranks.iter().enumerate() {
            for &b in &ranks[x + 1..] {
                exchange.push(link(a, b)?);
            }
        }
        let fan_out = (spec.members.iter())
            .map(|&m| link(rank0, m))
            .collect::<Option<Vec<_>>>()?;
        let hidden = card.hidden_bytes_per_token as f64;
        let machine = |i: usize| topo.nodes[i].machine.as_deref();
        let crowds = (ranks.iter())
            .map(|&i| match machine(i) {
                Some(m) => ranks.iter().filter(|&&j| machine(j) == Some(m)).count() as f64,
                None => 1.0,
            })
            .collect();
        Some(GroupCompute {
            ranks: ranks
                .iter()
                .map(|&i| Compute::of(&topo.nodes[i], card))
                .collect(),
            shares: spec.shares(),
            crowds,
            exchange,
            fan_out,
            partial_bytes: 2.0 * hidden,
            input_bytes: if first {
                TOKEN_BYTES as f64
            } else {
                2.0 * hidden
            },
            logits_bytes: 4.0 * card.vocab_size as f64,
        })
    }

    /// The slowest rank's share of `per_rank` (what one layer costs on a rank's CPU whole), each rank
    /// slowed by the ranks it shares its machine with.
    fn slowest(&self, per_rank: impl Fn(Compute) -> f64) -> f64 {
        (self.ranks.iter().zip(&self.shares).zip(&self.crowds))
            .map(|((&c, &s), &crowd)| s * crowd * per_rank(c))
            .fold(0.0, f64::max)
    }

    /// The most ranks that share one machine (1: every rank on its own, or not known).
    pub fn crowd(&self) -> usize {
        self.crowds.iter().fold(1.0, |a: f64, &b| a.max(b)) as usize
    }

    /// One reduction's exchange for `tokens` tokens: the slowest pair's one-way hop.
    pub fn exchange_us(&self, tokens: usize) -> f64 {
        self.exchange_bytes_us(tokens as f64 * self.partial_bytes)
    }

    /// An exchange of `bytes` from every member to every other: the slowest pair's one-way hop.
    fn exchange_bytes_us(&self, bytes: f64) -> f64 {
        self.exchange
            .iter()
            .map(|l| l.send_us(bytes))
            .fold(0.0, f64::max)
    }

    /// Rank 0 sending the stage's input for `tokens` tokens to every member.
    pub fn fan_out_us(&self, tokens: usize) -> f64 {
        let bytes = tokens as f64 * self.input_bytes;
        self.fan_out
            .iter()
            .map(|l| l.send_us(bytes))
            .fold(0.0, f64::max)
    }

    /// The reductions of `layers` layers for `tokens` tokens (two a layer).
    pub fn reduce_us(&self, layers: usize, tokens: usize) -> f64 {
        2.0 * layers as f64 * self.exchange_us(tokens)
    }

    /// One layer for a decode step of `tokens` tokens at `context`: the slowest share and two
    /// exchanges.
    pub fn layer_us(&self, tokens: usize, context: usize) -> f64 {
        self.slowest(|c| c.decode_layer_us(tokens, context)) + 2.0 * self.exchange_us(tokens)
    }

    /// The head split by vocabulary (each rank its share of the rows), its logits made whole, and
    /// rank 0's sampling.
    pub fn head_us(&self, tokens: usize, sampled: usize) -> f64 {
        self.slowest(|c| c.head_us(tokens, 0))
            + self.exchange_bytes_us(tokens as f64 * self.logits_bytes)
            + self.ranks[0].sampling_us(sampled)
    }

    pub fn stage_us(&self, layers: usize, tokens: usize, context: usize, last: bool) -> f64 {
        let head = if last {
            self.head_us(tokens, tokens)
        } else {
            0.0
        };
        self.fan_out_us(tokens) + layers as f64 * self.layer_us(tokens, context) + head
    }

    pub fn chunk_us(&self, layers: usize, offset: usize, tokens: usize, sample: bool) -> f64 {
        let layer = self.slowest(|c| c.chunk_us(1, offset, tokens, false));
        let head = if sample { self.head_us(1, 1) } else { 0.0 };
        self.fan_out_us(tokens) + layers as f64 * (layer + 2.0 * self.exchange_us(tokens)) + head
    }

    /// What one more cached position adds (the slowest rank's share of attention, at the priced
    /// context's slowest rank when shares differ in attention).
    pub fn attention_per_position_us(&self, layers: usize) -> f64 {
        layers as f64 * self.slowest(|c| c.attention_per_position_us(1))
    }

    /// The worst link kind the group's exchanges use.
    pub fn worst_kind(&self) -> Option<crate::model::LinkKind> {
        self.exchange.iter().map(|l| l.kind).max()
    }
}

/// A stage's pricing: one node (its CPU and maybe its GPU) or a tensor-parallel group.
#[derive(Debug, Clone)]
pub(crate) enum StageCompute {
    Node(Split),
    Group(GroupCompute),
}

impl StageCompute {
    /// Stage `s` of `k` on node `node` with `gpu_layers` on its GPU, or computed by `group` with
    /// `node` as its rank 0. `None` when a pair of the group has no link.
    pub fn of(
        ctx: (&Topology, &LinkIndex, &ModelCard),
        node: usize,
        gpu_layers: usize,
        group: Option<&GroupSpec>,
        first: bool,
    ) -> Option<Self> {
        Some(match group {
            Some(g) => StageCompute::Group(GroupCompute::of(ctx, node, g, first)?),
            None => StageCompute::Node(Split::of(&ctx.0.nodes[node], ctx.2, gpu_layers)),
        })
    }

    pub fn stage_us(&self, layers: usize, tokens: usize, context: usize, last: bool) -> f64 {
        match self {
            StageCompute::Node(s) => s.stage_us(layers, tokens, context, last),
            StageCompute::Group(g) => g.stage_us(layers, tokens, context, last),
        }
    }

    pub fn chunk_us(&self, layers: usize, offset: usize, tokens: usize, sample: bool) -> f64 {
        match self {
            StageCompute::Node(s) => s.chunk_us(layers, offset, tokens, sample),
            StageCompute::Group(g) => g.chunk_us(layers, offset, tokens, sample),
        }
    }

    pub fn head_us(&self, layers: usize, tokens: usize, sampled: usize) -> f64 {
        match self {
            StageCompute::Node(s) => s.head_us(layers, tokens, sampled),
            StageCompute::Group(g) => g.head_us(tokens, sampled),
        }
    }

    pub fn attention_per_position_us(&self, layers: usize) -> f64 {
        match self {
            StageCompute::Node(s) => s.attention_per_position_us(layers),
            StageCompute::Group(g) => g.attention_per_position_us(layers),
        }
    }

    /// The group's time on the network per step of `tokens` tokens (its input fanned out and its
    /// reductions); 0 for one node.
    pub fn network_us(&self, layers: usize, tokens: usize) -> (f64, f64) {
        match self {
            StageCompute::Node(_) => (0.0, 0.0),
            StageCompute::Group(g) => (g.fan_out_us(tokens), g.reduce_us(layers, tokens)),
        }
    }

    pub fn group(&self) -> Option<&GroupCompute> {
        match self {
            StageCompute::Node(_) => None,
            StageCompute::Group(g) => Some(g),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::tests::node;
    use crate::model::{Link, LinkKind};

    /// Two nodes at 1000 layer-steps/s (4000 batched) linked at 100 µs and 1 MB/s (a byte a µs);
    /// 10 layers of 100 bytes, 10 bytes of activations a token.
    fn two() -> (Topology, ModelCard) {
        let mut a = node("a", 1000.0);
        let mut b = node("b", 1000.0);
        for n in [&mut a, &mut b] {
            n.prefill_speed = Some(4000.0);
            n.mem_available = 1000;
        }
        let link = Link {
            a: "a".parse().unwrap(),
            b: "b".parse().unwrap(),
            kind: LinkKind::Ethernet,
            rtt_us: Some(100.0),
            bandwidth_bps: Some(1e6),
        };
        let mut card = crate::split::tests::card(10, 100);
        card.hidden_bytes_per_token = 10;
        card.embed_bytes = 50;
        card.head_bytes = 70;
        let topo = Topology {
            nodes: vec![a, b],
            links: vec![link],
        };
        (topo, card)
    }

    #[test]
    fn shares_follow_the_weights_or_are_equal() {
        let g = GroupSpec {
            members: vec![1],
            weights: vec![3, 1],
        };
        assert_eq!(g.shares(), [0.75, 0.25]);
        let odd = GroupSpec {
            members: vec![1, 2],
            weights: vec![3, 1],
        };
        assert_eq!(odd.shares(), [1.0 / 3.0; 3]);
        assert_eq!(weight_of(&node("x", 12.3456)), 12_346);
        assert_eq!(weight_of(&node("x", 1e-9)), 1);
    }

    #[test]
    fn every_rank_holds_its_share_and_its_extras() {
        let (topo, card) = two();
        // Half of 10 layers of 100 bytes; every rank the embedding (50) and half the head (70).
        assert_eq!(rank_bytes(&card, 0.5, 10, (true, true), 0), 500 + 50 + 35);
        assert_eq!(rank_bytes(&card, 0.5, 10, (true, true), 0), 500 + 50 + 35);
        assert_eq!(rank_bytes(&card, 0.5, 10, (false, true), 0), 500 + 35);
        assert_eq!(rank_bytes(&card, 0.5, 10, (false, false), 0), 500);
        let even = GroupSpec {
            members: vec![1],
            weights: vec![1, 1],
        };
        // 1000 bytes a node: rank 0 has 915 for layers at 50 bytes a layer's half: 18, capped at 10.
        assert_eq!(
            group_capacity(&topo, &card, (0, &even), (true, true), 0),
            10
        );
        // Three quarters on rank 0 (with 53 bytes of the head): 897 / 75 = 11 → 10; with a KV reserve
        // of 1 byte × 20 tokens a layer, 897 / 90 = 9.
        let uneven = GroupSpec {
            members: vec![1],
            weights: vec![3, 1],
        };
        let mut kv = card.clone();
        kv.kv_bytes_per_token_per_layer = 1;
        assert_eq!(
            group_capacity(&topo, &kv, (0, &uneven), (true, true), 20),
            9
        );
    }

    #[test]
    fn a_step_is_the_fan_out_then_the_slowest_share_and_two_exchanges_a_layer() {
        let (topo, card) = two();
        let links = LinkIndex::new(&topo, card.hidden_bytes_per_token);
        let spec = GroupSpec {
            members: vec![1],
            weights: vec![1, 1],
        };
        let g = GroupCompute::of((&topo, &links, &card), 0, &spec, true).unwrap();
        // 8 tokens: a layer's half is max(1000, 8 · 250) / 2 = 1000 µs; an exchange 50 + 8 · 20 bytes;
        // the ids fanned out 50 + 8 · 4.
        assert_eq!(g.exchange_us(8), 210.0);
        assert_eq!(g.fan_out_us(8), 82.0);
        assert_eq!(g.reduce_us(10, 8), 4200.0);
        assert_eq!(g.stage_us(10, 8, 0, false), 82.0 + 10.0 * (1000.0 + 420.0));
        // A prompt chunk of 8 costs the same (no attention measured); one token a step: 500 µs a layer.
        assert_eq!(g.chunk_us(10, 0, 8, false), g.stage_us(10, 8, 0, false));
        assert_eq!(
            g.stage_us(10, 1, 0, false),
            54.0 + 10.0 * (500.0 + 2.0 * 70.0)
        );
        // Not a first stage: the hidden state in f32 (20 bytes a token) is fanned out.
        let mid = GroupCompute::of((&topo, &links, &card), 0, &spec, false).unwrap();
        assert_eq!(mid.fan_out_us(1), 70.0);
        // The head split by vocabulary when last: half of its 70 bytes (0.7 layers at 1000/s) on
        // each rank, then the logits' exchange — one hop of 50 µs (this card's vocabulary of 0 puts
        // no bytes on the wire).
        assert!((g.stage_us(10, 1, 0, true) - g.stage_us(10, 1, 0, false) - 400.0).abs() < 1e-9);
        let mut wide = card.clone();
        wide.vocab_size = 5;
        let g = GroupCompute::of((&topo, &links, &wide), 0, &spec, true).unwrap();
        // 5 logits of 4 bytes: one exchange of 20 bytes, 50 + 20 µs on this link.
        assert!((g.stage_us(10, 1, 0, true) - g.stage_us(10, 1, 0, false) - 420.0).abs() < 1e-9);
        // No link between the members: no pricing.
        let lonely = Topology {
            links: vec![],
            ..topo.clone()
        };
        let none = LinkIndex::new(&lonely, 10);
        assert!(GroupCompute::of((&lonely, &none, &card), 0, &spec, true).is_none());
    }
}
