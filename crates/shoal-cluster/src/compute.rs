//! From a node's measured compute ([`ComputeFacts`]) to the planner's speeds for one model: the one
//! place these units are converted.
//!
//! - Decode ([`shoal_placement::NodeInfo::speed`], layer-steps per second): a decode step streams a
//!   layer's weights once, so `speed = bytes_per_s[card.weight_type] / card.layer_bytes`. A type the
//!   node did not measure (or a card that names none) takes the node's slowest measured rate; a node
//!   that measured nothing (an older version) keeps its published [`NodeFacts::speed`], an estimate for
//!   a reference layer, scaled to this model's layer size (see [`REFERENCE_LAYER`]).
//! - Batched ([`shoal_placement::NodeInfo::prefill_speed`], layer-tokens per second): one token costs
//!   `2 · layer_params` flops per layer, so `prefill_speed = flops_per_s / (2 · card.layer_params)`;
//!   `None` when either is unknown (the planner then prices a batch as one token per step).
//! - What a token costs besides its layers' weights ([`token_costs`], microseconds): the output head
//!   (`card.head_bytes` at the measured rate for `card.head_type`, else the rate the layers get), one
//!   token's attention per layer and cached position (`card.attention_flops_per_position` at the
//!   measured attention flops) and sampling (`card.vocab_size` entries at the measured pass rate); each
//!   `None` when the node or the card does not say (the planner then prices the head as layers and
//!   leaves attention and sampling out).

use shoal_placement::{ModelCard, NodeInfo};

use crate::facts::{ComputeFacts, NodeFacts, REFERENCE_LAYER, usable};

/// The planner's decode speed and batched rate of node `f` for the model of `card`.
pub fn speeds(f: &NodeFacts, card: &ModelCard) -> (f64, Option<f64>) {
    (decode_speed(f, card), prefill_speed(&f.compute, card))
}

/// Layer-steps per second of one decode stream (see the module docs); always finite and > 0 for a
/// node whose published speed is.
pub fn decode_speed(f: &NodeFacts, card: &ModelCard) -> f64 {
    let layer = card.layer_bytes as f64;
    let measured = f
        .compute
        .bytes_per_s(&card.weight_type)
        .or_else(|| f.compute.slowest());
    match measured {
        Some(rate) if card.layer_bytes > 0 => rate / layer,
        // Measured, but the card does not say its layer size: the reference layer's rate.
        Some(_) => f.compute.reference_speed().unwrap_or(f.speed),
        // Not measured: the published estimate is for the reference layer; a bigger layer is slower.
        None if card.layer_bytes > 0 && usable(f.speed) => {
            f.speed * REFERENCE_LAYER.1 as f64 / layer
        }
        None => f.speed,
    }
}

/// The planner's node `f` for the model of `card`, offering `mem_available` bytes.
pub fn node_info(f: &NodeFacts, card: Option<&ModelCard>, mem_available: u64) -> NodeInfo {
    let (speed, prefill_speed) = match card {
        Some(c) => speeds(f, c),
        None => (f.speed, None),
    };
    let costs = card.map(|c| token_costs(&f.compute, c)).unwrap_or_default();
    NodeInfo {
        id: f.id.clone(),
        mem_available,
        speed,
        prefill_speed,
        head_us: costs.head_us,
        attention_us: costs.attention_us,
        sample_us: costs.sample_us,
    }
}

/// What one token of the model of `card` costs on a node besides its layers' weights, microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TokenCosts {
    /// The output head's weights streamed once.
    pub head_us: Option<f64>,
    /// One token's attention per layer and cached position.
    pub attention_us: Option<f64>,
    /// Sampling one token.
    pub sample_us: Option<f64>,
}

/// [`TokenCosts`] from the measured compute `c` (see the module docs).
pub fn token_costs(c: &ComputeFacts, card: &ModelCard) -> TokenCosts {
    let per = |amount: u64, rate: Option<f64>| match rate {
        Some(r) if amount > 0 && usable(r) => Some(amount as f64 * 1e6 / r),
        _ => None,
    };
    let head_rate = c
        .bytes_per_s(&card.head_type)
        .or_else(|| c.bytes_per_s(&card.weight_type))
        .or_else(|| c.slowest());
    TokenCosts {
        head_us: per(card.head_bytes, head_rate),
        attention_us: per(
            card.attention_flops_per_position,
            Some(c.attention_flops_per_s),
        ),
        sample_us: per(card.vocab_size, Some(c.sample_entries_per_s)),
    }
}

