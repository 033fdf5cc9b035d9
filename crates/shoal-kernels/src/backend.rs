//! Instruction-set backends, their one-time runtime detection, and the dispatch to them.
//!
//! This is the top of the kernel layers: [`Backend`]'s methods and [`vec_dot`] call down into
//! `x86` (and `x86::avx512`), `arm` (NEON, on aarch64) or `scalar`, which never call back up.

use std::sync::OnceLock;

use crate::format::{Layout, QType};
use crate::gemm::Gemm;
use crate::scalar;

/// An implementation of the kernels for one instruction set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Portable Rust, the reference.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C (ggml's AVX2 path).
    Avx2,
    /// AVX2 plus AVX-VNNI `vpdpbusd` for the 8-bit products.
    AvxVnni,
    /// AVX-512 VNNI on weights repacked into 16-row groups ([`crate::PackedMatrix`]), and 512-bit
    /// kernels of the IQ formats and `MXFP4` on GGUF rows; the other formats' plain GGML rows and
    /// single dot products run the `AvxVnni` kernels.
    Avx512Vnni,
    /// aarch64 NEON (Advanced SIMD), every ARMv8-A CPU: 8-bit products with `smull` + `sadalp`.
    Neon,
    /// NEON plus the `dotprod` extension (`sdot`: four 8-bit products per 32-bit lane), ARMv8.2+
    /// (Apple M1 and later, Cortex-A55/A76 and later, Neoverse).
    NeonDot,
    /// `NeonDot` plus the `i8mm` extension (`smmla`: 2 × 8 by 8 × 2 products), ARMv8.6 (Apple M2
    /// and later, Neoverse V1/N2, Graviton 3): the 32-value formats' matmul on pairs of weight
    /// rows × pairs of activation rows; everything else as `NeonDot`.
    NeonI8mm,
}

/// The cached detection result; the only global state of the crate.
static DETECTED: OnceLock<Backend> = OnceLock::new();

impl Backend {
    /// The best backend this CPU supports, detected on first use and cached.
    ///
    /// The environment variable `SHOAL_KERNEL_BACKEND` (`scalar`, `avx2`, `avxvnni`,
    /// `avx512vnni`, `neon`, `neondot`, `neoni8mm`), read once,
    /// can force a slower backend for comparisons; an unsupported choice is ignored.
    pub fn detect() -> Backend {
        *DETECTED.get_or_init(|| {
            let best = Self::all()
                .into_iter()
                .rev()
                .find(|b| b.is_supported())
                .unwrap_or(Backend::Scalar);
            let forced =
                std::env::var("SHOAL_KERNEL_BACKEND")
                    .ok()
                    .and_then(|v| match v.as_str() {
                        "scalar" => Some(Backend::Scalar),
                        "avx2" => Some(Backend::Avx2),
                        "avxvnni" => Some(Backend::AvxVnni),
                        "avx512vnni" => Some(Backend::Avx512Vnni),
                        "neon" => Some(Backend::Neon),
                        "neondot" => Some(Backend::NeonDot),
                        "neoni8mm" => Some(Backend::NeonI8mm),
                        _ => None,
                    });
            forced.filter(|b| b.is_supported()).unwrap_or(best)
        })
    }

    /// Every backend, slowest first within each architecture (a CPU supports only one
    /// architecture's, so [`Backend::detect`]'s "last supported" is the best).
    pub fn all() -> [Backend; 7] {
        [
            Backend::Scalar,
            Backend::Avx2,
            Backend::AvxVnni,
            Backend::Avx512Vnni,
            Backend::Neon,
            Backend::NeonDot,
            Backend::NeonI8mm,
        ]
    }

    /// The backends this CPU can run.
    pub fn supported() -> Vec<Backend> {
        Self::all()
            .into_iter()
            .filter(|b| b.is_supported())
            .collect()
    }

    /// Whether this CPU can run the backend.
    pub fn is_supported(self) -> bool {
        match self {
            Backend::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => crate::x86::has_avx2(),
            #[cfg(target_arch = "x86_64")]
            Backend::AvxVnni => crate::x86::has_vnni(),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512Vnni => crate::x86::avx512::has_avx512_vnni(),
            #[cfg(not(target_arch = "x86_64"))]
            Backend::Avx2 | Backend::AvxVnni | Backend::Avx512Vnni => false,
            #[cfg(target_arch = "aarch64")]
            Backend::Neon => crate::arm::has_neon(),
            #[cfg(target_arch = "aarch64")]
            Backend::NeonDot => crate::arm::has_dotprod(),
            #[cfg(target_arch = "aarch64")]
            Backend::NeonI8mm => crate::arm::has_i8mm(),
            #[cfg(not(target_arch = "aarch64"))]
            Backend::Neon | Backend::NeonDot | Backend::NeonI8mm => false,
        }
    }

