//! Tensor-parallel shares of a stage's layers (issue 31, decision 024): several members each hold
//! and read a slice of every layer at once, so one stream's token reads its weights in parallel.
//!
//! Megatron's split: a member's [`Share`] is a range of KV heads (with their query heads) and a
//! range of feed-forward columns. Q, K, V, gate and up are cut by output rows (whole heads, whole
//! columns: exact), the attention output and down projections by input columns, so each member's
//! product is a partial sum of the layer's output — the stage's `reduce` hook sums the members'
//! partials (an all-reduce) after each, and every member then holds the same hidden state. A column
//! cut must fall on a quantization block of the matrix and of its activations (32 values for the
//! legacy types, 256 for the K-quants), so [`shares`] places the cuts on those boundaries, as near
//! as they go to each member's weight (its measured read bandwidth: a faster member takes more);
//! where the blocks are too coarse to give every member a part, some members hold none of the heads
//! (or columns) and add zero to that sum.
//!
//! Expert parallelism: in a mixture-of-experts layer each member also holds a contiguous run of the
//! routed experts (whole experts, as many as its weight's share allows, at least one; only their
//! bytes are read) and a column slice of the shared expert; the router, its bias and the shared
//! expert's gate are whole on every member. After the attention's all-reduce every member holds the
//! token's hidden state, routes it exactly as the whole layer does (`crate::ffn`: same top-k, same
//! weights normalised over all k) and adds only its experts' weighted outputs to its feed-forward
//! partial sum — one all-reduce, no expert dropped. Leading dense layers split by columns as above.
//!
//! The bias of a column-cut matrix is added by the member holding its first columns; norms,
//! per-head Q/K norms and the token embedding are whole on every member. The output head is split by
//! vocabulary rows ([`Share::vocab`]): every member computes its rows' logits, zeros elsewhere, and one
//! more all-reduce makes them whole (adding zeros is exact), so the head is read in parallel too.
//! Latent-attention layers (deepseek2) split by heads too: every member holding heads computes the
//! (shared) latent and caches it whole, its heads' queries, products and values, and its columns of
//! the output projection.

use std::ops::Range;

use crate::block::{BlockSpec, DenseSpec, FfnSpec, MatrixSpec, StageSpec};
use crate::config::{LayerRange, ModelConfig};
use crate::error::{ModelError, Result};
use crate::ffn::{DenseFfn, Ffn, MoeFfn};
use crate::gguf::{GgufFile, RawTensor};
use crate::linear::{LinearSet, kernel_qtype, matrix_shape};
use crate::mla::MlaAttn;

/// One member's slice of every layer of a stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The member's place in the group: partial sums are added in rank order; rank 0 takes the
    /// stage's input and returns its output.
    pub rank: usize,
    /// How many members the layers are split over.
    pub members: usize,
    /// The query heads this member computes: whole groups of a KV head's queries, or part of one
    /// group (its KV head is then computed by every member that shares it). Empty when the heads
    /// cannot be cut on the attention output's blocks finer than another member's whole: that
    /// member computes the attention and this one adds nothing to its sum.
    pub q_heads: Range<usize>,
    /// The dense feed-forward columns (gate and up rows, down's input columns) this member computes;
    /// empty when the layers have no dense feed-forward, or when another member holds them all.
    pub ff: Range<usize>,
    /// The routed experts this member holds and computes, a contiguous run of expert ids (never
    /// empty in a mixture-of-experts stage: every expert on exactly one member); empty in a dense one.
    pub experts: Range<usize>,
    /// The shared expert's columns this member computes (as `ff`); empty when the layers have no
    /// shared expert, or when another member holds it all.
    pub shared_ff: Range<usize>,
    /// On the model's last stage, the output head's rows (vocabulary entries) this member computes:
    /// each member's logits, zero outside its rows, are made whole by one more all-reduce (adding
    /// zeros is exact), so the head is read in parallel like every layer. Empty elsewhere.
    pub vocab: Range<usize>,
}

