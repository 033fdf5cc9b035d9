//! From a node's measured compute ([`ComputeFacts`]) to the planner's speeds for one model: the one
//! place these units are converted.
//!
//! - Decode ([`shoal_placement::NodeInfo::speed`], layer-steps per second): a decode step streams the
//!   weights a token reads in a layer once, so `speed = bytes_per_s[card.weight_type] /
//!   card.read_layer_bytes()` (a mixture-of-experts layer's active bytes — router, attention, shared
//!   and top-k experts — not every expert it holds). A type the
//!   node did not measure (or a card that names none) takes the node's slowest measured rate; a node
//!   that measured nothing (an older version) keeps its published [`NodeFacts::speed`], an estimate for
//!   a reference layer, scaled to this model's layer size (see [`REFERENCE_LAYER`]).
//! - Batched ([`shoal_placement::NodeInfo::prefill_speed`], layer-tokens per second): one token costs
//!   `2 · layer_params` flops per layer (the active ones of an MoE layer), so `prefill_speed =
//!   flops_per_s / (2 · card.read_layer_params())`;
//!   `None` when either is unknown (the planner then prices a batch as one token per step).
//! - What a token costs besides its layers' weights ([`token_costs`], microseconds): the output head
//!   (`card.head_bytes` at the measured rate for `card.head_type`, else the rate the layers get), one
//!   token's attention per layer and cached position (`card.attention_flops_per_position` at the
//!   measured attention flops) and sampling (`card.vocab_size` entries at the measured pass rate); each
//!   `None` when the node or the card does not say (the planner then prices the head as layers and
//!   leaves attention and sampling out).
//! - A GPU ([`gpu_info`], the planner's [`shoal_placement::GpuInfo`]): the GPU the node's device policy
//!   offers (`--device gpu:N`: that one, used whatever it measured; `auto`: the one measured fastest,
//!   used when faster than the CPU), its speeds and costs from its own measured [`ComputeFacts`] by the
//!   same conversions (a named GPU not measured yet is priced as the CPU), its memory the device's free
//!   memory, else its total, else the host's (a GPU sharing it).

use shoal_placement::{GpuInfo, ModelCard, NodeInfo};

use crate::facts::{ComputeFacts, DevicePolicy, GpuFacts, NodeFacts, REFERENCE_LAYER, usable};

/// The planner's decode speed and batched rate of node `f` for the model of `card`.
pub fn speeds(f: &NodeFacts, card: &ModelCard) -> (f64, Option<f64>) {
    (decode_speed(f, card), prefill_speed(&f.compute, card))
}

/// Layer-steps per second of one decode stream (see the module docs); always finite and > 0 for a
/// node whose published speed is.
pub fn decode_speed(f: &NodeFacts, card: &ModelCard) -> f64 {
    let layer = card.read_layer_bytes() as f64;
    match measured_decode_speed(&f.compute, card) {
        Some(speed) => speed,
        None if f.compute.slowest().is_some() => f.speed,
        // Not measured: the published estimate is for the reference layer; a bigger layer is slower.
        None if layer > 0.0 && usable(f.speed) => f.speed * REFERENCE_LAYER.1 as f64 / layer,
        None => f.speed,
    }
}

/// Layer-steps per second from measured compute `c` (the rate for the card's type, else the slowest
/// measured, over its layer's bytes; the reference layer's when the card does not say them); `None`
/// when `c` measured nothing.
fn measured_decode_speed(c: &ComputeFacts, card: &ModelCard) -> Option<f64> {
    let rate = c.bytes_per_s(&card.weight_type).or_else(|| c.slowest())?;
    let layer = card.read_layer_bytes();
    if layer > 0 {
        Some(rate / layer as f64)
    } else {
        // Measured, but the card does not say its layer size: the reference layer's rate.
        c.reference_speed()
    }
}

