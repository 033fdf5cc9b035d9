//! A GPU layer's feed-forward ([`GpuFfn`]), the device twin of [`crate::ffn::Ffn`]: dense
//! (`down(act(gate·x) * up·x)`) or routed experts, recorded with no read back to the host as
//! llama.cpp's `mul_mat_id` does it: the router's logits (`ffn_gate_inp`, its bias when the file
//! has one) → each token's top-k expert ids and weights on the device, by the host's rules
//! (shoal-gpu's `moe_route`: softmax or sigmoid, the selection bias, renormalisation, scale) → the
//! stacked expert matrices of each projection multiplied per (token, slot) by the expert its id
//! names (`matvec_id`, with each expert's bias rows) → the gated product → `down` → the slots
//! weighted and added in expert order, plus the shared expert (gated by
//! `sigmoid(ffn_gate_inp_shexp · x)`, or ungated as GLM-4.5's). gpt-oss's experts: the router's
//! bias, top-k then softmax, each expert's bias rows, the clamped SwiGLU, MXFP4 matrices. Prefill
//! takes the same per-pair path (correct; not grouped by expert as the CPU's prefill is).
//!
//! Group-limited routing (DeepSeek V3) is the routing kernel's too (at most 32 groups).

use shoal_gpu::{Commands, Gpu, GpuMatrix, GpuVec, MoeGating, MoeRouting};
use shoal_kernels::{QMatrix, QType};

use super::layers::Scratch;
use super::{GpuLinear, load_linear};
use crate::arch::{Activation, Gating};
use crate::block::{DenseSpec, ExpertTensor, FfnSpec, MoeSpec, read_norm};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::linear::kernel_qtype;

/// A layer's feed-forward on the device.
pub(super) enum GpuFfn {
    Dense(GpuDense),
    Moe(Box<GpuMoe>),
}

pub(super) struct GpuDense {
    gate_up: GpuLinear,
    down: GpuLinear,
    ff: usize,
}

/// One projection of every expert: the stacked matrix and the experts' bias rows.
struct Stacked {
    w: GpuMatrix,
    bias: Option<GpuVec>,
}

pub(super) struct GpuMoe {
    router: GpuLinear,
    gate: Stacked,
    up: Stacked,
    down: Stacked,
    /// The shared expert and its gate vector as a `1 × dim` matrix (none: ungated).
    shared: Option<(GpuDense, Option<GpuMatrix>)>,
    selection_bias: Option<GpuVec>,
    routing: MoeRouting,
    ff: usize,
}

impl GpuDense {
    fn load(g: &mut GgufFile, gpu: &Gpu, spec: &DenseSpec) -> Result<Self> {
        Ok(Self {
            gate_up: load_linear(g, gpu, &spec.gate_up)?,
            down: load_linear(g, gpu, &spec.down)?,
            ff: spec.down.input,
        })
    }

    fn forward(
        &self,
        cmd: &mut Commands<'_>,
        s: &mut Scratch<'_>,
        (h, total): (&GpuVec, usize),
        act: Activation,
        out: &GpuVec,
    ) -> Result<()> {
        let n = total * self.ff;
        let (gate, up, a) = (s.get("gate", n)?, s.get("up", n)?, s.get("act", n)?);
        self.gate_up.forward(cmd, s, h, total, &[&gate, &up])?;
        gated(cmd, act, &gate, &up, &a)?;
        self.down.forward(cmd, s, &a, total, &[out])
    }
}

/// `y = act(gate) · up`.
fn gated(
    cmd: &mut Commands<'_>,
    act: Activation,
    gate: &GpuVec,
    up: &GpuVec,
    y: &GpuVec,
) -> Result<()> {
    match act {
        Activation::Silu => cmd.swiglu(gate, up, y)?,
        Activation::GeluTanh => cmd.geglu(gate, up, y)?,
        Activation::SwigluOai => cmd.swiglu_oai(gate, up, y)?,
    }
    Ok(())
}

/// A 3-D tensor (`[count, rows, cols]`: experts, or latent attention's heads) uploaded stacked.
pub(super) fn load_stacked_matrix(
    g: &mut GgufFile,
    gpu: &Gpu,
    t: &ExpertTensor,
    count: usize,
) -> Result<GpuMatrix> {
    let raw = g.read_raw(&t.name)?;
    t.check(&raw.dims, count)?;
    let qtype = kernel_qtype(&t.name, raw.ty)?;
    let m = QMatrix::new(qtype, count * t.rows, t.cols, &raw.data)
        .map_err(|e| ModelError::BadInput(format!("{}: {e}", t.name)))?;
    Ok(gpu.upload_experts(&m, count)?)
}

/// An expert tensor (`[count, rows, cols]`) uploaded stacked, with its bias rows.
fn load_stacked(g: &mut GgufFile, gpu: &Gpu, t: &ExpertTensor, count: usize) -> Result<Stacked> {
    let w = load_stacked_matrix(g, gpu, t, count)?;
    let bias = match t.read_bias(g, count)? {
        Some(b) => Some(gpu.upload(&b)?),
        None => None,
    };
    Ok(Stacked { w, bias })
}

