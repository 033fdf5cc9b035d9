//! The architectures shoal runs, and what sets each apart, as data.
//!
//! Every supported family is one pre-norm decoder (`x += attn(norm(x)); x += ffn(norm(x))`), so one forward
//! pass ([`crate::decoder`]) serves them all. What differs is either read from the GGUF's tensor table
//! (a tensor that is present is used: Q/K/V biases, Q/K norms, post-attention and post-FFN norms, fused
//! `attn_qkv` or a fused gate+up `ffn_up`, rope frequency factors, an untied output head) or is a property
//! of the family, listed here in [`Family`]: the rotary style, the FFN activation, embedding scaling,
//! the default sliding-window pattern and the local-layer rope base.
//!
//! Mixture-of-experts families (`qwen3moe`, `qwen2moe`) are the same decoder whose feed-forward is a
//! routed set of experts ([`crate::ffn`], decision 020): the family fixes the routing ([`Routing`]: a
//! softmax over the router's logits, top-k, and whether the k weights are renormalised to sum to 1);
//! the expert counts come from the metadata (`expert_count`, `expert_used_count`,
//! `expert_feed_forward_length`) and a shared expert (`ffn_*_shexp`, gated by
//! `sigmoid(ffn_gate_inp_shexp · x)`) is used when the file has its tensors.
//!
//! `gpt-oss` (gpt-oss-20b/120b) is the same decoder again. What its files carry is used because it is
//! there: biases on Q/K/V/O, on the router and on every expert (`ffn_*_exps.bias`), attention sinks
//! (`attn_sinks`: a per-head logit in the softmax's denominator) and YaRN rope scaling
//! (`rope.scaling.type yarn`, see [`crate::ops::Yarn`]). What the family fixes: the routing
//! ([`Gating::TopKThenSoftmax`]: the k largest biased router logits, then a softmax over those k), the
//! experts' activation ([`Activation::SwigluOai`], llama.cpp's clamped `swiglu_oai`), sliding windows on
//! every other layer (the even ones), local layers rotated like the global ones, and the FFN norm read
//! from `post_attention_norm` (the name llama.cpp loads it by). Other architectures (`llama4`, …) are
//! refused by name.
//!
//! `glm4moe` (GLM-4.5 / 4.6 / 4.7 and their Air builds) is the same decoder once more: Q/K/V biases
//! and optional Q/K norms are used because the file has them, partial rotary (`rope.dimension_count`
//! below the head size: only the first values of each head rotated, NEOX) comes from the metadata, the
//! FFN norm is read from `post_attention_norm`, the first `leading_dense_block_count` layers have a
//! dense feed-forward, and the routing is [`Gating::Sigmoid`]: sigmoid scores, the top k chosen on the
//! scores plus a per-expert bias (`exp_probs_b`), weighted by the unbiased scores, renormalised when
//! `expert_weights_norm` and scaled by `expert_weights_scale`; the shared expert is added ungated. The
//! `nextn_predict_layers` multi-token-prediction layers at the end of the file are not run (llama.cpp
//! skips them too): the model has `block_count − nextn_predict_layers` layers.
//!
//! `deepseek2` (DeepSeek V2/V3/R1, Kimi K2, Moonlight, GLM-4.7-Flash) is the same decoder with multi-head
//! latent attention as its attention ([`crate::mla`], decision 022): the file's `attn_q_a`/`attn_q_b`
//! (or `attn_q`), `attn_kv_a_mqa`, `attn_k_b`/`attn_v_b` make it a one-KV-head attention over a cached
//! latent of `kv_lora_rank + rope` values per token. Its feed-forward is glm4moe's machinery with the
//! gating the file names (`expert_gating_func`: softmax for V2, sigmoid for V3), group-limited top-k
//! (`expert_group_count` / `expert_group_used_count`), the selection bias, leading dense layers and an
//! ungated shared expert; rotary pairs are interleaved (ggml's normal mode) on the rope part only.

use crate::error::{ModelError, Result};

