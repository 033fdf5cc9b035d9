//! Architecture-independent model shape, read from GGUF metadata.

use crate::arch::{Activation, Arch, Gating, RopeStyle, Routing};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::ops::Yarn;

/// The shape of a decoder-only transformer, as much as placement and the engine need; the
/// per-architecture details are in [`ArchParams`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelConfig {
    pub architecture: String,
    pub n_layers: usize,
    pub dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    pub arch: ArchParams,
}

/// What the forward pass does differently per family (see [`crate::arch`]), resolved from the family
/// and the GGUF metadata.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ArchParams {
    pub arch: Arch,
    pub rope: RopeStyle,
    /// Values of each head that are rotated (the first `rope_dims`; `head_dim` for full rotary).
    pub rope_dims: usize,
    /// Linear rope scaling: positions are multiplied by this (`1 / rope.scaling.factor`).
    pub rope_freq_scale: f32,
    /// YaRN's mix of interpolated and extrapolated frequencies (`rope.scaling.type yarn`).
    pub yarn: Option<Yarn>,
    /// Rope base of the sliding-window layers (`None`: they rotate as the global layers do).
    pub local_rope_theta: Option<f32>,
    /// Keys a sliding-window layer attends to (0: no sliding window).
    pub sliding_window: usize,
    /// Per layer: whether it is a sliding-window layer.
    pub local_layers: Vec<bool>,
    /// Multiply queries by this before the `q·k` products (Gemma 3, Phi-3); `None`: scale the scores by
    /// `1 / sqrt(head_dim)` instead (Llama, Qwen).
    pub query_scale: Option<f32>,
    /// Token embeddings are multiplied by this (Gemma: `sqrt(dim)`).
    pub embed_scale: f32,
    pub activation: Activation,
    /// How an embedding pools the final hidden states (`{arch}.pooling_type`).
    pub pooling: Pooling,
    /// A mixture-of-experts feed-forward's shape and routing (`None`: dense).
    pub experts: Option<Experts>,
    /// Multi-head latent attention's shape (deepseek2; `None`: ordinary attention).
    pub mla: Option<Mla>,
}

/// Multi-head latent attention's shape (deepseek2, decision 022). The model's `n_kv_heads` is 1 and its
/// `head_dim` is `kv_lora + rope` (what the file's `key_length` says): the one cached key per token is the
/// normed latent followed by the rotated rope part, and the values are the latent (the key's first
/// `kv_lora` values), so the cache holds `kv_lora + rope` values per token and layer.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Mla {
    /// Rank of the query bottleneck (`attention.q_lora_rank`; 0: queries straight from `attn_q`).
    pub q_lora: usize,
    /// Rank of the key/value latent (`attention.kv_lora_rank`).
    pub kv_lora: usize,
    /// Query/key values per head that are not rotated (`attention.key_length_mla − rope.dimension_count`).
    pub nope: usize,
    /// Rotated query/key values per head (`rope.dimension_count`); the key's are shared by every head.
    pub rope: usize,
    /// Values per head once decompressed by `attn_v_b` (`attention.value_length_mla`).
    pub v_head: usize,
    /// Factor on the `q·k` scores: `1 / sqrt(nope + rope)`, times YaRN's `mscale²` where the file scales
    /// rope with `rope.scaling.yarn_log_multiplier` (DeepSeek V2/V3), as llama.cpp.
    pub kq_scale: f32,
}

/// A mixture-of-experts layer's shape (`{arch}.expert_*` keys) and its family's routing.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Experts {
    /// Routed experts per layer (`expert_count`).
    pub count: usize,
    /// Experts each token uses (`expert_used_count`, the k of top-k).
    pub used: usize,
    /// Hidden size of one routed expert (`expert_feed_forward_length`; absent: `feed_forward_length / used`,
    /// as llama.cpp).
    pub ff: usize,
    /// Hidden size of the shared expert, when the file has one (`expert_shared_feed_forward_length`;
    /// absent: `expert_shared_count` experts of `ff` when the file says so, else `feed_forward_length`).
    pub shared_ff: usize,
    pub routing: Routing,
    /// Factor on the chosen experts' weights (`expert_weights_scale`; absent or 0: 1, as llama.cpp).
    pub weights_scale: f32,
    /// The first layers whose feed-forward is dense (`leading_dense_block_count`: GLM-4.5).
    pub leading_dense: usize,
    /// Group-limited routing (DeepSeek V3): the experts form `groups` equal groups (`expert_group_count`;
    /// 0 or 1: none) and a token chooses among the `groups_used` groups (`expert_group_used_count`) whose two
    /// best selection scores sum highest.
    pub groups: usize,
    pub groups_used: usize,
}

