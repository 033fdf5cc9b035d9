//! A layer's feed-forward, the one place the decoder's layers differ in kind ([`crate::block::FfnSpec`]):
//! [`DenseFfn`] (`down(act(gate·x) * up·x)`) or [`MoeFfn`], a mixture of experts (decision 020).
//!
//! A mixture-of-experts layer routes each token: the router's logits (`ffn_gate_inp · x`, one per
//! expert) go through a softmax, the `k` largest are kept (and, for Qwen 3 MoE, renormalised to sum
//! to 1), and the token's output is `Σ w_e · expert_e(x)`; Qwen 2 MoE adds a shared expert scaled by
//! `sigmoid(ffn_gate_inp_shexp · x)`. gpt-oss keeps the `k` largest logits (its router has a bias) and
//! takes the softmax over those `k` only ([`Gating`]); GLM-4.5 takes sigmoid scores, chooses the `k`
//! largest of score + `exp_probs_b` and weights them by their unbiased scores (renormalised and scaled
//! as its file says), and adds its shared expert ungated; DeepSeek (`deepseek2`) routes as its file names
//! (softmax or sigmoid) and may first keep only the best groups of experts (group-limited top-k).
//! gpt-oss's experts carry biases (rows of the 2-D
//! `ffn_*_exps.bias`, given to each expert's matrices like a dense layer's bias). The experts' 3-D GGUF tensors are `count` contiguous matrices, so
//! each expert is loaded as an ordinary [`LinearSet`] over its slice (packed like the dense matrices).
//!
//! A tensor-parallel member (`crate::split`) holds a contiguous run of the experts (only their bytes
//! are read) and a slice of the shared expert's columns; it routes every token over all experts with
//! the whole router, exactly as the whole layer does, and adds only its experts' weighted outputs to
//! its partial sum, which the members' all-reduce makes whole.
//!
//! Compute is grouped by expert: the batch's rows routed to expert `e` are gathered, multiplied by `e`'s
//! matrices in one matmul each (so in prefill and batched decode every used expert's weights are read
//! once per step), and scattered back with their weights. A single decoding token reads only its top-k
//! experts, the router and the shared expert.

use shoal_kernels::ThreadPool;

use std::ops::Range;

use crate::arch::{Activation, Gating, Routing};
use crate::block::{DenseSpec, ExpertTensor, FfnSpec, MatrixSpec, MoeSpec, read_norm};
use crate::error::Result;
use crate::gguf::{GgufFile, RawTensor};
use crate::linear::{LinearScratch, LinearSet, Part};
use crate::ops;

/// Loads the matrices `spec` names, stacked as one [`LinearSet`], and checks its shape.
pub(crate) fn load_set(g: &mut GgufFile, spec: &MatrixSpec) -> Result<LinearSet> {
    let parts: Vec<Part<'_>> = spec
        .parts
        .iter()
        .map(|p| Part {
            weight: &p.weight,
            bias: p.bias.as_deref(),
        })
        .collect();
    let set = LinearSet::load(g, &parts)?;
    spec.check(set.out_features(), set.in_features())?;
    Ok(set)
}

/// A layer's feed-forward, loaded.
pub(crate) enum Ffn {
    Dense(DenseFfn),
    Moe(MoeFfn),
    /// A tensor-parallel member holding none of a dense feed-forward's columns (they could not be
    /// cut finer than another member's whole): its partial sum is zero.
    Idle,
}

/// Buffers the feed-forward reuses from layer to layer.
#[derive(Default)]
pub(crate) struct FfnScratch {
    lin: LinearScratch,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    /// Router logits (then probabilities), `rows × experts`.
    logits: Vec<f32>,
    /// Per expert: the rows routed to it and their weights.
    routes: Vec<Vec<(usize, f32)>>,
    /// One expert's gathered input rows and its output.
    rows_in: Vec<f32>,
    rows_out: Vec<f32>,
}

impl Ffn {
    pub(crate) fn load(g: &mut GgufFile, spec: &FfnSpec) -> Result<Self> {
        Ok(match spec {
            FfnSpec::Dense(d) => Self::Dense(DenseFfn::load(g, d)?),
            FfnSpec::Moe(m) => {
                let shared = match &m.shared {
                    Some((d, _)) => Some(DenseFfn::load(g, d)?),
                    None => None,
                };
                Self::Moe(MoeFfn::load(g, m, 0..m.experts.count, shared)?)
            }
        })
    }