/// The GPU node `f` offers the planner for the model of `card`, by its device policy: `gpu:N` that
/// GPU, always used (its measured speeds, else the CPU's); `auto` the GPU measured fastest, used
/// when faster than the CPU; `cpu` none. Its memory is what the device says is free (else its
/// total, else — a GPU sharing the host's memory, as lavapipe and Apple's do — `host_mem`).
pub fn gpu_info(f: &NodeFacts, card: &ModelCard, host_mem: u64) -> Option<GpuInfo> {
    let measured = |g: &GpuFacts| {
        g.compute
            .as_ref()
            .and_then(|c| measured_decode_speed(c, card))
    };
    let (index, always) = match f.device {
        DevicePolicy::Cpu => return None,
        DevicePolicy::Gpu(i) => (i, true),
        // `auto` keeps a mixture-of-experts model on the CPU: the GPU stage runs it (a named GPU is
        // used), but its prefill is not grouped by expert yet and no GPU rate of one is measured.
        DevicePolicy::Auto if card.has_experts() => return None,
        DevicePolicy::Auto => {
            let best = (f.gpus.iter().enumerate())
                .filter_map(|(i, g)| measured(g).map(|s| (i, s)))
                .max_by(|a, b| a.1.total_cmp(&b.1))?;
            (best.0, false)
        }
    };
    let g = f.gpus.get(index)?;
    let mem_available = g.memory_free.or(g.memory_total).unwrap_or(host_mem);
    let gpu = g
        .compute
        .as_ref()
        .and_then(|c| Some((c, measured_decode_speed(c, card)?)));
    let (speed, prefill_speed, costs) = match gpu {
        Some((c, speed)) => (speed, prefill_speed(c, card), token_costs(c, card)),
        // Named but not measured: priced as the CPU.
        None => {
            let (speed, prefill_speed) = speeds(f, card);
            (speed, prefill_speed, token_costs(&f.compute, card))
        }
    };
    Some(GpuInfo {
        index,
        mem_available,
        speed,
        prefill_speed,
        head_us: costs.head_us,
        attention_us: costs.attention_us,
        always,
    })
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
        gpu: card.and_then(|c| gpu_info(f, c, mem_available)),
        machine: f.machine.clone(),
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
        head_us: per(card.read_head_bytes(), head_rate),
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
    let params = card.read_layer_params();
    if params == 0 || !usable(c.flops_per_s) {
        return None;
    }
    Some(c.flops_per_s / (2.0 * params as f64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::MemoryFacts;
    use std::collections::BTreeMap;

    fn card(weight_type: &str, layer_bytes: u64, layer_params: u64) -> ModelCard {
        ModelCard {
            id: "m".parse().unwrap(),
            n_layers: 30,
            layer_bytes,
            embed_bytes: 0,
            head_bytes: 0,
            active_head_bytes: 0,
            kv_bytes_per_token_per_layer: 0,
            context_length: 2048,
            hidden_bytes_per_token: 1152,
            tied_embeddings: true,
            weight_type: weight_type.into(),
            layer_params,
            active_layer_bytes: 0,
            active_layer_params: 0,
            head_type: String::new(),
            head_params: 0,
            vocab_size: 0,
            attention_flops_per_position: 0,
            max_group: 1,
        }
    }

    fn node(speed: f64, rates: &[(&str, f64)], flops: f64) -> NodeFacts {
        NodeFacts {
            id: "n".parse().unwrap(),
            name: "n".into(),
            api_url: None,
            addrs: vec![],
            memory: MemoryFacts::default(),
            cpu_cores: 2,
            cpu_load: None,
            temperature_c: None,
            power_w: None,
            cpu_model: String::new(),
            machine: None,
            core_kinds: None,
            thermal: None,
            accelerator: "cpu".into(),
            gpus: Vec::new(),
            device: Default::default(),
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
    fn a_mixture_of_experts_layer_is_priced_by_the_bytes_and_flops_a_token_reads() {
        let n = node(1.0, &[("q4_k", 6e9)], 40e9);
        // 30 MB held per layer, of which a token reads 3 MB (router, attention, top-k experts) and
        // multiplies by 4M of its 40M parameters: the speeds of a 3 MB, 4M-parameter dense layer.
        let mut moe = card("q4_k", 30_000_000, 40_000_000);
        (moe.active_layer_bytes, moe.active_layer_params) = (3_000_000, 4_000_000);
        assert_eq!(
            speeds(&n, &moe),
            speeds(&n, &card("q4_k", 3_000_000, 4_000_000))
        );
        assert_eq!(decode_speed(&n, &moe), 2000.0);
        // Memory still counts every expert.
        assert_eq!(moe.per_layer_bytes(0), 30_000_000);
        // Not measured: the published estimate scales by the bytes read, too.
        let old = node(4500.0, &[], 0.0);
        assert_eq!(
            decode_speed(&old, &moe),
            decode_speed(&old, &card("q4_k", 3_000_000, 0))
        );
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

    /// A node's GPU reaches the planner by its device policy, its speeds converted from its own
    /// measured compute exactly as the CPU's are.
    #[test]
    fn the_device_policy_decides_which_gpu_the_planner_sees() {
        let mut n = node(1.0, &[("q4_0", 6e9)], 40e9);
        let fast = GpuFacts {
            name: "fast".into(),
            memory_total: Some(24 << 30),
            memory_free: Some(20 << 30),
            compute: Some(ComputeFacts {
                weight_bytes_per_s: [("q4_0".to_string(), 60e9)].into_iter().collect(),
                flops_per_s: 400e9,
                ..n.compute.clone()
            }),
            ..GpuFacts::default()
        };
        let unmeasured = GpuFacts {
            name: "lavapipe".into(),
            ..GpuFacts::default()
        };
        n.gpus = vec![unmeasured, fast];
        let c = card("q4_0", 3_000_000, 4_000_000);
        assert_eq!(node_info(&n, Some(&c), 7).gpu, None, "--device cpu");
        n.device = DevicePolicy::Auto;
        let g = node_info(&n, Some(&c), 7)
            .gpu
            .expect("auto: the measured GPU");
        assert_eq!((g.index, g.mem_available, g.always), (1, 20 << 30, false));
        assert_eq!((g.speed, g.prefill_speed), (20_000.0, Some(50_000.0)));
        // A mixture-of-experts model: the GPU stage cannot run it, so `auto` offers no GPU.
        let mut moe = c.clone();
        moe.layer_bytes *= 10;
        moe.active_layer_bytes = c.layer_bytes;
        assert_eq!(node_info(&n, Some(&moe), 7).gpu, None, "auto, experts");
        // Named, but not measured: used whatever, priced as the CPU, in the host's memory.
        n.device = DevicePolicy::Gpu(0);
        let g = node_info(&n, Some(&c), 7).gpu.expect("gpu:0");
        assert_eq!((g.index, g.mem_available, g.always), (0, 7, true));
        assert_eq!((g.speed, g.prefill_speed), (2000.0, Some(5000.0)));
        // A GPU index the node does not have: none.
        n.device = DevicePolicy::Gpu(5);
        assert_eq!(node_info(&n, Some(&c), 7).gpu, None);
        // Older nodes publish no policy: CPU only.
        let old: DevicePolicy = serde_json::from_str("\"cpu\"").unwrap();
        assert_eq!(old, DevicePolicy::default());
        assert_eq!(
            serde_json::to_string(&DevicePolicy::Gpu(1)).unwrap(),
            r#"{"gpu":1}"#
        );
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
