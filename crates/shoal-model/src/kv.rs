//! Per-sequence KV cache for the layers of one stage.
//!
//! Keys and values live in one contiguous `(n_kv_heads, capacity, head_dim)` buffer per layer — a plain
//! host buffer on CPU (read by [`crate::attention`]), a tensor on other devices — grown by doubling
//! (rounded to [`KV_GRANULE`] tokens) so appending a token copies that token only.

use candle_core::{DType, Device, Tensor};

use crate::attention::HostKvLayer;
use crate::error::{ModelError, Result};

/// Capacity grows in multiples of this many tokens.
pub const KV_GRANULE: usize = 64;

enum Layer {
    Host {
        k: Vec<f32>,
        v: Vec<f32>,
    },
    /// Allocated on the first `reserve`.
    Device(Option<(Tensor, Tensor)>),
}

pub struct KvCache {
    layers: Vec<Layer>,
    len: usize,
    capacity: usize,
    n_kv_heads: usize,
    head_dim: usize,
    device: Device,
}

impl KvCache {
    /// An empty cache for `n_layers` layers (the layers of one stage): host buffers when `host`, else
    /// tensors on `device`.
    pub fn new(
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        device: &Device,
        host: bool,
    ) -> Self {
        let empty = || match host {
            true => Layer::Host {
                k: Vec::new(),
                v: Vec::new(),
            },
            false => Layer::Device(None),
        };
        Self {
            layers: (0..n_layers).map(|_| empty()).collect(),
            len: 0,
            capacity: 0,
            n_kv_heads,
            head_dim,
            device: device.clone(),
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
        2 * self.layers.len() * self.n_kv_heads * self.capacity * self.head_dim * 4
    }

    /// Makes room for `extra` more tokens in every layer.
    pub fn reserve(&mut self, extra: usize) -> Result<()> {
        let needed = self.len + extra;
        if needed <= self.capacity {
            return Ok(());
        }
        let new_cap = needed.max(self.capacity * 2).div_ceil(KV_GRANULE) * KV_GRANULE;
        let (nkv, hd, old_cap, len) = (self.n_kv_heads, self.head_dim, self.capacity, self.len);
        for layer in self.layers.iter_mut() {
            match layer {
                Layer::Host { k, v } => {
                    for buf in [k, v] {
                        let mut grown = vec![0f32; nkv * new_cap * hd];
                        for g in 0..nkv {
                            let src = &buf[g * old_cap * hd..][..len * hd];
                            grown[g * new_cap * hd..][..len * hd].copy_from_slice(src);
                        }
                        *buf = grown;
                    }
                }
                Layer::Device(bufs) => {
                    let grow = |old: Option<&Tensor>| -> Result<Tensor> {
                        let grown = Tensor::zeros((nkv, new_cap, hd), DType::F32, &self.device)?;
                        if let (Some(old), true) = (old, len > 0) {
                            grown.slice_set(&old.narrow(1, 0, len)?.contiguous()?, 1, 0)?;
                        }
                        Ok(grown)
                    };
                    let (k, v) = (
                        grow(bufs.as_ref().map(|b| &b.0))?,
                        grow(bufs.as_ref().map(|b| &b.1))?,
                    );
                    *bufs = Some((k, v));
                }
            }
        }
        self.capacity = new_cap;
        Ok(())
    }

    /// The host buffers of stage-local layer `layer` (CPU caches only).
    pub fn host_layer(&mut self, layer: usize) -> Result<HostKvLayer<'_>> {
        match self.layers.get_mut(layer) {
            Some(Layer::Host { k, v }) => Ok(HostKvLayer {
                k,
                v,
                capacity: self.capacity,
            }),
            _ => Err(ModelError::BadInput(format!("no host KV layer {layer}"))),
        }
    }

    /// Writes `k`, `v` of shape `(n_kv_heads, t, head_dim)` for layer `layer` (stage-local index) at
    /// positions `len..len+t` and returns views of all keys and values up to `len + t` (device caches).
    /// Call [`KvCache::advance`] once every layer has been appended.
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let t = k.dim(1)?;
        self.reserve(t)?;
        let Some(Layer::Device(Some((kc, vc)))) = self.layers.get(layer) else {
            return Err(ModelError::BadInput(format!("no device KV layer {layer}")));
        };
        kc.slice_set(&k.contiguous()?, 1, self.len)?;
        vc.slice_set(&v.contiguous()?, 1, self.len)?;
        Ok((
            kc.narrow(1, 0, self.len + t)?,
            vc.narrow(1, 0, self.len + t)?,
        ))
    }

    /// Commits `t` appended tokens.
    pub fn advance(&mut self, t: usize) {
        self.len += t;
    }

    /// Forgets tokens after `len` (used to roll back or reuse a prefix).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}