    /// `out = ffn(x)` for `m` rows of `x`.
    pub(crate) fn forward(
        &self,
        x: &[f32],
        m: usize,
        act: Activation,
        out: &mut Vec<f32>,
        s: &mut FfnScratch,
        pool: &ThreadPool,
    ) -> Result<()> {
        match self {
            Self::Dense(d) => d.forward(x, m, act, out, s, pool),
            Self::Moe(e) => e.forward(x, m, act, out, s, pool),
            Self::Idle => {
                out.clear();
                out.resize(x.len(), 0.0);
                Ok(())
            }
        }
    }
}

/// `down(act(gate · x) * (up · x))`, gate and up as one set.
pub(crate) struct DenseFfn {
    gate_up: LinearSet,
    down: LinearSet,
    ff: usize,
}

impl DenseFfn {
    /// Of matrices already loaded (a tensor-parallel member's slices of a dense feed-forward or of a
    /// shared expert).
    pub(crate) fn of(gate_up: LinearSet, down: LinearSet) -> Self {
        let ff = down.in_features();
        Self { gate_up, down, ff }
    }

    fn load(g: &mut GgufFile, spec: &DenseSpec) -> Result<Self> {
        Ok(Self {
            gate_up: load_set(g, &spec.gate_up)?,
            down: load_set(g, &spec.down)?,
            ff: spec.down.input,
        })
    }

    fn forward(
        &self,
        x: &[f32],
        m: usize,
        act: Activation,
        out: &mut Vec<f32>,
        s: &mut FfnScratch,
        pool: &ThreadPool,
    ) -> Result<()> {
        self.gate_up
            .forward(x, m, &mut s.gate_up, &mut s.lin, pool)?;
        s.act.resize(m * self.ff, 0.0);
        ops::gated_par(act, &s.gate_up, self.ff, &mut s.act, pool);
        self.down.forward(&s.act, m, out, &mut s.lin, pool)
    }
}

/// Routed experts (and a gated shared expert): all of them, or a tensor-parallel member's share —
/// the router and the routing are whole on every member, so each computes the same choice and
/// weights and adds only its experts' outputs (and its slice of the shared expert) to its partial sum.
pub(crate) struct MoeFfn {
    router: LinearSet,
    /// The experts this layer holds: ids `first..first + experts.len()` of the router's.
    experts: Vec<DenseFfn>,
    first: usize,
    /// The shared expert (or this member's slice of it) and its gate vector (none: ungated).
    shared: Option<(DenseFfn, Option<Vec<f32>>)>,
    used: usize,
    routing: Routing,
    /// Added to the scores only to choose the experts (`exp_probs_b`).
    selection_bias: Option<Vec<f32>>,
    /// Factor on the chosen weights.
    scale: f32,
    /// Group-limited routing: (groups, groups used); (0, 0): none.
    groups: (usize, usize),
}

/// One expert's matrix: its name, its slice of the 3-D tensor and its row of the bias.
type ExpertPart = (String, RawTensor, Option<Vec<f32>>);

/// Matrices `held` of the `count` of a 3-D expert tensor, each as its own `rows × cols` tensor, with
/// its bias (a row of the `[count, rows]` bias tensor) when the file has one (also latent attention's
/// per-head `attn_k_b` / `attn_v_b`). Only those matrices' bytes are read: they are contiguous.
pub(crate) fn split_experts(
    g: &mut GgufFile,
    t: &ExpertTensor,
    count: usize,
    held: Range<usize>,
) -> Result<Vec<ExpertPart>> {
    let biases = match t.read_bias(g, count)? {
        Some(b) => b[held.start * t.rows..held.end * t.rows]
            .chunks_exact(t.rows)
            .map(|r| Some(r.to_vec()))
            .collect(),
        None => vec![None; held.len()],
    };
    let dims = g
        .tensors()
        .get(&t.name)
        .map(|e| e.dims.clone())
        .unwrap_or_default();
    t.check(&dims, count)?;
    let raw = g.read_raw_rows(&t.name, held.clone())?;
    let per = raw.data.len() / held.len().max(1);
    Ok(raw
        .data
        .chunks_exact(per.max(1))
        .zip(biases)
        .map(|(c, bias)| {
            let m = RawTensor {
                ty: raw.ty,
                dims: vec![t.rows, t.cols],
                data: c.to_vec(),
            };
            (t.name.clone(), m, bias)
        })
        .collect())
}

