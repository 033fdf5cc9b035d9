//! Rates of a placement beyond one stream: aggregate decode rates at several batch sizes, time to first
//! token, the goal's ranking figure. [`Timing`] holds the numbers of one candidate (per-stage layer
//! counts and rates, the links of its hops) and turns them into a [`Prediction`].
//!
//! With `t_i(b)` a stage's decode step of `b` tokens at the priced context (`compute::Compute::stage_us`:
//! each layer's weight roofline plus its attention over the context, and on the last stage the output
//! head and sampling; for a tensor-parallel stage `group::GroupCompute::stage_us`: the slowest rank's
//! share of each layer, two exchanges a layer, the input fanned out), a hop
//! `h(bytes) = rtt/2 + bytes/bandwidth`, `H` the hidden bytes of one token and `k` stages:
//! - one stream: `R(1)`, where `R(b) = Σ t_i(b) + Σ h_fwd(b·H) + Σ h_back(b·4)` is a micro-batch's round trip;
//! - `B` concurrent streams: the engine splits them into `m = min(B, k)` micro-batches of `b = ⌈B/m⌉`
//!   and keeps them all in flight, so a cycle (every stream one token) lasts `max(R(b), m·T(b))`, where
//!   `T(b)` is the busiest resource per micro-batch (the slowest stage `t_i(b)`, or a link's transfer
//!   `b·H/bandwidth`): `tok/s = B / max(R(b), m·T(b))`;
//! - time to first token of a prompt of `P` tokens: it is prefilled in chunks of [`PREFILL_CHUNK_TOKENS`]
//!   and the engine launches a sequence's next chunk only when the previous one has come back, so
//!   `TTFT = Σ_chunks c (Σ p_i(c) + Σ h_fwd(c·H) + Σ h_back(4))`, where `p_i(c)` is the chunk's weights
//!   roofline and causal attention over the prompt so far (`compute::Compute::chunk_us`), the last stage
//!   adding the head and sampling for the prompt's last row; compute-bound stages make that
//!   `≈ Σ_i P·layers_i / prefill_speed_i` plus attention and every chunk's hops.
//!
//! The goal's figure, in microseconds per token (lower is better): `R(1)` for latency, `1/tok/s` at the
//! largest of [`BATCH_SIZES`] for throughput.

use crate::cost::{Layout, resolve_stages, return_route};
use crate::group::StageCompute;
use crate::links::{LinkCost, LinkIndex};
use crate::model::{Goal, LinkKind, ModelCard, TOKEN_BYTES, Topology, decode_context};
use crate::output::{BatchRate, HopPrediction, Prediction, Stage, StagePrediction};
use shoal_ids::NodeId;

/// Batch sizes (concurrent streams) whose aggregate rate is predicted; the last one ranks for throughput.
pub const BATCH_SIZES: [usize; 4] = [1, 4, 16, 32];
/// Tokens of one prefill chunk (the engine's default `max_batch_tokens`).
pub const PREFILL_CHUNK_TOKENS: usize = 256;

/// What limits a rate.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bound {
    RoundTrip,
    Stage(usize),
    Forward(usize),
    Back(usize),
}

/// The numbers of one candidate.
#[derive(Debug, Clone)]
pub(crate) struct Timing {
    layers: Vec<usize>,
    /// Each stage's compute: its node's CPU, and its GPU for the stage's first layers; or its
    /// tensor-parallel group.
    compute: Vec<StageCompute>,
    fwd: Vec<LinkCost>,
    back: Vec<LinkCost>,
    hidden: f64,
    /// The context (cached tokens) a decode step's attention is priced at.
    context: usize,
}

