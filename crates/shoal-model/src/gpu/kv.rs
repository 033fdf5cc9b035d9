//! One sequence's KV cache on the device: [`GpuKv`], a [`shoal_gpu::GpuKvCache`] that grows
//! without losing its contents (a bigger cache and a copy on the device), is cut back or extended
//! with blank positions, and is copied for prefixes and forks — what [`crate::KvCache`] does on
//! the host, with the same method names.

use std::sync::Arc;

use shoal_gpu::{Gpu, GpuKvCache, KvShape};

use crate::error::{ModelError, Result};

/// Positions a new cache starts with.
const MIN_CAPACITY: usize = 64;

/// A sequence's keys and values of a stage's layers, on the device.
pub struct GpuKv {
    gpu: Arc<Gpu>,
    /// The shape of every cache this sequence holds (`capacity` aside).
    shape: KvShape,
    cache: Option<GpuKvCache>,
    len: usize,
}

impl std::fmt::Debug for GpuKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuKv")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl GpuKv {
    /// An empty cache for `shape.layers` layers (no device memory until the first token).
    pub fn new(gpu: Arc<Gpu>, shape: KvShape) -> Self {
        Self {
            gpu,
            shape,
            cache: None,
            len: 0,
        }
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions allocated.
    pub fn capacity(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.shape().capacity)
    }

    /// Bytes of keys and values allocated on the device.
    pub fn allocated_bytes(&self) -> usize {
        let s = self.shape;
        let per_value = if s.keys_only { 1 } else { 2 };
        per_value * s.layers * self.capacity() * s.n_kv_heads * s.head_dim * 2
    }

    pub(crate) fn cache(&self) -> Result<&GpuKvCache> {
        self.cache
            .as_ref()
            .ok_or_else(|| ModelError::BadInput("a device KV cache used before reserve".into()))
    }

    /// A cache of `capacity` positions.
    fn alloc(&self, capacity: usize) -> Result<GpuKvCache> {
        Ok(self.gpu.kv_cache(KvShape {
            capacity,
            ..self.shape
        })?)
    }

    /// Room for `extra` more tokens: a bigger cache (double, or what is needed, or the most a
    /// storage binding allows) holding a copy of the current contents.
    pub fn reserve(&mut self, extra: usize) -> Result<()> {
        let needed = self.len + extra;
        if needed <= self.capacity() {
            return Ok(());
        }
        let want = needed.max(2 * self.capacity()).max(MIN_CAPACITY);
        let bigger = match self.alloc(want) {
            Ok(c) => c,
            // Doubling may not fit a binding when exactly what is needed does.
            Err(_) if want > needed => self.alloc(needed)?,
            Err(e) => return Err(e),
        };
        if let Some(old) = &self.cache {
            self.gpu.kv_copy(old, &bigger, self.len)?;
        }
        self.cache = Some(bigger);
        Ok(())
    }

    /// Counts `t` tokens written by a forward pass as held.
    pub fn advance(&mut self, t: usize) {
        self.len = (self.len + t).min(self.capacity());
    }

    /// Holds `t` more tokens whose keys and values are whatever the cache had (a placeholder).
    pub fn extend_blank(&mut self, t: usize) -> Result<()> {
        self.reserve(t)?;
        self.len += t;
        Ok(())
    }

    /// Keeps the first `len` tokens.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// A compact copy of the first `len` tokens (at most those held).
    pub fn copy_prefix(&self, len: usize) -> Result<GpuKv> {
        let len = len.min(self.len);
        let mut out = GpuKv::new(self.gpu.clone(), self.shape);
        if len > 0 {
            let cache = out.alloc(len)?;
            self.gpu.kv_copy(self.cache()?, &cache, len)?;
            out.cache = Some(cache);
            out.len = len;
        }
        Ok(out)
    }
}