/// How embeddings pool a sequence's final hidden states (after the output norm): llama.cpp's
/// `pooling_type`. A decoder LLM's GGUF has no such key (llama.cpp then pools nothing and its server
/// refuses OpenAI embeddings); shoal pools by the mean, as `llama-server --embeddings --pooling mean`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// The mean over every token (no key, or `none` / `mean`).
    Mean,
    /// The first token (`cls`).
    Cls,
    /// The last token (`last`: Qwen3-Embedding and its kind).
    Last,
    /// A reranker's scores (`rank`): no embeddings.
    Rank,
}

impl Pooling {
    /// From llama.cpp's `LLAMA_POOLING_TYPE_*` number (absent: [`Pooling::Mean`]).
    pub fn from_gguf(value: Option<u32>) -> Self {
        match value {
            Some(2) => Pooling::Cls,
            Some(3) => Pooling::Last,
            Some(4) => Pooling::Rank,
            _ => Pooling::Mean,
        }
    }
}

impl ArchParams {
    /// A plain Llama with full rotary over `head_dim` and no sliding window, for tests and tools.
    pub fn llama(head_dim: usize, n_layers: usize) -> Self {
        Self {
            arch: Arch::Llama,
            rope: RopeStyle::Interleaved,
            rope_dims: head_dim,
            rope_freq_scale: 1.0,
            yarn: None,
            local_rope_theta: Some(10_000.0),
            sliding_window: 0,
            local_layers: vec![false; n_layers],
            query_scale: None,
            embed_scale: 1.0,
            activation: Activation::Silu,
            pooling: Pooling::Mean,
            experts: None,
            mla: None,
        }
    }
}

