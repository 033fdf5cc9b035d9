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

use shoal_placement::ModelCard;

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
            backend: "cpu".into(),
            speed,
            compute: ComputeFacts {
                weight_bytes_per_s: rates.iter().map(|(t, r)| (t.to_string(), *r)).collect(),
                flops_per_s: flops,
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
