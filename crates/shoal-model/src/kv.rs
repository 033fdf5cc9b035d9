//! Per-sequence KV cache for the layers of one stage, and where its memory comes from.
//!
//! [`KvCache`]: keys and values live in one contiguous `(n_kv_heads, capacity, head_dim)` f16 buffer per
//! layer (read by [`crate::attention`]), grown by a quarter at a time (rounded to [`KV_GRANULE`] tokens)
//! so appending a token copies that token only. Under latent attention (deepseek2, decision 022) a cache
//! holds keys only ([`KvCache::for_model`]): the value of a token is the first `kv_lora` values of its key.
//!
//! [`KvBuffers`]: where a cache takes its buffers and gives them back when it grows or is dropped. With
//! none, buffers are allocated and freed (and the allocator hands large freed blocks back to the OS, so
//! the next sequence page-faults them in again); with one (the engine's node KV pool), a freed
//! sequence's buffers are kept — already touched — for the next. [`KvSpares`] is the bookkeeping of
//! such kept buffers (best fit by length), [`KvSource`] names the buffers a stage's caches will use once
//! its engine chooses them. A reused buffer's old contents are never read: attention reads positions
//! below the cache's length only, and every position is written before it counts.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use half::f16;

use crate::attention::HostKvLayer;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// Capacity grows in multiples of this many tokens.
pub const KV_GRANULE: usize = 64;

/// Bytes per stored key or value: f16 (llama.cpp's default cache type).
pub const VALUE_BYTES: usize = 2;

/// One buffer of keys or values (one layer's, of one cache).
pub type KvBuf = Vec<f16>;

/// Where KV caches take their buffers and give them back (see the module overview).
pub trait KvBuffers: Send + Sync {
    /// A buffer of at least `len` and at most `2 * len` values, with whatever it held before, or `None`
    /// (the cache allocates one).
    fn take(&self, len: usize) -> Option<KvBuf>;
    /// Takes back a buffer no cache uses any more: kept for a later [`KvBuffers::take`], or freed.
    fn give(&self, buf: KvBuf);
}

/// Kept buffers by length; a take returns the shortest that is long enough and at most twice as long
/// (so a cache never holds much more than it asked for).
#[derive(Debug, Default)]
pub struct KvSpares {
    by_len: BTreeMap<usize, Vec<KvBuf>>,
    bytes: usize,
}

impl KvSpares {
    /// Bytes of the buffers kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The shortest kept buffer of `len..=2 * len` values, if any.
    pub fn take(&mut self, len: usize) -> Option<KvBuf> {
        let (&found, _) = self.by_len.range(len..=len.saturating_mul(2)).next()?;
        self.remove(found)
    }

    /// Keeps `buf`.
    pub fn put(&mut self, buf: KvBuf) {
        self.bytes += buf_bytes(&buf);
        self.by_len.entry(buf.len()).or_default().push(buf);
    }

    /// Gives up the longest kept buffer (to free it), if any.
    pub fn pop_largest(&mut self) -> Option<KvBuf> {
        let (&longest, _) = self.by_len.iter().next_back()?;
        self.remove(longest)
    }

    fn remove(&mut self, len: usize) -> Option<KvBuf> {
        let list = self.by_len.get_mut(&len)?;
        let buf = list.pop()?;
        if list.is_empty() {
            self.by_len.remove(&len);
        }
        self.bytes -= buf_bytes(&buf);
        Some(buf)
    }
}

/// Bytes a buffer's allocation holds.
pub fn buf_bytes(buf: &KvBuf) -> usize {
    buf.capacity() * VALUE_BYTES
}

/// The [`KvBuffers`] of a stage's caches, chosen after the stage is built (when its engine starts):
/// caches made before then, or when none is chosen, allocate their own. Clones share the choice.
#[derive(Clone, Default)]
pub struct KvSource(Arc<OnceLock<Arc<dyn KvBuffers>>>);

impl KvSource {
    /// Chooses `buffers` for every cache made from now on; false (and nothing changed) when chosen
    /// already.
    pub fn bind(&self, buffers: Arc<dyn KvBuffers>) -> bool {
        self.0.set(buffers).is_ok()
    }

