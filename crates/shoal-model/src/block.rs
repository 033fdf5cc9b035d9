//! What a decoder stage reads from a GGUF file, described once for every loader (the CPU's
//! [`crate::DecoderStage`] and the GPU's [`crate::gpu::GpuDecoderStage`]): [`BlockSpec`] names one
//! layer's tensors (which optional parts the file has, how the matrices are split or fused, the
//! shape each must have), [`StageSpec`] the stage's ends (embedding, final norm, output head or
//! the tied embedding) and its rotary embeddings. Loaders read the names, upload or pack the
//! tensors as they like, and check the shapes with [`MatrixSpec::check`] and [`read_norm`].
//! A layer's feed-forward is [`FfnSpec`]: dense (`[gate | up]`, `down`) or a mixture of experts
//! ([`MoeSpec`]: the router, the three 3-D expert tensors, an optional gated shared expert). Biases
//! (Q/K/V/O, the router's, each expert's rows of `ffn_*_exps.bias`) and attention sinks are used when
//! the file has them (gpt-oss). A latent-attention layer (deepseek2) reads `[q_a | kv_a]` (or
//! `[q | kv_a]`) as its `qkv` and the rest of its attention from [`MlaSpec`].

use crate::config::{Experts, LayerRange, Mla, ModelConfig};
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, names};
use crate::ops::RopeSpec;

/// One weight tensor of a [`MatrixSpec`], and its bias when the file has one.
#[derive(Debug, Clone)]
pub struct PartSpec {
    pub weight: String,
    pub bias: Option<String>,
}

/// Matrices reading one input whose outputs sit side by side (`[q | k | v]`, `[gate | up]`): the
/// parts in output order, and the shape the whole must have.
#[derive(Debug, Clone)]
pub struct MatrixSpec {
    pub parts: Vec<PartSpec>,
    /// The name errors report.
    pub name: String,
    /// Output features of all parts together.
    pub out: usize,
    /// Input features.
    pub input: usize,
}

impl MatrixSpec {
    fn new(
        g: &GgufFile,
        name: String,
        weights: &[(String, Option<String>)],
        out: usize,
        input: usize,
    ) -> Self {
        let parts = weights
            .iter()
            .map(|(w, b)| PartSpec {
                weight: w.clone(),
                bias: b.clone().filter(|b| g.has_tensor(b)),
            })
            .collect();
        Self {
            parts,
            name,
            out,
            input,
        }
    }

    /// Checks a loaded matrix of `out × input`.
    pub fn check(&self, out: usize, input: usize) -> Result<()> {
        if out != self.out || input != self.input {
            return Err(ModelError::BadShape {
                name: self.name.clone(),
                got: vec![out, input],
                expected: vec![self.out, self.input],
            });
        }
        Ok(())
    }
}

/// A norm weight vector: its name and length.
#[derive(Debug, Clone)]
pub struct NormSpec {
    pub name: String,
    pub len: usize,
}

/// One decoder layer's tensors: `x += post_norm(attn(norm(x)))`, `x += post_norm(ffn(norm(x)))`.
#[derive(Debug, Clone)]
pub struct BlockSpec {
    pub attn_norm: NormSpec,
    /// Outputs `[q | k | v]`: one fused tensor or three (latent attention: `[q_a | kv_a]`).
    pub qkv: MatrixSpec,
    /// Latent attention's other tensors (deepseek2), when the model has it.
    pub mla: Option<MlaSpec>,
    /// Per-head Q/K norms (Qwen 3, Gemma 3), when the file has them.
    pub q_norm: Option<NormSpec>,
    pub k_norm: Option<NormSpec>,
    pub wo: MatrixSpec,
    /// Attention sinks (`attn_sinks`, one logit per query head: gpt-oss), when the file has them.
    pub sinks: Option<NormSpec>,
    pub post_attn_norm: Option<NormSpec>,
    pub ffn_norm: NormSpec,
    pub ffn: FfnSpec,
    pub post_ffn_norm: Option<NormSpec>,
    /// A sliding-window layer.
    pub local: bool,
}