impl Timing {
    /// `None` when adjacent nodes (or the token's way back, or a group's members) have no link. Decode
    /// attention is priced at `context` cached tokens.
    pub fn new(
        topo: &Topology,
        links: &LinkIndex,
        card: &ModelCard,
        layout: Layout<'_>,
        context: usize,
    ) -> Option<Timing> {
        let order = layout.order;
        let fwd = order
            .windows(2)
            .map(|w| Some(LinkCost::of(&topo.links[links.fwd(w[0], w[1])?])))
            .collect::<Option<Vec<_>>>()?;
        let back = return_route(links, order)?
            .into_iter()
            .map(|(a, b)| Some(LinkCost::of(&topo.links[links.back(a, b)?])))
            .collect::<Option<Vec<_>>>()?;
        let compute = layout.stage_computes((topo, links, card))?;
        Some(Timing {
            layers: layout.counts.to_vec(),
            compute,
            fwd,
            back,
            hidden: card.hidden_bytes_per_token as f64,
            context,
        })
    }

    /// The worst link kind used anywhere (`Loopback` for one stage).
    pub fn worst_kind(&self) -> LinkKind {
        let groups = self.compute.iter().filter_map(|c| c.group()?.worst_kind());
        (self.fwd.iter().chain(&self.back))
            .map(|l| l.kind)
            .chain(groups)
            .max()
            .unwrap_or(LinkKind::Loopback)
    }

    fn is_last(&self, i: usize) -> bool {
        i + 1 == self.layers.len()
    }

    fn stage_us(&self, i: usize, tokens: usize) -> f64 {
        let last = self.is_last(i);
        self.compute[i].stage_us(self.layers[i], tokens, self.context, last)
    }

    /// Stage `i`'s share of a prompt: every chunk, the head and sampling for the last row on the last
    /// stage.
    fn stage_prompt_us(&self, i: usize, prompt_tokens: usize) -> f64 {
        Self::chunks(prompt_tokens)
            .map(|(offset, c, last_chunk)| {
                let sample = last_chunk && self.is_last(i);
                self.compute[i].chunk_us(self.layers[i], offset, c, sample)
            })
            .sum()
    }

    /// A micro-batch of `tokens` tokens through every stage and hop, and `back_tokens` ids back.
    fn trip_us(&self, tokens: usize, back_tokens: usize) -> f64 {
        let (t, ids) = (tokens as f64, (back_tokens * TOKEN_BYTES as usize) as f64);
        (0..self.layers.len())
            .map(|i| self.stage_us(i, tokens))
            .sum::<f64>()
            + self
                .fwd
                .iter()
                .map(|l| l.send_us(t * self.hidden))
                .sum::<f64>()
            + self.back.iter().map(|l| l.send_us(ids)).sum::<f64>()
    }

    /// A micro-batch's round trip: every row samples a token that goes back.
    fn round_trip_us(&self, tokens: usize) -> f64 {
        self.trip_us(tokens, tokens)
    }

    /// The busiest resource per micro-batch of `tokens` tokens: a stage's compute or a link's transfer.
    fn busiest(&self, tokens: usize) -> (f64, Bound) {
        let t = tokens as f64;
        let stages = (0..self.layers.len()).map(|i| (self.stage_us(i, tokens), Bound::Stage(i)));
        let fwd = (self.fwd.iter().enumerate())
            .map(|(h, l)| (l.transfer_us(t * self.hidden), Bound::Forward(h)));
        let back = (self.back.iter().enumerate())
            .map(|(h, l)| (l.transfer_us(t * TOKEN_BYTES as f64), Bound::Back(h)));
        stages
            .chain(fwd)
            .chain(back)
            .fold(
                (0.0, Bound::RoundTrip),
                |best, x| {
                    if x.0 > best.0 { x } else { best }
                },
            )
    }

    /// One stream's time per token.
    pub fn token_latency_us(&self) -> f64 {
        self.round_trip_us(1)
    }

    /// Aggregate rate of `batch` streams: (tok/s, micro-batches, what bounds it).
    fn rate(&self, batch: usize) -> (f64, usize, Bound) {
        let batch = batch.max(1);
        let m = batch.min(self.layers.len()).max(1);
        let b = batch.div_ceil(m);
        let round_trip = self.round_trip_us(b);
        let (busiest, bound) = self.busiest(b);
        let (cycle, bound) = if m as f64 * busiest >= round_trip {
            (m as f64 * busiest, bound)
        } else {
            (round_trip, Bound::RoundTrip)
        };
        (batch as f64 * 1e6 / cycle, m, bound)
    }

