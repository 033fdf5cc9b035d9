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
use shoal_ids::NodeId;

/// What each stage's layers cost, in stage order.
pub(crate) struct Costs<'a> {
    /// One layer on the stage's CPU.
    pub cpu_us: &'a [f64],
    /// The layers the stage's GPU takes at most and one layer's cost there (`(0, _)`: no GPU). A
    /// stage's first layers go to its GPU.
    pub gpu: &'a [(usize, f64)],
    /// Besides its layers (the head and sampling on the last stage).
    pub fixed_us: &'a [f64],
}

impl Costs<'_> {
    /// Stage `i`'s layers' time with `count` of them.
    fn layers_us(&self, i: usize, count: usize) -> f64 {
        let (g, g_us) = self.gpu.get(i).copied().unwrap_or((0, 0.0));
        let on_gpu = count.min(g);
        on_gpu as f64 * g_us + (count - on_gpu) as f64 * self.cpu_us[i]
    }
}

/// Layer counts per stage (each >= 1, summing to `n_layers`, within memory) for `goal`.
pub(crate) fn assign_layers(
    card: &ModelCard,
    names: &[&NodeId],
    mems: &[u64],
    kv_tokens: usize,
    costs: Costs<'_>,
    goal: Goal,
) -> Result<Vec<usize>, PlacementError> {
    let cap = capacity(card, names, mems, kv_tokens)?;
    let n = card.n_layers;
    Ok(match goal {
        Goal::Latency if costs.gpu.iter().all(|g| g.0 == 0) => {
            fastest_first(n, &cap.caps, &cap.usable, costs.cpu_us)
        }
        Goal::Latency => cheapest_next(n, &cap.caps, &costs),
        Goal::Throughput => balanced(n, &cap.caps, &costs),
    })
}