/// Multi-head latent attention's tensors besides `[q_a | kv_a]` and the output (decision 022).
#[derive(Debug, Clone)]
pub struct MlaSpec {
    /// `attn_q_a_norm` and `attn_q_b` (`heads·(nope + rope) × q_lora`), when queries pass the bottleneck.
    pub q_b: Option<(NormSpec, MatrixSpec)>,
    /// `attn_kv_a_norm`, over the latent.
    pub kv_a_norm: NormSpec,
    /// `attn_k_b`: per head a `kv_lora × nope` matrix taking a query's unrotated part into the latent.
    pub k_b: ExpertTensor,
    /// `attn_v_b`: per head a `v_head × kv_lora` matrix taking the attended latent to the head's values.
    pub v_b: ExpertTensor,
    /// Files of the older layout: `attn_kv_b` (`heads·(nope + v_head) × kv_lora`, per head the keys' rows
    /// then the values'), split at load into `k_b` (transposed) and `v_b`; `None` when the file has
    /// `attn_k_b`.
    pub kv_b: Option<MatrixSpec>,
    pub shape: Mla,
}

/// A layer's feed-forward.
#[derive(Debug, Clone)]
pub enum FfnSpec {
    Dense(DenseSpec),
    Moe(Box<MoeSpec>),
}

/// `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone)]
pub struct DenseSpec {
    /// Outputs `[gate | up]`: two tensors, or Phi-3's one with both stacked.
    pub gate_up: MatrixSpec,
    pub down: MatrixSpec,
}

/// One 3-D tensor holding every routed expert's matrix (`[count, rows, cols]` row-major: `count`
/// contiguous `rows × cols` matrices), and the 2-D `[count, rows]` bias beside it when the file has one.
#[derive(Debug, Clone)]
pub struct ExpertTensor {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub bias: Option<String>,
}

impl ExpertTensor {
    /// The `[count, rows]` bias beside the tensor (row `e` expert `e`'s), when the file has one.
    pub fn read_bias(&self, g: &mut GgufFile, count: usize) -> Result<Option<Vec<f32>>> {
        let Some(name) = &self.bias else {
            return Ok(None);
        };
        let b = g.read_f32_vec(name)?;
        if b.len() != count * self.rows {
            return Err(ModelError::BadShape {
                name: name.clone(),
                got: vec![b.len()],
                expected: vec![count, self.rows],
            });
        }
        Ok(Some(b))
    }

    /// Checks a tensor's row-major dims against `[count, rows, cols]`.
    pub fn check(&self, dims: &[usize], count: usize) -> Result<()> {
        let expected = vec![count, self.rows, self.cols];
        if dims != expected {
            return Err(ModelError::BadShape {
                name: self.name.clone(),
                got: dims.to_vec(),
                expected,
            });
        }
        Ok(())
    }
}

/// A mixture-of-experts feed-forward: `Σ_top-k w_e · expert_e(x)` (+ `sigmoid(g · x) · shared(x)`).
#[derive(Debug, Clone)]
pub struct MoeSpec {
    /// `ffn_gate_inp`: the router, `count × dim`.
    pub router: MatrixSpec,
    pub gate_exps: ExpertTensor,
    pub up_exps: ExpertTensor,
    pub down_exps: ExpertTensor,
    /// The shared expert and its gate vector (`ffn_gate_inp_shexp`; none: added ungated, GLM-4.5), when
    /// the file has them.
    pub shared: Option<(DenseSpec, Option<NormSpec>)>,
    /// The per-expert bias added to the scores only to choose the top k (`exp_probs_b`: GLM-4.5).
    pub selection_bias: Option<NormSpec>,
    pub experts: Experts,
}

fn norm(name: String, len: usize) -> NormSpec {
    NormSpec { name, len }
}

fn opt_norm(g: &GgufFile, name: String, len: usize) -> Option<NormSpec> {
    g.has_tensor(&name).then(|| norm(name, len))
}

