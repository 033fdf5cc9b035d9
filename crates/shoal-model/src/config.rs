//! Architecture-independent model shape, read from GGUF metadata.

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

/// The shape of a decoder-only transformer, as much as placement and the engine need.
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
}

impl ModelConfig {
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let arch = gguf.get_str("general.architecture")?.to_string();
        if !matches!(arch.as_str(), "llama" | "mistral") {
            return Err(ModelError::UnsupportedArchitecture(arch));
        }
        let k = |s: &str| format!("{arch}.{s}");
        let dim = gguf.get_u32(&k("embedding_length"))? as usize;
        let n_heads = gguf.get_u32(&k("attention.head_count"))? as usize;
        let n_kv_heads = gguf
            .get_u32(&k("attention.head_count_kv"))
            .unwrap_or(n_heads as u32) as usize;
        let head_dim = gguf
            .get_u32(&k("rope.dimension_count"))
            .map(|d| d as usize)
            .unwrap_or(dim / n_heads.max(1));
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
        let cfg = Self {
            n_layers: gguf.get_u32(&k("block_count"))? as usize,
            dim,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim: gguf.get_u32(&k("feed_forward_length"))? as usize,
            vocab_size,
            context_length: gguf.get_u32(&k("context_length")).unwrap_or(2048) as usize,
            rope_theta: gguf.get_f32(&k("rope.freq_base")).unwrap_or(10_000.0),
            rms_eps: gguf
                .get_f32(&k("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5),
            architecture: arch,
        };
        if cfg.n_heads == 0 || cfg.n_kv_heads == 0 || !cfg.n_heads.is_multiple_of(cfg.n_kv_heads) {
            return Err(ModelError::InvalidGguf {
                path: gguf.path().display().to_string(),
                message: format!("bad head counts {} / {}", cfg.n_heads, cfg.n_kv_heads),
            });
        }
        Ok(cfg)
    }

    /// KV-cache bytes per token for the given number of layers, `value_bytes` per stored key or value
    /// ([`crate::kv::value_bytes`]: 2 in host caches, 4 on devices).
    pub fn kv_bytes_per_token(&self, layers: usize, value_bytes: usize) -> usize {
        2 * layers * self.n_kv_heads * self.head_dim * value_bytes
    }
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
