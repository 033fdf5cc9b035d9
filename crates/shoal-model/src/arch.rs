//! The architectures shoal runs, and what sets each apart, as data.
//!
//! Every supported family is one pre-norm decoder (`x += attn(norm(x)); x += ffn(norm(x))`), so one forward
//! pass ([`crate::decoder`]) serves them all. What differs is either read from the GGUF's tensor table
//! (a tensor that is present is used: Q/K/V biases, Q/K norms, post-attention and post-FFN norms, fused
//! `attn_qkv` or a fused gate+up `ffn_up`, rope frequency factors, an untied output head) or is a property
//! of the family, listed here in [`Family`]: the rotary style, the FFN activation, embedding scaling,
//! the default sliding-window pattern and the local-layer rope base.

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
    /// Rope base of the local layers when the file gives none (`rope.freq_base_swa`).
    pub local_rope_base: f32,
    /// Whether `attention.sliding_window` is honoured (llama.cpp ignores Phi-3's).
    pub uses_sliding_window: bool,
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
        }
    }

    /// The family's fixed properties.
    pub fn family(self) -> Family {
        let base = Family {
            rope: RopeStyle::Neox,
            activation: Activation::Silu,
            scale_embeddings: false,
            swa_pattern: 0,
            local_rope_base: 10_000.0,
            uses_sliding_window: false,
        };
        match self {
            Self::Llama | Self::Mistral => Family {
                rope: RopeStyle::Interleaved,
                ..base
            },
            Self::Qwen2 | Self::Qwen3 | Self::Phi3 => base,
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
}
