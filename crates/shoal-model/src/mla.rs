//! Multi-head latent attention on the host (deepseek2: DeepSeek V2/V3/R1, Kimi K2; decision 022), in the
//! absorbed form llama.cpp runs, which makes it a one-KV-head attention over a cached latent.
//!
//! Per token the layer's `qkv` set has produced `[q_a | kv_a]` (or `[q | kv_a]` without a query
//! bottleneck). Then:
//! - queries: `q = q_b · rms_norm(q_a)`, per head `[q_nope (nope) | q_pe (rope)]`; `q_pe` is rotated and
//!   `q_nope` is taken into the latent space by the head's `attn_k_b` (`kv_lora × nope`), so a head's
//!   query is `[k_b · q_nope | rope(q_pe)]` (`kv_lora + rope` values);
//! - the key: `[rms_norm(kv_a[..kv_lora]) | rope(kv_a[kv_lora..])]`, one per token for all heads, is
//!   what the cache stores ([`crate::kv::KvCache::for_model`]: keys only);
//! - values are the latent, the first `kv_lora` values of each key: the attention kernel is handed the
//!   keys as the values too and the last `rope` values of each head's output are dropped (every output
//!   value is its own chain of multiply-adds, so the kept ones are exactly what a `kv_lora`-wide value
//!   cache gives);
//! - each head's attended latent goes through its `attn_v_b` (`v_head × kv_lora`), and the heads side by
//!   side (`heads · v_head`) are the input of `attn_output`.
//!
//! The 2·heads small per-head products (`attn_k_b`, `attn_v_b`: 128 of each per layer at DeepSeek V3's
//! size) run as one job each, heads spread over the pool's threads and each head's product whole on
//! one thread ([`per_head`]), not as one pool hand-off per head.
//!
//! Files of the older layout carry `attn_kv_b` instead of `attn_k_b` / `attn_v_b`; it is split at load
//! (`split_kv_b`), so they run the same way with the same cache.
//!
//! Scores are scaled by [`Mla::kq_scale`]. Numerics are the ordinary attention's ([`crate::attention`]):
//! f16 keys, queries rounded to f16, weights rounded to f16 before the values.

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use shoal_kernels::attn::attend_f16;
use shoal_kernels::math::{f32_to_f16, round_to_f16};
use shoal_kernels::{Parallel, ThreadPool};

use crate::attention::{RopeRows, SeqChunk, run_items};
use shoal_kernels::dequantize_row;

use crate::block::{MatrixSpec, MlaSpec, read_norm};
use crate::config::Mla;
use crate::error::{ModelError, Result};
use crate::ffn::{load_set, split_experts};
use crate::gguf::types::ggml_type;
use crate::gguf::{GgufFile, RawTensor};
use crate::linear::{LinearScratch, LinearSet, kernel_qtype};
use crate::ops;

/// The per-head `attn_k_b` and `attn_v_b` of an older file's `attn_kv_b` (`heads·(nope + v_head) ×
/// kv_lora`): each head's `v_head` value rows are its `attn_v_b` as they are (quantized as stored), its
/// `nope` key rows transposed (`kv_lora × nope`, dequantized and kept as F16) its `attn_k_b`, as the
/// current converter writes them.
fn split_kv_b(
    g: &mut GgufFile,
    spec: &MatrixSpec,
    a: Mla,
    n_heads: usize,
    heads: &Range<usize>,
) -> Result<(Vec<LinearSet>, Vec<LinearSet>)> {
    let (k_b, v_b) = split_kv_b_raw(g, spec, a, n_heads)?;
    let set = |t: RawTensor| LinearSet::from_raws(vec![(spec.name.clone(), t, None)]);
    let mine = |v: Vec<RawTensor>| -> Result<Vec<LinearSet>> {
        v.into_iter()
            .skip(heads.start)
            .take(heads.len())
            .map(set)
            .collect()
    };
    Ok((mine(k_b)?, mine(v_b)?))
}