impl BlockSpec {
    /// Layer `i`'s tensors in `g`.
    pub fn describe(g: &GgufFile, cfg: &ModelConfig, i: usize) -> Self {
        let (dim, hd) = (cfg.dim, cfg.head_dim);
        let (qd, kvd) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
        let w = |p: &str| names::blk(i, p);
        let wb = |p: &str| (w(p), Some(names::blk_bias(i, p)));
        let plain = |p: &str| (w(p), None);
        let family = cfg.arch.arch.family();
        let qkv_parts: Vec<_> = if let Some(mla) = cfg.arch.mla {
            let q = if mla.q_lora > 0 { "attn_q_a" } else { "attn_q" };
            vec![plain(q), plain("attn_kv_a_mqa")]
        } else if g.has_tensor(&w("attn_qkv")) {
            vec![wb("attn_qkv")]
        } else {
            ["attn_q", "attn_k", "attn_v"].map(wb).to_vec()
        };
        let m = |name: &str, parts: &[(String, Option<String>)], out, input| {
            MatrixSpec::new(g, w(name), parts, out, input)
        };
        let (qkv_out, attn_out) = match cfg.arch.mla {
            Some(a) => {
                let q = match a.q_lora {
                    0 => cfg.n_heads * (a.nope + a.rope),
                    r => r,
                };
                (q + a.kv_lora + a.rope, cfg.n_heads * a.v_head)
            }
            None => (qd + 2 * kvd, qd),
        };
        let ffn = match cfg.arch.experts.filter(|e| i >= e.leading_dense) {
            Some(experts) => FfnSpec::Moe(Box::new(MoeSpec::describe(g, cfg, i, experts))),
            None => {
                let gate_up_parts: Vec<_> = if g.has_tensor(&w("ffn_gate")) {
                    vec![plain("ffn_gate"), plain("ffn_up")]
                } else {
                    // Phi-3: `ffn_up` holds gate and up stacked.
                    vec![plain("ffn_up")]
                };
                FfnSpec::Dense(DenseSpec {
                    gate_up: m("ffn_up", &gate_up_parts, 2 * cfg.ffn_dim, dim),
                    down: m("ffn_down", &[plain("ffn_down")], dim, cfg.ffn_dim),
                })
            }
        };
        Self {
            attn_norm: norm(w("attn_norm"), dim),
            qkv: m("attn_qkv", &qkv_parts, qkv_out, dim),
            mla: cfg.arch.mla.map(|a| MlaSpec::describe(g, cfg, i, a)),
            q_norm: opt_norm(g, w("attn_q_norm"), hd),
            k_norm: opt_norm(g, w("attn_k_norm"), hd),
            wo: m("attn_output", &[wb("attn_output")], dim, attn_out),
            sinks: opt_norm(g, w("attn_sinks"), cfg.n_heads),
            // gpt-oss's pre-FFN norm is named `post_attention_norm`: then it is not a post norm.
            post_attn_norm: opt_norm(g, w("post_attention_norm"), dim)
                .filter(|_| family.ffn_norm != "post_attention_norm"),
            ffn_norm: norm(w(family.ffn_norm), dim),
            ffn,
            post_ffn_norm: opt_norm(g, w("post_ffw_norm"), dim),
            local: cfg.arch.local_layers.get(i).copied().unwrap_or(false),
        }
    }
}

impl MlaSpec {
    /// Layer `i`'s latent attention in `g`.
    fn describe(g: &GgufFile, cfg: &ModelConfig, i: usize, a: Mla) -> Self {
        let w = |p: &str| names::blk(i, p);
        let per_head = |p: &str, rows, cols| ExpertTensor {
            name: w(p),
            rows,
            cols,
            bias: None,
        };
        let q_out = cfg.n_heads * (a.nope + a.rope);
        Self {
            q_b: (a.q_lora > 0).then(|| {
                let q_b =
                    MatrixSpec::new(g, w("attn_q_b"), &[(w("attn_q_b"), None)], q_out, a.q_lora);
                (norm(w("attn_q_a_norm"), a.q_lora), q_b)
            }),
            kv_a_norm: norm(w("attn_kv_a_norm"), a.kv_lora),
            k_b: per_head("attn_k_b", a.kv_lora, a.nope),
            v_b: per_head("attn_v_b", a.v_head, a.kv_lora),
            kv_b: (!g.has_tensor(&w("attn_k_b")) && g.has_tensor(&w("attn_kv_b"))).then(|| {
                let rows = cfg.n_heads * (a.nope + a.v_head);
                let name = w("attn_kv_b");
                MatrixSpec::new(g, name.clone(), &[(name, None)], rows, a.kv_lora)
            }),
            shape: a,
        }
    }
}

impl MoeSpec {
    /// Layer `i`'s experts in `g`.
    fn describe(g: &GgufFile, cfg: &ModelConfig, i: usize, experts: Experts) -> Self {
        let (dim, ff) = (cfg.dim, experts.ff);
        let w = |p: &str| names::blk(i, p);
        let expert = |p: &str, rows, cols| ExpertTensor {
            name: w(p),
            rows,
            cols,
            bias: Some(names::blk_bias(i, p)).filter(|b| g.has_tensor(b)),
        };
        let shared = g.has_tensor(&w("ffn_gate_shexp")).then(|| {
            let sff = experts.shared_ff;
            let parts = [(w("ffn_gate_shexp"), None), (w("ffn_up_shexp"), None)];
            let ffn = DenseSpec {
                gate_up: MatrixSpec::new(g, w("ffn_up_shexp"), &parts, 2 * sff, dim),
                down: MatrixSpec::new(
                    g,
                    w("ffn_down_shexp"),
                    &[(w("ffn_down_shexp"), None)],
                    dim,
                    sff,
                ),
            };
            (ffn, opt_norm(g, w("ffn_gate_inp_shexp"), dim))
        });
        Self {
            router: MatrixSpec::new(
                g,
                w("ffn_gate_inp"),
                &[(w("ffn_gate_inp"), Some(names::blk_bias(i, "ffn_gate_inp")))],
                experts.count,
                dim,
            ),
            gate_exps: expert("ffn_gate_exps", ff, dim),
            up_exps: expert("ffn_up_exps", ff, dim),
            down_exps: expert("ffn_down_exps", dim, ff),
            shared,
            selection_bias: opt_norm(g, names::blk_bias(i, "exp_probs_b"), experts.count),
            experts,
        }
    }
}

