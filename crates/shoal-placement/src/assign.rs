//! Layer counts chosen for the goal, within each stage's memory (`split::capacity`). `cost_us[i]` is
//! what one layer of stage `i` takes (for one token under the latency goal, for one micro-batch of the
//! largest predicted batch under the throughput goal), `fixed_us[i]` what the stage takes besides its
//! layers (the output head and sampling on the last stage).
//!
//! - [`Goal::Latency`]: minimise `Σ layers_i · cost_i` — one layer per stage, the rest to the cheapest
//!   stages first, each filled to its capacity (exact: the objective is linear). Stages of equal cost share
//!   their part in proportion to memory, so equal nodes split exactly as `split_layers` does.
//!   (`fixed_us` is the same whatever the counts, so it does not change the choice.)
//! - [`Goal::Throughput`]: minimise `max_i layers_i · cost_i + fixed_i` (balanced stage times) — one layer per
//!   stage, then each next layer to the stage whose time after taking it is lowest, within capacity (ties:
//!   more spare capacity, then the earlier stage). Exact for this min-max objective.

use crate::error::PlacementError;
use crate::model::{Goal, ModelCard};
use crate::split::{capacity, fill};

/// Layer counts per stage (each >= 1, summing to `n_layers`, within memory) for `goal`.
pub(crate) fn assign_layers(
    card: &ModelCard,
    names: &[&str],
    mems: &[u64],
    kv_tokens: usize,
    (cost_us, fixed_us): (&[f64], &[f64]),
    goal: Goal,
) -> Result<Vec<usize>, PlacementError> {
    let cap = capacity(card, names, mems, kv_tokens)?;
    Ok(match goal {
        Goal::Latency => fastest_first(card.n_layers, &cap.caps, &cap.usable, cost_us),
        Goal::Throughput => balanced(card.n_layers, &cap.caps, cost_us, fixed_us),
    })
}

/// Minimises `Σ counts_i · cost_i` (requires `len <= n <= Σ caps`, every cap >= 1).
fn fastest_first(n: usize, caps: &[usize], usable: &[u128], cost: &[f64]) -> Vec<usize> {
    let k = caps.len();
    let mut counts = vec![1; k];
    let mut left = n - k;
    let mut by_cost: Vec<usize> = (0..k).collect();
    by_cost.sort_by(|&a, &b| cost[a].total_cmp(&cost[b]).then(a.cmp(&b)));
    let mut start = 0;
    while start < k && left > 0 {
        let end = (start..k)
            .find(|&j| cost[by_cost[j]] != cost[by_cost[start]])
            .unwrap_or(k);
        let group = &by_cost[start..end];
        let room: usize = group.iter().map(|&i| caps[i] - 1).sum();
        let take = left.min(room);
        if take > 0 {
            let weights: Vec<u128> = group.iter().map(|&i| usable[i]).collect();
            let group_caps: Vec<usize> = group.iter().map(|&i| caps[i]).collect();
            let shares = fill(group.len() + take, &weights, &group_caps);
            for (&i, share) in group.iter().zip(shares) {
                counts[i] = share;
            }
            left -= take;
        }
        start = end;
    }
    counts
}

/// Minimises `max counts_i · cost_i + fixed_i` (requires `len <= n <= Σ caps`, every cap >= 1; a
/// missing `fixed_i` is 0).
fn balanced(n: usize, caps: &[usize], cost: &[f64], fixed: &[f64]) -> Vec<usize> {
    let k = caps.len();
    let mut counts = vec![1; k];
    let extra = |i: usize| fixed.get(i).copied().unwrap_or(0.0);
    for _ in k..n {
        let next = (0..k).filter(|&i| counts[i] < caps[i]).min_by(|&x, &y| {
            let tx = (counts[x] + 1) as f64 * cost[x] + extra(x);
            let ty = (counts[y] + 1) as f64 * cost[y] + extra(y);
            tx.total_cmp(&ty)
                .then((caps[y] - counts[y]).cmp(&(caps[x] - counts[x])))
                .then(x.cmp(&y))
        });
        match next {
            Some(i) => counts[i] += 1,
            None => break,
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::split_layers;

    fn card(n_layers: usize) -> ModelCard {
        crate::split::tests::card(n_layers, 10)
    }

    #[test]
    fn latency_fills_the_fastest_node_to_capacity() {
        // a holds 20 layers and is 4x faster: it takes 20, b the rest.
        let counts = assign_layers(
            &card(30),
            &["a", "b"],
            &[200, 400],
            0,
            (&[1.0, 4.0], &[]),
            Goal::Latency,
        );
        assert_eq!(counts.unwrap(), [20, 10]);
        // Order does not matter: the fast node is second.
        let counts = assign_layers(
            &card(30),
            &["b", "a"],
            &[400, 200],
            0,
            (&[4.0, 1.0], &[]),
            Goal::Latency,
        );
        assert_eq!(counts.unwrap(), [10, 20]);
    }

    #[test]
    fn latency_keeps_one_layer_on_a_slow_stage() {
        let counts = assign_layers(
            &card(30),
            &["a", "b", "c"],
            &[1000, 1000, 1000],
            0,
            (&[9.0, 1.0, 9.0], &[]),
            Goal::Latency,
        );
        assert_eq!(counts.unwrap(), [1, 28, 1]);
    }

    #[test]
    fn equal_costs_split_like_memory() {
        let c = card(31);
        let mems = [240, 160, 330];
        let names = ["a", "b", "c"];
        let got = assign_layers(&c, &names, &mems, 0, (&[2.0; 3], &[]), Goal::Latency).unwrap();
        assert_eq!(got, split_layers(&c, &names, &mems, 0).unwrap());
    }

    #[test]
    fn throughput_balances_stage_times() {
        // b is twice as fast: it takes twice the layers (20 vs 10: both stages 20 units).
        let counts = assign_layers(
            &card(30),
            &["a", "b"],
            &[1000, 1000],
            0,
            (&[2.0, 1.0], &[]),
            Goal::Throughput,
        );
        assert_eq!(counts.unwrap(), [10, 20]);
        // Memory still caps: b holds 15, a takes the rest.
        let counts = assign_layers(
            &card(30),
            &["a", "b"],
            &[1000, 150],
            0,
            (&[2.0, 1.0], &[]),
            Goal::Throughput,
        );
        assert_eq!(counts.unwrap(), [15, 15]);
    }

    /// The last stage's head counts in the balance: with it worth 10 layers of b, b takes fewer layers.
    #[test]
    fn throughput_balances_the_head_too() {
        let counts = assign_layers(
            &card(30),
            &["a", "b"],
            &[1000, 1000],
            0,
            (&[1.0, 1.0], &[0.0, 10.0]),
            Goal::Throughput,
        );
        assert_eq!(counts.unwrap(), [20, 10]);
    }

    #[test]
    fn memory_errors_are_the_splits_errors() {
        let err = assign_layers(
            &card(30),
            &["a", "b"],
            &[100, 100],
            0,
            (&[1.0, 1.0], &[]),
            Goal::Latency,
        );
        assert_eq!(err.unwrap_err().error_type(), "does_not_fit");
    }
}
