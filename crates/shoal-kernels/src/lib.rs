//! shoal-kernels: quantized matrix × activations kernels for GGML block formats.
//!
//! The engine keeps GGUF weight bytes exactly as they are in the file and multiplies them here.
//!
//! Main types and data flow:
//! - [`QType`]: weight formats — `F32`, `Q4_1` (20-byte blocks of 32: f16 `d`, f16 `m`, 16 nibble
//!   bytes) and `Q8_0` (34-byte blocks: f16 `d`, 32 × i8). [`ActType`] is the matching activation
//!   format: `Q8_1` (36-byte blocks: f16 `d`, f16 `s = d·Σq`, 32 × i8) for `Q4_1` weights, `Q8_0`
//!   for `Q8_0` weights, `F32` for `F32` weights — the same pairing ggml uses.
//! - [`QMatrix`]: a borrowed `rows × cols` weight matrix (`rows` = output features `n`, `cols` =
//!   input features `k`), row-major GGML rows.
//! - [`Activations`]: `m` activation rows quantized once into the format the weights need; reusable
//!   across several matmuls that read the same input (Q, K, V; gate and up).
//! - [`matmul`] / [`matmul_quantized`]: `out (m × n) = x (m × k) · Wᵀ`. Weight-stationary: the
//!   weight rows are split into chunks that threads claim dynamically; each chunk's rows are dotted
//!   against all `m` activation rows (4 at a time) so weights stream from memory once per call.
//!   Every output element is computed by exactly one thread with the same instruction sequence, so
//!   results are bitwise independent of the thread count.
//! - [`vec_dot`]: one weight row · one quantized activation row, dispatched to the best
//!   [`Backend`] for this CPU (detected once: AVX-VNNI, AVX2+FMA+F16C, or scalar). The portable
//!   versions live in [`scalar`] and are the reference the SIMD paths are tested against.
//! - [`ThreadPool`]: a small dedicated pool in the style of llama.cpp's: the caller is thread 0,
//!   workers spin briefly on a generation counter and then sleep, so back-to-back matmuls of a
//!   decode step pay ~100 ns of hand-off while an idle server burns no CPU. Any [`Parallel`]
//!   implementation works with [`matmul`]; [`RayonCurrent`] runs on the caller's rayon pool.
//!
//! Everything at the public boundary checks slice lengths and returns [`KernelError`] (or panics
//! with a clear message where documented); the `unsafe` SIMD code is only reached after those
//! checks.

mod acts;
mod backend;
mod error;
mod format;
mod matmul;
mod pool;
mod quant;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use acts::Activations;
pub use backend::{Backend, vec_dot, vec_dot_with};
pub use error::KernelError;
pub use format::{ActType, QK, QType, row_bytes};
pub use matmul::{QMatrix, matmul, matmul_quantized, matmul_quantized_with};
pub use pool::{Parallel, RayonCurrent, ThreadPool};
pub use quant::{dequantize_row, quantize_row_q4_1, quantize_row_q8_0, quantize_row_q8_1};