impl ModelConfig {
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let name = gguf.get_str("general.architecture")?.to_string();
        let arch = Arch::from_name(&name)?;
        let family = arch.family();
        let k = |s: &str| format!("{name}.{s}");
        let bad = |message: String| ModelError::InvalidGguf {
            path: gguf.path().display().to_string(),
            message,
        };
        let dim = gguf.get_u32(&k("embedding_length"))? as usize;
        let n_heads = gguf.get_u32(&k("attention.head_count"))? as usize;
        let n_kv_heads = gguf
            .get_u32(&k("attention.head_count_kv"))
            .unwrap_or(n_heads as u32) as usize;
        if n_heads == 0 || n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
            return Err(bad(format!("bad head counts {n_heads} / {n_kv_heads}")));
        }
        let head_dim = match gguf.get_u32(&k("attention.key_length")) {
            Ok(d) => d as usize,
            Err(_) => dim / n_heads,
        };
        let value_dim = gguf
            .get_u32(&k("attention.value_length"))
            .map_or(head_dim, |d| d as usize);
        if arch != Arch::Deepseek2 && value_dim != head_dim {
            return Err(ModelError::Unsupported(format!(
                "key length {head_dim} differs from value length {value_dim}"
            )));
        }
        // Multi-section rope (GLM-4.5V and other vision-language files: llama.cpp's `use_mrope`, any
        // section non-zero) is not implemented: refuse it rather than rotate as plain NEOX.
        if let Some(candle_core::quantized::gguf_file::Value::Array(sections)) =
            gguf.value(&k("rope.dimension_sections"))
            && sections.iter().any(|v| v.to_u32().map_or(true, |s| s != 0))
        {
            return Err(ModelError::Unsupported(format!(
                "multi-section rope ({}); shoal rotates one section",
                k("rope.dimension_sections")
            )));
        }
        let rope_dims = gguf
            .get_u32(&k("rope.dimension_count"))
            .map_or(head_dim, |d| d as usize);
        if head_dim == 0
            || !head_dim.is_multiple_of(2)
            || rope_dims > head_dim
            || !rope_dims.is_multiple_of(2)
        {
            return Err(bad(format!(
                "bad head size {head_dim} / rotary dims {rope_dims}"
            )));
        }
        let vocab_size = match gguf.get_u32(&k("vocab_size")) {
            Ok(v) => v as usize,
            Err(_) => match gguf.value("tokenizer.ggml.tokens") {
                Some(candle_core::quantized::gguf_file::Value::Array(a)) => a.len(),
                _ => {
                    return Err(ModelError::MissingKey {
                        key: k("vocab_size"),
                    });
                }
            },
        };
        // GLM-4.5's multi-token-prediction layers sit after the model's own; like llama.cpp, shoal does
        // not run them.
        let nextn = gguf.get_u32(&k("nextn_predict_layers")).unwrap_or(0) as usize;
        let n_layers = (gguf.get_u32(&k("block_count"))? as usize).saturating_sub(nextn);
        let rope_freq_scale = rope_scaling(gguf, &k)?;
        // DeepSeek's YaRN: the converter writes `0.1 · mscale_all_dim`, llama.cpp divides by 0.1.
        let yarn_log_mul = gguf
            .get_f32(&k("rope.scaling.yarn_log_multiplier"))
            .ok()
            .filter(|&m| arch == Arch::Deepseek2 && m != 0.0)
            .map(|m| m / 0.1);
        let yarn = yarn(gguf, &k, rope_freq_scale, yarn_log_mul.is_some());
        let mla = match arch {
            Arch::Deepseek2 => Some(mla(
                gguf,
                &k,
                [head_dim, value_dim, n_kv_heads, rope_dims],
                mla_kq_scale(yarn, rope_freq_scale, yarn_log_mul.unwrap_or(0.0)),
            )?),
            _ => None,
        };
        let window = gguf
            .get_u32(&k("attention.sliding_window"))
            .map_or(0, |w| w as usize);
        let sliding_window = if family.uses_sliding_window {
            window
        } else {
            0
        };
        let local_layers = local_layers(gguf, &k, n_layers, sliding_window, family.swa_pattern)?;
        let query_scale = match arch {
            // Gemma 3 27B (62 layers) scales by the model's dim per head rather than the key length, as
            // Google's reference and llama.cpp do.
            Arch::Gemma3 if n_layers == 62 => Some(1.0 / ((dim / n_heads) as f32).sqrt()),
            Arch::Gemma3 | Arch::Phi3 => Some(1.0 / (head_dim as f32).sqrt()),
            _ => None,
        };
        let ffn_dim = gguf.get_u32(&k("feed_forward_length"))? as usize;
        let experts = match family.routing {
            Some(routing) => Some(experts(gguf, &k, ffn_dim, routing)?),
            None => None,
        };
        // Latent attention caches one key of the latent and the rope part per token, for every head.
        let (n_kv_heads, head_dim) = match mla {
            Some(m) => (1, m.kv_lora + m.rope),
            None => (n_kv_heads, head_dim),
        };
        let cfg = Self {
            n_layers,
            dim,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim,
            vocab_size,
            context_length: context_length(gguf, &k),
            rope_theta: gguf.get_f32(&k("rope.freq_base")).unwrap_or(10_000.0),
            rms_eps: gguf
                .get_f32(&k("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5),
            arch: ArchParams {
                arch,
                rope: family.rope,
                rope_dims,
                rope_freq_scale,
                yarn,
                local_rope_theta: gguf
                    .get_f32(&k("rope.freq_base_swa"))
                    .ok()
                    .or(family.local_rope_base),
                sliding_window,
                local_layers,
                query_scale,
                embed_scale: if family.scale_embeddings {
                    (dim as f32).sqrt()
                } else {
                    1.0
                },
                activation: family.activation,
                pooling: Pooling::from_gguf(gguf.get_u32(&k("pooling_type")).ok()),
                experts,
                mla,
            },
            architecture: name,
        };
        if cfg.n_layers == 0 || cfg.dim == 0 || cfg.ffn_dim == 0 || cfg.vocab_size == 0 {
            return Err(bad("a model dimension is 0".into()));
        }
        Ok(cfg)
    }

    /// KV-cache bytes per token for the given number of layers, `value_bytes` per stored key or value
    /// ([`crate::kv::VALUE_BYTES`] in the CPU caches).
    pub fn kv_bytes_per_token(&self, layers: usize, value_bytes: usize) -> usize {
        layers * self.kv_values_per_token_per_layer() * value_bytes
    }

    /// Values one token stores in one layer's KV cache: a key and a value per KV head, or under latent
    /// attention the one key whose first `kv_lora` values are also the value (`kv_lora + rope`).
    pub fn kv_values_per_token_per_layer(&self) -> usize {
        match self.arch.mla {
            Some(_) => self.n_kv_heads * self.head_dim,
            None => 2 * self.n_kv_heads * self.head_dim,
        }
    }
}

