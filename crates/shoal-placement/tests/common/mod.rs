//! Builders shared by the scenario tests.
#![allow(dead_code)] // each test binary uses a different subset

use shoal_placement::{Link, LinkKind, ModelCard, NodeInfo};

pub const GB: u64 = 1_000_000_000;

pub fn node(id: &str, mem_gb: u64, speed: f64) -> NodeInfo {
    NodeInfo {
        id: id.into(),
        mem_available: mem_gb * GB,
        speed,
        prefill_speed: None,
    }
}

/// A link with nothing measured (the kind's defaults apply).
pub fn link(a: &str, b: &str, kind: LinkKind) -> Link {
    Link {
        a: a.into(),
        b: b.into(),
        kind,
        rtt_us: None,
        bandwidth_bps: None,
    }
}

/// 30 layers of 1 GB, no extras, 8 KB activations.
pub fn card() -> ModelCard {
    ModelCard {
        id: "test-30".into(),
        n_layers: 30,
        layer_bytes: GB,
        embed_bytes: 0,
        head_bytes: 0,
        kv_bytes_per_token_per_layer: 0,
        context_length: 2048,
        hidden_bytes_per_token: 8192,
        tied_embeddings: false,
        weight_type: String::new(),
        layer_params: 0,
    }
}
