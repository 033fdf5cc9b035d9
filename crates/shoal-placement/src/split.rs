//! Memory-weighted layer split for an ordered list of nodes, and each stage's capacity (used by the
//! goal-driven splits of `assign` too).
//!
//! 1. Each stage's usable memory is `mem_available − its extra bytes` (embeddings on the first stage, head
//!    on the last); its capacity is how many whole layers (weights + KV reserve) fit in that.
//! 2. Layers are shared in proportion to usable memory with largest-remainder rounding (exact integer
//!    arithmetic; equal remainders go to the earlier stage).
//! 3. Every stage gets at least one layer, taken from the stage with the most layers (earliest on ties).
//! 4. Repair: stages over capacity are cut to capacity and the excess goes, one layer at a time, to the
//!    stage with the most spare capacity (earliest on ties).

use crate::error::PlacementError;
use crate::model::ModelCard;
use shoal_ids::NodeId;

/// Memory facts of one stage in a given order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    mem: u64,
    extra: u64,
    capacity: usize,
}

fn slots(card: &ModelCard, mems: &[u64], kv_tokens: usize) -> Vec<Slot> {
    let per_layer = card.per_layer_bytes(kv_tokens);
    let k = mems.len();
    mems.iter()
        .enumerate()
        .map(|(i, &mem)| {
            let extra = card.stage_bytes(0, i == 0, i + 1 == k, kv_tokens);
            let usable = mem.saturating_sub(extra);
            let capacity = if mem < extra {
                0
            } else {
                // Layers that cost nothing fit without limit.
                usable.checked_div(per_layer).map_or(card.n_layers, |c| {
                    usize::try_from(c).unwrap_or(usize::MAX).min(card.n_layers)
                })
            };
            Slot {
                mem,
                extra,
                capacity,
            }
        })
        .collect()
}

/// How many whole layers each stage can hold and the memory it has for layers, in stage order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Capacity {
    /// Layers each stage can hold (weights + KV reserve), at most `n_layers`; every one >= 1.
    pub caps: Vec<usize>,
    /// Memory each stage has for layers once its extras are paid.
    pub usable: Vec<u128>,
}

/// Checks that `card` fits on stages whose nodes offer `mems` bytes (in stage order) with >= 1 layer
/// each, and says how many layers each can hold. `names` (same length as `mems`) only labels errors.
pub(crate) fn capacity(
    card: &ModelCard,
    names: &[&NodeId],
    mems: &[u64],
    kv_tokens: usize,
) -> Result<Capacity, PlacementError> {
    let n = card.n_layers;
    let k = mems.len();
    if n == 0 {
        return Err(PlacementError::EmptyModel {
            model: card.id.clone(),
        });
    }
    if k == 0 {
        return Err(PlacementError::NoNodes);
    }
    if k > n {
        return Err(PlacementError::TooManyStages {
            requested: k,
            max: n,
        });
    }
    let slots = slots(card, mems, kv_tokens);
    if let Some((i, slot)) = slots.iter().enumerate().find(|(_, s)| s.capacity == 0) {
        return Err(PlacementError::NodeDoesNotFit {
            node: match names.get(i) {
                Some(name) => (*name).clone(),
                None => {
                    return Err(PlacementError::InvalidConstraints {
                        reason: format!("{} node names for {k} stages", names.len()),
                    });
                }
            },
            needed: card.stage_bytes(1, i == 0, i + 1 == k, kv_tokens),
            available: slot.mem,
        });
    }
    let total_capacity: usize = slots.iter().map(|s| s.capacity).sum();
    if total_capacity < n {
        let per_layer = card.per_layer_bytes(kv_tokens);
        let available = slots
            .iter()
            .map(|s| {
                s.extra
                    .saturating_add(per_layer.saturating_mul(s.capacity as u64))
            })
            .fold(0u64, u64::saturating_add);
        return Err(PlacementError::DoesNotFit {
            needed: card.total_bytes(kv_tokens),
            available,
        });
    }
    Ok(Capacity {
        caps: slots.iter().map(|s| s.capacity).collect(),
        usable: slots
            .iter()
            .map(|s| u128::from(s.mem.saturating_sub(s.extra)))
            .collect(),
    })
}