    /// The chosen buffers, if any.
    pub fn get(&self) -> Option<Arc<dyn KvBuffers>> {
        self.0.get().cloned()
    }
}

impl std::fmt::Debug for KvSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bound = self.0.get().is_some();
        f.debug_struct("KvSource").field("bound", &bound).finish()
    }
}

struct Layer {
    k: KvBuf,
    v: KvBuf,
}

pub struct KvCache {
    layers: Vec<Layer>,
    len: usize,
    capacity: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// Values are stored beside the keys (false: keys only, latent attention).
    values: bool,
    buffers: Option<Arc<dyn KvBuffers>>,
}

impl KvCache {
    /// An empty cache for `n_layers` layers (the layers of one stage) that allocates its own buffers.
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        Self::with_buffers(n_layers, n_kv_heads, head_dim, None)
    }

    /// An empty cache for `n_layers` layers of `cfg`'s model (keys only under latent attention), taking
    /// its buffers from `buffers` when there are some.
    pub fn for_model(
        cfg: &ModelConfig,
        n_layers: usize,
        buffers: Option<Arc<dyn KvBuffers>>,
    ) -> Self {
        let mut kv = Self::with_buffers(n_layers, cfg.n_kv_heads, cfg.head_dim, buffers);
        kv.values = cfg.arch.mla.is_none();
        kv
    }

    /// An empty cache taking its buffers from `buffers` (and giving them back) when there are some.
    pub fn with_buffers(
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        buffers: Option<Arc<dyn KvBuffers>>,
    ) -> Self {
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
            values: true,
            buffers,
        }
    }

    /// Whether values are stored beside the keys (false: a latent-attention cache of keys only).
    pub fn has_values(&self) -> bool {
        self.values
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
        self.layers
            .iter()
            .map(|l| buf_bytes(&l.k) + buf_bytes(&l.v))
            .sum()
    }

    /// Makes room for `extra` more tokens in every layer.
    pub fn reserve(&mut self, extra: usize) -> Result<()> {
        let needed = self.len + extra;
        if needed <= self.capacity {
            return Ok(());
        }
        // Grow by a quarter (amortised O(1) appends; at most 25 % + one granule over what is used, or
        // twice that when a kept buffer is taken).
        let new_cap = needed
            .max(self.capacity + self.capacity / 4)
            .div_ceil(KV_GRANULE)
            * KV_GRANULE;
        let (nkv, hd, old_cap, len) = (self.n_kv_heads, self.head_dim, self.capacity, self.len);
        let want = nkv * new_cap * hd;
        let values = self.values;
        let mut grown: Vec<Layer> = (0..self.layers.len())
            .map(|_| Layer {
                k: self.buffer(want),
                v: if values {
                    self.buffer(want)
                } else {
                    Vec::new()
                },
            })
            .collect();
        // A kept buffer may be longer than asked: use what every layer's buffers hold.
        let cap = grown
            .iter()
            .flat_map(|l| [Some(l.k.len()), values.then_some(l.v.len())])
            .flatten()
            .min()
            .map_or(new_cap, |n| n / (nkv * hd).max(1));
        for (old, new) in self.layers.iter().zip(grown.iter_mut()) {
            for (src, dst) in [(&old.k, &mut new.k), (&old.v, &mut new.v)] {
                if dst.is_empty() {
                    continue;
                }
                for g in 0..nkv {
                    dst[g * cap * hd..][..len * hd]
                        .copy_from_slice(&src[g * old_cap * hd..][..len * hd]);
                }
            }
        }
        let old = std::mem::replace(&mut self.layers, grown);
        self.give_back(old);
        self.capacity = cap;
        Ok(())
    }

    /// A buffer of at least `len` values: a kept one (old contents and all) or a fresh one.
    fn buffer(&self, len: usize) -> KvBuf {
        self.buffers
            .as_ref()
            .and_then(|b| b.take(len))
            .filter(|b| b.len() >= len)
            .unwrap_or_else(|| vec![f16::ZERO; len])
    }

    /// Hands `layers`' buffers back to where they came from (or frees them).
    fn give_back(&self, layers: Vec<Layer>) {
        let Some(buffers) = &self.buffers else {
            return;
        };
        for Layer { k, v } in layers {
            for buf in [k, v] {
                if buf.capacity() > 0 {
                    buffers.give(buf);
                }
            }
        }
    }

    /// The buffers of stage-local layer `layer`.
    pub fn host_layer(&mut self, layer: usize) -> Result<HostKvLayer<'_>> {
        let n = self.n_kv_heads * self.capacity * self.head_dim;
        let nv = if self.values { n } else { 0 };
        match self.layers.get_mut(layer) {
            Some(Layer { k, v }) => match (k.get_mut(..n), v.get_mut(..nv)) {
                (Some(k), Some(v)) => Ok(HostKvLayer {
                    k,
                    v,
                    capacity: self.capacity,
                }),
                _ => Err(ModelError::BadInput(format!(
                    "KV layer {layer} holds fewer than {n} values"
                ))),
            },
            None => Err(ModelError::BadInput(format!("no KV layer {layer}"))),
        }
    }

    /// Commits `t` appended tokens.
    pub fn advance(&mut self, t: usize) {
        self.len += t;
    }

    /// Appends `t` tokens of zeros (a placeholder whose attention reads nothing of another sequence).
    pub fn extend_blank(&mut self, t: usize) -> Result<()> {
        self.reserve(t)?;
        let (nkv, hd, cap, len) = (self.n_kv_heads, self.head_dim, self.capacity, self.len);
        for layer in &mut self.layers {
            for buf in [&mut layer.k, &mut layer.v] {
                if buf.is_empty() {
                    continue;
                }
                for g in 0..nkv {
                    buf[(g * cap + len) * hd..][..t * hd].fill(f16::ZERO);
                }
            }
        }
        self.len += t;
        Ok(())
    }

    /// Forgets tokens after `len` (used to roll back or reuse a prefix).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// A new cache holding a copy of this one's first `len` tokens (prefix reuse: the KV of a token
    /// depends only on the tokens before it, so a shared prompt prefix needs computing once).
    pub fn copy_prefix(&self, len: usize) -> Result<KvCache> {
        let len = len.min(self.len);
        let mut out = KvCache::with_buffers(
            self.layers.len(),
            self.n_kv_heads,
            self.head_dim,
            self.buffers.clone(),
        );
        out.values = self.values;
        out.reserve(len)?;
        let (nkv, hd, src_cap, dst_cap) =
            (self.n_kv_heads, self.head_dim, self.capacity, out.capacity);
        for (src, dst) in self.layers.iter().zip(out.layers.iter_mut()) {
            for (s, d) in [(&src.k, &mut dst.k), (&src.v, &mut dst.v)] {
                if d.is_empty() {
                    continue;
                }
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

impl Drop for KvCache {
    fn drop(&mut self) {
        let layers = std::mem::take(&mut self.layers);
        self.give_back(layers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value stored for `(layer, kv head, token, dim)` in the tests' caches (2 layers, 3 heads of 4).
    fn value(layer: usize, g: usize, t: usize, d: usize) -> f32 {
        (layer * 1000 + g * 100 + t * 10 + d) as f32
    }

    /// Visits every `(layer, head, token < tokens, dim)` of `kv` with its key and value slots' index.
    fn each(kv: &mut KvCache, tokens: usize, mut f: impl FnMut(&mut HostKvLayer<'_>, usize, f32)) {
        for layer in 0..2 {
            let mut l = kv.host_layer(layer).unwrap();
            let cap = l.capacity;
            for (g, t, d) in
                (0..3).flat_map(|g| (0..tokens).flat_map(move |t| (0..4).map(move |d| (g, t, d))))
            {
                f(&mut l, (g * cap + t) * 4 + d, value(layer, g, t, d));
            }
        }
    }

    /// Writes `value` keys (and negated values) for the first `tokens` tokens and commits them.
    fn fill(kv: &mut KvCache, tokens: usize) {
        each(kv, tokens, |l, i, x| {
            l.k[i] = f16::from_f32(x);
            l.v[i] = f16::from_f32(-x);
        });
        kv.advance(tokens);
    }

    /// Asserts the first `tokens` tokens hold what [`fill`] wrote.
    fn check(kv: &mut KvCache, tokens: usize) {
        each(kv, tokens, |l, i, x| {
            assert_eq!((l.k[i].to_f32(), l.v[i].to_f32()), (x, -x), "slot {i}");
        });
    }

    #[test]
    fn copy_prefix_keeps_the_first_tokens_of_every_head() {
        let mut kv = KvCache::new(2, 3, 4);
        kv.reserve(5).unwrap();
        fill(&mut kv, 5);
        let mut p = kv.copy_prefix(3).unwrap();
        assert_eq!(p.len(), 3);
        check(&mut p, 3);
        // Longer than what is stored: clamps.
        assert_eq!(kv.copy_prefix(99).unwrap().len(), 5);
    }

    #[test]
    fn a_keys_only_cache_holds_no_values_and_keeps_its_keys_through_growth_and_copies() {
        let mut kv = KvCache::new(2, 1, 6);
        kv.values = false;
        kv.reserve(3).unwrap();
        let key = |layer: usize, t: usize, d: usize| (layer * 100 + t * 10 + d) as f32;
        let write = |kv: &mut KvCache, from: usize, to: usize| {
            for layer in 0..2 {
                let l = kv.host_layer(layer).unwrap();
                assert!(l.v.is_empty());
                for (t, d) in (from..to).flat_map(|t| (0..6).map(move |d| (t, d))) {
                    l.k[t * 6 + d] = f16::from_f32(key(layer, t, d));
                }
            }
            kv.advance(to - from);
        };
        let read = |kv: &mut KvCache, tokens: usize| {
            for layer in 0..2 {
                let l = kv.host_layer(layer).unwrap();
                for (t, d) in (0..tokens).flat_map(|t| (0..6).map(move |d| (t, d))) {
                    assert_eq!(l.k[t * 6 + d].to_f32(), key(layer, t, d), "{layer} {t} {d}");
                }
            }
        };
        write(&mut kv, 0, 3);
        // Growing past a granule copies the keys; the allocation is keys only.
        kv.reserve(KV_GRANULE + 1).unwrap();
        read(&mut kv, 3);
        assert_eq!(kv.allocated_bytes(), 2 * kv.capacity() * 6 * VALUE_BYTES);
        kv.extend_blank(2).unwrap();
        let mut p = kv.copy_prefix(3).unwrap();
        assert!(!p.has_values());
        read(&mut p, 3);
        write(&mut p, 3, 4);
        read(&mut p, 4);
    }

    /// Buffers kept in a [`KvSpares`], counting every take and give.
    #[derive(Default)]
    struct Kept {
        spares: std::sync::Mutex<KvSpares>,
        gets: std::sync::atomic::AtomicUsize,
    }

    impl KvBuffers for Kept {
        fn take(&self, len: usize) -> Option<KvBuf> {
            self.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.spares.lock().unwrap().take(len)
        }
        fn give(&self, buf: KvBuf) {
            self.spares.lock().unwrap().put(buf);
        }
    }

    #[test]
    fn spares_give_the_shortest_buffer_long_enough_and_at_most_twice_as_long() {
        let mut s = KvSpares::default();
        for len in [100, 300, 150] {
            s.put(vec![f16::ZERO; len]);
        }
        assert_eq!(s.bytes(), 550 * VALUE_BYTES);
        assert_eq!(s.take(120).map(|b| b.len()), Some(150));
        assert_eq!(
            s.take(120).map(|b| b.len()),
            None,
            "300 is more than twice 120"
        );
        assert_eq!(s.take(100).map(|b| b.len()), Some(100));
        assert_eq!(s.take(301), None);
        assert_eq!(s.pop_largest().map(|b| b.len()), Some(300));
        assert_eq!((s.pop_largest(), s.bytes()), (None, 0));
    }

    #[test]
    fn a_cache_gives_its_buffers_back_when_it_grows_and_when_dropped_and_the_next_takes_them() {
        let kept = Arc::new(Kept::default());
        let buffers: Arc<dyn KvBuffers> = kept.clone();
        let per_token = 2 * 3 * 4 * VALUE_BYTES; // 2 layers × (3 heads × 4 dims) × f16, keys or values
        let mut kv = KvCache::with_buffers(2, 3, 4, Some(buffers.clone()));
        kv.reserve(10).unwrap();
        assert_eq!(kv.capacity(), KV_GRANULE);
        assert_eq!(kv.allocated_bytes(), 2 * KV_GRANULE * per_token);
        assert_eq!(kept.spares.lock().unwrap().bytes(), 0, "nothing kept yet");
        kv.advance(10);
        // Growing hands the old buffers back.
        kv.reserve(KV_GRANULE).unwrap();
        assert_eq!(kv.capacity(), 2 * KV_GRANULE);
        assert_eq!(
            kept.spares.lock().unwrap().bytes(),
            2 * KV_GRANULE * per_token
        );
        drop(kv);
        let all = 2 * 3 * KV_GRANULE * per_token;
        assert_eq!(kept.spares.lock().unwrap().bytes(), all);
        // A new short sequence takes the longer kept buffers (within twice what it asks) and uses all
        // they hold: it grows no more until they are full.
        let mut next = KvCache::with_buffers(2, 3, 4, Some(buffers));
        next.reserve(KV_GRANULE + 1).unwrap();
        assert_eq!(next.capacity(), 2 * KV_GRANULE);
        assert_eq!(
            kept.spares.lock().unwrap().bytes(),
            all - next.allocated_bytes()
        );
        let gets = kept.gets.load(std::sync::atomic::Ordering::Relaxed);
        next.reserve(2 * KV_GRANULE - 1)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            kept.gets.load(std::sync::atomic::Ordering::Relaxed),
            gets,
            "fits: no buffer taken"
        );
    }

    #[test]
    fn growing_into_a_kept_buffer_keeps_every_stored_token_and_ignores_its_old_contents() {
        let kept = Arc::new(Kept::default());
        // Kept buffers full of NaN, longer than the next growth asks for.
        for _ in 0..4 {
            kept.give(vec![f16::NAN; 3 * 200 * 4]);
        }
        let mut kv = KvCache::with_buffers(2, 3, 4, Some(kept.clone()));
        kv.reserve(5).unwrap(); // fresh (the kept ones are more than twice as long)
        assert_eq!(kv.capacity(), KV_GRANULE);
        fill(&mut kv, 5);
        kv.reserve(KV_GRANULE + 40).unwrap(); // 128 asked: the 200-token buffers are taken whole
        assert_eq!(kv.capacity(), 200);
        assert_eq!(kv.host_layer(1).unwrap().k.len(), 3 * 200 * 4);
        check(&mut kv, 5);
    }

    #[test]
    fn blank_tokens_are_zeros_even_in_a_kept_buffer_and_follow_what_is_stored() {
        let kept = Arc::new(Kept::default());
        for _ in 0..4 {
            kept.give(vec![f16::NAN; 3 * 200 * 4]);
        }
        let mut kv = KvCache::with_buffers(2, 3, 4, Some(kept));
        kv.reserve(3).unwrap(); // fresh (the kept ones are more than twice as long)
        fill(&mut kv, 3);
        kv.extend_blank(KV_GRANULE).unwrap(); // grows into the kept NaN buffers
        assert_eq!((kv.len(), kv.capacity()), (3 + KV_GRANULE, 200));
        check(&mut kv, 3);
        let mut blanks = 0;
        for layer in 0..2 {
            let l = kv.host_layer(layer).unwrap();
            let cap = l.capacity;
            for g in 0..3 {
                for i in (g * cap + 3) * 4..(g * cap + 3 + KV_GRANULE) * 4 {
                    assert_eq!((l.k[i], l.v[i]), (f16::ZERO, f16::ZERO), "slot {i}");
                    blanks += 1;
                }
            }
        }
        assert_eq!(blanks, 2 * 3 * KV_GRANULE * 4);
    }
}
