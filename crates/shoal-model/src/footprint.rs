//! [`Footprint`]: what a model costs to hold and to run, read from its GGUF header alone (no tensor
//! data): the figures the placement planner needs for every architecture this crate loads — bytes per
//! part a stage may hold, KV and activation bytes per token, and for the cost model the weight type
//! that holds most of the layers' bytes (nodes publish their measured speed per type) and the
//! parameters of one layer (its matrix products' flops per token). A mixture-of-experts layer holds
//! every expert but a token reads only `expert_used_count` of them: `layer_bytes` is what a stage holds,
//! `active_layer_bytes` what one token reads (router, attention, shared expert and k routed experts).
//! Under latent attention (deepseek2) a token's KV is its latent and rope part: `kv_lora + rope` values
//! per layer ([`ModelConfig::kv_values_per_token_per_layer`]).

use std::collections::BTreeMap;

use crate::config::ModelConfig;
use crate::decoder::names;
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::kv;

/// Bytes and shapes of a model, per part a pipeline stage may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    pub n_layers: usize,
    /// Weight bytes of one transformer layer (layer 0's tensors): what a stage holds per layer.
    pub layer_bytes: u64,
    /// Weight bytes one token reads in one layer: `layer_bytes`, or in a mixture-of-experts layer the
    /// routed experts' bytes (`*_exps` tensors) scaled by `expert_used_count / expert_count`.
    pub active_layer_bytes: u64,
    /// Extra bytes on the first stage: the token embeddings.
    pub embed_bytes: u64,
    /// Extra bytes on the last stage: the final norm and the output head (with tied embeddings the last
    /// stage holds its own copy of the embedding matrix as the head), and the multi-token-prediction
    /// block where the file has one ([`crate::decoder::nextn::nextn_bytes`]; loaded only by a node
    /// that drafts with it: [`Footprint::without_nextn`] is the footprint elsewhere).
    pub head_bytes: u64,
    /// What a token reads of `head_bytes` when that is less (the multi-token-prediction block is held,
    /// not run by the main pass): the final norm and the output head; 0 when the same as `head_bytes`.
    pub active_head_bytes: u64,
    /// KV-cache bytes one token takes in one layer (f16 values, as the CPU stages store them).
    pub kv_bytes_per_token_per_layer: u64,
    pub context_length: usize,
    /// Activation bytes per token between two stages (an f16 hidden state).
    pub hidden_bytes_per_token: u64,
    /// No `output.weight`: the head is the embedding matrix, held once by a stage that is first and last.
    pub tied_embeddings: bool,
    /// ggml name (`Q4_K`, `Q8_0`, `F16`, …) of the tensor type holding most of the weight bytes of all
    /// layers (a "Q4_K_M" file mixes types; the planner prices a layer at this one's speed); "" when
    /// the file has no layer tensors.
    pub weight_type: &'static str,
    /// Weights of layer 0's matrices (tensors of two or more dims; norms left out): a token costs
    /// `2 · layer_params` floating-point operations per layer in its matrix products.
    pub layer_params: u64,
    /// The weights one token multiplies by in one layer (`layer_params` with the routed experts scaled
    /// as in `active_layer_bytes`).
    pub active_layer_params: u64,
    /// ggml name of the output head matrix's type (`output.weight`, or `token_embd.weight` when the
    /// embeddings are tied); "" when the file has neither.
    pub head_type: &'static str,
    /// Weights of the output head matrix (vocabulary × hidden size).
    pub head_params: u64,
    pub vocab_size: usize,
    /// Floating-point operations of one token's attention per layer and cached position:
    /// `4 · n_heads · head_dim` (the `q·k` products and the weighted sum of values; under latent
    /// attention `2 · n_heads · (kv_lora + rope + kv_lora)`: keys of the latent and rope part, values of
    /// the latent).
    pub attention_flops_per_position: u64,
}

impl Footprint {
    /// This footprint on a node that does not load the multi-token-prediction block (it drafts
    /// otherwise, or not at all): the last stage holds the final norm and the head alone.
    pub fn without_nextn(self) -> Self {
        match self.active_head_bytes {
            0 => self,
            head => Self {
                head_bytes: head,
                active_head_bytes: 0,
                ..self
            },
        }
    }