impl Share {
    /// The KV heads this member's query heads read.
    pub fn kv_heads(&self, cfg: &ModelConfig) -> Range<usize> {
        let g = cfg.n_heads / cfg.n_kv_heads;
        self.q_heads.start / g..self.q_heads.end.div_ceil(g)
    }

    /// The model's shape as this member computes it: its heads and feed-forward columns.
    pub fn local_config(&self, cfg: &ModelConfig) -> ModelConfig {
        let mut local = cfg.clone();
        local.n_heads = self.q_heads.len();
        local.n_kv_heads = self.kv_heads(cfg).len();
        local.ffn_dim = self.ff.len();
        local
    }

    /// Whether this member computes a part of the attention.
    pub fn attends(&self) -> bool {
        !self.q_heads.is_empty()
    }
}

/// Splits layers `range` of `g` over `weights.len()` members, member `i`'s share as near to
/// `weights[i] / Σ weights` of the heads, of the feed-forward columns, of the routed experts (whole
/// experts) and of the shared expert's columns as the quantization blocks and the KV groups allow.
/// Heads and columns are cut into non-empty parts where the blocks allow it, else some members hold
/// none of them. An error names why the layers cannot be split that many ways.
pub fn shares(
    g: &mut GgufFile,
    cfg: &ModelConfig,
    range: LayerRange,
    weights: &[f64],
) -> Result<Vec<Share>> {
    let n = weights.len();
    let refuse = |why: String| {
        Err(ModelError::Unsupported(format!(
            "tensor-parallel split of {} over {n} members: {why}",
            cfg.architecture
        )))
    };
    if weights.is_empty() || weights.iter().any(|w| !(w.is_finite() && *w > 0.0)) {
        return refuse(format!("member weights {weights:?} must be positive"));
    }
    let spec = StageSpec::describe(g, cfg, range)?;
    // The column cuts must fall on blocks of every layer's attention output and down matrices.
    let (mut wo_align, mut down_align, mut shared_align) = (1, 1, 1);
    let (mut dense, mut moe, mut shared_ff) = (false, None, 0);
    for b in &spec.blocks {
        wo_align = lcm(wo_align, column_block(g, &b.wo)?);
        match &b.ffn {
            FfnSpec::Dense(d) => {
                dense = true;
                down_align = lcm(down_align, column_block(g, &d.down)?);
            }
            FfnSpec::Moe(m) => {
                moe = Some(m.experts.count);
                if let Some((d, _)) = &m.shared {
                    shared_ff = d.down.input;
                    shared_align = lcm(shared_align, column_block(g, &d.down)?);
                }
            }
        }
    }
    // The attention output's input columns per query head (latent attention: a head's values).
    let hd = cfg.arch.mla.map_or(cfg.head_dim, |a| a.v_head);
    let group = cfg.n_heads / cfg.n_kv_heads;
    // Query-head counts at which a cut may fall, and feed-forward columns.
    let head_cuts = points(cfg.n_heads, |h| (h * hd).is_multiple_of(wo_align));
    // A member's query heads are whole KV groups, or lie within one (the attention kernel pairs its
    // local heads with its local KV heads in order).
    let grouped = |a: usize, b: usize| {
        (a.is_multiple_of(group) && b.is_multiple_of(group)) || a / group == (b - 1) / group
    };
    let heads = cut_or_empty(&head_cuts, weights, grouped);
    let columns = |total: usize, align: usize| {
        cut_or_empty(
            &points(total, |f| f.is_multiple_of(align)),
            weights,
            |_, _| true,
        )
    };
    let ff = if dense {
        columns(cfg.ffn_dim, down_align)
    } else {
        vec![0; n + 1]
    };
    let shared = columns(shared_ff, shared_align);
    let experts = match moe {
        Some(count) => match cut(&points(count, |_| true), weights, |_, _| true) {
            Some(c) => c,
            None => {
                return refuse(format!(
                    "{count} routed experts cannot give each member at least one"
                ));
            }
        },
        None => vec![0; n + 1],
    };
    // The head's rows, on 64-row boundaries (any row cut is exact; these keep the kernels' row groups
    // whole).
    let vocab = match &spec.last {
        Some(last) => {
            let rows = head_rows(g, last.tied)?;
            cut_or_empty(&points(rows, |v| v.is_multiple_of(64)), weights, |_, _| {
                true
            })
        }
        None => vec![0; n + 1],
    };
    let split: Vec<Share> = (0..n)
        .map(|rank| Share {
            rank,
            members: n,
            q_heads: heads[rank]..heads[rank + 1],
            ff: ff[rank]..ff[rank + 1],
            experts: experts[rank]..experts[rank + 1],
            shared_ff: shared[rank]..shared[rank + 1],
            vocab: vocab[rank]..vocab[rank + 1],
        })
        .collect();
    if let Some(idle) = split
        .iter()
        .find(|s| !s.attends() && s.ff.is_empty() && s.experts.is_empty() && s.shared_ff.is_empty())
    {
        return refuse(format!(
            "member {} would hold nothing: {} query heads ({group} per KV head) of {hd} columns on \
             {wo_align}-value blocks, {} feed-forward columns on {down_align}-value blocks",
            idle.rank, cfg.n_heads, cfg.ffn_dim
        ));
    }
    Ok(split)
}