    /// Microseconds per token by the goal's figure (lower is better).
    pub fn score_us(&self, goal: Goal) -> f64 {
        match goal {
            Goal::Latency => self.token_latency_us(),
            Goal::Throughput => {
                let batch = BATCH_SIZES[BATCH_SIZES.len() - 1];
                1e6 / self.rate(batch).0
            }
        }
    }

    /// The prompt's chunks, in order: (tokens before it, its tokens, whether it is the last).
    fn chunks(prompt_tokens: usize) -> impl Iterator<Item = (usize, usize, bool)> {
        let p = prompt_tokens.max(1);
        let n = p.div_ceil(PREFILL_CHUNK_TOKENS);
        (0..n).map(move |c| {
            let offset = c * PREFILL_CHUNK_TOKENS;
            (offset, (p - offset).min(PREFILL_CHUNK_TOKENS), c + 1 == n)
        })
    }

    /// Each chunk goes through the whole pipeline before the next is launched; one id comes back.
    fn ttft_us(&self, prompt_tokens: usize) -> f64 {
        let hops: f64 = Self::chunks(prompt_tokens)
            .map(|(_, c, _)| {
                let fwd = self.fwd.iter().map(|l| l.send_us(c as f64 * self.hidden));
                let back = self.back.iter().map(|l| l.send_us(TOKEN_BYTES as f64));
                fwd.chain(back).sum::<f64>()
            })
            .sum();
        let stages: f64 = (0..self.layers.len())
            .map(|i| self.stage_prompt_us(i, prompt_tokens))
            .sum();
        stages + hops
    }

    /// What one more cached token adds to one stream's time per token (attention on every stage).
    fn attention_per_position_us(&self) -> f64 {
        (self.compute.iter().zip(&self.layers))
            .map(|(c, &n)| c.attention_per_position_us(n))
            .sum()
    }

    fn bound_name(&self, bound: Bound, names: &[&NodeId]) -> String {
        let back_pair = |h: usize| -> (usize, usize) {
            if self.back.len() == 1 {
                (names.len() - 1, 0)
            } else {
                (names.len() - 1 - h, names.len() - 2 - h)
            }
        };
        match bound {
            Bound::RoundTrip => "round trip".to_string(),
            Bound::Stage(i) => format!("stage {}", names[i]),
            Bound::Forward(h) => format!("link {}→{}", names[h], names[h + 1]),
            Bound::Back(h) => {
                let (a, b) = back_pair(h);
                format!("link {}→{}", names[a], names[b])
            }
        }
    }

    /// Every figure, for stages run by `names` (in order).
    pub fn prediction(&self, names: &[&NodeId], goal: Goal, prompt_tokens: usize) -> Prediction {
        let token_latency_us = self.token_latency_us();
        let aggregate = BATCH_SIZES
            .iter()
            .map(|&batch| {
                let (tok_s, micro_batches, bound) = self.rate(batch);
                BatchRate {
                    batch,
                    micro_batches,
                    tok_s,
                    bound: self.bound_name(bound, names),
                }
            })
            .collect();
        let prompt_tokens = prompt_tokens.max(1);
        let stages = (0..self.layers.len())
            .map(|i| StagePrediction {
                node: names[i].clone(),
                layers: self.layers[i],
                token_us: self.stage_us(i, 1),
                prompt_us: self.stage_prompt_us(i, prompt_tokens),
                attention_us: self.context as f64
                    * self.compute[i].attention_per_position_us(self.layers[i]),
                head_us: if self.is_last(i) {
                    self.compute[i].head_us(self.layers[i], 1, 1)
                } else {
                    0.0
                },
                fan_out_us: self.compute[i].network_us(self.layers[i], 1).0,
                reduce_us: self.compute[i].network_us(self.layers[i], 1).1,
            })
            .collect();
        let hops = (self.fwd.iter().enumerate())
            .map(|(h, l)| HopPrediction {
                from: names[h].clone(),
                to: names[h + 1].clone(),
                kind: l.kind,
                token_us: l.send_us(self.hidden),
                prompt_us: Self::chunks(prompt_tokens)
                    .map(|(_, c, _)| l.send_us(c as f64 * self.hidden))
                    .sum(),
            })
            .collect();
        Prediction {
            goal,
            decode_tok_s: 1e6 / token_latency_us,
            token_latency_us,
            aggregate,
            prompt_tokens,
            ttft_us: self.ttft_us(prompt_tokens),
            context_tokens: self.context,
            attention_us_per_token_of_context: self.attention_per_position_us(),
            stages,
            hops,
            return_us: self
                .back
                .iter()
                .map(|l| l.send_us(TOKEN_BYTES as f64))
                .sum(),
        }
    }
}

