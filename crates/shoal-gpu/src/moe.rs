//! Mixture-of-experts layers on the device, as llama.cpp's `mul_mat_id` does them: the router's
//! logits become each token's top-k expert ids and weights on the device ([`Commands::moe_route`]),
//! the experts' matrices of a projection are one stacked [`GpuMatrix`] ([`Gpu::upload_experts`]),
//! and [`Commands::matvec_id`] multiplies each (token, slot) pair by the expert its id names (the
//! per-format matvec kernels with another row locator, `kernels/matvec_id.wgsl`), so a layer is
//! recorded with no read back to the host; [`Commands::moe_combine`] adds the weighted slots (and a
//! shared expert). Prefill runs the same path per (token, slot) pair: correct, not grouped by
//! expert as the CPU's prefill is.

use crate::ops::{entry, same_len};
use crate::pipelines::Kernel;
use crate::{Commands, GpuError, GpuMatrix, GpuVec, MatvecConfig};

/// Threads per workgroup of the routing and combination kernels.
const WG: u32 = 64;

/// Where a router's softmax sits (shoal-model's `Gating`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeGating {
    /// Softmax over every expert's logit, then the k largest probabilities (Qwen).
    SoftmaxThenTopK,
    /// The k largest logits, then a softmax over those k (gpt-oss).
    TopKThenSoftmax,
    /// Sigmoid scores; the k largest of score + selection bias, weighted by their scores (GLM-4.5).
    Sigmoid,
}

/// How tokens choose their experts: shoal-model's routing rules, every field as its `Experts`.
#[derive(Debug, Clone, Copy)]
pub struct MoeRouting {
    /// Experts (router logits per token).
    pub experts: usize,
    /// Experts each token uses (at most 64 and `experts`).
    pub used: usize,
    pub gating: MoeGating,
    /// Renormalise the chosen weights to sum to 1.
    pub norm_weights: bool,
    /// Factor on the chosen weights.
    pub scale: f32,
    /// Group-limited routing (DeepSeek V3): (groups, groups used); none when groups ≤ 1 or every
    /// group is used. At most 32 groups.
    pub groups: (usize, usize),
}

fn u32_of(what: &str, v: usize) -> Result<u32, GpuError> {
    u32::try_from(v).map_err(|_| GpuError::Shape(format!("{what} {v} does not fit a u32")))
}