/// The tensor the output head's rows are read from: the token embedding when the head is tied to it.
pub(crate) fn head_tensor(tied: bool) -> &'static str {
    if tied {
        crate::gguf::names::TOKEN_EMBD
    } else {
        crate::gguf::names::OUTPUT
    }
}

/// Rows (vocabulary entries) of the output head.
pub(crate) fn head_rows(g: &GgufFile, tied: bool) -> Result<usize> {
    let name = head_tensor(tied);
    g.tensors()
        .get(name)
        .and_then(|e| e.dims.first().copied())
        .ok_or_else(|| ModelError::MissingTensor { name: name.into() })
}

/// Rows `rows` of the output head (a member's part of a split head), only those read.
pub(crate) fn load_head_rows(
    g: &mut GgufFile,
    tied: bool,
    rows: Range<usize>,
) -> Result<LinearSet> {
    let name = head_tensor(tied);
    LinearSet::from_raws(vec![(name.to_string(), g.read_raw_rows(name, rows)?, None)])
}

/// `0..=total` where `allowed`, with both ends always.
fn points(total: usize, allowed: impl Fn(usize) -> bool) -> Vec<usize> {
    (0..=total)
        .filter(|&p| p == 0 || p == total || allowed(p))
        .collect()
}

/// [`cut`] into non-empty parts where one exists, else into parts of which some are empty (the
/// whole in one part always is one).
fn cut_or_empty(
    allowed: &[usize],
    weights: &[f64],
    valid: impl Fn(usize, usize) -> bool,
) -> Vec<usize> {
    cut(allowed, weights, &valid)
        .or_else(|| cut_parts(allowed, weights, &valid, true))
        .unwrap_or_else(|| vec![0; weights.len() + 1])
}

/// The block a column cut of `m`'s input must fall on: its weight format's and its activations'.
fn column_block(g: &GgufFile, m: &MatrixSpec) -> Result<usize> {
    let mut align = 1;
    for p in &m.parts {
        let entry = g
            .tensors()
            .get(&p.weight)
            .ok_or_else(|| ModelError::MissingTensor {
                name: p.weight.clone(),
            })?;
        let q = kernel_qtype(&p.weight, entry.ty)?;
        align = lcm(align, lcm(q.block_size(), q.act_type().block_size()));
    }
    Ok(align)
}

fn lcm(a: usize, b: usize) -> usize {
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    a / gcd(a, b) * b
}

/// Cut points of `0..total` (`allowed` ascending, from 0 to `total`) into `weights.len()` non-empty
/// parts `[a, b)` each `valid`, the cuts as near their weighted targets as can be (least sum of
/// squared distances); `None` when no such cut exists.
fn cut(
    allowed: &[usize],
    weights: &[f64],
    valid: impl Fn(usize, usize) -> bool,
) -> Option<Vec<usize>> {
    cut_parts(allowed, weights, &valid, false)
}

