//! The entry points: validate the request, pick the search, predict and explain the result.

use std::collections::BTreeSet;

use shoal_ids::NodeId;

use crate::cost::breakdown;
use crate::error::PlacementError;
use crate::explain::{Facts, SingleNode, explain, single_nodes};
use crate::model::{Constraints, ModelCard, Topology};
use crate::output::{GpuLayers, NodeVerdict, Placement, Stage, TensorGroup, stages_from_counts};
use crate::refine::refine;
use crate::search::{Candidate, Ctx, EXHAUSTIVE_NODES, Mode, search_auto, search_orders};
use crate::split::split_layers;
use crate::tensor::{group_candidates, offer_groups};
use crate::verdict::verdicts;

/// At most this many candidates are returned.
pub const MAX_CANDIDATES: usize = 32;

/// Candidate placements of `card` on `topology` under `constraints`, best first by the goal's figure
/// (one stream's latency by default), each with its [`Prediction`](crate::Prediction); the first also says
/// why each node is in or out. Deterministic: the same input gives the same output.
pub fn plan(
    topology: &Topology,
    card: &ModelCard,
    constraints: &Constraints,
) -> Result<Vec<Placement>, PlacementError> {
    plan_up_to(topology, card, constraints, MAX_CANDIDATES)
}

/// The best placement: the first of [`plan`].
pub fn best(
    topology: &Topology,
    card: &ModelCard,
    constraints: &Constraints,
) -> Result<Placement, PlacementError> {
    let mut all = plan_up_to(topology, card, constraints, 1)?;
    // plan never returns an empty list: it errors instead.
    Ok(all.swap_remove(0))
}

/// [`plan`] keeping at most `limit` (>= 1) candidates.
fn plan_up_to(
    topology: &Topology,
    card: &ModelCard,
    constraints: &Constraints,
    limit: usize,
) -> Result<Vec<Placement>, PlacementError> {
    validate(topology, card)?;
    if constraints.max_stages == Some(0) {
        return Err(PlacementError::InvalidConstraints {
            reason: "max_stages must be at least 1".into(),
        });
    }
    let max_k = constraints.max_stages.unwrap_or(usize::MAX);
    let ctx = Ctx::new(
        topology,
        card,
        constraints.kv_reserve_tokens,
        constraints.goal,
        constraints.context(),
    );
    let pinned = match &constraints.pinned_nodes {
        Some(ids) => Some(resolve(topology, ids.iter(), "pinned_nodes")?),
        None => None,
    };
    if let Some(p) = &pinned {
        if p.is_empty() {
            return Err(PlacementError::InvalidConstraints {
                reason: "pinned_nodes is empty".into(),
            });
        }
        if p.len() > max_k {
            return Err(PlacementError::TooManyStages {
                requested: p.len(),
                max: max_k,
            });
        }
    }
    let everyone: Vec<usize> = (0..topology.nodes.len()).collect();
    let prompt = constraints.prompt();
    let mut finisher = Finisher {
        ctx: &ctx,
        singles: single_nodes(&ctx, &everyone),
        best_group: None,
        prompt,
        max_k,
    };

    if let Some(counts) = &constraints.layer_counts {
        let cand = manual(
            &ctx,
            counts,
            pinned.as_deref(),
            constraints.keep_order,
            max_k,
        )?;
        return Ok(vec![finisher.finish(cand, Mode::Manual, true)]);
    }
    let (mut candidates, mode, pool) = match pinned {
        Some(p) if constraints.keep_order => (vec![ctx.evaluate_strict(&p)?], Mode::Pinned, p),
        Some(p) => {
            let mut found = search_orders(&ctx, &p);
            let groups = group_candidates(&ctx, &p, &p, 1);
            finisher.best_group = groups.iter().min_by(|a, b| ctx.compare(a, b)).cloned();
            found.extend(groups);
            (found, Mode::Pinned, p)
        }
        None => {
            let mut found = search_auto(&ctx, &everyone, max_k);
            offer_groups(&ctx, &everyone, max_k, &mut found);
            if everyone.len() > EXHAUSTIVE_NODES {
                refine(&ctx, &everyone, max_k, &mut found);
            }
            finisher.best_group = found.best_group().cloned();
            (found.into_sorted(&ctx), Mode::Auto, everyone.clone())
        }
    };
    if candidates.is_empty() {
        return Err(diagnose(&ctx, &pool, max_k));
    }
    candidates.sort_by(|a, b| ctx.compare(a, b));
    candidates.truncate(limit.max(1));
    Ok(candidates
        .into_iter()
        .enumerate()
        .map(|(i, c)| finisher.finish(c, mode, i == 0))
        .collect())
}