/// Latent attention's shape from a deepseek2 file: `[key_length, value_length, head_count_kv,
/// rope.dimension_count]` as read, checked against the MLA keys. Files written before llama.cpp cached the
/// latent (no `key_length_mla`: their key and value lengths are the decompressed ones, their heads all KV
/// heads, and `attn_kv_b` holds `attn_k_b` and `attn_v_b` together) are read with those sizes; their
/// `attn_kv_b` is split at load ([`crate::block::MlaSpec`]).
fn mla(
    gguf: &GgufFile,
    k: &dyn Fn(&str) -> String,
    [key, value, n_kv, rope]: [usize; 4],
    kq: impl Fn(usize) -> f32,
) -> Result<Mla> {
    let kv_lora = gguf.get_u32(&k("attention.kv_lora_rank"))? as usize;
    let (key_mla, v_head, latent_ok) = match gguf.get_u32(&k("attention.key_length_mla")) {
        Ok(key_mla) => (
            key_mla as usize,
            gguf.get_u32(&k("attention.value_length_mla"))? as usize,
            n_kv == 1 && key == kv_lora + rope && value == kv_lora,
        ),
        Err(_) => (key, value, true),
    };
    if !latent_ok || key_mla <= rope || v_head == 0 || kv_lora == 0 {
        return Err(ModelError::InvalidGguf {
            path: gguf.path().display().to_string(),
            message: format!(
                "latent attention: {n_kv} KV heads of key {key} / value {value}, kv_lora_rank \
                 {kv_lora}, rope {rope}, key_length_mla {key_mla}, value_length_mla {v_head}"
            ),
        });
    }
    Ok(Mla {
        q_lora: gguf
            .get_u32(&k("attention.q_lora_rank"))
            .map_or(0, |v| v as usize),
        kv_lora,
        nope: key_mla - rope,
        rope,
        v_head,
        kq_scale: kq(key_mla),
    })
}

/// Latent attention's score factor for keys of `key_mla` values, as llama.cpp's deepseek2 graph: with
/// YaRN, `mscale = attn_factor · (1 + 0.1 ln s) · (1 + 0.1 · log_mul · ln s)` (the first factor undoing
/// the cancellation in [`yarn`], `s` the scaling factor) and the scores scaled by `mscale² / sqrt(key_mla)`.
fn mla_kq_scale(yarn: Option<Yarn>, freq_scale: f32, log_mul: f32) -> impl Fn(usize) -> f32 {
    let mscale = yarn.map_or(1.0, |y| {
        let ln = (1.0 / freq_scale).ln();
        y.attn_factor * (1.0 + 0.1 * ln) * (1.0 + 0.1 * log_mul * ln)
    });
    move |key_mla| mscale * mscale / (key_mla as f32).sqrt()
}