/// [`cut`], parts allowed to be empty when `empty`.
fn cut_parts(
    allowed: &[usize],
    weights: &[f64],
    valid: &dyn Fn(usize, usize) -> bool,
    empty: bool,
) -> Option<Vec<usize>> {
    let (n, m) = (weights.len(), allowed.len());
    let total = *allowed.last()? as f64;
    let sum: f64 = weights.iter().sum();
    let targets: Vec<f64> = weights
        .iter()
        .scan(0.0, |acc, w| {
            *acc += w;
            Some(*acc / sum * total)
        })
        .collect();
    // best[i][k]: the least cost of cutting parts 0..=i with part i ending at allowed[k], and the
    // point part i started at.
    let mut best = vec![vec![None::<(f64, usize)>; m]; n];
    let first_end = usize::from(!empty);
    for i in 0..n {
        for k in first_end..m {
            let cost_here = (allowed[k] as f64 - targets[i]).powi(2);
            let from = |j: usize| -> Option<f64> {
                let before = if i == 0 {
                    (j == 0).then_some(0.0)?
                } else {
                    best[i - 1][j]?.0
                };
                (j == k || valid(allowed[j], allowed[k])).then_some(before + cost_here)
            };
            let starts = if empty { 0..k + 1 } else { 0..k };
            best[i][k] = starts
                .filter_map(|j| from(j).map(|c| (c, j)))
                .min_by(|a, b| a.0.total_cmp(&b.0));
        }
    }
    let mut points = vec![allowed[m - 1]];
    let mut k = m - 1;
    for i in (0..n).rev() {
        let (_, j) = best[i][k]?;
        points.push(allowed[j]);
        k = j;
    }
    points.reverse();
    Some(points)
}

/// The output rows `wanted` (ranges of the whole `[part₀ | part₁ | …]`, ascending) of the matrices
/// `spec` names, with their biases, as one set; only those rows are read.
fn load_rows(g: &mut GgufFile, spec: &MatrixSpec, wanted: &[Range<usize>]) -> Result<LinearSet> {
    let mut raws = Vec::new();
    for want in wanted {
        let mut start = 0;
        for p in &spec.parts {
            let rows = g
                .tensors()
                .get(&p.weight)
                .and_then(|e| e.dims.first().copied())
                .ok_or_else(|| ModelError::MissingTensor {
                    name: p.weight.clone(),
                })?;
            let (lo, hi) = (want.start.max(start), want.end.min(start + rows));
            if lo < hi {
                let local = lo - start..hi - start;
                let bias = p.bias.as_deref().map(|b| g.read_f32_vec(b)).transpose()?;
                raws.push((
                    p.weight.clone(),
                    g.read_raw_rows(&p.weight, local.clone())?,
                    bias.map(|b| b[local].to_vec()),
                ));
            }
            start += rows;
        }
    }
    LinearSet::from_raws(raws)
}

/// Input columns `cols` of the one matrix `spec` names (its bias with it when `bias` is asked).
fn load_columns(
    g: &mut GgufFile,
    spec: &MatrixSpec,
    cols: Range<usize>,
    bias: bool,
) -> Result<LinearSet> {
    let [p] = spec.parts.as_slice() else {
        return Err(ModelError::Unsupported(format!(
            "a column split of {}, stored in {} parts",
            spec.name,
            spec.parts.len()
        )));
    };
    let raw = g.read_raw(&p.weight)?;
    let sliced = take_columns(&p.weight, &raw, cols)?;
    let b = match (&p.bias, bias) {
        (Some(b), true) => Some(g.read_f32_vec(b)?),
        _ => None,
    };
    LinearSet::from_raws(vec![(p.weight.clone(), sliced, b)])
}