/// Minimises `Σ time_i(counts_i)` when a stage's layers cost more past its GPU's (requires `len <= n
/// <= Σ caps`, every cap >= 1): one layer each, then every next layer to the stage it adds least to
/// (ties: the earlier stage) — exact, since each stage's time is convex in its layers (a GPU is only
/// used when faster than its node's CPU).
fn cheapest_next(n: usize, caps: &[usize], costs: &Costs<'_>) -> Vec<usize> {
    let k = caps.len();
    let mut counts = vec![1; k];
    let added = |i: usize, c: usize| costs.layers_us(i, c + 1) - costs.layers_us(i, c);
    for _ in k..n {
        let next = (0..k).filter(|&i| counts[i] < caps[i]).min_by(|&x, &y| {
            added(x, counts[x])
                .total_cmp(&added(y, counts[y]))
                .then(x.cmp(&y))
        });
        match next {
            Some(i) => counts[i] += 1,
            None => break,
        }
    }
    counts
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

/// Minimises `max time_i(counts_i) + fixed_i` (requires `len <= n <= Σ caps`, every cap >= 1; a
/// missing `fixed_i` is 0).
fn balanced(n: usize, caps: &[usize], costs: &Costs<'_>) -> Vec<usize> {
    let k = caps.len();
    let mut counts = vec![1; k];
    let extra = |i: usize| costs.fixed_us.get(i).copied().unwrap_or(0.0);
    for _ in k..n {
        let next = (0..k).filter(|&i| counts[i] < caps[i]).min_by(|&x, &y| {
            let tx = costs.layers_us(x, counts[x] + 1) + extra(x);
            let ty = costs.layers_us(y, counts[y] + 1) + extra(y);
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
    use crate::split::tests::ids;

    /// Costs of stages without GPUs.
    fn cpu<'a>(cpu_us: &'a [f64], fixed_us: &'a [f64]) -> Costs<'a> {
        Costs {
            cpu_us,
            gpu: &[],
            fixed_us,
        }
    }

    fn card(n_layers: usize) -> ModelCard {
        crate::split::tests::card(n_layers, 10)
    }

    #[test]
    fn latency_fills_the_fastest_node_to_capacity() {
        // a holds 20 layers and is 4x faster: it takes 20, b the rest.
        let counts = assign_layers(
            &card(30),
            &ids(["a", "b"]).each_ref(),
            &[200, 400],
            0,
            cpu(&[1.0, 4.0], &[]),
            Goal::Latency,
        );
        assert_eq!(counts.unwrap(), [20, 10]);
        // Order does not matter: the fast node is second.
        let counts = assign_layers(
            &card(30),
            &ids(["b", "a"]).each_ref(),
            &[400, 200],
            0,
            cpu(&[4.0, 1.0], &[]),
            Goal::Latency,
        );
        assert_eq!(counts.unwrap(), [10, 20]);
    }

    #[test]
    fn latency_keeps_one_layer_on_a_slow_stage() {
        let counts = assign_layers(
            &card(30),
            &ids(["a", "b", "c"]).each_ref(),
            &[1000, 1000, 1000],
            0,
            cpu(&[9.0, 1.0, 9.0], &[]),
            Goal::Latency,
        );
        assert_eq!(counts.unwrap(), [1, 28, 1]);
    }

    #[test]
    fn equal_costs_split_like_memory() {
        let c = card(31);
        let mems = [240, 160, 330];
        let names = ids(["a", "b", "c"]);
        let names = names.each_ref();
        let got = assign_layers(&c, &names, &mems, 0, cpu(&[2.0; 3], &[]), Goal::Latency).unwrap();
        assert_eq!(got, split_layers(&c, &names, &mems, 0).unwrap());
    }

    #[test]
    fn throughput_balances_stage_times() {
        // b is twice as fast: it takes twice the layers (20 vs 10: both stages 20 units).
        let counts = assign_layers(
            &card(30),
            &ids(["a", "b"]).each_ref(),
            &[1000, 1000],
            0,
            cpu(&[2.0, 1.0], &[]),
            Goal::Throughput,
        );
        assert_eq!(counts.unwrap(), [10, 20]);
        // Memory still caps: b holds 15, a takes the rest.
        let counts = assign_layers(
            &card(30),
            &ids(["a", "b"]).each_ref(),
            &[1000, 150],
            0,
            cpu(&[2.0, 1.0], &[]),
            Goal::Throughput,
        );
        assert_eq!(counts.unwrap(), [15, 15]);
    }

    /// The last stage's head counts in the balance: with it worth 10 layers of b, b takes fewer layers.
    #[test]
    fn throughput_balances_the_head_too() {
        let counts = assign_layers(
            &card(30),
            &ids(["a", "b"]).each_ref(),
            &[1000, 1000],
            0,
            cpu(&[1.0, 1.0], &[0.0, 10.0]),
            Goal::Throughput,
        );
        assert_eq!(counts.unwrap(), [20, 10]);
    }

    /// A stage whose first layers run on a faster GPU: those layers are cheap, the rest cost the CPU's.
    #[test]
    fn a_gpu_segment_is_filled_first_and_balanced_as_a_piecewise_time() {
        let gpu = [(12, 1.0), (0, 0.0)];
        let costs = |fixed_us| Costs {
            cpu_us: &[10.0, 4.0],
            gpu: &gpu,
            fixed_us,
        };
        // Latency: a's 12 GPU layers (1 each) first, then b's CPU (4) before a's CPU (10).
        let counts = assign_layers(
            &card(30),
            &ids(["a", "b"]).each_ref(),
            &[1000, 1000],
            0,
            costs(&[]),
            Goal::Latency,
        );
        assert_eq!(counts.unwrap(), [12, 18]);
        // Throughput: the slower stage as fast as can be — a's time is 12 + 10·(n − 12) past its GPU,
        // b's 4·m: a = 16, b = 14 take 52 and 56; a = 15 leaves b 60, a = 17 takes 62 itself.
        let counts = assign_layers(
            &card(30),
            &ids(["a", "b"]).each_ref(),
            &[1000, 1000],
            0,
            costs(&[]),
            Goal::Throughput,
        );
        assert_eq!(counts.unwrap(), [16, 14]);
    }

    #[test]
    fn memory_errors_are_the_splits_errors() {
        let err = assign_layers(
            &card(30),
            &ids(["a", "b"]).each_ref(),
            &[100, 100],
            0,
            cpu(&[1.0, 1.0], &[]),
            Goal::Latency,
        );
        assert_eq!(err.unwrap_err().error_type(), "does_not_fit");
    }
}