    /// A short name for logs and benchmarks.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Scalar => "scalar",
            Backend::Avx2 => "avx2",
            Backend::AvxVnni => "avxvnni",
            Backend::Avx512Vnni => "avx512vnni",
            Backend::Neon => "neon",
            Backend::NeonDot => "neondot",
            Backend::NeonI8mm => "neoni8mm",
        }
    }

    /// Falls back to `Scalar` if this CPU cannot run `self`, so callers may pass any variant.
    pub(crate) fn usable(self) -> Backend {
        if self.is_supported() {
            self
        } else {
            Backend::Scalar
        }
    }

    /// Quantizes `x` (32 · nb values) to i8 quants in `qs` (32 · nb bytes) with the ggml Q8 rule,
    /// returning each block's unrounded scale `d` and quant sum in `ds` (nb entries).
    ///
    /// # Panics
    /// If the lengths disagree.
    pub(crate) fn quantize_q8(self, x: &[f32], qs: &mut [u8], ds: &mut [(f32, i32)]) {
        match self.usable() {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 | Backend::AvxVnni | Backend::Avx512Vnni => {
                crate::x86::quantize_q8(x, qs, ds)
            }
            #[cfg(target_arch = "aarch64")]
            Backend::Neon | Backend::NeonDot | Backend::NeonI8mm => {
                crate::arm::quantize_q8(x, qs, ds)
            }
            _ => scalar::quantize_q8(x, qs, ds),
        }
    }

    /// Quantizes `x` (256 · nb values) into `Q8_K` blocks: quants in `qs`, each block's scale in
    /// `d` (nb entries) and its 16 sums of 16 quants in `bsums` (16 · nb entries).
    ///
    /// # Panics
    /// If the lengths disagree.
    pub(crate) fn quantize_q8k(self, x: &[f32], qs: &mut [u8], d: &mut [f32], bsums: &mut [i16]) {
        match self.usable() {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 | Backend::AvxVnni | Backend::Avx512Vnni => {
                crate::x86::quantize_q8k(x, qs, d, bsums)
            }
            #[cfg(target_arch = "aarch64")]
            Backend::Neon | Backend::NeonDot | Backend::NeonI8mm => {
                crate::arm::quantize_q8k(x, qs, d, bsums)
            }
            _ => scalar::quantize_q8k(x, qs, d, bsums),
        }
    }

    /// Computes the outputs of weight rows `rows` for every activation row of `g`.
    ///
    /// # Panics
    /// If `g` is in the 16-row layout and this backend is not AVX-512 VNNI (a [`crate::PackedMatrix`]
    /// only uses that layout with it).
    pub(crate) fn gemm_rows(self, g: &Gemm<'_>, rows: std::ops::Range<usize>) {
        match (self.usable(), g.layout) {
            #[cfg(target_arch = "x86_64")]
            (Backend::Avx512Vnni, Layout::Rows16) => crate::x86::avx512::gemm_rows(g, rows),
            (_, Layout::Rows16) => panic!("16-row weight groups need the AVX-512 VNNI backend"),
            #[cfg(target_arch = "x86_64")]
            (Backend::Avx2, _) => crate::x86::gemm_rows(false, g, rows),
            #[cfg(target_arch = "x86_64")]
            (Backend::AvxVnni, _) => crate::x86::gemm_rows(true, g, rows),
            #[cfg(target_arch = "x86_64")]
            (Backend::Avx512Vnni, _) => crate::x86::gemm_rows_512(g, rows),
            #[cfg(target_arch = "aarch64")]
            (Backend::Neon, _) => crate::arm::gemm_rows(crate::arm::Level::Neon, g, rows),
            #[cfg(target_arch = "aarch64")]
            (Backend::NeonDot, _) => crate::arm::gemm_rows(crate::arm::Level::Dot, g, rows),
            #[cfg(target_arch = "aarch64")]
            (Backend::NeonI8mm, _) => crate::arm::gemm_rows(crate::arm::Level::I8mm, g, rows),
            _ => scalar::gemm_rows(g, rows),
        }
    }
}

/// One weight row · one activation row (`x_q` in `qtype.act_type()`), on the detected backend.
///
/// # Panics
/// If `k` is not a multiple of the block size or the slice lengths do not match `k`.
pub fn vec_dot(qtype: QType, k: usize, w_row: &[u8], x_q: &[u8]) -> f32 {
    vec_dot_with(Backend::detect(), qtype, k, w_row, x_q)
}

/// [`vec_dot`] on a chosen backend (`Scalar` if this CPU cannot run it).
///
/// # Panics
/// If `k` is not a multiple of the block size or the slice lengths do not match `k`.
pub fn vec_dot_with(backend: Backend, qtype: QType, k: usize, w_row: &[u8], x_q: &[u8]) -> f32 {
    let (wb, xb) = match (qtype.try_row_bytes(k), qtype.act_type().try_row_bytes(k)) {
        (Ok(w), Ok(x)) => (w, x),
        (Err(e), _) | (_, Err(e)) => panic!("shoal_kernels::vec_dot: {e}"),
    };
    assert!(
        w_row.len() == wb && x_q.len() == xb,
        "shoal_kernels::vec_dot: {} {} bytes and {} {} bytes for k = {k}, expected {wb} and {xb}",
        w_row.len(),
        qtype.name(),
        x_q.len(),
        qtype.act_type().name(),
    );
    match backend.usable() {
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => crate::x86::vec_dot(false, qtype, k, w_row, x_q),
        #[cfg(target_arch = "x86_64")]
        Backend::AvxVnni => crate::x86::vec_dot(true, qtype, k, w_row, x_q),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512Vnni => crate::x86::vec_dot_512(qtype, k, w_row, x_q),
        #[cfg(target_arch = "aarch64")]
        Backend::Neon => crate::arm::vec_dot(crate::arm::Level::Neon, qtype, k, w_row, x_q),
        #[cfg(target_arch = "aarch64")]
        Backend::NeonDot => crate::arm::vec_dot(crate::arm::Level::Dot, qtype, k, w_row, x_q),
        #[cfg(target_arch = "aarch64")]
        Backend::NeonI8mm => crate::arm::vec_dot(crate::arm::Level::I8mm, qtype, k, w_row, x_q),
        _ => scalar::vec_dot(qtype, k, w_row, x_q),
    }
}
