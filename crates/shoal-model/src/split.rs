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
//! as they go to each member's weight (its measured read bandwidth: a faster member takes more).
//! Biases of the cut-by-columns matrices are added by rank 0 alone; norms, per-head Q/K norms and the
//! token embedding are whole on every member; the output head on rank 0.
//!
//! Mixture-of-experts and latent-attention layers are not split yet (expert parallelism is the
//! other half of the issue): [`shares`] refuses them by name.

use std::ops::Range;

use crate::block::{BlockSpec, DenseSpec, FfnSpec, MatrixSpec, StageSpec};
use crate::config::{LayerRange, ModelConfig};
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, RawTensor};
use crate::linear::{LinearSet, kernel_qtype, matrix_shape};

/// One member's slice of every layer of a stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The member's place in the group: partial sums are added in rank order; rank 0 adds the biases
    /// of the column-cut matrices and holds the output head.
    pub rank: usize,
    /// How many members the layers are split over.
    pub members: usize,
    /// The query heads this member computes: whole groups of a KV head's queries, or part of one
    /// group (its KV head is then computed by every member that shares it).
    pub q_heads: Range<usize>,
    /// The feed-forward columns (gate and up rows, down's input columns) this member computes.
    pub ff: Range<usize>,
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
}

/// Splits layers `range` of `g` over `weights.len()` members, member `i`'s share as near to
/// `weights[i] / Σ weights` of the heads and of the feed-forward columns as the quantization blocks
/// and the KV groups allow. An error names why the layers cannot be split that many ways.
pub fn shares(
    g: &mut GgufFile,
    cfg: &ModelConfig,
    range: LayerRange,
    weights: &[f64],
) -> Result<Vec<Share>> {
    let refuse = |why: String| {
        Err(ModelError::Unsupported(format!(
            "tensor-parallel split of {} over {} members: {why}",
            cfg.architecture,
            weights.len()
        )))
    };
    if weights.is_empty() || weights.iter().any(|w| !(w.is_finite() && *w > 0.0)) {
        return refuse(format!("member weights {weights:?} must be positive"));
    }
    if cfg.arch.mla.is_some() || cfg.arch.experts.is_some() {
        return refuse(
            "mixture-of-experts and latent-attention layers are not split yet".to_string(),
        );
    }
    let spec = StageSpec::describe(g, cfg, range)?;
    // The column cuts must fall on blocks of every layer's attention output and down matrices.
    let (mut wo_align, mut down_align) = (1, 1);
    for b in &spec.blocks {
        wo_align = lcm(wo_align, column_block(g, &b.wo)?);
        let FfnSpec::Dense(d) = &b.ffn else {
            return refuse("a mixture-of-experts layer".to_string());
        };
        down_align = lcm(down_align, column_block(g, &d.down)?);
    }
    let (hd, group) = (cfg.head_dim, cfg.n_heads / cfg.n_kv_heads);
    // Query-head counts at which a cut may fall, and feed-forward columns.
    let head_cuts: Vec<usize> = (0..=cfg.n_heads)
        .filter(|h| (h * hd).is_multiple_of(wo_align))
        .collect();
    // A member's query heads are whole KV groups, or lie within one (the attention kernel pairs its
    // local heads with its local KV heads in order).
    let grouped = |a: usize, b: usize| {
        (a.is_multiple_of(group) && b.is_multiple_of(group)) || a / group == (b - 1) / group
    };
    let ff_cuts: Vec<usize> = (0..=cfg.ffn_dim)
        .filter(|f| f.is_multiple_of(down_align))
        .collect();
    let Some(heads) = cut(&head_cuts, weights, grouped) else {
        return refuse(format!(
            "{} query heads ({} per KV head) of {hd} columns cannot be cut on {wo_align}-value blocks",
            cfg.n_heads, group
        ));
    };
    let Some(ff) = cut(&ff_cuts, weights, |_, _| true) else {
        return refuse(format!(
            "{} feed-forward columns cannot be cut on {down_align}-value blocks",
            cfg.ffn_dim
        ));
    };
    Ok((0..weights.len())
        .map(|rank| Share {
            rank,
            members: weights.len(),
            q_heads: heads[rank]..heads[rank + 1],
            ff: ff[rank]..ff[rank + 1],
        })
        .collect())
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
    for i in 0..n {
        for k in 1..m {
            let cost_here = (allowed[k] as f64 - targets[i]).powi(2);
            let from = |j: usize| -> Option<f64> {
                let before = if i == 0 {
                    (j == 0).then_some(0.0)?
                } else {
                    best[i - 1][j]?.0
                };
                valid(allowed[j], allowed[k]).then_some(before + cost_here)
            };
            best[i][k] = (0..k)
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
/// `spec` names, with their biases, as one set.
pub(crate) fn load_rows(
    g: &mut GgufFile,
    spec: &MatrixSpec,
    wanted: &[Range<usize>],
) -> Result<LinearSet> {
    let mut parts = Vec::with_capacity(spec.parts.len());
    for p in &spec.parts {
        let raw = g.read_raw(&p.weight)?;
        let bias = p.bias.as_deref().map(|b| g.read_f32_vec(b)).transpose()?;
        parts.push((p.weight.as_str(), raw, bias));
    }
    let mut raws = Vec::new();
    for want in wanted {
        let mut start = 0;
        for (name, raw, bias) in &parts {
            let (rows, _, _) = matrix_shape(name, raw)?;
            let (lo, hi) = (want.start.max(start), want.end.min(start + rows));
            if lo < hi {
                let local = lo - start..hi - start;
                raws.push((
                    name.to_string(),
                    take_rows(raw, rows, local.clone()),
                    bias.as_ref().map(|b| b[local].to_vec()),
                ));
            }
            start += rows;
        }
    }
    LinearSet::from_raws(raws)
}

/// Input columns `cols` of the one matrix `spec` names (its bias with it when `bias` is asked).
pub(crate) fn load_columns(
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

/// Rows `range` of a `[rows, cols]` matrix.
fn take_rows(raw: &RawTensor, rows: usize, range: Range<usize>) -> RawTensor {
    let row_bytes = raw.data.len() / rows;
    let mut dims = raw.dims.clone();
    dims[0] = range.len();
    RawTensor {
        ty: raw.ty,
        dims,
        data: raw.data[range.start * row_bytes..range.end * row_bytes].to_vec(),
    }
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

/// What a member's slice of one layer reads: `[q | k | v]` rows of its heads, the output
/// projection's columns of its query heads, `[gate | up]` rows and down's columns of its
/// feed-forward range.
pub(crate) struct BlockSlices<'a> {
    /// The layer's dense feed-forward (only those are split).
    pub dense: &'a DenseSpec,
    pub qkv: Vec<Range<usize>>,
    pub wo_cols: Range<usize>,
    pub gate_up: Vec<Range<usize>>,
    pub ff: Range<usize>,
    pub sinks: Range<usize>,
}

impl<'a> BlockSlices<'a> {
    pub(crate) fn of(share: &Share, cfg: &ModelConfig, spec: &'a BlockSpec) -> Result<Self> {
        let hd = cfg.head_dim;
        let (qd, kvd) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
        let q = share.q_heads.clone();
        let kv = &share.kv_heads(cfg);
        let (FfnSpec::Dense(dense), None) = (&spec.ffn, &spec.mla) else {
            return Err(ModelError::Unsupported(format!(
                "a tensor-parallel slice of {}'s layer {}",
                cfg.architecture, spec.attn_norm.name
            )));
        };
        let ff = &share.ff;
        Ok(Self {
            dense,
            qkv: vec![
                q.start * hd..q.end * hd,
                qd + kv.start * hd..qd + kv.end * hd,
                qd + kvd + kv.start * hd..qd + kvd + kv.end * hd,
            ],
            wo_cols: q.start * hd..q.end * hd,
            gate_up: vec![ff.clone(), cfg.ffn_dim + ff.start..cfg.ffn_dim + ff.end],
            ff: ff.clone(),
            sinks: q,
        })
    }
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
    fn lcm_of_blocks() {
        assert_eq!(lcm(32, 256), 256);
        assert_eq!(lcm(1, 32), 32);
        assert_eq!(lcm(192, 256), 768);
    }
}
