//! Replicas: several placements of one model on disjoint node sets, so they share the traffic.
//!
//! [`plan_replicas`] is greedy: the best placement on the whole pool, then the best on the nodes it left,
//! and so on, until `count` are placed or the nodes left cannot hold another — then it returns the ones
//! that fit and says why the next did not. A replica's tensor-parallel group takes at most its share of
//! the nodes left (unless only a larger one holds the model), so the first does not take them all. Two replicas of a two-node pipeline come out when no node
//! holds the model alone. [`group_tok_s`] adds up the replicas' predicted aggregate rates.

use std::fmt::Write;

use crate::error::PlacementError;
use crate::fmt::fmt_tok_s;
use crate::model::{Constraints, ModelCard, Topology};
use crate::output::{Placement, Stage};
use crate::plan::best;
use crate::rates::BATCH_SIZES;

/// Up to `count` placements of `card` on disjoint node sets of `topology`, each the best on the nodes the
/// earlier ones left. `constraints.pinned_nodes` (if any) is the pool to choose from rather than a pin;
/// manual `layer_counts` only make sense for one replica. Every explanation starts with "replica i of n"
/// and carries the group's aggregate rate; when fewer than `count` fit, each ends with why the next did
/// not. Errors only when not even one fits (the planner's error) or `count` is 0.
pub fn plan_replicas(
    topology: &Topology,
    card: &ModelCard,
    constraints: &Constraints,
    count: usize,
) -> Result<Vec<Placement>, PlacementError> {
    if count == 0 {
        return Err(PlacementError::InvalidConstraints {
            reason: "at least one replica must be asked for".into(),
        });
    }
    if count == 1 {
        return Ok(vec![best(topology, card, constraints)?]);
    }
    if constraints.layer_counts.is_some() {
        return Err(PlacementError::InvalidConstraints {
            reason: "manual layer counts place one replica, not several".into(),
        });
    }
    let pool = constraints.pinned_nodes.clone();
    let each = Constraints {
        pinned_nodes: None,
        keep_order: false,
        ..constraints.clone()
    };
    let mut left = Topology {
        nodes: topology
            .nodes
            .iter()
            .filter(|n| pool.as_ref().is_none_or(|p| p.contains(&n.id)))
            .cloned()
            .collect(),
        links: topology.links.clone(),
    };
    let mut out: Vec<Placement> = Vec::with_capacity(count);
    let mut short: Option<PlacementError> = None;
    while out.len() < count {
        // A tensor-parallel group takes at most this replica's share of the nodes left, so that the
        // first does not leave the rest without a node — unless only a larger group holds the model.
        let share = (left.nodes.len() / (count - out.len())).max(1);
        let capped = ModelCard {
            max_group: card.max_group.min(share),
            ..card.clone()
        };
        match best(&left, &capped, &each).or_else(|_| best(&left, card, &each)) {
            Ok(p) => {
                left.nodes
                    .retain(|n| !p.stages.iter().flat_map(Stage::nodes).any(|x| *x == n.id));
                out.push(p);
                if left.nodes.is_empty() && out.len() < count {
                    short = Some(PlacementError::NoNodes);
                }
            }
            Err(e) if out.is_empty() => return Err(e),
            Err(e) => short = Some(e),
        }
        if short.is_some() {
            break;
        }
    }
    annotate(&mut out, count, short.as_ref());
    Ok(out)
}

/// Σ over replicas of each one's predicted aggregate rate with `batch` concurrent streams on it (0 for a
/// replica whose prediction lacks that batch size).
pub fn group_tok_s(placements: &[Placement], batch: usize) -> f64 {
    placements
        .iter()
        .filter_map(|p| p.prediction.tok_s_at(batch))
        .sum()
}

fn annotate(out: &mut [Placement], count: usize, short: Option<&PlacementError>) {
    let n = out.len();
    let batch = BATCH_SIZES[BATCH_SIZES.len() - 1];
    let group = group_tok_s(out, batch);
    let one: f64 = out.iter().map(|p| p.prediction.decode_tok_s).sum();
    for (i, p) in out.iter_mut().enumerate() {
        let mut text = format!("replica {} of {n}: {}", i + 1, p.explanation);
        let _ = write!(
            text,
            "; group of {n} replica{}: {} at batch {batch} each, {} with one stream each",
            if n == 1 { "" } else { "s" },
            fmt_tok_s(group),
            fmt_tok_s(one)
        );
        if let Some(e) = short {
            let _ = write!(text, "; only {n} of {count} replicas fit: {e}");
        }
        p.explanation = text;
    }
}