/// Every predicted figure of `stages` (for instance an instance already placed), decode attention priced
/// at [`decode_context`] of the prompt (as [`crate::plan`] does when the constraints name no context).
/// `None` when a node is unknown or adjacent stages have no link.
pub fn forecast(
    topology: &Topology,
    card: &ModelCard,
    stages: &[Stage],
    goal: Goal,
    prompt_tokens: usize,
) -> Option<Prediction> {
    let context = decode_context(prompt_tokens.max(1));
    forecast_at(topology, card, stages, goal, prompt_tokens, context)
}

/// [`forecast`] with decode attention priced at `context_tokens` cached tokens.
pub fn forecast_at(
    topology: &Topology,
    card: &ModelCard,
    stages: &[Stage],
    goal: Goal,
    prompt_tokens: usize,
    context_tokens: usize,
) -> Option<Prediction> {
    let links = LinkIndex::new(topology, card.hidden_bytes_per_token);
    let resolved = resolve_stages(topology, stages)?;
    let timing = Timing::new(topology, &links, card, resolved.layout(), context_tokens)?;
    let names: Vec<&NodeId> = stages.iter().map(|s| &s.node).collect();
    Some(timing.prediction(&names, goal, prompt_tokens))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Link, LinkKind, NodeInfo};

    fn node(id: &str, speed: f64, prefill: Option<f64>) -> NodeInfo {
        NodeInfo {
            id: id.parse().unwrap(),
            mem_available: u64::MAX / 8,
            speed,
            prefill_speed: prefill,
            head_us: None,
            attention_us: None,
            sample_us: None,
            gpu: None,
            machine: None,
        }
    }

    /// A link of exactly 100 µs rtt and 1 MB/s (1 byte = 1 µs).
    fn link(a: &str, b: &str) -> Link {
        Link {
            a: a.parse().unwrap(),
            b: b.parse().unwrap(),
            kind: LinkKind::Ethernet,
            rtt_us: Some(100.0),
            bandwidth_bps: Some(1e6),
        }
    }

    fn card(hidden: u64) -> ModelCard {
        let mut c = crate::split::tests::card(30, 1);
        c.hidden_bytes_per_token = hidden;
        c
    }

    fn stages(list: &[(&str, usize)]) -> Vec<Stage> {
        let names: Vec<NodeId> = list.iter().map(|x| x.0.parse().unwrap()).collect();
        let counts: Vec<usize> = list.iter().map(|x| x.1).collect();
        crate::output::stages_from_counts(&names.iter().collect::<Vec<_>>(), &counts)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn one_node_runs_a_batch_at_its_roofline() {
        // 30 layers at 1000 layer-steps/s: 30 ms per step; compute-bound at 8000 layer-tokens/s, so a batch
        // of b costs max(30 ms, b · 3.75 ms).
        let topo = Topology {
            nodes: vec![node("a", 1000.0, Some(8000.0))],
            links: vec![],
        };
        let p = forecast(&topo, &card(10), &stages(&[("a", 30)]), Goal::Latency, 512).unwrap();
        assert!(close(p.token_latency_us, 30_000.0));
        assert!(close(p.decode_tok_s, 1e6 / 30_000.0));
        let rate = |b: usize| p.tok_s_at(b).unwrap();
        assert!(close(rate(1), 1e6 / 30_000.0));
        assert!(
            close(rate(4), 4e6 / 30_000.0),
            "memory-bound: 4 tokens per step"
        );
        assert!(
            close(rate(16), 16e6 / 60_000.0),
            "compute-bound: 16 · 3.75 ms"
        );
        assert!(close(rate(32), 32e6 / 120_000.0));
        assert_eq!(p.aggregate[3].bound, "stage a");
        // TTFT: 2 chunks of 256 tokens, each 256 · 3.75 ms, no hops.
        assert!(close(p.ttft_us, 2.0 * 256.0 * 3750.0));
        assert_eq!(p.prompt_tokens, 512);
        assert!(close(p.stages[0].prompt_us, p.ttft_us));
        assert_eq!(p.return_us, 0.0);
    }

    #[test]
    fn without_a_measured_batch_rate_a_batch_costs_b_steps() {
        let topo = Topology {
            nodes: vec![node("a", 1000.0, None)],
            links: vec![],
        };
        let p = forecast(&topo, &card(10), &stages(&[("a", 30)]), Goal::Latency, 100).unwrap();
        for r in &p.aggregate {
            assert!(close(r.tok_s, p.decode_tok_s), "{r:?}");
        }
        assert!(close(p.ttft_us, 100.0 * 30_000.0));
    }

    #[test]
    fn a_pipeline_streams_at_its_round_trip_and_batches_at_its_slowest_stage() {
        // a: 10 layers at 1000/s = 10 ms; b: 20 layers at 1000/s = 20 ms (b never compute-bound below
        // batch 50: prefill 50 000). Hop a→b: 50 µs + 100 bytes/token; token back: 50 + 4 µs.
        let topo = Topology {
            nodes: vec![
                node("a", 1000.0, Some(50_000.0)),
                node("b", 1000.0, Some(50_000.0)),
            ],
            links: vec![link("a", "b")],
        };
        let st = stages(&[("a", 10), ("b", 20)]);
        let p = forecast(&topo, &card(100), &st, Goal::Throughput, 256).unwrap();
        let one = 10_000.0 + 20_000.0 + 150.0 + 54.0;
        assert!(close(p.token_latency_us, one));
        assert!(close(p.hops[0].token_us, 150.0));
        assert!(close(p.return_us, 54.0));
        // Batch 4: 2 micro-batches of 2; round trip 30 ms + 250 + 58 µs; busiest = stage b 20 ms; 2 · 20 ms
        // > round trip, so the slowest stage bounds it.
        let r4 = &p.aggregate[1];
        assert_eq!((r4.batch, r4.micro_batches), (4, 2));
        assert!(close(r4.tok_s, 4e6 / 40_000.0), "{r4:?}");
        assert_eq!(r4.bound, "stage b");
        // Batch 1 is the one-stream rate, latency-bound.
        assert!(close(p.aggregate[0].tok_s, p.decode_tok_s));
        assert_eq!(p.aggregate[0].bound, "round trip");
        // Throughput's figure is batch 32: 2 micro-batches of 16; b: max(20 ms, 16·20/50 000 s = 6.4 ms).
        assert!(close(p.goal_tok_s(), 32e6 / 40_000.0));
        // TTFT of 256 tokens: one chunk, a then b compute-bound? a: max(10 ms, 256·10/50 000 s = 51.2 ms),
        // b: 102.4 ms; hop 50 + 25 600 µs; one id back 54 µs.
        let ttft = 51_200.0 + 102_400.0 + 25_650.0 + 54.0;
        assert!(close(p.ttft_us, ttft), "{} vs {ttft}", p.ttft_us);
    }

    #[test]
    fn a_thin_link_bounds_a_big_batch() {
        // 1 MB/s and 4 000 bytes per token: 4 ms per token on the wire, more than either stage's 1 ms.
        let topo = Topology {
            nodes: vec![node("a", 1000.0, Some(1e9)), node("b", 1000.0, Some(1e9))],
            links: vec![link("a", "b")],
        };
        let p = forecast(
            &topo,
            &card(4000),
            &stages(&[("a", 1), ("b", 1)]),
            Goal::Latency,
            1,
        );
        let r32 = p.unwrap().aggregate[3].clone();
        assert_eq!(r32.bound, "link a→b");
        assert!(close(r32.tok_s, 32e6 / (2.0 * 16.0 * 4000.0)));
    }

    /// Head, sampling and attention show in the figures: on the last stage only for the head, at the
    /// priced context for attention, and a forecast at another context moves by the stated slope.
    #[test]
    fn head_sampling_and_attention_are_priced_where_they_run() {
        let mut a = node("a", 1000.0, None);
        let mut b = node("b", 1000.0, None);
        for n in [&mut a, &mut b] {
            n.head_us = Some(3000.0);
            n.sample_us = Some(100.0);
            n.attention_us = Some(0.01);
        }
        let topo = Topology {
            nodes: vec![a, b],
            links: vec![link("a", "b")],
        };
        let st = stages(&[("a", 10), ("b", 20)]);
        let p = forecast_at(&topo, &card(100), &st, Goal::Latency, 100, 1000).unwrap();
        assert_eq!(p.context_tokens, 1000);
        // a: 10 · (1000 + 1000 · 0.01); b: 20 · 1010 + head 3000 + sample 100; hops 150 + 54.
        assert!(close(p.stages[0].token_us, 10_100.0));
        assert!(close(p.stages[0].attention_us, 100.0) && p.stages[0].head_us == 0.0);
        assert!(close(p.stages[1].token_us, 20_200.0 + 3100.0));
        assert!(close(p.stages[1].head_us, 3100.0) && close(p.stages[1].attention_us, 200.0));
        assert!(close(p.token_latency_us, 10_100.0 + 23_300.0 + 204.0));
        assert!(close(p.attention_us_per_token_of_context, 0.3));
        let q = forecast_at(&topo, &card(100), &st, Goal::Latency, 100, 200).unwrap();
        assert!(close(
            q.token_latency_us,
            p.token_latency_us - 800.0 * p.attention_us_per_token_of_context
        ));
        // The default context is the prompt plus half the assumed generation.
        let d = forecast(&topo, &card(100), &st, Goal::Latency, 100).unwrap();
        assert_eq!(d.context_tokens, 100 + crate::DEFAULT_GENERATED_TOKENS / 2);
        // TTFT of 100 tokens (one chunk): a 100 · 10 · 1000 + attention over 5050 positions per layer;
        // b likewise for 20 layers, plus the head and sampling of the last row; hop 50 + 10 000, id back 54.
        let attn = 5050.0 * 0.01;
        let ttft = 10.0 * (100_000.0 + attn) + 20.0 * (100_000.0 + attn) + 3100.0 + 10_050.0 + 54.0;
        assert!(close(p.ttft_us, ttft), "{} vs {ttft}", p.ttft_us);
    }

    #[test]
    fn an_unknown_node_or_missing_link_has_no_forecast() {
        let topo = Topology {
            nodes: vec![node("a", 1.0, None), node("b", 1.0, None)],
            links: vec![],
        };
        let c = card(1);
        assert!(
            forecast(
                &topo,
                &c,
                &stages(&[("a", 15), ("b", 15)]),
                Goal::Latency,
                1
            )
            .is_none()
        );
        assert!(forecast(&topo, &c, &stages(&[("zz", 30)]), Goal::Latency, 1).is_none());
    }
}