    /// Reads the footprint of the model in `gguf`.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let cfg = ModelConfig::from_gguf(gguf)?;
        let bytes = |name: &str| gguf.tensor_bytes(name).unwrap_or(0);
        // A layer stands for them all: the first mixture-of-experts one where leading layers are dense
        // (GLM-4.5), so a layer is priced by its experts.
        let layer0 = names::blk_prefix(cfg.arch.experts.map_or(0, |e| e.leading_dense));
        let layer_bytes = gguf
            .tensor_names()
            .filter(|n| n.starts_with(&layer0))
            .map(bytes)
            .sum();
        let embed_bytes = bytes(names::TOKEN_EMBD);
        // A whole last stage also holds the multi-token-prediction block (GLM-4.5's nextn layer).
        let read_head =
            bytes(names::OUTPUT_NORM) + gguf.tensor_bytes(names::OUTPUT).unwrap_or(embed_bytes);
        let nextn = crate::decoder::nextn::nextn_bytes(gguf, &cfg);
        let (head_bytes, active_head_bytes) = match nextn {
            0 => (read_head, 0),
            n => (read_head + n, read_head),
        };
        let infos = gguf.tensors();
        let mut by_type: BTreeMap<&'static str, u64> = BTreeMap::new();
        for (name, info) in infos.iter().filter(|(n, _)| n.starts_with(names::BLK)) {
            *by_type.entry(info.ty.name).or_default() += bytes(name);
        }
        // Most bytes; a tie goes to the first name (BTreeMap order), so the choice is stable.
        let weight_type = by_type
            .iter()
            .rev()
            .max_by_key(|(_, b)| **b)
            .map_or("", |(t, _)| *t);
        let layer_params = infos
            .iter()
            // Matrices only: gpt-oss's per-expert biases are 2-D too.
            .filter(|(n, i)| n.starts_with(&layer0) && n.ends_with(".weight") && i.dims.len() >= 2)
            .map(|(_, i)| elements(&i.dims))
            .sum();
        // The routed experts' share of layer 0, and the fraction of it a token reads.
        let (routed_bytes, routed_params) = infos
            .iter()
            .filter(|(n, _)| n.starts_with(&layer0) && n.ends_with(names::EXPERTS_SUFFIX))
            .fold((0u64, 0u64), |(b, p), (n, i)| {
                (b + bytes(n), p + elements(&i.dims))
            });
        let (used, count) = cfg
            .arch
            .experts
            .map_or((1, 1), |e| (e.used as u64, e.count as u64));
        let active = |total: u64, routed: u64| total - routed + routed * used / count;
        let head = infos
            .get(names::OUTPUT)
            .or_else(|| infos.get(names::TOKEN_EMBD));
        let head_type = head.map_or("", |i| i.ty.name);
        let head_params = head.map_or(0, |i| elements(&i.dims));
        Ok(Self {
            n_layers: cfg.n_layers,
            layer_bytes,
            active_layer_bytes: active(layer_bytes, routed_bytes),
            embed_bytes,
            head_bytes,
            active_head_bytes,
            kv_bytes_per_token_per_layer: cfg.kv_bytes_per_token(1, kv::VALUE_BYTES) as u64,
            context_length: cfg.context_length,
            hidden_bytes_per_token: 2 * cfg.dim as u64,
            tied_embeddings: gguf.tensor_bytes(names::OUTPUT).is_none(),
            weight_type,
            layer_params,
            active_layer_params: active(layer_params, routed_params),
            head_type,
            head_params,
            vocab_size: cfg.vocab_size,
            attention_flops_per_position: attention_flops(&cfg),
        })
    }
}

/// Floating-point operations of one token's attention per layer and cached position.
fn attention_flops(cfg: &ModelConfig) -> u64 {
    let value_width = cfg.arch.mla.map_or(cfg.head_dim, |m| m.kv_lora);
    2 * (cfg.n_heads * (cfg.head_dim + value_width)) as u64
}

/// Elements of a tensor of `dims`.
fn elements(dims: &[usize]) -> u64 {
    dims.iter().map(|&d| d as u64).product()
}