/// The families shoal loads, by their GGUF `general.architecture` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// Llama 1–3, SmolLM, TinyLlama, and Mistral files written with the `llama` architecture.
    Llama,
    /// Mistral 7B-style files that declare `mistral`: the same graph as `llama`.
    Mistral,
    /// Qwen 2 / 2.5: biases on Q, K and V.
    Qwen2,
    /// Qwen 3 (dense): RMS norms on Q and K per head.
    Qwen3,
    /// Gemma 3 (text): local sliding-window and global layers, two rope bases, Q/K norms, post norms,
    /// scaled embeddings, GELU.
    Gemma3,
    /// Phi-3 / Phi-3.5 mini: fused QKV and fused gate+up.
    Phi3,
    /// Qwen 1.5-MoE / Qwen 2-MoE: Qwen 2's attention (Q/K/V biases), routed experts whose top-k softmax
    /// weights are used as they are, plus a shared expert gated by a sigmoid.
    Qwen2Moe,
    /// Qwen 3 MoE (30B-A3B, 235B-A22B): Qwen 3's attention (Q/K norms), routed experts whose top-k
    /// softmax weights are renormalised to sum to 1.
    Qwen3Moe,
    /// gpt-oss (20b, 120b): biased attention with sinks, alternating sliding-window and full layers,
    /// YaRN rope, biased experts routed top-k-then-softmax through the clamped SwiGLU.
    #[serde(rename = "gpt-oss")]
    GptOss,
    /// GLM-4.5 / 4.6 / 4.7 (and Air): leading dense layers, then sigmoid-routed experts with a selection
    /// bias and an ungated shared expert; Q/K/V biases, partial rotary.
    Glm4Moe,
    /// DeepSeek V2 / V3 / R1, Kimi K2, Moonlight, GLM-4.7-Flash: multi-head latent attention, leading
    /// dense layers, then routed experts (softmax or sigmoid, group-limited, with a selection bias) and an
    /// ungated shared expert.
    Deepseek2,
}

/// How a mixture-of-experts family turns the router's logits into expert weights: pick the
/// `expert_used_count` largest, weight them by [`Gating`], and (when `norm_weights`) divide the
/// weights by their sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Routing {
    /// Renormalise the top-k weights to sum to 1 (llama.cpp's `norm_w`: Qwen 3 MoE yes, Qwen 2 MoE no;
    /// GLM-4.5 as its `expert_weights_norm` says).
    pub norm_weights: bool,
    pub gating: Gating,
}

/// Where the softmax of a router sits (llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Gating {
    /// Softmax over every expert's logit, then the k largest probabilities (Qwen's `SOFTMAX`).
    SoftmaxThenTopK,
    /// The k largest logits, then a softmax over those k (gpt-oss's `SOFTMAX_WEIGHT`).
    TopKThenSoftmax,
    /// `sigmoid` of every logit; the k largest of the scores plus the selection bias (`exp_probs_b`)
    /// are chosen, weighted by their unbiased scores (GLM-4.5's `SIGMOID`).
    Sigmoid,
}

/// How rotary embeddings pair up the values of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])` (ggml's "normal" mode; GGUF Llama weights are permuted for it).
    Interleaved,
    /// Halves `(x[i], x[i + n/2])` (ggml's NEOX mode: Qwen, Gemma, Phi-3).
    Neox,
}

/// The FFN's gated activation: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Activation {
    /// `x · sigmoid(x)` (SwiGLU).
    Silu,
    /// GELU, tanh approximation (GeGLU).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (llama.cpp's `swiglu_oai`, α 1.702, limit 7):
    /// `min(g, 7) · sigmoid(1.702 · min(g, 7)) · (clamp(u, -7, 7) + 1)`.
    SwigluOai,
}

/// What a family fixes that its GGUF metadata does not say.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Family {
    pub rope: RopeStyle,
    pub activation: Activation,
    /// Multiply token embeddings by `sqrt(dim)` (Gemma).
    pub scale_embeddings: bool,
    /// With a sliding window: every `n`-th layer (the last of each group of `n`) is global, the others
    /// local; used when the file has no `attention.sliding_window_pattern`.
    pub swa_pattern: usize,
    /// Rope base of the local layers when the file gives none (`rope.freq_base_swa`); `None`: the
    /// local layers rotate exactly as the global ones (the same base and scaling: gpt-oss).
    pub local_rope_base: Option<f32>,
    /// Whether `attention.sliding_window` is honoured (llama.cpp ignores Phi-3's).
    pub uses_sliding_window: bool,
    /// A mixture-of-experts feed-forward and its routing (`None`: a dense one).
    pub routing: Option<Routing>,
    /// The name of the norm before the feed-forward (`ffn_norm`; gpt-oss: `post_attention_norm`).
    pub ffn_norm: &'static str,
}

