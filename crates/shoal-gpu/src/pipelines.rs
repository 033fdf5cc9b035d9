//! The WGSL kernels and the key of the per-device pipeline cache.

use std::borrow::Cow;

use shoal_kernels::QType;

const REDUCE: &str = include_str!("kernels/reduce.wgsl");
const MATVEC: &str = include_str!("kernels/matvec.wgsl");
const MATVEC_DIRECT: &str = include_str!("kernels/matvec_direct.wgsl");
const MATVEC_ID: &str = include_str!("kernels/matvec_id.wgsl");
const MOE_ROUTE: &str = include_str!("kernels/moe_route.wgsl");
const MOE_COMBINE: &str = include_str!("kernels/moe_combine.wgsl");
const MATMAT: &str = include_str!("kernels/matmat.wgsl");
const PLAIN: &str = include_str!("kernels/matvec_plain.wgsl");
const BLOCKS: &str = include_str!("kernels/matvec_blocks.wgsl");
const ROWWISE: &str = include_str!("kernels/rowwise.wgsl");
const RMS_NORM: &str = include_str!("kernels/rms_norm.wgsl");
const SWIGLU: &str = include_str!("kernels/swiglu.wgsl");
const ADD: &str = include_str!("kernels/add.wgsl");
const ROPE: &str = include_str!("kernels/rope.wgsl");
const KV_WRITE: &str = include_str!("kernels/kv_write.wgsl");
const ATTENTION: &str = include_str!("kernels/attention.wgsl");
const EMBED: &str = include_str!("kernels/embed.wgsl");
const COPY_ROWS: &str = include_str!("kernels/copy_rows.wgsl");
const GRID: &str = include_str!("kernels/grid.wgsl");
const IQ: &str = include_str!("kernels/matvec_iq.wgsl");

/// One weight format's WGSL (`kernels/matvec_<type>.wgsl`; every format shoal-kernels reads has
/// one): its weight bindings and decode, and whether it is a plain format (`F32`, `F16`, `BF16`:
/// `w4` per vec4) or a block format (`block_dot` and `dequant4` per 32-value unit; the IQ formats
/// and `MXFP4` give `iq_scale` and `iq4` to `matvec_iq.wgsl`, which makes those).
fn format_source(qtype: QType) -> (&'static str, bool) {
    match qtype {
        QType::F32 => (include_str!("kernels/matvec_f32.wgsl"), true),
        QType::F16 => (include_str!("kernels/matvec_f16.wgsl"), true),
        QType::BF16 => (include_str!("kernels/matvec_bf16.wgsl"), true),
        QType::Q8_0 => (include_str!("kernels/matvec_q8_0.wgsl"), false),
        QType::Q4_0 => (include_str!("kernels/matvec_q4_0.wgsl"), false),
        QType::Q4_1 => (include_str!("kernels/matvec_q4_1.wgsl"), false),
        QType::Q5_0 => (include_str!("kernels/matvec_q5_0.wgsl"), false),
        QType::Q5_1 => (include_str!("kernels/matvec_q5_1.wgsl"), false),
        QType::Q2_K => (include_str!("kernels/matvec_q2_k.wgsl"), false),
        QType::Q3_K => (include_str!("kernels/matvec_q3_k.wgsl"), false),
        QType::Q4_K => (include_str!("kernels/matvec_q4_k.wgsl"), false),
        QType::Q5_K => (include_str!("kernels/matvec_q5_k.wgsl"), false),
        QType::Q6_K => (include_str!("kernels/matvec_q6_k.wgsl"), false),
        iq => (crate::iq::format_source(iq), false),
    }
}

/// One compute kernel (a WGSL module with entry point `main`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    /// Matrix-vector product over weights of one format (decode).
    Matvec(QType),
    /// The id-indexed matrix-vector product over stacked experts of one format (`matvec.wgsl` with
    /// `matvec_id.wgsl`'s row locator instead of `matvec_direct.wgsl`'s).
    MatvecId(QType),
    /// Tiled matrix-matrix product over weights of one format (prefill, batches).
    Matmat(QType),
    RmsNorm,
    Swiglu,
    Add,
    Rope,
    KvWrite,
    Attention,
    /// One row of an embedding table of one format, dequantized.
    Embed(QType),
    CopyRows,
    MoeRoute,
    MoeCombine,
}

impl Kernel {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Matvec(_) => "matvec",
            Self::MatvecId(_) => "matvec_id",
            Self::Matmat(_) => "matmat",
            Self::RmsNorm => "rms_norm",
            Self::Swiglu => "swiglu",
            Self::Add => "add",
            Self::Rope => "rope",
            Self::KvWrite => "kv_write",
            Self::Attention => "attention",
            Self::Embed(_) => "embed",
            Self::CopyRows => "copy_rows",
            Self::MoeRoute => "moe_route",
            Self::MoeCombine => "moe_combine",
        }
    }

    /// The module's WGSL: the reduction helpers where it reduces, its frame (`matvec.wgsl` and its
    /// row locator, `matmat.wgsl` or `embed.wgsl`, then `matvec_plain.wgsl` or `matvec_blocks.wgsl` by format; or
    /// `rowwise.wgsl`), then the kernel itself (for a product its format's weight bindings and
    /// decode; for the IQ formats and `MXFP4` after their tables' offsets and `matvec_iq.wgsl`).
    pub(crate) fn source(self) -> Cow<'static, str> {
        let (frame, qtype) = match self {
            Self::Matvec(q) => (
                Cow::Owned(format!("{REDUCE}\n{MATVEC}\n{MATVEC_DIRECT}")),
                q,
            ),
            Self::MatvecId(q) => (Cow::Owned(format!("{REDUCE}\n{MATVEC}\n{MATVEC_ID}")), q),
            Self::Matmat(q) => (Cow::Borrowed(MATMAT), q),
            Self::Embed(q) => (Cow::Owned(format!("{GRID}\n{EMBED}")), q),
            Self::RmsNorm => return Cow::Owned(format!("{REDUCE}\n{ROWWISE}\n{RMS_NORM}")),
            Self::Swiglu => return Cow::Owned(format!("{ROWWISE}\n{SWIGLU}")),
            Self::Add => return Cow::Owned(format!("{ROWWISE}\n{ADD}")),
            Self::Attention => return Cow::Owned(format!("{REDUCE}\n{ATTENTION}")),
            Self::Rope => return Cow::Owned(format!("{GRID}\n{ROPE}")),
            Self::KvWrite => return Cow::Owned(format!("{GRID}\n{KV_WRITE}")),
            Self::CopyRows => return Cow::Owned(format!("{GRID}\n{COPY_ROWS}")),
            Self::MoeRoute => return Cow::Owned(format!("{GRID}\n{MOE_ROUTE}")),
            Self::MoeCombine => return Cow::Owned(format!("{GRID}\n{MOE_COMBINE}")),
        };
        let (format, plain) = format_source(qtype);
        let rows = if plain { PLAIN } else { BLOCKS };
        if qtype.is_iq() {
            let offsets = crate::iq::wgsl_offsets();
            return Cow::Owned(format!("{frame}\n{rows}\n{offsets}\n{IQ}\n{format}"));
        }
        Cow::Owned(format!("{frame}\n{rows}\n{format}"))
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