/// Reads a norm's F32 vector, checking its length.
pub fn read_norm(g: &mut GgufFile, spec: &NormSpec) -> Result<Vec<f32>> {
    let v = g.read_f32_vec(&spec.name)?;
    if v.len() != spec.len {
        return Err(ModelError::BadShape {
            name: spec.name.clone(),
            got: vec![v.len()],
            expected: vec![spec.len],
        });
    }
    Ok(v)
}

/// [`read_norm`] of a norm the file may lack.
pub fn read_opt_norm(g: &mut GgufFile, spec: &Option<NormSpec>) -> Result<Option<Vec<f32>>> {
    spec.as_ref().map(|s| read_norm(g, s)).transpose()
}

/// A stage's ends and its rotary embeddings.
#[derive(Debug, Clone)]
pub struct StageSpec {
    pub range: LayerRange,
    /// The token embedding is needed: on the first stage, or as the head on a last stage whose
    /// file ties them.
    pub embedding: bool,
    /// The stage looks tokens up (the first stage).
    pub first: bool,
    /// The final norm and head (the last stage), and whether the head is the tied embedding.
    pub last: Option<Head>,
    pub blocks: Vec<BlockSpec>,
    /// Rotary embedding of the global layers, and of the sliding-window ones.
    pub rope_global: RopeSpec,
    pub rope_local: RopeSpec,
}

/// The last stage's final norm and output head.
#[derive(Debug, Clone)]
pub struct Head {
    pub norm: NormSpec,
    /// `output.weight` is absent: the head is the token embedding.
    pub tied: bool,
}

impl StageSpec {
    /// Layers `range` of `cfg`'s model in `g` (the range checked), reading only the rotary
    /// embedding's frequency factors.
    pub fn describe(g: &mut GgufFile, cfg: &ModelConfig, range: LayerRange) -> Result<Self> {
        let range = LayerRange::new(range.start, range.end, cfg.n_layers)?;
        let first = range.is_first();
        let tied = !g.has_tensor(names::OUTPUT);
        let last = range.is_last(cfg.n_layers).then(|| Head {
            norm: norm(names::OUTPUT_NORM.into(), cfg.dim),
            tied,
        });
        let (rope_global, rope_local) = rope_specs(g, cfg)?;
        Ok(Self {
            embedding: first || last.as_ref().is_some_and(|h| h.tied),
            first,
            last,
            blocks: (range.start..range.end)
                .map(|i| BlockSpec::describe(g, cfg, i))
                .collect(),
            range,
            rope_global,
            rope_local,
        })
    }
}

/// The global and the local (sliding-window layers') rotary embeddings.
fn rope_specs(g: &mut GgufFile, cfg: &ModelConfig) -> Result<(RopeSpec, RopeSpec)> {
    let factors = match () {
        _ if g.has_tensor(names::ROPE_FREQS) => Some(g.read_f32_vec(names::ROPE_FREQS)?),
        _ if g.has_tensor(names::ROPE_FACTORS_SHORT) => {
            Some(g.read_f32_vec(names::ROPE_FACTORS_SHORT)?)
        }
        _ => None,
    };
    let a = &cfg.arch;
    if let Some(f) = &factors
        && f.len() != a.rope_dims / 2
    {
        return Err(ModelError::BadShape {
            name: names::ROPE_FREQS.into(),
            got: vec![f.len()],
            expected: vec![a.rope_dims / 2],
        });
    }
    let global = RopeSpec {
        style: a.rope,
        dims: a.rope_dims,
        theta: cfg.rope_theta,
        freq_scale: a.rope_freq_scale,
        factors,
        yarn: a.yarn,
    };
    let local = match a.local_rope_theta {
        Some(theta) => RopeSpec {
            theta,
            freq_scale: 1.0,
            factors: None,
            yarn: None,
            ..global.clone()
        },
        None => global.clone(),
    };
    Ok((global, local))
}