/// A mixture-of-experts family's expert counts and sizes, checked.
fn experts(
    gguf: &GgufFile,
    k: &dyn Fn(&str) -> String,
    ffn_dim: usize,
    routing: Routing,
) -> Result<Experts> {
    let count = gguf.get_u32(&k("expert_count"))? as usize;
    let used = gguf.get_u32(&k("expert_used_count"))? as usize;
    if count == 0 || used == 0 || used > count {
        return Err(ModelError::InvalidGguf {
            path: gguf.path().display().to_string(),
            message: format!("{used} experts used of {count}"),
        });
    }
    let ff = gguf
        .get_u32(&k("expert_feed_forward_length"))
        .map_or(ffn_dim / used, |v| v as usize);
    let shared_count = gguf.get_u32(&k("expert_shared_count")).ok();
    let shared_ff = gguf
        .get_u32(&k("expert_shared_feed_forward_length"))
        .map_or(shared_count.map_or(ffn_dim, |n| n as usize * ff), |v| {
            v as usize
        });
    // GLM-4.5 and DeepSeek say in their files whether to renormalise and how to scale (DeepSeek also
    // names its gating: 1 softmax, 2 sigmoid); the others' are fixed, as llama.cpp fixes them.
    let deepseek = gguf
        .get_str("general.architecture")
        .is_ok_and(|a| a == "deepseek2");
    let mut routing = routing;
    if deepseek {
        routing.gating = match gguf.get_u32(&k("expert_gating_func")).unwrap_or(1) {
            1 => Gating::SoftmaxThenTopK,
            2 => Gating::Sigmoid,
            other => {
                return Err(ModelError::Unsupported(format!(
                    "{} {other}",
                    k("expert_gating_func")
                )));
            }
        };
    }
    let from_file = deepseek || routing.gating == Gating::Sigmoid;
    if let (true, Some(candle_core::quantized::gguf_file::Value::Bool(b))) =
        (from_file, gguf.value(&k("expert_weights_norm")))
    {
        routing.norm_weights = *b;
    }
    let weights_scale = match gguf.get_f32(&k("expert_weights_scale")) {
        Ok(s) if from_file && s != 0.0 => s,
        _ => 1.0,
    };
    let groups = gguf
        .get_u32(&k("expert_group_count"))
        .map_or(0, |v| v as usize);
    let groups_used = gguf
        .get_u32(&k("expert_group_used_count"))
        .map_or(0, |v| v as usize);
    if groups > 1 && (!count.is_multiple_of(groups) || groups_used == 0 || groups_used >= groups) {
        return Err(ModelError::InvalidGguf {
            path: gguf.path().display().to_string(),
            message: format!("{count} experts in {groups} groups, {groups_used} used"),
        });
    }
    Ok(Experts {
        count,
        used,
        ff,
        shared_ff,
        routing,
        weights_scale,
        leading_dense: gguf
            .get_u32(&k("leading_dense_block_count"))
            .map_or(0, |v| v as usize),
        groups,
        groups_used,
    })
}

/// The trained context length; Phi-3's long-context (`longrope`) files serve their original context with
/// the short rope factors (the long factors and their attention factor are not implemented).
fn context_length(gguf: &GgufFile, k: &dyn Fn(&str) -> String) -> usize {
    let n = gguf.get_u32(&k("context_length")).unwrap_or(2048) as usize;
    match gguf.get_str(&k("rope.scaling.type")) {
        Ok("longrope") => gguf
            .get_u32(&k("rope.scaling.original_context_length"))
            .map_or(n, |o| n.min(o as usize)),
        _ => n,
    }
}

/// Which layers use the sliding window: `attention.sliding_window_pattern` as a per-layer array of
/// booleans, or as a period `n` (layers `n-1, 2n-1, …` are global), or the family's period.
fn local_layers(
    gguf: &GgufFile,
    k: &dyn Fn(&str) -> String,
    n_layers: usize,
    window: usize,
    family_pattern: usize,
) -> Result<Vec<bool>> {
    use candle_core::quantized::gguf_file::Value;
    if window == 0 {
        return Ok(vec![false; n_layers]);
    }
    let key = k("attention.sliding_window_pattern");
    if let Some(Value::Array(flags)) = gguf.value(&key) {
        let flags: Vec<bool> = flags
            .iter()
            .map(|v| matches!(v, Value::Bool(true)))
            .collect();
        if flags.len() != n_layers {
            return Err(ModelError::InvalidGguf {
                path: gguf.path().display().to_string(),
                message: format!("{key} has {} entries for {n_layers} layers", flags.len()),
            });
        }
        return Ok(flags);
    }
    let n = gguf.get_u32(&key).map_or(family_pattern, |p| p as usize);
    Ok((0..n_layers).map(|l| n == 0 || l % n < n - 1).collect())
}

