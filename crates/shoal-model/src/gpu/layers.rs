//! A [`GpuDecoderStage`]'s layers over one batch, recorded into one command buffer: per layer
//! rms norm → Q, K, V products (+ biases) → per-head Q/K norms → RoPE at each row's position →
//! K/V of each chunk into its sequence's device cache → causal attention per sequence → output
//! product → residual (+ post norm) → norm → the feed-forward (`ffn`: dense, or routed experts) →
//! residual (+ post norm), as [`crate::DecoderStage`] computes it on the host.

use std::collections::HashMap;

use shoal_gpu::{Attend, AttendWith, Commands, Gpu, GpuVec};

use super::mla::MlaRun;
use super::{GpuDecoderStage, GpuKv, GpuLinear};
use crate::decoder::SeqChunk;
use crate::error::Result;

/// Device vectors of one batch, by use and length, made once and reused by every layer (the
/// kernels check lengths exactly, so each use has its own).
pub(super) struct Scratch<'g> {
    gpu: &'g Gpu,
    vecs: HashMap<(&'static str, usize), GpuVec>,
}

impl Scratch<'_> {
    pub(super) fn gpu(&self) -> &Gpu {
        self.gpu
    }

    pub(super) fn get(&mut self, what: &'static str, len: usize) -> Result<GpuVec> {
        if let Some(v) = self.vecs.get(&(what, len)) {
            return Ok(v.clone());
        }
        let v = self.gpu.zeros(len)?;
        self.vecs.insert((what, len), v.clone());
        Ok(v)
    }
}

impl GpuLinear {
    /// Output features of all parts together.
    pub(super) fn out_features(&self) -> usize {
        self.parts.iter().map(|(w, _)| w.rows()).sum()
    }

    /// `outs[i]` (each `rows × widths[i]`) receive the columns of `x · [W₀ | W₁ | …]ᵀ (+ b)`
    /// side by side: each part straight into its output when the parts are the outputs, else
    /// through a scratch product split by columns (a fused QKV or gate|up tensor).
    pub(super) fn forward(
        &self,
        cmd: &mut Commands<'_>,
        s: &mut Scratch<'_>,
        x: &GpuVec,
        rows: usize,
        outs: &[&GpuVec],
    ) -> Result<()> {
        let direct = self.parts.len() == outs.len()
            && self
                .parts
                .iter()
                .zip(outs)
                .all(|((w, _), o)| o.len() == rows * w.rows());
        let mut col = 0;
        for (i, (w, bias)) in self.parts.iter().enumerate() {
            let n = rows * w.rows();
            let y = match (direct, bias) {
                (true, None) => outs[i].clone(),
                _ => s.get("product", n)?,
            };
            cmd.matmat(w, x, &y)?;
            let y = match bias {
                Some(b) => {
                    let target = match direct {
                        true => outs[i].clone(),
                        false => s.get("product+bias", n)?,
                    };
                    cmd.add_rows(&y, b, &target)?;
                    target
                }
                None => y,
            };
            if !direct {
                split(cmd, &y, w.rows(), col, outs, rows)?;
            }
            col += w.rows();
        }
        Ok(())
    }
}

/// Copies columns `col..col + width` of `y` (`rows × width`) into the outputs whose columns,
/// side by side, they are.
fn split(
    cmd: &mut Commands<'_>,
    y: &GpuVec,
    width: usize,
    col: usize,
    outs: &[&GpuVec],
    rows: usize,
) -> Result<()> {
    let mut start = 0;
    for out in outs {
        let w = out.len() / rows.max(1);
        let (lo, hi) = (start.max(col), (start + w).min(col + width));
        if lo < hi {
            cmd.copy_rows(y, (lo - col, width), out, (lo - start, w), rows, hi - lo)?;
        }
        start += w;
    }
    Ok(())
}