/// Turns candidates into placements (the same context for all of them).
struct Finisher<'a> {
    ctx: &'a Ctx<'a>,
    singles: Vec<SingleNode>,
    /// The best candidate with a tensor-parallel group, when one was costed.
    best_group: Option<Candidate>,
    prompt: usize,
    max_k: usize,
}

impl Finisher<'_> {
    /// `chosen`: the first placement, which also says why each node is in or out.
    fn finish(&self, cand: Candidate, mode: Mode, chosen: bool) -> Placement {
        let ctx = self.ctx;
        let names = ctx.names(&cand.order);
        let prediction = cand.timing.prediction(&names, ctx.goal, self.prompt);
        let nodes: Vec<NodeVerdict> = if chosen {
            verdicts(ctx, &cand, mode, self.max_k)
        } else {
            Vec::new()
        };
        // The candidate was costed with these links, so the breakdown exists.
        let cost = breakdown(ctx.topo, &ctx.links, ctx.card, cand.layout(), ctx.context);
        let explanation = match &cost {
            Some(cost) => explain(
                ctx,
                &Facts {
                    cand: &cand,
                    cost,
                    prediction: &prediction,
                    mode,
                    singles: &self.singles,
                    best_group: self.best_group.as_ref(),
                    verdicts: &nodes,
                },
            ),
            None => String::new(),
        };
        Placement {
            stages: with_groups(
                ctx,
                &cand,
                with_gpus(ctx, &cand, stages_from_counts(&names, &cand.counts)),
            ),
            predicted_token_latency_us: cost.map_or(prediction.token_latency_us, |c| c.total_us),
            explanation,
            prediction,
            nodes,
        }
    }
}

/// `stages` with each one's GPU layers as the candidate was costed with them.
fn with_gpus(ctx: &Ctx, cand: &Candidate, mut stages: Vec<Stage>) -> Vec<Stage> {
    for ((stage, &i), &layers) in stages.iter_mut().zip(&cand.order).zip(&cand.gpu) {
        stage.gpu = ctx.topo.nodes[i]
            .used_gpu()
            .filter(|_| layers > 0)
            .map(|g| GpuLayers {
                index: g.index,
                layers,
            });
    }
    stages
}

/// `stages` with each one's tensor-parallel group as the candidate was costed with it.
fn with_groups(ctx: &Ctx, cand: &Candidate, mut stages: Vec<Stage>) -> Vec<Stage> {
    for (s, stage) in stages.iter_mut().enumerate() {
        stage.group = cand.group(s).map(|g| TensorGroup {
            members: g.members.iter().map(|&m| ctx.id(m).clone()).collect(),
            weights: g.weights.clone(),
        });
    }
    stages
}

fn validate(topology: &Topology, card: &ModelCard) -> Result<(), PlacementError> {
    if card.n_layers == 0 {
        return Err(PlacementError::EmptyModel {
            model: card.id.clone(),
        });
    }
    if topology.nodes.is_empty() {
        return Err(PlacementError::NoNodes);
    }
    let mut seen = BTreeSet::new();
    for node in &topology.nodes {
        if !seen.insert(node.id.as_str()) {
            return Err(PlacementError::DuplicateNode {
                node: node.id.clone(),
                field: "topology.nodes",
            });
        }
        if !(node.speed.is_finite() && node.speed > 0.0) {
            return Err(PlacementError::InvalidNode {
                node: node.id.clone(),
                reason: format!("speed must be finite and > 0, got {}", node.speed),
            });
        }
    }
    Ok(())
}

