//! Multi-head latent attention on the device (deepseek2), the twin of [`crate::mla`] in the same
//! absorbed form: per token `[q_a | kv_a]` from the layer's `qkv` → queries `q_b · rms_norm(q_a)`
//! (or `attn_q`'s straight) → each head's `q_nope` through its `attn_k_b` (the heads' matrices
//! stacked, multiplied per (token, head) by shoal-gpu's id-indexed matvec, the ids being the heads)
//! → the head's query `[k_b · q_nope | rope(q_pe)]`; the key `[rms_norm(latent) | rope(k_pe)]`, one
//! per token for every head, written to a keys-only device cache (one KV head of `kv_lora + rope`,
//! read back as the values too); attention with the scores scaled by `kq_scale`; each head's attended latent
//! (the first `kv_lora` values) through its `attn_v_b` → `attn_output`'s input. Files of the older
//! `attn_kv_b` layout are split at load as the CPU splits them (`crate::mla::split_kv_b_raw`).

use shoal_gpu::{Attend, AttendWith, Commands, Gpu, GpuKvCache, GpuMatrix, GpuVec};

use super::layers::Scratch;
use super::{GpuLinear, GpuRope, load_linear, upload_norm};
use crate::block::MlaSpec;
use crate::config::Mla;
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, RawTensor};
use crate::linear::kernel_qtype;
use shoal_kernels::QMatrix;

/// Per-head matrices of one type and shape (`attn_kv_b` split), uploaded stacked.
fn stack(gpu: &Gpu, name: &str, heads: Vec<RawTensor>) -> Result<GpuMatrix> {
    let Some(first) = heads.first() else {
        return Err(ModelError::BadInput(format!("{name}: no heads")));
    };
    let (qtype, rows, cols) = (kernel_qtype(name, first.ty)?, first.dims[0], first.dims[1]);
    let n = heads.len();
    let data: Vec<u8> = heads.into_iter().flat_map(|t| t.data).collect();
    let m = QMatrix::new(qtype, n * rows, cols, &data)
        .map_err(|e| ModelError::BadInput(format!("{name}: {e}")))?;
    Ok(gpu.upload_experts(&m, n)?)
}

/// One layer's latent attention on the device.
pub(super) struct GpuMla {
    q_b: Option<(GpuVec, GpuLinear)>,
    kv_a_norm: GpuVec,
    /// Every head's `attn_k_b` (`kv_lora × nope`) and `attn_v_b` (`v_head × kv_lora`), stacked.
    k_b: GpuMatrix,
    v_b: GpuMatrix,
    shape: Mla,
    heads: usize,
}

/// Where a batch's latent attention reads and writes: the `[q_a | kv_a]` rows, the rotary
/// embedding and each row's position, each sequence's (cache, position, rows), the output.
pub(super) struct MlaRun<'a> {
    pub proj: (&'a GpuVec, &'a GpuVec),
    pub rope: &'a GpuRope,
    pub positions: &'a [u32],
    pub seqs: Vec<(&'a GpuKvCache, usize, usize)>,
    pub layer: usize,
    pub eps: f32,
}

impl GpuMla {
    pub(super) fn load(g: &mut GgufFile, gpu: &Gpu, spec: &MlaSpec, heads: usize) -> Result<Self> {
        let q_b = match &spec.q_b {
            Some((norm, m)) => Some((upload_norm(g, gpu, norm)?, load_linear(g, gpu, m)?)),
            None => None,
        };
        let (k_b, v_b) = match &spec.kv_b {
            Some(kv_b) => {
                let (k, v) = crate::mla::split_kv_b_raw(g, kv_b, spec.shape, heads)?;
                (stack(gpu, &kv_b.name, k)?, stack(gpu, &kv_b.name, v)?)
            }
            None => (
                super::ffn::load_stacked_matrix(g, gpu, &spec.k_b, heads)?,
                super::ffn::load_stacked_matrix(g, gpu, &spec.v_b, heads)?,
            ),
        };
        Ok(Self {
            q_b,
            kv_a_norm: upload_norm(g, gpu, &spec.kv_a_norm)?,
            k_b,
            v_b,
            shape: spec.shape,
            heads,
        })
    }

    pub(super) fn shape(&self) -> Mla {
        self.shape
    }