/// [`split_kv_b`]'s tensors, per head: `attn_k_b` (F16, `kv_lora × nope`) and `attn_v_b` (as stored,
/// `v_head × kv_lora`).
pub(crate) fn split_kv_b_raw(
    g: &mut GgufFile,
    spec: &MatrixSpec,
    a: Mla,
    n_heads: usize,
) -> Result<(Vec<RawTensor>, Vec<RawTensor>)> {
    let raw = g.read_raw(&spec.name)?;
    let &[rows, cols] = &raw.dims[..] else {
        return Err(ModelError::BadShape {
            name: spec.name.clone(),
            got: raw.dims.clone(),
            expected: vec![spec.out, spec.input],
        });
    };
    spec.check(rows, cols)?;
    let qtype = kernel_qtype(&spec.name, raw.ty)?;
    let row_bytes = raw.data.len() / rows;
    let f16_type = ggml_type(1).ok_or_else(|| ModelError::BadInput("no F16 type".into()))?;
    let mut row = vec![0f32; cols];
    let (mut k_b, mut v_b) = (Vec::new(), Vec::new());
    for h in 0..n_heads {
        let first = h * (a.nope + a.v_head);
        // k_b[h][r][c] = kv_b[first + c][r].
        let mut t = vec![half::f16::ZERO; a.kv_lora * a.nope];
        for c in 0..a.nope {
            let at = (first + c) * row_bytes;
            dequantize_row(qtype, &raw.data[at..at + row_bytes], &mut row).map_err(|e| {
                ModelError::InvalidGguf {
                    path: g.path().display().to_string(),
                    message: format!("{}: {e}", spec.name),
                }
            })?;
            for (r, &x) in row.iter().enumerate() {
                t[r * a.nope + c] = half::f16::from_f32(x);
            }
        }
        let k = RawTensor {
            ty: f16_type,
            dims: vec![a.kv_lora, a.nope],
            data: t.iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        let v_rows = (first + a.nope) * row_bytes..(first + a.nope + a.v_head) * row_bytes;
        let v = RawTensor {
            ty: raw.ty,
            dims: vec![a.v_head, a.kv_lora],
            data: raw.data[v_rows].to_vec(),
        };
        k_b.push(k);
        v_b.push(v);
    }
    Ok((k_b, v_b))
}

/// One thread's buffers for [`per_head`]: a head's rows in (`total × nope` or `total × kv_lora`) and out.
#[derive(Default)]
pub(crate) struct HeadScratch {
    lin: LinearScratch,
    part: Vec<f32>,
    out: Vec<f32>,
}

/// The kernels' [`Parallel`] of one part, run on the calling thread: a head's product stays on the
/// thread that took the head.
struct OneThread;

impl Parallel for OneThread {
    fn n_threads(&self) -> usize {
        1
    }
    fn run_parts(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        f(0, 1)
    }
}

/// Every head's small product at once: `sets[h]` times the `total` rows' `width` values at `h · step`
/// of each `stride`-wide row of `x`, handed to `place(h, y)` (`y`: `total ×` the set's outputs). The
/// heads are spread over `pool`'s threads, each head's product whole on one thread: at DeepSeek V3's
/// size a head's `attn_k_b` or `attn_v_b` is 64 K values, too small to split, and one call per head
/// (128 per matrix and layer) paid the pool's hand-off each time. Each output value is the same chain
/// of operations whichever thread computes it, so the result does not depend on the thread count.
#[allow(clippy::too_many_arguments)] // the operands of one batched product
fn per_head(
    sets: &[LinearSet],
    x: &[f32],
    stride: usize,
    step: usize,
    width: usize,
    scratch: &mut Vec<Mutex<HeadScratch>>,
    pool: &ThreadPool,
    place: impl Fn(usize, &[f32]) + Sync,
) -> Result<()> {
    let total = x.len() / stride;
    scratch.resize_with(pool.n_threads().max(1), Default::default);
    let scratch = &*scratch;
    let next = AtomicUsize::new(0);
    let failed = Mutex::new(None);
    pool.run(|t, _| {
        let mut s = scratch[t].lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut *s;
        loop {
            let h = next.fetch_add(1, Ordering::Relaxed);
            if h >= sets.len() {
                break;
            }
            s.part.clear();
            for row in x.chunks_exact(stride) {
                s.part.extend_from_slice(&row[h * step..][..width]);
            }
            match sets[h].forward(&s.part, total, &mut s.out, &mut s.lin, &OneThread) {
                Ok(()) => place(h, &s.out),
                Err(e) => {
                    failed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_or_insert(e);
                }
            }
        }
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Query heads attended together in one work item (they share each key's conversion to f32).
const HEADS_PER_ITEM: usize = 8;

/// One layer's latent attention, loaded.
pub(crate) struct MlaAttn {
    /// `attn_q_a_norm` and `attn_q_b`, when queries pass the bottleneck.
    q_b: Option<(Vec<f32>, LinearSet)>,
    kv_a_norm: Vec<f32>,
    /// Per head: `attn_k_b` (`kv_lora × nope`) and `attn_v_b` (`v_head × kv_lora`).
    k_b: Vec<LinearSet>,
    v_b: Vec<LinearSet>,
    shape: Mla,
}

/// Buffers reused from layer to layer.
#[derive(Default)]
pub(crate) struct MlaScratch {
    lin: LinearScratch,
    qa: Vec<f32>,
    q: Vec<f32>,
    /// Per thread of the pool: one head's rows in and out ([`per_head`]).
    heads: Vec<Mutex<HeadScratch>>,
    /// Absorbed queries, `total × heads × (kv_lora + rope)`.
    queries: Vec<f32>,
    /// Attended latents, `total × heads × kv_lora`.
    latent: Vec<f32>,
}

impl MlaAttn {
    pub(crate) fn load(g: &mut GgufFile, spec: &MlaSpec, n_heads: usize) -> Result<Self> {
        Self::load_heads(g, spec, n_heads, 0..n_heads, |g, m, _| load_set(g, m))
    }

    /// The attention of query heads `heads` of the layer's `n_heads` (a tensor-parallel member's):
    /// their `attn_k_b` / `attn_v_b` only, and `q_b` read by `rows` (the matrix and the output rows of
    /// those heads).
    pub(crate) fn load_heads(
        g: &mut GgufFile,
        spec: &MlaSpec,
        n_heads: usize,
        heads: Range<usize>,
        rows: impl FnOnce(&mut GgufFile, &MatrixSpec, Range<usize>) -> Result<LinearSet>,
    ) -> Result<Self> {
        let a = spec.shape;
        let qk = a.nope + a.rope;
        let q_b = match &spec.q_b {
            Some((norm, m)) => {
                let cut = heads.start * qk..heads.end * qk;
                Some((read_norm(g, norm)?, rows(g, m, cut)?))
            }
            None => None,
        };
        let per_head = |g: &mut GgufFile, t| -> Result<Vec<LinearSet>> {
            split_experts(g, t, n_heads, heads.clone())?
                .into_iter()
                .map(|part| LinearSet::from_raws(vec![part]))
                .collect()
        };
        let (k_b, v_b) = match &spec.kv_b {
            Some(kv_b) => split_kv_b(g, kv_b, a, n_heads, &heads)?,
            None => (per_head(g, &spec.k_b)?, per_head(g, &spec.v_b)?),
        };
        Ok(Self {
            q_b,
            kv_a_norm: read_norm(g, &spec.kv_a_norm)?,
            k_b,
            v_b,
            shape: spec.shape,
        })
    }

    /// The attention of a batch: `proj` holds `total` rows of `[q_a | kv_a]`, each chunk's keys are stored
    /// in its cache at `pos..pos + t`, and `out` receives `total × heads · v_head`.
    #[allow(clippy::too_many_arguments)] // the operands of one attention
    pub(crate) fn attend(
        &self,
        proj: &[f32],
        chunks: &mut [SeqChunk<'_>],
        rope: &RopeRows,
        eps: f32,
        out: &mut Vec<f32>,
        s: &mut MlaScratch,
        pool: &ThreadPool,
    ) -> Result<()> {
        let a = self.shape;
        let nh = self.k_b.len();
        let (qk, kw) = (a.nope + a.rope, a.kv_lora + a.rope);
        let total: usize = chunks.iter().map(|c| c.t).sum();
        out.clear();
        if total == 0 {
            return Ok(());
        }
        let width = proj.len() / total;
        let qa_w = width - kw;
        // Queries.
        s.qa.clear();
        for row in proj.chunks_exact(width) {
            s.qa.extend_from_slice(&row[..qa_w]);
        }
        match &self.q_b {
            Some((norm, q_b)) => {
                for row in s.qa.chunks_exact_mut(qa_w) {
                    ops::rms_norm_in_place(row, norm, eps);
                }
                q_b.forward(&s.qa, total, &mut s.q, &mut s.lin, pool)?;
            }
            None => std::mem::swap(&mut s.q, &mut s.qa),
        }
        s.queries.clear();
        s.queries.resize(total * nh * kw, 0.0);
        // q_nope through each head's attn_k_b, into the first kv_lora values of the head's query.
        let queries = Mutex::new(&mut s.queries);
        per_head(
            &self.k_b,
            &s.q,
            nh * qk,
            qk,
            a.nope,
            &mut s.heads,
            pool,
            |h, y| {
                let mut queries = queries.lock().unwrap_or_else(|e| e.into_inner());
                for (dst, src) in queries
                    .chunks_exact_mut(nh * kw)
                    .zip(y.chunks_exact(a.kv_lora))
                {
                    dst[h * kw..][..a.kv_lora].copy_from_slice(src);
                }
            },
        )?;
        // The rotated q_pe after it.
        for (r, (dst, q)) in s
            .queries
            .chunks_exact_mut(nh * kw)
            .zip(s.q.chunks_exact(nh * qk))
            .enumerate()
        {
            for h in 0..nh {
                let dst = &mut dst[h * kw + a.kv_lora..(h + 1) * kw];
                dst.copy_from_slice(&q[h * qk + a.nope..][..a.rope]);
                rope.rotate(dst, r);
            }
        }
        // Queries enter the q·k products at f16 precision, as in llama.cpp.
        round_to_f16(&mut s.queries);
        // Keys: the normed latent and the rotated rope part, stored as f16.
        let mut key = vec![0f32; kw];
        let mut r = 0;
        for c in chunks.iter_mut() {
            for i in 0..c.t {
                let kv = &proj[r * width + qa_w..(r + 1) * width];
                ops::rms_norm(
                    &kv[..a.kv_lora],
                    &self.kv_a_norm,
                    eps,
                    &mut key[..a.kv_lora],
                );
                key[a.kv_lora..].copy_from_slice(&kv[a.kv_lora..]);
                rope.rotate(&mut key[a.kv_lora..], r);
                f32_to_f16(&key, &mut c.kv.k[(c.pos + i) * kw..][..kw]);
                r += 1;
            }
        }
        self.attend_latent(chunks, s, pool);
        // Each head's latent through its attn_v_b.
        out.resize(total * nh * a.v_head, 0.0);
        let heads_out = Mutex::new(out);
        let latent = &s.latent;
        per_head(
            &self.v_b,
            latent,
            nh * a.kv_lora,
            a.kv_lora,
            a.kv_lora,
            &mut s.heads,
            pool,
            |h, y| {
                let mut out = heads_out.lock().unwrap_or_else(|e| e.into_inner());
                for (dst, src) in out
                    .chunks_exact_mut(nh * a.v_head)
                    .zip(y.chunks_exact(a.v_head))
                {
                    dst[h * a.v_head..(h + 1) * a.v_head].copy_from_slice(src);
                }
            },
        )
    }

    /// `s.latent` (`total × heads × kv_lora`): every row's heads attended over its chunk's cached keys,
    /// the keys' latent part being the values. Work items are (row, group of heads), spread over `pool`.
    fn attend_latent(&self, chunks: &[SeqChunk<'_>], s: &mut MlaScratch, pool: &ThreadPool) {
        let a = self.shape;
        let nh = self.k_b.len();
        let kw = a.kv_lora + a.rope;
        let groups = nh.div_ceil(HEADS_PER_ITEM);
        // (chunk, position of the row) for every row of the batch.
        let rows: Vec<(usize, usize)> = chunks
            .iter()
            .enumerate()
            .flat_map(|(ci, c)| (0..c.t).map(move |i| (ci, c.pos + i)))
            .collect();
        let queries = &s.queries;
        let items = run_items(pool, rows.len() * groups, |item, scratch, o| {
            let (r, g) = (item / groups, item % groups);
            let (ci, pos) = rows[r];
            let heads = g * HEADS_PER_ITEM..((g + 1) * HEADS_PER_ITEM).min(nh);
            let n_q = heads.len();
            let keys = &chunks[ci].kv.k[..(pos + 1) * kw];
            let q = &queries[(r * nh + heads.start) * kw..][..n_q * kw];
            o.resize(n_q * kw, 0.0);
            attend_f16(q, n_q, keys, keys, kw, a.kq_scale, scratch, o);
        });
        s.latent.clear();
        s.latent.resize(rows.len() * nh * a.kv_lora, 0.0);
        for (item, o) in items.into_iter().enumerate() {
            let (r, g) = (item / groups, item % groups);
            for (j, head) in o.chunks_exact(kw).enumerate() {
                let h = g * HEADS_PER_ITEM + j;
                s.latent[(r * nh + h) * a.kv_lora..][..a.kv_lora]
                    .copy_from_slice(&head[..a.kv_lora]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `rows × cols` F16 matrix of values from a small deterministic sequence.
    fn set(rows: usize, cols: usize, seed: usize) -> LinearSet {
        let f16 = ggml_type(1).expect("F16");
        let data = (0..rows * cols)
            .flat_map(|i| {
                let v = ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0;
                half::f16::from_f32(v).to_le_bytes()
            })
            .collect();
        let raw = RawTensor {
            ty: f16,
            dims: vec![rows, cols],
            data,
        };
        LinearSet::from_raws(vec![("w".into(), raw, None)]).expect("set")
    }

    #[test]
    fn every_heads_product_at_once_equals_each_heads_own_product_bitwise() {
        let (heads, width, out, total) = (6, 32, 48, 3);
        let sets: Vec<LinearSet> = (0..heads).map(|h| set(out, width, h)).collect();
        // Rows of `heads` slices of `width` values, with 5 values of something else after each slice.
        let step = width + 5;
        let x: Vec<f32> = (0..total * heads * step)
            .map(|i| ((i * 31) % 97) as f32 / 48.0 - 1.0)
            .collect();
        let pool = ThreadPool::new(2);
        let mut want = vec![Vec::new(); heads];
        let mut lin = LinearScratch::default();
        for (h, w) in want.iter_mut().enumerate() {
            let part: Vec<f32> = x
                .chunks_exact(heads * step)
                .flat_map(|row| row[h * step..][..width].to_vec())
                .collect();
            sets[h]
                .forward(&part, total, w, &mut lin, &pool)
                .expect("one head");
        }
        let got = Mutex::new(vec![Vec::new(); heads]);
        let mut scratch = Vec::new();
        per_head(
            &sets,
            &x,
            heads * step,
            step,
            width,
            &mut scratch,
            &pool,
            |h, y| {
                got.lock().expect("lock")[h] = y.to_vec();
            },
        )
        .expect("every head");
        let got = got.into_inner().expect("lock");
        assert_eq!(got.len(), heads);
        for (h, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), total * out, "head {h}");
            assert!(
                g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
                "head {h}: {g:?} vs {w:?}"
            );
        }
        // A product that fails (an input narrower than the matrix) is the call's error.
        let err = per_head(
            &sets,
            &x,
            heads * step,
            step,
            width - 1,
            &mut scratch,
            &pool,
            |_, _| {},
        );
        assert!(err.is_err());
    }
}