impl GpuDecoderStage {
    /// Every layer over the batch's hidden states `x` (`total × dim`); returns the final ones.
    pub(super) fn layers(
        &self,
        cmd: &mut Commands<'_>,
        x: GpuVec,
        seqs: &mut [SeqChunk<'_, GpuKv>],
        total: usize,
    ) -> Result<GpuVec> {
        let c = &self.cfg;
        let (dim, hd) = (c.dim, c.head_dim);
        let (qd, kvd) = (c.n_heads * hd, c.n_kv_heads * hd);
        let eps = c.rms_eps;
        let mut s = Scratch {
            gpu: &self.gpu,
            vecs: HashMap::new(),
        };
        let positions: Vec<u32> = seqs
            .iter()
            .flat_map(|q| q.kv.len()..q.kv.len() + q.len)
            .map(|p| p as u32)
            .collect();
        let mut x = x;
        let x_alt = s.get("x'", total * dim)?;
        let mut x_next = x_alt;
        let h = s.get("h", total * dim)?;
        let (q, k, v) = (
            s.get("q", total * qd)?,
            s.get("k", total * kvd)?,
            s.get("v", total * kvd)?,
        );
        let attn = s.get("attn", total * qd)?;
        let o = s.get("o", total * dim)?;
        let post = s.get("post", total * dim)?;
        for (li, blk) in self.blocks.iter().enumerate() {
            cmd.rms_norm(&x, &blk.attn_norm, eps, &h)?;
            if let Some(mla) = &blk.mla {
                let a = mla.shape();
                let kw = a.kv_lora + a.rope;
                let qa_w = blk.qkv.out_features() - kw;
                let (qa, kva) = (
                    s.get("mla q_a", total * qa_w)?,
                    s.get("mla kv_a", total * kw)?,
                );
                blk.qkv.forward(cmd, &mut s, &h, total, &[&qa, &kva])?;
                let seq_caches = seqs
                    .iter()
                    .map(|sq| Ok((sq.kv.cache()?, sq.kv.len(), sq.len)))
                    .collect::<Result<Vec<_>>>()?;
                let run = MlaRun {
                    proj: (&qa, &kva),
                    rope: &self.rope_global,
                    positions: &positions,
                    seqs: seq_caches,
                    layer: li,
                    eps,
                };
                let heads_out = s.get("mla out", total * c.n_heads * a.v_head)?;
                mla.attend(cmd, &mut s, run, &heads_out)?;
                blk.wo.forward(cmd, &mut s, &heads_out, total, &[&o])?;
            } else {
                blk.qkv.forward(cmd, &mut s, &h, total, &[&q, &k, &v])?;
                let q = match &blk.q_norm {
                    Some(w) => {
                        let qn = s.get("q normed", total * qd)?;
                        cmd.rms_norm(&q, w, eps, &qn)?;
                        qn
                    }
                    None => q.clone(),
                };
                let k = match &blk.k_norm {
                    Some(w) => {
                        let kn = s.get("k normed", total * kvd)?;
                        cmd.rms_norm(&k, w, eps, &kn)?;
                        kn
                    }
                    None => k.clone(),
                };
                let rope = match blk.local {
                    true => &self.rope_local,
                    false => &self.rope_global,
                };
                cmd.rope_rows(&q, (0, qd), c.n_heads, rope.rope(hd), &positions)?;
                cmd.rope_rows(&k, (0, kvd), c.n_kv_heads, rope.rope(hd), &positions)?;
                let mut start = 0;
                for sq in seqs.iter() {
                    let (t, pos) = (sq.len, sq.kv.len());
                    let cache = sq.kv.cache()?;
                    cmd.kv_write_rows(cache, li, pos, t, &k, start * kvd, &v, start * kvd, kvd)?;
                    let at = Attend {
                        layer: li,
                        pos,
                        window: if blk.local { c.arch.sliding_window } else { 0 },
                        query_scale: c.arch.query_scale,
                    };
                    let with = AttendWith {
                        sinks: blk.sinks.as_ref(),
                        score_scale: None,
                    };
                    if seqs.len() == 1 {
                        cmd.attention_rows_with(cache, (&q, 0, qd), t, at, with, &attn)?;
                    } else {
                        let one = s.get("attn of a sequence", t * qd)?;
                        cmd.attention_rows_with(cache, (&q, start * qd, qd), t, at, with, &one)?;
                        cmd.copy_rows(&one, (0, 0), &attn, (start * qd, 0), 1, t * qd)?;
                    }
                    start += t;
                }
                blk.wo.forward(cmd, &mut s, &attn, total, &[&o])?;
            }
            residual(
                cmd,
                &x,
                &o,
                blk.post_attn_norm.as_ref(),
                eps,
                &post,
                &x_next,
            )?;
            std::mem::swap(&mut x, &mut x_next);
            cmd.rms_norm(&x, &blk.ffn_norm, eps, &h)?;
            blk.ffn
                .forward(cmd, &mut s, &h, total, c.arch.activation, &o)?;
            residual(cmd, &x, &o, blk.post_ffn_norm.as_ref(), eps, &post, &x_next)?;
            std::mem::swap(&mut x, &mut x_next);
        }
        Ok(x)
    }
}

/// `next = x + y`, or `next = x + rms_norm(y)` with a post norm (`tmp` holds the normed rows).
fn residual(
    cmd: &mut Commands<'_>,
    x: &GpuVec,
    y: &GpuVec,
    post_norm: Option<&GpuVec>,
    eps: f32,
    tmp: &GpuVec,
    next: &GpuVec,
) -> Result<()> {
    match post_norm {
        Some(w) => {
            cmd.rms_norm(y, w, eps, tmp)?;
            cmd.add(x, tmp, next)?;
        }
        None => cmd.add(x, y, next)?,
    }
    Ok(())
}
