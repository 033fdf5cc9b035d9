//! Per-sequence KV cache for the layers of one stage.
//!
//! Keys and values live in one contiguous `(n_kv_heads, capacity, head_dim)` f16 buffer per layer (read
//! by [`crate::attention`]), grown by a quarter at a time (rounded to [`KV_GRANULE`] tokens) so appending
//! a token copies that token only.

use half::f16;

use crate::attention::HostKvLayer;
use crate::error::{ModelError, Result};

/// Capacity grows in multiples of this many tokens.
pub const KV_GRANULE: usize = 64;

/// Bytes per stored key or value: f16 (llama.cpp's default cache type).
pub const VALUE_BYTES: usize = 2;

struct Layer {
    k: Vec<f16>,
    v: Vec<f16>,
}

pub struct KvCache {
    layers: Vec<Layer>,
    len: usize,
    capacity: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

impl KvCache {
    /// An empty cache for `n_layers` layers (the layers of one stage).
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        Self {
            layers: (0..n_layers)
                .map(|_| Layer {
                    k: Vec::new(),
                    v: Vec::new(),
                })
                .collect(),
            len: 0,
            capacity: 0,
            n_kv_heads,
            head_dim,
        }
    }

    /// Tokens stored (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes currently allocated.
    pub fn allocated_bytes(&self) -> usize {
        2 * self.layers.len() * self.n_kv_heads * self.capacity * self.head_dim * VALUE_BYTES
    }

    /// Makes room for `extra` more tokens in every layer.
    pub fn reserve(&mut self, extra: usize) -> Result<()> {
        let needed = self.len + extra;
        if needed <= self.capacity {
            return Ok(());
        }
        // Grow by a quarter (amortised O(1) appends; at most 25 % + one granule over what is used).
        let new_cap = needed
            .max(self.capacity + self.capacity / 4)
            .div_ceil(KV_GRANULE)
            * KV_GRANULE;
        let (nkv, hd, old_cap, len) = (self.n_kv_heads, self.head_dim, self.capacity, self.len);
        for layer in self.layers.iter_mut() {
            for buf in [&mut layer.k, &mut layer.v] {
                let mut grown = vec![f16::ZERO; nkv * new_cap * hd];
                for g in 0..nkv {
                    let src = &buf[g * old_cap * hd..][..len * hd];
                    grown[g * new_cap * hd..][..len * hd].copy_from_slice(src);
                }
                *buf = grown;
            }
        }
        self.capacity = new_cap;
        Ok(())
    }

    /// The buffers of stage-local layer `layer`.
    pub fn host_layer(&mut self, layer: usize) -> Result<HostKvLayer<'_>> {
        match self.layers.get_mut(layer) {
            Some(Layer { k, v }) => Ok(HostKvLayer {
                k,
                v,
                capacity: self.capacity,
            }),
            None => Err(ModelError::BadInput(format!("no KV layer {layer}"))),
        }
    }

    /// Commits `t` appended tokens.
    pub fn advance(&mut self, t: usize) {
        self.len += t;
    }

    /// Forgets tokens after `len` (used to roll back or reuse a prefix).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// A new cache holding a copy of this one's first `len` tokens (prefix reuse: the KV of a token
    /// depends only on the tokens before it, so a shared prompt prefix needs computing once).
    pub fn copy_prefix(&self, len: usize) -> Result<KvCache> {
        let len = len.min(self.len);
        let mut out = KvCache::new(self.layers.len(), self.n_kv_heads, self.head_dim);
        out.reserve(len)?;
        let (nkv, hd, src_cap, dst_cap) =
            (self.n_kv_heads, self.head_dim, self.capacity, out.capacity);
        for (src, dst) in self.layers.iter().zip(out.layers.iter_mut()) {
            for (s, d) in [(&src.k, &mut dst.k), (&src.v, &mut dst.v)] {
                for g in 0..nkv {
                    d[g * dst_cap * hd..][..len * hd]
                        .copy_from_slice(&s[g * src_cap * hd..][..len * hd]);
                }
            }
        }
        out.len = len;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_prefix_keeps_the_first_tokens_of_every_head() {
        let mut kv = KvCache::new(2, 3, 4);
        kv.reserve(5).unwrap();
        for layer in 0..2 {
            let l = kv.host_layer(layer).unwrap();
            let cap = l.capacity;
            for g in 0..3 {
                for t in 0..5 {
                    for d in 0..4 {
                        let x = (layer * 1000 + g * 100 + t * 10 + d) as f32;
                        l.k[(g * cap + t) * 4 + d] = f16::from_f32(x);
                        l.v[(g * cap + t) * 4 + d] = f16::from_f32(-x);
                    }
                }
            }
        }
        kv.advance(5);
        let mut p = kv.copy_prefix(3).unwrap();
        assert_eq!(p.len(), 3);
        for layer in 0..2 {
            let l = p.host_layer(layer).unwrap();
            let cap = l.capacity;
            for g in 0..3 {
                for t in 0..3 {
                    for d in 0..4 {
                        let x = (layer * 1000 + g * 100 + t * 10 + d) as f32;
                        assert_eq!(l.k[(g * cap + t) * 4 + d].to_f32(), x);
                        assert_eq!(l.v[(g * cap + t) * 4 + d].to_f32(), -x);
                    }
                }
            }
        }
        // Longer than what is stored: clamps.
        assert_eq!(kv.copy_prefix(99).unwrap().len(), 5);
    }
}