/// Layer-tokens per second when many tokens are batched; `None` when not measured or the card does
/// not say its layer's parameters.
pub fn prefill_speed(c: &ComputeFacts, card: &ModelCard) -> Option<f64> {
    if card.layer_params == 0 || !usable(c.flops_per_s) {
        return None;
    }
    Some(c.flops_per_s / (2.0 * card.layer_params as f64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::MemoryFacts;
    use std::collections::BTreeMap;

    fn card(weight_type: &str, layer_bytes: u64, layer_params: u64) -> ModelCard {
        ModelCard {
            id: "m".into(),
            n_layers: 30,
            layer_bytes,
            embed_bytes: 0,
            head_bytes: 0,
            kv_bytes_per_token_per_layer: 0,
            context_length: 2048,
            hidden_bytes_per_token: 1152,
            tied_embeddings: true,
            weight_type: weight_type.into(),
            layer_params,
            head_type: String::new(),
            head_params: 0,
            vocab_size: 0,
            attention_flops_per_position: 0,
        }
    }

    fn node(speed: f64, rates: &[(&str, f64)], flops: f64) -> NodeFacts {
        NodeFacts {
            id: "n".into(),
            name: "n".into(),
            api_url: None,
            addrs: vec![],
            memory: MemoryFacts::default(),
            cpu_cores: 2,
            cpu_load: None,
            temperature_c: None,
            power_w: None,
            accelerator: "cpu".into(),
            gpus: Vec::new(),
            backend: "cpu".into(),
            speed,
            compute: ComputeFacts {
                weight_bytes_per_s: rates.iter().map(|(t, r)| (t.to_string(), *r)).collect(),
                flops_per_s: flops,
                attention_flops_per_s: 0.0,
                sample_entries_per_s: 0.0,
                threads: 2,
                key: "k".into(),
            },
            models: vec![],
            links: vec![],
            instances: BTreeMap::new(),
            kv_capacity: BTreeMap::new(),
            downloads: vec![],
            removed: vec![],
            load: BTreeMap::new(),
            table_version: 0,
            seq: 0,
            started: 0,
        }
    }

    #[test]
    fn measured_rates_become_layer_steps_and_layer_tokens() {
        let n = node(1.0, &[("q4_0", 6e9), ("q8_0", 9e9)], 40e9);
        // 3 MB layers of q4_0 at 6 GB/s: 2000 layer-steps/s; 4M params: 8 Mflop per layer-token.
        let (speed, prefill) = speeds(&n, &card("q4_0", 3_000_000, 4_000_000));
        assert_eq!(speed, 2000.0);
        assert_eq!(prefill, Some(5000.0));
        assert_eq!(decode_speed(&n, &card("q8_0", 3_000_000, 0)), 3000.0);
        // Halving the layer doubles the speed.
        assert_eq!(decode_speed(&n, &card("q4_0", 1_500_000, 0)), 4000.0);
    }

    #[test]
    fn unknown_types_and_fields_fall_back() {
        let n = node(1.0, &[("q4_0", 6e9), ("q8_0", 9e9)], 40e9);
        // A type the node did not measure, or none named: the slowest measured rate.
        assert_eq!(decode_speed(&n, &card("iq4_xs", 3_000_000, 0)), 2000.0);
        assert_eq!(decode_speed(&n, &card("", 3_000_000, 0)), 2000.0);
        // No layer size: the reference layer's rate (no q4_1 measured: the slowest).
        assert_eq!(
            decode_speed(&n, &card("q4_0", 0, 0)),
            6e9 / REFERENCE_LAYER.1 as f64
        );
        // No parameters, or no flops measured: no batched rate.
        assert_eq!(prefill_speed(&n.compute, &card("q4_0", 1, 0)), None);
        let unmeasured = node(4500.0, &[], 0.0);
        assert_eq!(
            prefill_speed(&unmeasured.compute, &card("q4_0", 1, 4)),
            None
        );
        // Nothing measured: the published estimate, scaled from the reference layer to this one.
        let (r, twice) = (REFERENCE_LAYER.1, 2 * REFERENCE_LAYER.1);
        assert_eq!(decode_speed(&unmeasured, &card("q4_0", r, 0)), 4500.0);
        assert_eq!(decode_speed(&unmeasured, &card("q4_0", twice, 0)), 2250.0);
        assert_eq!(decode_speed(&unmeasured, &card("q4_0", 0, 0)), 4500.0);
    }

    /// The head streams at the rate of its own type (else the layers'), attention and sampling at their
    /// measured rates; what the node or the card does not say is `None`.
    #[test]
    fn head_attention_and_sampling_are_priced_from_their_figures() {
        let mut n = node(1.0, &[("q4_0", 6e9), ("q8_0", 9e9)], 40e9);
        n.compute.attention_flops_per_s = 20e9;
        n.compute.sample_entries_per_s = 5e8;
        let mut c = card("q4_0", 3_000_000, 0);
        c.head_bytes = 18_000_000;
        c.head_type = "q8_0".into();
        c.attention_flops_per_position = 2000;
        c.vocab_size = 50_000;
        let costs = token_costs(&n.compute, &c);
        assert_eq!(costs.head_us, Some(2000.0), "18 MB at 9 GB/s");
        assert_eq!(costs.attention_us, Some(0.1), "2000 flops at 20 Gflop/s");
        assert_eq!(costs.sample_us, Some(100.0), "50 000 entries at 500 M/s");
        c.head_type = "q6_k".into();
        assert_eq!(
            token_costs(&n.compute, &c).head_us,
            Some(3000.0),
            "the layers' rate"
        );
        let info = node_info(&n, Some(&c), 7);
        assert_eq!((info.mem_available, info.speed), (7, 2000.0));
        assert_eq!(info.head_us, Some(3000.0));
        // An older node (no attention or sampling figure) or an older card (no sizes): not priced.
        n.compute.attention_flops_per_s = 0.0;
        c.vocab_size = 0;
        let costs = token_costs(&n.compute, &c);
        assert_eq!((costs.attention_us, costs.sample_us), (None, None));
        let unmeasured = node(4500.0, &[], 0.0);
        assert_eq!(token_costs(&unmeasured.compute, &c), TokenCosts::default());
        assert_eq!(node_info(&unmeasured, None, 1).speed, 4500.0);
    }

    /// A node that measured streams a model's layers at its measured rate for that model's type, so
    /// two nodes compare by the type the model uses, not by one figure for every model.
    #[test]
    fn nodes_compare_by_the_models_type() {
        let a = node(1.0, &[("q4_k", 4e9), ("q8_0", 12e9)], 1e9);
        let b = node(1.0, &[("q4_k", 6e9), ("q8_0", 8e9)], 1e9);
        let q4k = card("q4_k", 1_000_000, 0);
        let q8 = card("q8_0", 1_000_000, 0);
        assert!(decode_speed(&a, &q4k) < decode_speed(&b, &q4k));
        assert!(decode_speed(&a, &q8) > decode_speed(&b, &q8));
    }
}