/// Columns `range` of a `[rows, cols]` matrix: whole quantization blocks of every row.
fn take_columns(name: &str, raw: &RawTensor, range: Range<usize>) -> Result<RawTensor> {
    let (rows, cols, q) = matrix_shape(name, raw)?;
    let block = q.block_size();
    if !range.start.is_multiple_of(block) || !range.end.is_multiple_of(block) || range.end > cols {
        return Err(ModelError::BadInput(format!(
            "{name}: columns {range:?} of {cols} do not fall on its {block}-value blocks"
        )));
    }
    let row_bytes = raw.data.len() / rows;
    let per_block = row_bytes / (cols / block);
    let (from, to) = (
        range.start / block * per_block,
        range.end / block * per_block,
    );
    let mut data = Vec::with_capacity(rows * (to - from));
    for row in raw.data.chunks_exact(row_bytes) {
        data.extend_from_slice(&row[from..to]);
    }
    let mut dims = raw.dims.clone();
    dims[1] = range.len();
    Ok(RawTensor {
        ty: raw.ty,
        dims,
        data,
    })
}

/// A member's slice of layer `spec`: `[q | k | v]` rows of its heads and the output projection's
/// columns of them (none when it holds no heads), its attention sinks, and its feed-forward (see
/// [`member_ffn`]). Under latent attention `[q_a | kv_a]` is whole (the latent is every head's),
/// or `[q | kv_a]` cut to the member's heads' query rows; `q_b` rows and the per-head `attn_k_b` /
/// `attn_v_b` are the member's heads' ([`MlaAttn::load_heads`]), and every member holding heads
/// caches the whole latent.
pub(crate) struct BlockSlice {
    /// `[q | k | v]` and the attention output's columns; `None` when the member holds no heads.
    pub attention: Option<(LinearSet, LinearSet)>,
    /// Latent attention's heads (deepseek2), when the member holds some.
    pub mla: Option<MlaAttn>,
    pub sinks: Range<usize>,
    pub ffn: Ffn,
}

impl BlockSlice {
    pub(crate) fn load(
        g: &mut GgufFile,
        share: &Share,
        cfg: &ModelConfig,
        spec: &BlockSpec,
    ) -> Result<Self> {
        let hd = cfg.head_dim;
        let (qd, kvd) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
        let q = share.q_heads.clone();
        let kv = &share.kv_heads(cfg);
        let (qkv, cols) = match (&spec.mla, cfg.arch.mla) {
            (Some(_), Some(a)) => {
                let (qk, kw) = (a.nope + a.rope, a.kv_lora + a.rope);
                let qkv = match a.q_lora {
                    0 => {
                        let at = cfg.n_heads * qk;
                        vec![q.start * qk..q.end * qk, at..at + kw]
                    }
                    r => std::iter::once(0..r + kw).collect(),
                };
                (qkv, q.start * a.v_head..q.end * a.v_head)
            }
            _ => (
                vec![
                    q.start * hd..q.end * hd,
                    qd + kv.start * hd..qd + kv.end * hd,
                    qd + kvd + kv.start * hd..qd + kvd + kv.end * hd,
                ],
                q.start * hd..q.end * hd,
            ),
        };
        let (attention, mla) = if share.attends() {
            let mla = match &spec.mla {
                Some(m) => Some(MlaAttn::load_heads(
                    g,
                    m,
                    cfg.n_heads,
                    q.clone(),
                    |g, m, r| load_rows(g, m, &[r]),
                )?),
                None => None,
            };
            let attention = (
                load_rows(g, &spec.qkv, &qkv)?,
                load_columns(g, &spec.wo, cols.clone(), cols.start == 0)?,
            );
            (Some(attention), mla)
        } else {
            (None, None)
        };
        Ok(Self {
            attention,
            mla,
            sinks: q,
            ffn: member_ffn(g, share, &spec.ffn)?,
        })
    }
}

