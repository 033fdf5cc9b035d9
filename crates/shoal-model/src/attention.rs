//! Self-attention on the host (CPU): rotary embedding, KV-cache append and causal attention over plain
//! `f32` buffers, parallel over heads.
//!
//! Numerics follow llama.cpp's CPU path: keys and values are stored at f16 precision (llama.cpp's
//! default cache type), queries are rounded to f16 for the `q·k` products and attention weights are
//! rounded to f16 before weighting the values. Every output row is computed the same way whatever the
//! chunking or batching, so chunked prefill and batched decode give bitwise the same results as one
//! sequence run alone.

use std::sync::Mutex;

use half::f16;
use shoal_kernels::ThreadPool;

pub use crate::ops::RopeTable;

fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Dot product with eight independent partial sums, so the compiler keeps it in SIMD registers.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Head layout of the attention.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// One layer's host KV storage: `[kv head][capacity][head_dim]` for keys and values.
pub struct HostKvLayer<'a> {
    pub k: &'a mut [f32],
    pub v: &'a mut [f32],
    pub capacity: usize,
}

/// Attention of one sequence chunk of `t` tokens starting at position `pos`.
///
/// `qkv` holds `t` rows of `[q (n_heads·hd) | k (n_kv·hd) | v (n_kv·hd)]`; q and k are rotated in place,
/// k and v are written to `kv` at `pos..pos+t`, and `out` (`t × n_heads·hd`) receives the result.
#[allow(clippy::too_many_arguments)] // buffers, shape and helpers of one call, all distinct
pub fn attend(
    qkv: &mut [f32],
    t: usize,
    pos: usize,
    heads: Heads,
    rope: &RopeTable,
    kv: HostKvLayer<'_>,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    let Heads {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
    } = heads;
    let (qd, kvd) = (nh * hd, nkv * hd);
    let row = qd + 2 * kvd;
    assert!(
        qkv.len() == t * row && out.len() == t * qd,
        "attend: buffer sizes do not match the heads"
    );
    assert!(
        pos + t <= kv.capacity && pos + t <= rope.positions(),
        "attend: KV capacity or positions exceeded"
    );
    for i in 0..t {
        let r = &mut qkv[i * row..(i + 1) * row];
        for h in 0..nh + nkv {
            rope.rotate(&mut r[h * hd..(h + 1) * hd], pos + i);
        }
        for g in 0..nkv {
            let dst = (g * kv.capacity + pos + i) * hd;
            for d in 0..hd {
                kv.k[dst + d] = round_f16(r[qd + g * hd + d]);
                kv.v[dst + d] = round_f16(r[qd + kvd + g * hd + d]);
            }
        }
    }
    let (k, v, cap) = (&*kv.k, &*kv.v, kv.capacity);
    let qkv = &*qkv;
    let scale = 1.0 / (hd as f32).sqrt();
    let group = nh / nkv;
    // Per-head outputs `[t][hd]`, each written by exactly one thread.
    let per_head: Vec<Mutex<Vec<f32>>> = (0..nh).map(|_| Mutex::new(vec![0f32; t * hd])).collect();
    pool.run(|ti, n| {
        let mut q = vec![0f32; hd];
        let mut w = Vec::with_capacity(pos + t);
        for h in (ti..nh).step_by(n) {
            let g = h / group;
            let (kh, vh) = (&k[g * cap * hd..], &v[g * cap * hd..]);
            let Ok(mut o) = per_head[h].lock() else {
                continue;
            };
            for i in 0..t {
                let len = pos + i + 1;
                for d in 0..hd {
                    q[d] = round_f16(qkv[i * row + h * hd + d]);
                }
                w.clear();
                let mut max = f32::NEG_INFINITY;
                for j in 0..len {
                    let kj = &kh[j * hd..(j + 1) * hd];
                    let s = dot(&q, kj) * scale;
                    max = max.max(s);
                    w.push(s);
                }
                let mut sum = 0f32;
                for s in w.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let inv = 1.0 / sum;
                let oi = &mut o[i * hd..(i + 1) * hd];
                oi.fill(0.0);
                for (j, s) in w.iter().enumerate() {
                    let p = round_f16(s * inv);
                    let vj = &vh[j * hd..(j + 1) * hd];
                    for d in 0..hd {
                        oi[d] += p * vj[d];
                    }
                }
            }
        }
    });
    for (h, o) in per_head.into_iter().enumerate() {
        let o = o.into_inner().unwrap_or_else(|e| e.into_inner());
        for i in 0..t {
            out[i * qd + h * hd..i * qd + (h + 1) * hd].copy_from_slice(&o[i * hd..(i + 1) * hd]);
        }
    }
}