/// Splits `card.n_layers` over stages whose nodes offer `mems` bytes (in stage order). Returns the layer
/// count per stage, each >= 1, summing to `n_layers`, each within its node's memory.
///
/// `names` (same length as `mems`) only labels errors.
pub fn split_layers(
    card: &ModelCard,
    names: &[&NodeId],
    mems: &[u64],
    kv_tokens: usize,
) -> Result<Vec<usize>, PlacementError> {
    let cap = capacity(card, names, mems, kv_tokens)?;
    let counts = fill(card.n_layers, &cap.usable, &cap.caps);
    debug_assert_eq!(counts.iter().sum::<usize>(), card.n_layers);
    Ok(counts)
}

/// Shares `n` layers in proportion to `weights` (largest remainder), at least one each, then moves layers
/// off stages over their `caps`. Requires `len <= n <= Σ caps` and every cap >= 1.
pub(crate) fn fill(n: usize, weights: &[u128], caps: &[usize]) -> Vec<usize> {
    let mut counts = largest_remainder(n, weights);
    ensure_one_each(&mut counts);
    repair(&mut counts, caps);
    counts
}

/// Shares `n` in proportion to `weights` (largest remainder; ties to the lower index). Equal shares when
/// all weights are zero.
pub fn largest_remainder(n: usize, weights: &[u128]) -> Vec<usize> {
    let total: u128 = weights.iter().sum();
    let weights: Vec<u128> = if total == 0 {
        vec![1; weights.len()]
    } else {
        weights.to_vec()
    };
    let total: u128 = weights.iter().sum();
    let mut counts = Vec::with_capacity(weights.len());
    let mut remainders = Vec::with_capacity(weights.len());
    for (i, &w) in weights.iter().enumerate() {
        let num = n as u128 * w;
        counts.push((num / total) as usize);
        remainders.push((num % total, i));
    }
    let left = n - counts.iter().sum::<usize>();
    remainders.sort_by(|x, y| y.0.cmp(&x.0).then(x.1.cmp(&y.1)));
    for &(_, i) in remainders.iter().take(left) {
        counts[i] += 1;
    }
    counts
}

/// Gives every empty stage one layer from the fullest stage (requires `sum >= len`).
fn ensure_one_each(counts: &mut [usize]) {
    while let Some(empty) = counts.iter().position(|&c| c == 0) {
        let donor = (0..counts.len())
            .max_by(|&x, &y| counts[x].cmp(&counts[y]).then(y.cmp(&x)))
            .expect("non-empty");
        if counts[donor] <= 1 {
            return;
        }
        counts[donor] -= 1;
        counts[empty] += 1;
    }
}

