//! The WGSL kernels and the key of the per-device pipeline cache.

use std::borrow::Cow;

const REDUCE: &str = include_str!("kernels/reduce.wgsl");
const MATVEC: &str = include_str!("kernels/matvec.wgsl");
const MATVEC_F32: &str = include_str!("kernels/matvec_f32.wgsl");
const MATVEC_F16: &str = include_str!("kernels/matvec_f16.wgsl");
const MATVEC_Q8_0: &str = include_str!("kernels/matvec_q8_0.wgsl");
const MATVEC_Q4_0: &str = include_str!("kernels/matvec_q4_0.wgsl");
const MATVEC_BLOCKS: &str = include_str!("kernels/matvec_blocks.wgsl");
const MATVEC_Q4_1: &str = include_str!("kernels/matvec_q4_1.wgsl");
const MATVEC_Q5_0: &str = include_str!("kernels/matvec_q5_0.wgsl");
const MATVEC_Q5_1: &str = include_str!("kernels/matvec_q5_1.wgsl");
const MATVEC_Q4_K: &str = include_str!("kernels/matvec_q4_k.wgsl");
const MATVEC_Q6_K: &str = include_str!("kernels/matvec_q6_k.wgsl");
const ROWWISE: &str = include_str!("kernels/rowwise.wgsl");
const RMS_NORM: &str = include_str!("kernels/rms_norm.wgsl");
const SWIGLU: &str = include_str!("kernels/swiglu.wgsl");
const ADD: &str = include_str!("kernels/add.wgsl");
const ROPE: &str = include_str!("kernels/rope.wgsl");
const KV_WRITE: &str = include_str!("kernels/kv_write.wgsl");
const ATTENTION: &str = include_str!("kernels/attention.wgsl");
const EMBED: &str = include_str!("kernels/embed.wgsl");
const GRID: &str = include_str!("kernels/grid.wgsl");

/// One compute kernel (a WGSL module with entry point `main`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    MatvecF32,
    MatvecF16,
    MatvecQ8_0,
    MatvecQ4_0,
    MatvecQ4_1,
    MatvecQ5_0,
    MatvecQ5_1,
    MatvecQ4K,
    MatvecQ6K,
    RmsNorm,
    Swiglu,
    Add,
    Rope,
    KvWrite,
    Attention,
    Embed,
}

impl Kernel {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::MatvecF32 => "matvec_f32",
            Self::MatvecF16 => "matvec_f16",
            Self::MatvecQ8_0 => "matvec_q8_0",
            Self::MatvecQ4_0 => "matvec_q4_0",
            Self::MatvecQ4_1 => "matvec_q4_1",
            Self::MatvecQ5_0 => "matvec_q5_0",
            Self::MatvecQ5_1 => "matvec_q5_1",
            Self::MatvecQ4K => "matvec_q4_k",
            Self::MatvecQ6K => "matvec_q6_k",
            Self::RmsNorm => "rms_norm",
            Self::Swiglu => "swiglu",
            Self::Add => "add",
            Self::Rope => "rope",
            Self::KvWrite => "kv_write",
            Self::Attention => "attention",
            Self::Embed => "embed",
        }
    }

    /// The module's WGSL: the reduction helpers where it reduces, its frame (`matvec.wgsl`, plus
    /// `matvec_blocks.wgsl` for the block formats, or `rowwise.wgsl`), then the kernel itself (for
    /// a matrix-vector product its format's weight bindings and `row_dot` or `block_dot`).
    pub(crate) fn source(self) -> Cow<'static, str> {
        let format = match self {
            Self::MatvecF32 => return Cow::Owned(format!("{REDUCE}\n{MATVEC}\n{MATVEC_F32}")),
            Self::MatvecF16 => return Cow::Owned(format!("{REDUCE}\n{MATVEC}\n{MATVEC_F16}")),
            Self::MatvecQ8_0 => MATVEC_Q8_0,
            Self::MatvecQ4_0 => MATVEC_Q4_0,
            Self::MatvecQ4_1 => MATVEC_Q4_1,
            Self::MatvecQ5_0 => MATVEC_Q5_0,
            Self::MatvecQ5_1 => MATVEC_Q5_1,
            Self::MatvecQ4K => MATVEC_Q4_K,
            Self::MatvecQ6K => MATVEC_Q6_K,
            Self::RmsNorm => return Cow::Owned(format!("{REDUCE}\n{ROWWISE}\n{RMS_NORM}")),
            Self::Swiglu => return Cow::Owned(format!("{ROWWISE}\n{SWIGLU}")),
            Self::Add => return Cow::Owned(format!("{ROWWISE}\n{ADD}")),
            Self::Attention => return Cow::Owned(format!("{REDUCE}\n{ATTENTION}")),
            Self::Rope => return Cow::Owned(format!("{GRID}\n{ROPE}")),
            Self::KvWrite => return Cow::Owned(format!("{GRID}\n{KV_WRITE}")),
            Self::Embed => return Cow::Owned(format!("{GRID}\n{EMBED}")),
        };
        Cow::Owned(format!("{REDUCE}\n{MATVEC}\n{MATVEC_BLOCKS}\n{format}"))
    }
}

/// A kernel and its override constants (sorted by name).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PipelineKey {
    kernel: Kernel,
    constants: Vec<(&'static str, u32)>,
}

impl PipelineKey {
    pub(crate) fn new(kernel: Kernel, constants: &[(&'static str, u32)]) -> Self {
        let mut constants = constants.to_vec();
        constants.sort_unstable();
        Self { kernel, constants }
    }
}