/// The linear rope scale of `rope.scaling.*`; kinds shoal does not implement are an error rather than
/// silently wrong positions.
fn rope_scaling(gguf: &GgufFile, k: &dyn Fn(&str) -> String) -> Result<f32> {
    let kind = gguf.get_str(&k("rope.scaling.type")).unwrap_or("none");
    let factor = gguf.get_f32(&k("rope.scaling.factor")).unwrap_or(1.0);
    match kind {
        "none" => Ok(1.0),
        "linear" | "yarn" if factor > 0.0 => Ok(1.0 / factor),
        // Llama 3's scaling travels as the `rope_freqs` tensor; Phi-3's as `rope_factors_*` tensors.
        "llama3" | "longrope" => Ok(1.0),
        other => Err(ModelError::Unsupported(format!(
            "rope scaling `{other}` (factor {factor})"
        ))),
    }
}

/// YaRN's parameters when `rope.scaling.type` is `yarn`, as llama.cpp resolves them: extrapolation mix
/// 1, betas 32 and 1, the original context (`rope.scaling.original_context_length`, else the trained
/// one), and an attention factor such that rotated values are scaled by
/// `rope.scaling.attn_factor · (1 + 0.1 · ln factor)` in all — or by `rope.scaling.attn_factor` alone
/// where DeepSeek's `yarn_log_multiplier` moves the magnitude into the attention's scale (`log_mul`).
fn yarn(
    gguf: &GgufFile,
    k: &dyn Fn(&str) -> String,
    freq_scale: f32,
    log_mul: bool,
) -> Option<Yarn> {
    if gguf.get_str(&k("rope.scaling.type")).ok()? != "yarn" {
        return None;
    }
    let factor = 1.0 / freq_scale;
    let mscale = if factor <= 1.0 || log_mul {
        1.0
    } else {
        0.1 * factor.ln() + 1.0
    };
    // llama.cpp cancels the scale ggml's rope applies itself (`1 + 0.1 ln(1 / freq_scale)`).
    let attn_factor = mscale
        * (1.0 / (1.0 + 0.1 * factor.ln()))
        * gguf.get_f32(&k("rope.scaling.attn_factor")).unwrap_or(1.0);
    let orig_ctx = gguf
        .get_u32(&k("rope.scaling.original_context_length"))
        .or_else(|_| gguf.get_u32(&k("context_length")))
        .map_or(2048, |v| v as usize);
    Some(Yarn {
        orig_ctx,
        ext_factor: 1.0,
        attn_factor,
        beta_fast: gguf
            .get_f32(&k("rope.scaling.yarn_beta_fast"))
            .unwrap_or(32.0),
        beta_slow: gguf
            .get_f32(&k("rope.scaling.yarn_beta_slow"))
            .unwrap_or(1.0),
    })
}

/// Half-open range of layers `[start, end)` a stage holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LayerRange {
    pub start: usize,
    pub end: usize,
}

impl LayerRange {
    pub fn new(start: usize, end: usize, n_layers: usize) -> Result<Self> {
        if start >= end || end > n_layers {
            return Err(ModelError::BadLayerRange {
                start,
                end,
                n_layers,
            });
        }
        Ok(Self { start, end })
    }

    pub fn full(n_layers: usize) -> Self {
        Self {
            start: 0,
            end: n_layers,
        }
    }

    pub fn len(&self) -> usize {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    pub fn is_first(&self) -> bool {
        self.start == 0
    }

    pub fn is_last(&self, n_layers: usize) -> bool {
        self.end == n_layers
    }
}