/// Moves layers off stages over capacity onto stages with spare capacity (requires total capacity >= sum
/// and every capacity >= 1).
fn repair(counts: &mut [usize], caps: &[usize]) {
    let mut excess = 0;
    for (c, &cap) in counts.iter_mut().zip(caps) {
        if *c > cap {
            excess += *c - cap;
            *c = cap;
        }
    }
    while excess > 0 {
        let Some(target) = (0..counts.len())
            .filter(|&i| counts[i] < caps[i])
            .max_by(|&x, &y| {
                (caps[x] - counts[x])
                    .cmp(&(caps[y] - counts[y]))
                    .then(y.cmp(&x))
            })
        else {
            return;
        };
        counts[target] += 1;
        excess -= 1;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    /// Node ids of test names.
    pub(crate) fn ids<const N: usize>(names: [&str; N]) -> [NodeId; N] {
        names.map(|n| n.parse().unwrap())
    }

    pub(crate) fn card(n_layers: usize, layer_bytes: u64) -> ModelCard {
        ModelCard {
            id: "m".parse().unwrap(),
            n_layers,
            layer_bytes,
            embed_bytes: 0,
            head_bytes: 0,
            active_head_bytes: 0,
            kv_bytes_per_token_per_layer: 0,
            context_length: 0,
            hidden_bytes_per_token: 0,
            tied_embeddings: false,
            weight_type: String::new(),
            layer_params: 0,
            active_layer_bytes: 0,
            active_layer_params: 0,
            head_type: String::new(),
            head_params: 0,
            vocab_size: 0,
            attention_flops_per_position: 0,
            max_group: 1,
        }
    }

    #[test]
    fn largest_remainder_exact_and_ties_to_earlier() {
        assert_eq!(largest_remainder(10, &[1, 1, 1]), [4, 3, 3]);
        assert_eq!(largest_remainder(30, &[24, 16]), [18, 12]);
        assert_eq!(largest_remainder(7, &[1, 1]), [4, 3]);
        assert_eq!(largest_remainder(5, &[0, 0]), [3, 2]);
        assert_eq!(largest_remainder(3, &[2, 1, 0]), [2, 1, 0]);
    }

    #[test]
    fn split_follows_memory_ratio() {
        let c = card(30, GB / 2);
        let counts = split_layers(&c, &ids(["a", "b"]).each_ref(), &[24 * GB, 16 * GB], 0).unwrap();
        assert_eq!(counts, [18, 12]);
    }

    #[test]
    fn extras_reduce_usable_memory() {
        let mut c = card(10, GB);
        c.embed_bytes = 4 * GB;
        // usable: 16 - 4 = 12 and 12 → equal split
        let counts = split_layers(&c, &ids(["a", "b"]).each_ref(), &[16 * GB, 12 * GB], 0).unwrap();
        assert_eq!(counts, [5, 5]);
    }

    #[test]
    fn every_stage_gets_a_layer() {
        let c = card(4, 1);
        let counts =
            split_layers(&c, &ids(["a", "b", "c"]).each_ref(), &[1_000_000, 1, 1], 0).unwrap();
        assert_eq!(counts, [2, 1, 1]);
    }

    #[test]
    fn repair_moves_layers_within_capacity() {
        // Largest remainder gives the first node 2 layers (1.76 rounds up) but only 1 fits in 190 bytes.
        let c = card(11, 100);
        let counts = split_layers(&c, &ids(["a", "b"]).each_ref(), &[190, 1000], 0).unwrap();
        assert_eq!(counts, [1, 10]);
    }

    #[test]
    fn kv_reserve_limits_capacity() {
        let mut c = card(10, 100);
        c.kv_bytes_per_token_per_layer = 1;
        c.head_bytes = 500;
        // per layer 200 with 100 tokens: a holds 8, b holds (950 - 500) / 200 = 2
        let counts = split_layers(&c, &ids(["a", "b"]).each_ref(), &[1_700, 950], 100).unwrap();
        assert_eq!(counts, [8, 2]);
        let err = split_layers(&c, &ids(["a", "b"]).each_ref(), &[1_500, 950], 100).unwrap_err();
        assert_eq!(err.error_type(), "does_not_fit");
    }

    #[test]
    fn does_not_fit_reports_numbers() {
        let c = card(10, GB);
        let err =
            split_layers(&c, &ids(["a", "b"]).each_ref(), &[4 * GB, 4 * GB + 10], 0).unwrap_err();
        assert_eq!(
            err,
            PlacementError::DoesNotFit {
                needed: 10 * GB,
                available: 8 * GB
            }
        );
    }

    #[test]
    fn node_smaller_than_its_extra_is_named() {
        let mut c = card(10, 1);
        c.head_bytes = 1000;
        let err = split_layers(&c, &ids(["a", "b"]).each_ref(), &[1000, 500], 0).unwrap_err();
        assert_eq!(err.error_type(), "node_does_not_fit");
        assert!(err.to_string().contains(" b "), "{err}");
    }

    #[test]
    fn more_stages_than_layers_is_rejected() {
        let c = card(2, 1);
        let err = split_layers(&c, &ids(["a", "b", "c"]).each_ref(), &[10, 10, 10], 0).unwrap_err();
        assert_eq!(
            err,
            PlacementError::TooManyStages {
                requested: 3,
                max: 2
            }
        );
    }
}