impl Arch {
    /// Every supported architecture name, for error messages and the README.
    pub const SUPPORTED: &'static [&'static str] = crate::supported::ARCHITECTURES;

    /// The architecture of a `general.architecture` value.
    pub fn from_name(name: &str) -> Result<Self> {
        Ok(match name {
            "llama" => Self::Llama,
            "mistral" => Self::Mistral,
            "qwen2" => Self::Qwen2,
            "qwen3" => Self::Qwen3,
            "gemma3" => Self::Gemma3,
            "phi3" => Self::Phi3,
            "qwen2moe" => Self::Qwen2Moe,
            "qwen3moe" => Self::Qwen3Moe,
            "gpt-oss" => Self::GptOss,
            "glm4moe" => Self::Glm4Moe,
            "deepseek2" => Self::Deepseek2,
            other => return Err(ModelError::UnsupportedArchitecture(other.to_string())),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mistral => "mistral",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Gemma3 => "gemma3",
            Self::Phi3 => "phi3",
            Self::Qwen2Moe => "qwen2moe",
            Self::Qwen3Moe => "qwen3moe",
            Self::GptOss => "gpt-oss",
            Self::Glm4Moe => "glm4moe",
            Self::Deepseek2 => "deepseek2",
        }
    }

    /// The family's fixed properties.
    pub fn family(self) -> Family {
        let base = Family {
            rope: RopeStyle::Neox,
            activation: Activation::Silu,
            scale_embeddings: false,
            swa_pattern: 0,
            local_rope_base: Some(10_000.0),
            uses_sliding_window: false,
            routing: None,
            ffn_norm: "ffn_norm",
        };
        let softmax_first = |norm_weights| Routing {
            norm_weights,
            gating: Gating::SoftmaxThenTopK,
        };
        match self {
            Self::Llama | Self::Mistral => Family {
                rope: RopeStyle::Interleaved,
                ..base
            },
            Self::Qwen2 | Self::Qwen3 | Self::Phi3 => base,
            Self::Qwen2Moe => Family {
                routing: Some(softmax_first(false)),
                ..base
            },
            Self::Qwen3Moe => Family {
                routing: Some(softmax_first(true)),
                ..base
            },
            Self::GptOss => Family {
                activation: Activation::SwigluOai,
                swa_pattern: 2,
                local_rope_base: None,
                uses_sliding_window: true,
                routing: Some(Routing {
                    norm_weights: false,
                    gating: Gating::TopKThenSoftmax,
                }),
                ffn_norm: "post_attention_norm",
                ..base
            },
            // `norm_weights` is replaced by the file's `expert_weights_norm` (see `crate::config`).
            Self::Glm4Moe => Family {
                routing: Some(Routing {
                    norm_weights: false,
                    gating: Gating::Sigmoid,
                }),
                ffn_norm: "post_attention_norm",
                ..base
            },
            // The gating and `norm_weights` are replaced by the file's `expert_gating_func` and
            // `expert_weights_norm` (see `crate::config`); softmax is V2's, which writes no gating key.
            Self::Deepseek2 => Family {
                rope: RopeStyle::Interleaved,
                routing: Some(softmax_first(false)),
                ..base
            },
            Self::Gemma3 => Family {
                activation: Activation::GeluTanh,
                scale_embeddings: true,
                swa_pattern: 6,
                uses_sliding_window: true,
                ..base
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_name_round_trips() {
        for name in Arch::SUPPORTED {
            assert_eq!(Arch::from_name(name).map(Arch::name).ok(), Some(*name));
        }
    }

    #[test]
    fn unknown_architecture_lists_the_supported_ones() {
        let err = Arch::from_name("mamba")
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("mamba"), "{err}");
        for name in Arch::SUPPORTED {
            assert!(err.contains(name), "{err} should list {name}");
        }
    }

    #[test]
    fn moe_families_route_as_llama_cpp_does_and_other_moe_architectures_are_refused_by_name() {
        let q3 = Arch::from_name("qwen3moe").unwrap().family();
        let q2 = Arch::from_name("qwen2moe").unwrap().family();
        let oss = Arch::from_name("gpt-oss").unwrap().family();
        let glm = Arch::from_name("glm4moe").unwrap().family();
        let routing = |f: Family| f.routing.map(|r| (r.norm_weights, r.gating));
        assert_eq!(routing(q3), Some((true, Gating::SoftmaxThenTopK)));
        assert_eq!(routing(q2), Some((false, Gating::SoftmaxThenTopK)));
        assert_eq!(routing(oss), Some((false, Gating::TopKThenSoftmax)));
        assert_eq!(
            (oss.activation, oss.swa_pattern, oss.ffn_norm),
            (Activation::SwigluOai, 2, "post_attention_norm")
        );
        assert_eq!(routing(glm).map(|r| r.1), Some(Gating::Sigmoid));
        assert_eq!(
            (glm.rope, glm.ffn_norm),
            (RopeStyle::Neox, "post_attention_norm")
        );
        assert_eq!(Arch::Qwen3.family().routing, None);
        let ds = Arch::from_name("deepseek2").unwrap().family();
        assert_eq!((ds.rope, ds.ffn_norm), (RopeStyle::Interleaved, "ffn_norm"));
        for name in ["llama4", "mamba"] {
            let err = Arch::from_name(name).map(|_| ()).unwrap_err().to_string();
            assert!(err.contains(&format!("'{name}'")), "{err}");
        }
    }
}
