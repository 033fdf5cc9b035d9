//! Self-attention on the host (CPU): rotary embedding, KV-cache append (f16) and causal attention for a
//! whole batch of sequence chunks, parallel over (chunk, KV head).
//!
//! Numerics follow llama.cpp's CPU path: keys and values are stored as f16 (llama.cpp's default
//! cache type), queries are rounded to f16 for the `q·k` products and attention weights are
//! rounded to f16 before weighting the values. Every output row is computed the same way whatever the
//! chunking or batching, so chunked prefill and batched decode give bitwise the same results as one
//! sequence run alone. Attention sinks (gpt-oss: a per-head logit in the softmax's denominator) come
//! with the layer's [`AttnSpec`].

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use half::f16;
use shoal_kernels::ThreadPool;
use shoal_kernels::attn::attend_f16_sinks;
use shoal_kernels::math::{f32_to_f16, round_to_f16};

pub use crate::ops::RopeRows;

/// Head layout of the attention.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// How one layer attends.
#[derive(Debug, Clone, Copy)]
pub struct AttnSpec<'a> {
    pub heads: Heads,
    /// Keys a query sees, counting itself (0: all earlier positions).
    pub window: usize,
    /// Queries are multiplied by this before the `q·k` products (and the scores are not scaled);
    /// `None`: scores are scaled by `1 / sqrt(head_dim)`.
    pub query_scale: Option<f32>,
    /// One sink logit per query head (`attn_sinks`), when the layer has them.
    pub sinks: Option<&'a [f32]>,
}

/// One layer's host KV storage: `[kv head][capacity][head_dim]` f16 keys and values.
pub struct HostKvLayer<'a> {
    pub k: &'a mut [f16],
    pub v: &'a mut [f16],
    pub capacity: usize,
}

/// One sequence's chunk in a batched [`attend`]: `t` tokens from position `pos`, and its KV layer.
pub struct SeqChunk<'a> {
    pub t: usize,
    pub pos: usize,
    pub kv: HostKvLayer<'a>,
}

/// Attention of a batch of sequence chunks, in batch order.
///
/// `qkv` holds, for every chunk, `t` rows of `[q (n_heads·hd) | k (n_kv·hd) | v (n_kv·hd)]`; q and k
/// are rotated in place, k and v are stored in each chunk's KV layer at `pos..pos+t`, and `out`
/// (`Σt × n_heads·hd`) receives the result. The work is split over `pool` by (chunk, KV head), one
/// job for the whole batch.
pub fn attend(
    qkv: &mut [f32],
    chunks: &mut [SeqChunk<'_>],
    spec: AttnSpec<'_>,
    rope: &RopeRows,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    let Heads {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
    } = spec.heads;
    let (qd, kvd) = (nh * hd, nkv * hd);
    let row = qd + 2 * kvd;
    let total: usize = chunks.iter().map(|c| c.t).sum();
    assert!(
        qkv.len() == total * row && out.len() == total * qd,
        "attend: buffer sizes do not match the heads"
    );
    let mut starts = Vec::with_capacity(chunks.len());
    let mut start = 0;
    for c in chunks.iter_mut() {
        let (t, pos, cap) = (c.t, c.pos, c.kv.capacity);
        assert!(
            pos + t <= cap && start + t <= rope.rows(),
            "attend: KV capacity or rope rows exceeded"
        );
        for i in 0..t {
            let r = &mut qkv[(start + i) * row..(start + i + 1) * row];
            for h in 0..nh + nkv {
                rope.rotate(&mut r[h * hd..(h + 1) * hd], start + i);
            }
            if let Some(s) = spec.query_scale {
                r[..qd].iter_mut().for_each(|v| *v *= s);
            }
            for g in 0..nkv {
                let dst = (g * cap + pos + i) * hd;
                let (k, v) = r[qd..].split_at(kvd);
                f32_to_f16(&k[g * hd..(g + 1) * hd], &mut c.kv.k[dst..dst + hd]);
                f32_to_f16(&v[g * hd..(g + 1) * hd], &mut c.kv.v[dst..dst + hd]);
            }
            // Queries enter the q·k products at f16 precision, as in llama.cpp.
            round_to_f16(&mut r[..qd]);
        }
        starts.push(start);
        start += t;
    }
    let qkv = &*qkv;
    let scale = match spec.query_scale {
        Some(_) => 1.0,
        None => 1.0 / (hd as f32).sqrt(),
    };
    let group = nh / nkv;
    // One item per (chunk, KV head): its `group` query heads, output `[t][group · hd]`.
    let chunks = &*chunks;
    let items = run_items(pool, chunks.len() * nkv, |item, scratch, o| {
        let (ci, g) = (item / nkv, item % nkv);
        let c = &chunks[ci];
        let (t, pos, cap) = (c.t, c.pos, c.kv.capacity);
        o.resize(t * group * hd, 0.0);
        let (k, v) = (&c.kv.k[g * cap * hd..], &c.kv.v[g * cap * hd..]);
        for i in 0..t {
            let len = pos + i + 1;
            let first = match spec.window {
                0 => 0,
                w => len.saturating_sub(w),
            };
            let q = &qkv[(starts[ci] + i) * row + g * group * hd..][..group * hd];
            attend_f16_sinks(
                q,
                group,
                &k[first * hd..len * hd],
                &v[first * hd..len * hd],
                hd,
                scale,
                spec.sinks.map(|s| &s[g * group..(g + 1) * group]),
                scratch,
                &mut o[i * group * hd..(i + 1) * group * hd],
            );
        }
    });
    for (item, o) in items.into_iter().enumerate() {
        let (ci, g) = (item / nkv, item % nkv);
        for i in 0..chunks[ci].t {
            let at = (starts[ci] + i) * qd + g * group * hd;
            out[at..at + group * hd].copy_from_slice(&o[i * group * hd..(i + 1) * group * hd]);
        }
    }
}

/// Runs `items` independent work items over `pool`, the threads taking the next item as they finish one:
/// `work(item, scratch, out)` fills the item's own output (`scratch` is reused by the thread). Returns the
/// outputs in item order.
pub(crate) fn run_items(
    pool: &ThreadPool,
    items: usize,
    work: impl Fn(usize, &mut Vec<f32>, &mut Vec<f32>) + Sync,
) -> Vec<Vec<f32>> {
    let outs: Vec<Mutex<Vec<f32>>> = (0..items).map(|_| Mutex::new(Vec::new())).collect();
    let next = AtomicUsize::new(0);
    pool.run(|_, _| {
        let mut scratch = Vec::new();
        loop {
            let item = next.fetch_add(1, Ordering::Relaxed);
            if item >= items {
                break;
            }
            let Ok(mut out) = outs[item].lock() else {
                continue;
            };
            work(item, &mut scratch, &mut out);
        }
    });
    outs.into_iter()
        .map(|o| o.into_inner().unwrap_or_else(|e| e.into_inner()))
        .collect()
}