/// Node ids → topology indices, rejecting unknown and repeated ids.
fn resolve<'a>(
    topology: &Topology,
    ids: impl Iterator<Item = &'a NodeId>,
    field: &'static str,
) -> Result<Vec<usize>, PlacementError> {
    let mut out: Vec<usize> = Vec::new();
    for id in ids {
        let idx = topology
            .nodes
            .iter()
            .position(|n| n.id == *id)
            .ok_or_else(|| PlacementError::UnknownNode {
                node: id.clone(),
                field,
            })?;
        if out.contains(&idx) {
            return Err(PlacementError::DuplicateNode {
                node: id.clone(),
                field,
            });
        }
        out.push(idx);
    }
    Ok(out)
}

/// A manual split: the list order is the stage order.
fn manual(
    ctx: &Ctx,
    counts: &[(NodeId, usize)],
    pinned: Option<&[usize]>,
    keep_order: bool,
    max_k: usize,
) -> Result<Candidate, PlacementError> {
    let card = ctx.card;
    if counts.is_empty() {
        return Err(PlacementError::InvalidConstraints {
            reason: "layer_counts is empty".into(),
        });
    }
    let order = resolve(ctx.topo, counts.iter().map(|(id, _)| id), "layer_counts")?;
    if let Some((node, _)) = counts.iter().find(|(_, n)| *n == 0) {
        return Err(PlacementError::ZeroLayers { node: node.clone() });
    }
    let sum = counts
        .iter()
        .fold(0usize, |acc, (_, n)| acc.saturating_add(*n));
    if sum != card.n_layers {
        return Err(PlacementError::LayerCountSum {
            sum,
            n_layers: card.n_layers,
        });
    }
    if order.len() > max_k {
        return Err(PlacementError::TooManyStages {
            requested: order.len(),
            max: max_k,
        });
    }
    if let Some(p) = pinned {
        let same_set = p.iter().collect::<BTreeSet<_>>() == order.iter().collect::<BTreeSet<_>>();
        if !same_set || (keep_order && p != order.as_slice()) {
            return Err(PlacementError::InvalidConstraints {
                reason:
                    "layer_counts must name the pinned nodes (in the pinned order with keep_order)"
                        .into(),
            });
        }
    }
    for pair in order.windows(2) {
        if !ctx.linked(pair[0], pair[1]) {
            return Err(PlacementError::NoLink {
                a: ctx.topo.nodes[pair[0]].id.clone(),
                b: ctx.topo.nodes[pair[1]].id.clone(),
            });
        }
    }
    let k = order.len();
    for (i, (&idx, (_, n))) in order.iter().zip(counts).enumerate() {
        let node = &ctx.topo.nodes[idx];
        let needed = card.stage_bytes(*n, i == 0, i + 1 == k, ctx.kv_tokens);
        if needed > ctx.mem(idx) {
            return Err(PlacementError::NodeDoesNotFit {
                node: node.id.clone(),
                needed,
                available: ctx.mem(idx),
            });
        }
    }
    let layer_counts: Vec<usize> = counts.iter().map(|(_, n)| *n).collect();
    ctx.costed(&order, &layer_counts)
}

/// Why the search found nothing: not enough memory on the best `max_k` nodes, or no linked order.
fn diagnose(ctx: &Ctx, pool: &[usize], max_k: usize) -> PlacementError {
    let mut by_mem = pool.to_vec();
    by_mem.sort_by(|&x, &y| ctx.mem(y).cmp(&ctx.mem(x)).then(x.cmp(&y)));
    by_mem.truncate(max_k.min(ctx.card.n_layers));
    let names: Vec<&NodeId> = by_mem.iter().map(|&i| &ctx.topo.nodes[i].id).collect();
    let mems: Vec<u64> = by_mem.iter().map(|&i| ctx.mem(i)).collect();
    let fits = (1..=mems.len())
        .any(|k| split_layers(ctx.card, &names[..k], &mems[..k], ctx.kv_tokens).is_ok());
    if fits {
        PlacementError::NoRoute {
            nodes: pool.iter().map(|&i| ctx.topo.nodes[i].id.clone()).collect(),
        }
    } else {
        PlacementError::DoesNotFit {
            needed: ctx.card.total_bytes(ctx.kv_tokens),
            available: mems.iter().fold(0, |a, &m| a.saturating_add(m)),
        }
    }
}