/// A member's feed-forward of one layer: a dense one's columns `share.ff` (nothing when empty), or
/// a mixture of experts with the router whole, experts `share.experts` and the shared expert's
/// columns `share.shared_ff`.
fn member_ffn(g: &mut GgufFile, share: &Share, spec: &FfnSpec) -> Result<Ffn> {
    Ok(match spec {
        FfnSpec::Dense(d) => match dense_slice(g, d, &share.ff)? {
            Some(d) => Ffn::Dense(d),
            None => Ffn::Idle,
        },
        FfnSpec::Moe(m) => {
            let shared = match &m.shared {
                Some((d, _)) => dense_slice(g, d, &share.shared_ff)?,
                None => None,
            };
            Ffn::Moe(MoeFfn::load(g, m, share.experts.clone(), shared)?)
        }
    })
}

/// Columns `cols` of a dense feed-forward (`[gate | up]` rows, down's input columns, down's bias
/// with the first columns); `None` when `cols` is empty.
fn dense_slice(g: &mut GgufFile, d: &DenseSpec, cols: &Range<usize>) -> Result<Option<DenseFfn>> {
    if cols.is_empty() {
        return Ok(None);
    }
    let ff = d.down.input;
    let gate_up = [cols.clone(), ff + cols.start..ff + cols.end];
    Ok(Some(DenseFfn::of(
        load_rows(g, &d.gate_up, &gate_up)?,
        load_columns(g, &d.down, cols.clone(), cols.start == 0)?,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_follow_the_weights_on_allowed_points() {
        let any = |_, _| true;
        let every: Vec<usize> = (0..=8).collect();
        assert_eq!(cut(&every, &[1.0, 1.0], any), Some(vec![0, 4, 8]));
        assert_eq!(cut(&every, &[3.0, 1.0], any), Some(vec![0, 6, 8]));
        assert_eq!(cut(&every, &[1.0, 1.0, 2.0], any), Some(vec![0, 2, 4, 8]));
        // Only multiples of 3 allowed (and the end): the nearest to 4 is 3.
        assert_eq!(cut(&[0, 3, 6, 8], &[1.0, 1.0], any), Some(vec![0, 3, 8]));
        // Every member gets a part, whatever its weight.
        assert_eq!(cut(&[0, 4, 8], &[100.0, 1.0], any), Some(vec![0, 4, 8]));
        assert_eq!(cut(&[0, 8], &[1.0, 1.0], any), None);
        // 4 query heads in KV groups of 2 over 3 members: [0,1) [1,2) [2,4), never [1,3).
        let grouped = |a: usize, b: usize| {
            (a.is_multiple_of(2) && b.is_multiple_of(2)) || a / 2 == (b - 1) / 2
        };
        let heads: Vec<usize> = (0..=4).collect();
        let c = cut(&heads, &[1.0, 1.0, 1.0], grouped).unwrap();
        assert!(c == vec![0, 1, 2, 4] || c == vec![0, 2, 3, 4], "{c:?}");
    }

    #[test]
    fn where_no_cut_gives_every_member_a_part_some_hold_none() {
        let any = |_, _| true;
        // One block of 256 columns over two members: one holds it all.
        let c = cut_or_empty(&points(256, |f| f % 256 == 0), &[1.0, 1.0], any);
        assert!(c == vec![0, 0, 256] || c == vec![0, 256, 256], "{c:?}");
        // Two blocks over three members: one of them holds none, the others one each.
        let c = cut_or_empty(&points(512, |f| f % 256 == 0), &[1.0, 1.0, 1.0], any);
        let sizes: Vec<usize> = c.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(sizes.iter().filter(|&&s| s == 256).count(), 2, "{c:?}");
        // Where non-empty parts exist they are taken, as `cut` takes them.
        let c = cut_or_empty(&points(8, |_| true), &[3.0, 1.0], any);
        assert_eq!(c, vec![0, 6, 8]);
    }

    #[test]
    fn lcm_of_blocks() {
        assert_eq!(lcm(32, 256), 256);
        assert_eq!(lcm(1, 32), 32);
        assert_eq!(lcm(192, 256), 768);
    }
}