    /// The attention of a batch of `total` rows into `out` (`total × heads · v_head`).
    pub(super) fn attend(
        &self,
        cmd: &mut Commands<'_>,
        s: &mut Scratch<'_>,
        run: MlaRun<'_>,
        out: &GpuVec,
    ) -> Result<()> {
        let a = self.shape;
        let nh = self.heads;
        let (qk, kw) = (a.nope + a.rope, a.kv_lora + a.rope);
        let total = run.positions.len();
        let (qa, kva) = run.proj;
        let q = match &self.q_b {
            Some((norm, q_b)) => {
                let qn = s.get("mla q_a normed", qa.len())?;
                cmd.rms_norm(qa, norm, run.eps, &qn)?;
                let q = s.get("mla q", total * nh * qk)?;
                q_b.forward(cmd, s, &qn, total, &[&q])?;
                q
            }
            None => qa.clone(),
        };
        // The heads as ids, one per (row, head).
        let ids: Vec<f32> = (0..total * nh)
            .map(|p| f32::from_bits((p % nh) as u32))
            .collect();
        let ids = s.gpu().upload(&ids)?;
        let rows = total * nh;
        let q_nope = s.get("mla q_nope", rows * a.nope)?;
        cmd.copy_rows(&q, (0, qk), &q_nope, (0, a.nope), rows, a.nope)?;
        let q_lat = s.get("mla q latent", rows * a.kv_lora)?;
        cmd.matvec_id(&self.k_b, None, &q_nope, 1, &ids, &q_lat)?;
        // Queries `[k_b · q_nope | q_pe]` (room for the rope's bounds after the last head), q_pe
        // rotated in place.
        let queries = s.get("mla queries", rows * kw + a.kv_lora)?;
        cmd.copy_rows(&q_lat, (0, a.kv_lora), &queries, (0, kw), rows, a.kv_lora)?;
        cmd.copy_rows(&q, (a.nope, qk), &queries, (a.kv_lora, kw), rows, a.rope)?;
        let rope = run.rope.rope(kw);
        cmd.rope_rows(&queries, (a.kv_lora, nh * kw), nh, rope, run.positions)?;
        // Keys `[rms_norm(latent) | rope(k_pe)]`.
        let latent = s.get("mla kv latent", total * a.kv_lora)?;
        cmd.copy_rows(kva, (0, kw), &latent, (0, a.kv_lora), total, a.kv_lora)?;
        let normed = s.get("mla kv latent normed", total * a.kv_lora)?;
        cmd.rms_norm(&latent, &self.kv_a_norm, run.eps, &normed)?;
        let keys = s.get("mla keys", total * kw + a.kv_lora)?;
        cmd.copy_rows(&normed, (0, a.kv_lora), &keys, (0, kw), total, a.kv_lora)?;
        cmd.copy_rows(kva, (a.kv_lora, kw), &keys, (a.kv_lora, kw), total, a.rope)?;
        cmd.rope_rows(&keys, (a.kv_lora, kw), 1, rope, run.positions)?;
        // Attention per sequence, the key its own value.
        let attended = s.get("mla attended", rows * kw)?;
        let with = AttendWith {
            sinks: None,
            score_scale: Some(a.kq_scale),
        };
        let mut start = 0;
        for &(cache, pos, t) in &run.seqs {
            let (k0, q0) = (start * kw, start * nh * kw);
            cmd.kv_write_rows(cache, run.layer, pos, t, &keys, k0, &keys, k0, kw)?;
            let at = Attend {
                layer: run.layer,
                pos,
                window: 0,
                query_scale: None,
            };
            let one = s.get("mla attended of a sequence", t * nh * kw)?;
            cmd.attention_rows_with(cache, (&queries, q0, nh * kw), t, at, with, &one)?;
            cmd.copy_rows(&one, (0, 0), &attended, (q0, 0), 1, t * nh * kw)?;
            start += t;
        }
        // Each head's attended latent through its attn_v_b: rows of `heads · v_head`.
        let lat = s.get("mla attended latent", rows * a.kv_lora)?;
        cmd.copy_rows(&attended, (0, kw), &lat, (0, a.kv_lora), rows, a.kv_lora)?;
        cmd.matvec_id(&self.v_b, None, &lat, 1, &ids, out)?;
        Ok(())
    }
}