impl Commands<'_> {
    /// Routes `tokens = logits.len() / r.experts` tokens: `logits` (`tokens × experts`, replaced by
    /// the softmax or sigmoid scores) and the optional selection `bias` (`experts`, added only to
    /// choose) give each token's `r.used` expert ids (`ids`, `tokens × used`, u32 bit patterns in
    /// a [`GpuVec`], sorted ascending per token) and weights (`weights`, same shape), exactly as
    /// shoal-model's host routing chooses them (first index on a tie; group-limited when
    /// `r.groups` says so).
    pub fn moe_route(
        &mut self,
        logits: &GpuVec,
        bias: Option<&GpuVec>,
        r: MoeRouting,
        ids: &GpuVec,
        weights: &GpuVec,
    ) -> Result<(), GpuError> {
        if r.experts == 0 || r.used == 0 || r.used > r.experts.min(64) {
            return Err(GpuError::Config(format!(
                "routing to {} of {} experts: need 1..=min(64, experts)",
                r.used, r.experts
            )));
        }
        let (groups, used) = r.groups;
        if groups > 32 || (groups > 1 && (used == 0 || !r.experts.is_multiple_of(groups))) {
            return Err(GpuError::Config(format!(
                "{used} of {groups} expert groups of {} experts: need at most 32 groups, dividing \
                 the experts, one used at least",
                r.experts
            )));
        }
        if !logits.len().is_multiple_of(r.experts) {
            return Err(GpuError::Shape(format!(
                "{} router logits are not rows of {} experts",
                logits.len(),
                r.experts
            )));
        }
        let tokens = logits.len() / r.experts;
        same_len("routed ids", ids.len(), tokens * r.used)?;
        same_len("routed weights", weights.len(), tokens * r.used)?;
        if let Some(b) = bias {
            same_len("selection bias", b.len(), r.experts)?;
        }
        let gating = match r.gating {
            MoeGating::SoftmaxThenTopK => 0,
            MoeGating::TopKThenSoftmax => 1,
            MoeGating::Sigmoid => 2,
        };
        let params = self.gpu().uniform(&[
            r.experts as u32,
            r.used as u32,
            u32_of("tokens", tokens)?,
            gating,
            u32::from(r.norm_weights),
            r.scale.to_bits(),
            u32::from(bias.is_some()),
            groups as u32,
            used as u32,
        ]);
        let bias = self.gpu().buffer_or_dummy(bias)?;
        let buffers = [&params, &logits.buffer, &bias, &ids.buffer, &weights.buffer];
        let groups = (tokens as u32).div_ceil(WG);
        self.dispatch(Kernel::MoeRoute, WG, &buffers, groups)
    }

    /// `y[p] = E_ids[p] · x[p / x_div] (+ its bias row)` for every (token, slot) pair `p` of `ids`
    /// (from [`Commands::moe_route`]): `experts` is a stacked matrix ([`Gpu::upload_experts`]) of
    /// `per = rows / experts` rows, `bias` (`rows` values: row `e·per + r` expert `e`'s) optional,
    /// `x` holds `pairs / x_div` rows of `cols` values (`x_div` = the slots per token when every
    /// slot reads its token's row, 1 when each pair has its own), `y` `pairs × per` values.
    ///
    /// [`Gpu::upload_experts`]: crate::Gpu::upload_experts
    pub fn matvec_id(
        &mut self,
        experts: &GpuMatrix,
        bias: Option<&GpuVec>,
        x: &GpuVec,
        x_div: usize,
        ids: &GpuVec,
        y: &GpuVec,
    ) -> Result<(), GpuError> {
        let pairs = ids.len();
        let per = experts.rows() / experts.experts().max(1);
        let cols = experts.cols();
        if x_div == 0 || !pairs.is_multiple_of(x_div) || !cols.is_multiple_of(4) {
            return Err(GpuError::Shape(format!(
                "matvec_id of {pairs} pairs, {x_div} per input row, {cols} columns: need whole \
                 rows and columns a multiple of 4"
            )));
        }
        same_len("matvec_id input", x.len(), pairs / x_div * cols)?;
        same_len("matvec_id output", y.len(), pairs * per)?;
        if let Some(b) = bias {
            same_len("expert biases", b.len(), experts.rows())?;
        }
        if pairs == 0 {
            return Ok(());
        }
        let MatvecConfig { workgroup, rows } = MatvecConfig::default();
        let wg = workgroup.min(self.gpu().max_invocations);
        let rows = rows.min(wg);
        let groups = u32_of("rows", per)?.div_ceil(rows);
        let total = u32_of("workgroups", groups as usize * pairs)?;
        let grid = self.gpu().grid(total)?;
        let pipeline = self.gpu().pipeline(
            Kernel::MatvecId(experts.qtype()),
            &[("WG", wg), ("ROWS", rows)],
        )?;
        let layout = pipeline.get_bind_group_layout(0);
        let bias_buf = self.gpu().buffer_or_dummy(bias)?;
        let tables = match experts.qtype().is_iq() {
            true => Some(self.gpu().iq_tables()?),
            false => None,
        };
        let k = match experts.qtype().block_size() {
            1 => cols.div_ceil(4) * 4,
            _ => cols,
        };
        let mut binds = Vec::with_capacity(experts.chunks.len());
        let mut first = 0u32;
        for chunk in &experts.chunks {
            let params = self.gpu().uniform(&[
                chunk.rows,
                k as u32,
                first,
                per as u32,
                groups,
                pairs as u32,
                x_div as u32,
                u32::from(bias.is_some()),
            ]);
            first += chunk.rows;
            let mut entries = vec![
                entry(0, &params),
                entry(1, &x.buffer),
                entry(2, &y.buffer),
                entry(3, &chunk.weights),
                entry(5, &ids.buffer),
                entry(6, &bias_buf),
            ];
            if let Some(s) = &chunk.scales {
                entries.push(entry(4, s));
            }
            if let Some(t) = tables {
                entries.push(entry(7, t));
            }
            let bind = self
                .gpu()
                .device
                .create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("shoal matvec_id"),
                    layout: &layout,
                    entries: &entries,
                });
            binds.push((bind, params));
        }
        let mut pass = self
            .encoder()
            .begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        pass.set_pipeline(&pipeline);
        for (bind, _) in &binds {
            pass.set_bind_group(0, bind, &[]);
            pass.dispatch_workgroups(grid.0, grid.1, 1);
        }
        Ok(())
    }

    /// `out[t] = Σ_s weights[t·k + s] · y[t·k + s]` for each of `out.len() / dim` tokens (`y`:
    /// `tokens·k` rows of `dim` from [`Commands::matvec_id`], `weights` from
    /// [`Commands::moe_route`]), plus a shared expert's rows (`tokens × dim`), scaled by
    /// `sigmoid(gate[t])` when its gate logits (`tokens`) are given.
    pub fn moe_combine(
        &mut self,
        y: &GpuVec,
        weights: &GpuVec,
        shared: Option<(&GpuVec, Option<&GpuVec>)>,
        dim: usize,
        out: &GpuVec,
    ) -> Result<(), GpuError> {
        if dim == 0 || !out.len().is_multiple_of(dim) {
            return Err(GpuError::Shape(format!(
                "{} values are not rows of {dim}",
                out.len()
            )));
        }
        let tokens = out.len() / dim;
        if tokens == 0 {
            return Ok(());
        }
        if !weights.len().is_multiple_of(tokens) {
            return Err(GpuError::Shape(format!(
                "{} routed weights for {tokens} tokens",
                weights.len()
            )));
        }
        let k = weights.len() / tokens;
        same_len("expert outputs", y.len(), weights.len() * dim)?;
        let dummy = self.gpu().zeros(1)?;
        let (sh, gate, mode) = match shared {
            None => (&dummy, &dummy, 0),
            Some((s, g)) => {
                same_len("shared expert output", s.len(), out.len())?;
                match g {
                    Some(g) => {
                        same_len("shared expert gate", g.len(), tokens)?;
                        (s, g, 2)
                    }
                    None => (s, &dummy, 1),
                }
            }
        };
        let params = self
            .gpu()
            .uniform(&[dim as u32, k as u32, u32_of("tokens", tokens)?, mode]);
        let buffers = [
            &params,
            &y.buffer,
            &weights.buffer,
            &sh.buffer,
            &gate.buffer,
            &out.buffer,
        ];
        let n = u32_of("values", out.len())?;
        self.dispatch(Kernel::MoeCombine, WG, &buffers, n.div_ceil(WG))
    }
}