impl GpuFfn {
    /// Uploads the feed-forward `spec` names; `arch` names the model in refusals.
    pub(super) fn load(g: &mut GgufFile, gpu: &Gpu, spec: &FfnSpec, arch: &str) -> Result<Self> {
        let m = match spec {
            FfnSpec::Dense(d) => return Ok(Self::Dense(GpuDense::load(g, gpu, d)?)),
            FfnSpec::Moe(m) => m,
        };
        Ok(Self::Moe(Box::new(GpuMoe::load(g, gpu, m, arch)?)))
    }

    /// `out = ffn(h)` for `total` rows of `h`.
    pub(super) fn forward(
        &self,
        cmd: &mut Commands<'_>,
        s: &mut Scratch<'_>,
        h: &GpuVec,
        total: usize,
        act: Activation,
        out: &GpuVec,
    ) -> Result<()> {
        match self {
            Self::Dense(d) => d.forward(cmd, s, (h, total), act, out),
            Self::Moe(m) => m.forward(cmd, s, (h, total), act, out),
        }
    }
}

impl GpuMoe {
    fn load(g: &mut GgufFile, gpu: &Gpu, spec: &MoeSpec, arch: &str) -> Result<Self> {
        let e = spec.experts;
        if e.groups > 32 || (e.groups > 1 && !e.count.is_multiple_of(e.groups)) {
            return Err(ModelError::Unsupported(format!(
                "{} expert groups of {} experts ({arch}) on the GPU (at most 32, dividing the \
                 experts); run this model on the CPU (--device cpu)",
                e.groups, e.count
            )));
        }
        if e.used == 0 || e.used > e.count.min(64) {
            return Err(ModelError::Unsupported(format!(
                "{} of {} experts per token on the GPU (at most 64)",
                e.used, e.count
            )));
        }
        let shared = match &spec.shared {
            Some((ffn, gate)) => {
                let gate = match gate {
                    Some(n) => {
                        let v = read_norm(g, n)?;
                        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                        let m = QMatrix::new(QType::F32, 1, v.len(), &bytes)
                            .map_err(|err| ModelError::BadInput(format!("{}: {err}", n.name)))?;
                        Some(gpu.upload_matrix(&m)?)
                    }
                    None => None,
                };
                Some((GpuDense::load(g, gpu, ffn)?, gate))
            }
            None => None,
        };
        let selection_bias = match &spec.selection_bias {
            Some(n) => Some(gpu.upload(&read_norm(g, n)?)?),
            None => None,
        };
        Ok(Self {
            router: load_linear(g, gpu, &spec.router)?,
            gate: load_stacked(g, gpu, &spec.gate_exps, e.count)?,
            up: load_stacked(g, gpu, &spec.up_exps, e.count)?,
            down: load_stacked(g, gpu, &spec.down_exps, e.count)?,
            shared,
            selection_bias,
            routing: MoeRouting {
                experts: e.count,
                used: e.used,
                gating: match e.routing.gating {
                    Gating::SoftmaxThenTopK => MoeGating::SoftmaxThenTopK,
                    Gating::TopKThenSoftmax => MoeGating::TopKThenSoftmax,
                    Gating::Sigmoid => MoeGating::Sigmoid,
                },
                norm_weights: e.routing.norm_weights,
                scale: e.weights_scale,
                groups: (e.groups, e.groups_used),
            },
            ff: e.ff,
        })
    }

    fn forward(
        &self,
        cmd: &mut Commands<'_>,
        s: &mut Scratch<'_>,
        (h, total): (&GpuVec, usize),
        act: Activation,
        out: &GpuVec,
    ) -> Result<()> {
        let r = self.routing;
        let (k, dim) = (r.used, self.down.w.rows() / r.experts);
        let logits = s.get("router logits", total * r.experts)?;
        self.router.forward(cmd, s, h, total, &[&logits])?;
        let (ids, weights) = (
            s.get("expert ids", total * k)?,
            s.get("expert weights", total * k)?,
        );
        cmd.moe_route(&logits, self.selection_bias.as_ref(), r, &ids, &weights)?;
        let n = total * k * self.ff;
        let (gate, up, a) = (
            s.get("expert gate", n)?,
            s.get("expert up", n)?,
            s.get("expert act", n)?,
        );
        cmd.matvec_id(&self.gate.w, self.gate.bias.as_ref(), h, k, &ids, &gate)?;
        cmd.matvec_id(&self.up.w, self.up.bias.as_ref(), h, k, &ids, &up)?;
        gated(cmd, act, &gate, &up, &a)?;
        let y = s.get("expert out", total * k * dim)?;
        cmd.matvec_id(&self.down.w, self.down.bias.as_ref(), &a, 1, &ids, &y)?;
        let shared = match &self.shared {
            Some((ffn, gate)) => {
                let sh = s.get("shared out", total * dim)?;
                ffn.forward(cmd, s, (h, total), act, &sh)?;
                let logit = match gate {
                    Some(gm) => {
                        let l = s.get("shared gate", total)?;
                        cmd.matmat(gm, h, &l)?;
                        Some(l)
                    }
                    None => None,
                };
                Some((sh, logit))
            }
            None => None,
        };
        let shared = shared.as_ref().map(|(sh, l)| (sh, l.as_ref()));
        cmd.moe_combine(&y, &weights, shared, dim, out)?;
        Ok(())
    }
}