impl MoeFfn {
    /// Layer `spec`'s router, experts `held` and `shared` (the shared expert or a slice of it; its
    /// gate is read here).
    pub(crate) fn load(
        g: &mut GgufFile,
        spec: &MoeSpec,
        held: Range<usize>,
        shared: Option<DenseFfn>,
    ) -> Result<Self> {
        let n = spec.experts.count;
        let router = load_set(g, &spec.router)?;
        let first = held.start;
        let gates = split_experts(g, &spec.gate_exps, n, held.clone())?;
        let ups = split_experts(g, &spec.up_exps, n, held.clone())?;
        let downs = split_experts(g, &spec.down_exps, n, held)?;
        let experts = gates
            .into_iter()
            .zip(ups)
            .zip(downs)
            .map(|((gate, up), down)| {
                Ok(DenseFfn {
                    gate_up: LinearSet::from_raws(vec![gate, up])?,
                    down: LinearSet::from_raws(vec![down])?,
                    ff: spec.experts.ff,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let shared = match (shared, &spec.shared) {
            (Some(ffn), Some((_, gate))) => {
                let gate = gate.as_ref().map(|n| read_norm(g, n)).transpose()?;
                Some((ffn, gate))
            }
            _ => None,
        };
        let selection_bias = spec
            .selection_bias
            .as_ref()
            .map(|n| read_norm(g, n))
            .transpose()?;
        Ok(Self {
            router,
            experts,
            first,
            shared,
            used: spec.experts.used,
            routing: spec.experts.routing,
            selection_bias,
            scale: spec.experts.weights_scale,
            groups: (spec.experts.groups, spec.experts.groups_used),
        })
    }

    fn forward(
        &self,
        x: &[f32],
        m: usize,
        act: Activation,
        out: &mut Vec<f32>,
        s: &mut FfnScratch,
        pool: &ThreadPool,
    ) -> Result<()> {
        let dim = self.router.in_features();
        let n = self.router.out_features();
        self.router.forward(x, m, &mut s.logits, &mut s.lin, pool)?;
        s.routes.resize_with(n, Vec::new);
        s.routes.iter_mut().for_each(Vec::clear);
        for (t, probs) in s.logits.chunks_exact_mut(n).enumerate() {
            let how = Route {
                k: self.used,
                routing: self.routing,
                bias: self.selection_bias.as_deref(),
                scale: self.scale,
                groups: self.groups,
            };
            route(probs, &how, |e, w| s.routes[e].push((t, w)));
        }
        out.clear();
        out.resize(m * dim, 0.0);
        let mut routes = std::mem::take(&mut s.routes);
        for (expert, rows) in self.experts.iter().zip(&routes[self.first..]) {
            if rows.is_empty() {
                continue;
            }
            s.rows_in.clear();
            for &(t, _) in rows {
                s.rows_in.extend_from_slice(&x[t * dim..(t + 1) * dim]);
            }
            let mut rows_in = std::mem::take(&mut s.rows_in);
            let mut rows_out = std::mem::take(&mut s.rows_out);
            expert.forward(&rows_in, rows.len(), act, &mut rows_out, s, pool)?;
            for (&(t, w), y) in rows.iter().zip(rows_out.chunks_exact(dim)) {
                for (o, &v) in out[t * dim..(t + 1) * dim].iter_mut().zip(y) {
                    *o += w * v;
                }
            }
            std::mem::swap(&mut s.rows_in, &mut rows_in);
            std::mem::swap(&mut s.rows_out, &mut rows_out);
        }
        std::mem::swap(&mut s.routes, &mut routes);
        if let Some((ffn, gate)) = &self.shared {
            let mut y = std::mem::take(&mut s.rows_out);
            ffn.forward(x, m, act, &mut y, s, pool)?;
            for ((xr, yr), o) in x
                .chunks_exact(dim)
                .zip(y.chunks_exact(dim))
                .zip(out.chunks_exact_mut(dim))
            {
                let g = match gate {
                    Some(gate) => {
                        let g = xr.iter().zip(gate).map(|(a, b)| a * b).sum::<f32>();
                        1.0 / (1.0 + (-g).exp())
                    }
                    None => 1.0,
                };
                for (o, &v) in o.iter_mut().zip(yr) {
                    *o += g * v;
                }
            }
            s.rows_out = y;
        }
        Ok(())
    }
}

/// How one token picks its experts: the `k` of top-k, the family's routing, the selection bias (added to
/// the scores only to choose) and the factor on the weights.
struct Route<'a> {
    k: usize,
    routing: Routing,
    bias: Option<&'a [f32]>,
    scale: f32,
    /// Group-limited routing (DeepSeek V3): the experts form `.0` equal groups and only the `.1` groups
    /// whose two best selection scores sum highest are chosen from; `.0 ≤ 1`: no groups.
    groups: (usize, usize),
}

/// One token's routing: the `k` largest of `logits` (one per expert; first index on a tie) are handed
/// to `pick` with their weight. With [`Gating::SoftmaxThenTopK`] `logits` become softmax
/// probabilities in place first and the weights are the chosen probabilities; with
/// [`Gating::TopKThenSoftmax`] the weights are the softmax of the chosen logits; with
/// [`Gating::Sigmoid`] `logits` become sigmoid scores in place, the k largest of score + bias are
/// chosen and the weights are their scores. They are renormalised to sum to 1 when `norm_weights` (the
/// sum clamped below at f16's smallest normal, as llama.cpp does), then multiplied by `scale`.
fn route(logits: &mut [f32], how: &Route, mut pick: impl FnMut(usize, f32)) {
    let routing = how.routing;
    match routing.gating {
        Gating::SoftmaxThenTopK => softmax(logits),
        Gating::Sigmoid => logits
            .iter_mut()
            .for_each(|x| *x = 1.0 / (1.0 + (-*x).exp())),
        Gating::TopKThenSoftmax => {}
    }
    let select = |e: usize| logits[e] + how.bias.map_or(0.0, |b| b[e]);
    let allowed = allowed_groups(logits.len(), how.groups, &select);
    let open = |e: usize| allowed.as_ref().is_none_or(|a| a[e]);
    let mut chosen = [0usize; 64];
    let k = how.k.min(logits.len()).min(chosen.len());
    for i in 0..k {
        let mut best = usize::MAX;
        for e in (0..logits.len()).filter(|&e| open(e)) {
            if !chosen[..i].contains(&e) && (best == usize::MAX || select(e) > select(best)) {
                best = e;
            }
        }
        chosen[i] = best;
    }
    let mut weights = [0f32; 64];
    for (w, &e) in weights.iter_mut().zip(&chosen[..k]) {
        *w = logits[e];
    }
    let weights = &mut weights[..k];
    if routing.gating == Gating::TopKThenSoftmax {
        softmax(weights);
    }
    let total: f32 = weights.iter().sum();
    let scale = if routing.norm_weights {
        how.scale / total.max(6.103_515_6e-5)
    } else {
        how.scale
    };
    for (&e, &w) in chosen[..k].iter().zip(weights.iter()) {
        pick(e, w * scale);
    }
}

/// Under group-limited routing, which of `n` experts may be chosen: those of the `groups.1` groups (of
/// `n / groups.0` consecutive experts) whose two largest selection scores sum highest (first group on a
/// tie), as llama.cpp's `build_moe_ffn`; `None` without groups.
fn allowed_groups(
    n: usize,
    (groups, used): (usize, usize),
    select: &dyn Fn(usize) -> f32,
) -> Option<Vec<bool>> {
    if groups <= 1 || used >= groups {
        return None;
    }
    let per = n / groups;
    let score = |g: usize| {
        let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for e in g * per..(g + 1) * per {
            let s = select(e);
            if s > a {
                (a, b) = (s, a);
            } else if s > b {
                b = s;
            }
        }
        if per < 2 { a } else { a + b }
    };
    let scores: Vec<f32> = (0..groups).map(score).collect();
    let mut order: Vec<usize> = (0..groups).collect();
    order.sort_by(|&x, &y| scores[y].total_cmp(&scores[x]).then(x.cmp(&y)));
    let mut allowed = vec![false; n];
    for &g in &order[..used] {
        allowed[g * per..(g + 1) * per].fill(true);
    }
    Some(allowed)
}

/// `v = softmax(v)` in place.
fn softmax(v: &mut [f32]) {
    let max = v.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut sum = 0f32;
    for x in v.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    v.iter_mut().for_each(|x| *x /= sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picks(logits: &[f32], k: usize, norm: bool) -> Vec<(usize, f32)> {
        let routing = Routing {
            norm_weights: norm,
            gating: Gating::SoftmaxThenTopK,
        };
        let mut l = logits.to_vec();
        let mut out = Vec::new();
        route(&mut l, &plain(k, routing), |e, w| out.push((e, w)));
        out
    }

    fn plain(k: usize, routing: Routing) -> Route<'static> {
        Route {
            k,
            routing,
            bias: None,
            scale: 1.0,
            groups: (0, 0),
        }
    }

    #[test]
    fn group_limited_routing_chooses_within_the_groups_whose_two_best_scores_sum_highest() {
        // Two groups of three: group 0's best two sum 0.9 + 0.0, group 1's 0.5 + 0.5; the single best
        // expert (0) is in the group left out.
        let logits = [0.9, 0.0, -1.0, 0.5, 0.5, 0.4];
        let how = Route {
            k: 2,
            routing: Routing {
                norm_weights: false,
                gating: Gating::TopKThenSoftmax,
            },
            bias: None,
            scale: 1.0,
            groups: (2, 1),
        };
        let mut out = Vec::new();
        route(&mut logits.to_vec(), &how, |e, _| out.push(e));
        assert_eq!(out, [3, 4]);
        // Without groups the best two overall.
        out.clear();
        let free = Route {
            groups: (0, 0),
            ..how
        };
        route(&mut logits.to_vec(), &free, |e, _| out.push(e));
        assert_eq!(out, [0, 3]);
    }

    #[test]
    fn glm_routing_chooses_on_the_biased_scores_and_weights_by_the_unbiased_ones() {
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        let logits = [2.0, 1.0, 0.0, -1.0];
        // The bias lifts expert 3 over all (0.27 + 3), then 0 (0.88) beats 1 (0.73): chosen are 3 and 0,
        // weighted by sigmoid(-1) and sigmoid(2).
        let bias = [0.0, 0.0, 0.0, 3.0];
        for (norm, scale) in [(true, 2.5), (false, 1.0)] {
            let how = Route {
                k: 2,
                routing: Routing {
                    norm_weights: norm,
                    gating: Gating::Sigmoid,
                },
                bias: Some(&bias),
                scale,
                groups: (0, 0),
            };
            let mut l = logits.to_vec();
            let mut out = Vec::new();
            route(&mut l, &how, |e, w| out.push((e, w)));
            assert_eq!(out.iter().map(|r| r.0).collect::<Vec<_>>(), [3, 0]);
            let (a, b) = (sig(-1.0), sig(2.0));
            let z = if norm { a + b } else { 1.0 };
            assert!((out[0].1 - scale * a / z).abs() < 1e-6, "{out:?}");
            assert!((out[1].1 - scale * b / z).abs() < 1e-6, "{out:?}");
        }
    }

    #[test]
    fn gpt_oss_routing_takes_the_softmax_over_the_chosen_logits_only() {
        let routing = Routing {
            norm_weights: false,
            gating: Gating::TopKThenSoftmax,
        };
        let mut l = vec![0.0, 2.0, 1.0, -1.0];
        let mut out = Vec::new();
        route(&mut l, &plain(2, routing), |e, w| out.push((e, w)));
        let z = 2f32.exp() + 1f32.exp();
        assert_eq!(out.iter().map(|r| r.0).collect::<Vec<_>>(), [1, 2]);
        assert!((out[0].1 - 2f32.exp() / z).abs() < 1e-6);
        assert!((out[0].1 + out[1].1 - 1.0).abs() < 1e-6);
        // The logits are left as they were (no softmax over every expert).
        assert_eq!(l, [0.0, 2.0, 1.0, -1.0]);
    }

    #[test]
    fn routing_keeps_the_top_k_softmax_weights_renormalised_or_not() {
        let logits = [0.0, 2.0, 1.0, -1.0];
        let z: f32 = logits.iter().map(|v: &f32| v.exp()).sum();
        let p = |i: usize| logits[i].exp() / z;
        let raw = picks(&logits, 2, false);
        assert_eq!(raw.iter().map(|r| r.0).collect::<Vec<_>>(), [1, 2]);
        assert!((raw[0].1 - p(1)).abs() < 1e-6 && (raw[1].1 - p(2)).abs() < 1e-6);
        let normed = picks(&logits, 2, true);
        assert!((normed[0].1 - p(1) / (p(1) + p(2))).abs() < 1e-6);
        assert!((normed[0].1 + normed[1].1 - 1.0).abs() < 1e-6);
        // A tie goes to the first expert; k = all experts keeps every one.
        assert_eq!(picks(&[1.0, 1.0, 0.0], 1, true)[0], (0, 1.0));
        assert_eq!(picks(&logits, 4, false).len(), 4);
    }
}
