//! shoal-kernels: quantized matrix × activations kernels for GGML block formats.
//!
//! The engine keeps GGUF weight bytes exactly as they are in the file and multiplies them here.
//!
//! Main types and data flow:
//! - [`QType`]: weight formats, with ggml's type ids and block layouts (described in `format`):
//!   `F32`, `F16`, `BF16`; the 32-value formats `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0`; the
//!   K-quants `Q2_K`, `Q3_K`, `Q4_K`, `Q5_K`, `Q6_K` (256-value super-blocks: a row's length
//!   must be a multiple of 256, else [`KernelError::BadRowLength`]); and [`QType::IQ`]: `IQ4_NL`
//!   and `MXFP4` (32-value blocks) and `IQ4_XS`, `IQ3_S`, `IQ3_XXS`, `IQ2_XXS`, `IQ2_XS`,
//!   `IQ2_S`, `IQ1_S`, `IQ1_M` (256-value super-blocks). [`ActType`] is the matching
//!   activation format, paired as ggml pairs them: `Q8_0` (f16 `d`, 32 × i8) for `Q4_0`, `Q5_0`,
//!   `Q8_0`, `IQ4_NL`, `MXFP4`; `Q8_1` (plus f16 `s = d·Σq`) for `Q4_1`, `Q5_1`; `Q8_K` (f32 `d`
//!   per 256 values, sums of 16 quants) for the K-quants and the 256-value IQ formats; `F32` (the
//!   input as it is) for `F32`, `F16`, `BF16`.
//! - [`QMatrix`]: a borrowed `rows × cols` weight matrix (`rows` = output features `n`, `cols` =
//!   input features `k`), row-major GGML rows.
//! - [`Activations`]: `m` activation rows quantized once into the format the weights need (the
//!   same quants and scales as ggml's blocks, laid out for the kernels: quants per row, f32
//!   scales interleaved for groups of four rows, and for `Q8_K` the sums of each 16 quants).
//!   Reusable across several matmuls that read the same input (fused or separate Q/K/V,
//!   gate/up); [`Activations::ggml_row`] gives a row back as ggml bytes.
//! - [`matmul`] / [`matmul_quantized`]: `out (m × n) = x (m × k) · Wᵀ`. Weight-stationary: the
//!   weight rows are split into chunks that threads claim dynamically; each chunk's rows are dotted
//!   against all `m` activation rows (four at a time, decoding each weight block once) so weights
//!   stream from memory once per call, with software prefetch a few KB ahead. Every output
//!   element is computed by exactly one thread with the same instruction sequence, and the
//!   four-row kernel performs the same floating-point operations as the one-row kernel, so results
//!   are bitwise independent of the thread count and of a row's position in the batch.
//!   The SIMD kernels are one body per family with a small per-format decode: the 32-value
//!   formats as `d·q + m` (unsigned quants, `Q4_1`/`Q5_1`) or `d·q` (signed, `Q8_0`/`Q4_0`/
//!   `Q5_0`) with one FMA per block and activation row; the K-quants with integer sums over the
//!   whole 256-value super-block (`vpmaddubsw`, then `vpmaddwd` — `vpdpwssd` on AVX-VNNI — with
//!   the 16- or 32-value scales), their minimums and offsets taken through the activations'
//!   sums of 16, and one or two FMAs per super-block; `F16`/`BF16` converted eight at a time.
//!   `IQ4_NL`/`MXFP4` are signed 32-value formats whose nibbles become table values with one
//!   `vpshufb`; the 256-value IQ formats gather grid rows per 32 values, apply sign bits to the
//!   activations (`vpsignb`) and sum exact integers over the super-block with their 16- or
//!   32-value scales (`vpmaddubsw`, `vpmaddwd`/`vpdpwssd`), then one float step per super-block,
//!   bitwise equal to the scalar reference.
//!   `Q4_K`/`Q5_K` (AVX2, AVX-VNNI) multiply tiles of four weight rows × eight activation rows:
//!   the four rows are interleaved in registers by 8-byte chunks, so the products of a 32-value
//!   sub-block of four rows are added as `i16` and scaled by one `vpmaddwd` (5 multiplies per 32
//!   values and four rows instead of 8); each output then takes one exact integer per
//!   super-block, in every path of those formats (measured: 1.4× the one-row-at-a-time kernel
//!   at 64 activation rows).
//! - [`PackedMatrix`]: a matrix in the layout of the best backend (bytes behind an `Arc`: clones,
//!   and with [`PackedMatrix::from_shared_rows`] other holders, share one copy). With AVX-512
//!   VNNI, `Q4_1`/`Q8_0`/`Q4_K`/`Q5_K`/`Q6_K` rows are repacked into groups of 16 ([`Layout::Rows16`]) so one 512-bit
//!   `vpdpbusd` multiplies 16 rows by 4 broadcast activation bytes and each block needs one
//!   conversion and FMA per activation row and 16 outputs (no horizontal sums); decoding weights
//!   once per 8 activation rows. Measured on the dev VM: a whole decode token 1.9× the 256-bit
//!   kernels at m = 1, 3.2× at m = 16, 4× at prefill sizes. `Q4_K`/`Q5_K` sum each super-block's
//!   scaled sub-block products as exact integers per row (lane) and takes the same two float
//!   steps as its other paths (bitwise equal to them): 1024 × 1024 at m = 1 1.5× the AVX-VNNI
//!   kernel (35 vs 23 GB/s), 1.9× at m = 8, 2.7× at m = 64 (`Q5_K`: 1.16×, 1.8×, 3×). `Q6_K`
//!   keeps its other paths' eight integer lanes per row and super-block (`vpmaddubsw` of 4 values
//!   of 16 rows, `vpdpwssd` by each row's 16-value scale) and their float steps, so it is bitwise
//!   equal to them too: 2048 × 2048 at m = 4 1.5×, at m = 16 2.1×, at m = 64 2.5× the AVX-VNNI
//!   kernel; at m = 1 both stream at the dev VM's ~30 GB/s (the groups 0–10 % slower). Every other format, and every format
//!   on the other backends, stays in GGUF rows; on that backend `IQ4_NL`, `IQ4_XS`, `IQ3_S`,
//!   `IQ2_S` and `IQ1_M` run 512-bit kernels on them (two 32-value blocks or chunks per vector,
//!   signs applied through masks; bitwise equal to the 256-bit kernels), the other IQ formats and
//!   `MXFP4` the 256-bit ones (measured faster there). From 2 activation rows the 256-value IQ
//!   formats take `iqtile` there instead: each super-block of 16 weight rows decoded once (as
//!   `q + 128` bytes in the 16-row lane layout; `IQ4_XS` 16 rows at a time in vectors, `IQ3_S`
//!   with gathered grid rows) for the whole batch, `vpdpbusd` against broadcast activations, exact
//!   integer sums corrected by the activations' block sums — bitwise equal to the scalar kernel;
//!   `IQ4_NL` and `MXFP4` take `symtile` (16 GGUF rows decoded once per call into the same lane
//!   layout, one `vpdpbusd` and float step per 4 values as their one-row kernels' lanes: bitwise
//!   equal to them; 1.4–1.8× at m = 16 and 64). [`PackedMatrix::dequantize_row`] reads a row back
//!   from either layout (a tied embedding looked up in the output head's matrix).
//! - [`vec_dot`]: one weight row · one ggml activation row (`quantize_row_q8_1`/`_q8_0`/`_q8_k`),
//!   dispatched to the best [`Backend`] for this CPU (detected once and cached: AVX-512 VNNI, AVX-VNNI,
//!   AVX2+FMA+F16C on x86-64; NEON with `i8mm` (`smmla` for the 32-value formats' matmul) or
//!   `dotprod`, or plain NEON on aarch64; else scalar;
//!   `SHOAL_KERNEL_BACKEND` can force a slower one). The portable versions live in [`scalar`]
//!   and are the reference the SIMD paths are tested against. The NEON kernels (`arm`) decode
//!   each block once for four activation rows into `i8` vectors and sum exact integers per
//!   block (`sdot`, or `smull` + `sadalp`; the K-quants' scales applied to whole vectors of
//!   group sums), then take the scalar reference's float steps: bitwise equal to it for every
//!   quantized format.
//! - [`ThreadPool`]: a small dedicated pool in the style of llama.cpp's: the caller is thread 0,
//!   workers spin briefly on a generation counter and then sleep, so back-to-back matmuls of a
//!   decode step pay ~0.1–0.5 µs of hand-off (rayon, even inside `install`: ~1.8 µs) while an idle
//!   server burns no CPU; with one thread it is a plain call. Any [`Parallel`] implementation
//!   works with [`matmul`]; [`RayonCurrent`] runs on the caller's rayon pool.
//!
//! - [`attn::attend_f16`]: attention of the query heads sharing one KV head against its f16 cache
//!   (scores, softmax, weighted values) converting each cached row once; AVX-512, AVX2 and portable
//!   paths are bitwise equal, like the helpers of [`math`]. [`attn::attend_f16_sinks`] adds gpt-oss's
//!   attention sinks (a per-head logit in the softmax's denominator).
//! - [`probe()`]: the compute probe — decode bytes/s per format ([`TypeRate`]) and the batched
//!   flops/s on a pool, as a [`ProbeReport`] (`shoal serve` caches and publishes it).
//!
//! Typical use by a model: one `Arc<ThreadPool>` per stage, a `PackedMatrix` per GGUF weight tensor,
//! `w.matmul(x, m, &mut out, &pool)` per linear layer (or `Activations::quantize_into`
//! once plus `matmul_quantized` per matrix sharing the input), and
//! [`QMatrix::dequantize_row`] for embedding lookups ([`dequantize_row`] decodes every format
//! bitwise as ggml and the `gguf` Python package do; tests/dequant.rs checks it on fixtures).
//!
//! Module layers, each calling only the ones below it (no module calls back up):
//! 1. `error`, `format` (block formats and their byte layouts, [`Layout`], f16 and K-scale
//!    helpers) and `pool` — the shared types;
//! 2. `acts` (the [`Activations`] buffer and its layout) and `gemm` (one matmul's checked operands,
//!    which the row kernels read and write through), and `iq` (the IQ formats' lookup grids,
//!    generated from the `gguf` package's tables by `scripts/fixtures/iq_grids.py`, and their
//!    portable decoding; [`iq_tables`] hands the tables to shoal-gpu);
//! 3. the kernels: [`scalar`] (the reference: per-format decoders, dequantization, dots and the
//!    scalar matmul rows) and `x86` (AVX2/AVX-VNNI: `kernels` for the 32-value formats, `kquants`
//!    for the K-quants and `Q8_K` quantization, `iq` for the IQ formats, `plain` for
//!    `F32`/`F16`/`BF16`; `avx512`, `k512` and `k6512` for 16-row groups over the loop of
//!    `group`, `iq512` for the IQ formats' 512-bit kernels, `iqtile` and `symtile` for their
//!    batched 16-row-lane kernels), `arm` (NEON: `legacy`, `kquants`, `plain`, `quant`, `mmla`, and
//!    `iq` for the IQ formats), plus [`math`] and [`attn`] on top of `x86`;
//! 4. `backend`: [`Backend`] detection and the dispatch (`quantize_q8`, `quantize_q8k`,
//!    `gemm_rows`, [`vec_dot`]) down into `x86`, `arm` or `scalar`;
//! 5. the entry points over the dispatch: `quant` (quantizing [`Activations`] and single rows),
//!    `matmul` ([`QMatrix`] and the threaded driver that splits a `gemm` over a pool), and
//!    `packed` ([`PackedMatrix`], which repacks and then runs the `matmul` driver);
//! 6. `probe`, timing `matmul` and `packed` products.
//!
//! Everything at the public boundary checks slice lengths and returns [`KernelError`] (or panics
//! with a clear message where documented); the `unsafe` SIMD code is only reached after those
//! checks, and the crate's only global state is the cached CPU-feature detection.

mod acts;
#[cfg(target_arch = "aarch64")]
mod arm;
pub mod attn;
mod backend;
mod error;
mod format;
mod gemm;
mod iq;
pub mod math;
mod matmul;
mod packed;
mod pool;
mod probe;
mod quant;
pub mod rng;
pub mod scalar;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod weighted;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use acts::Activations;
pub use backend::{Backend, vec_dot, vec_dot_with};
pub use error::KernelError;
pub use format::{ActType, Layout, QK, QK_K, QType, row_bytes};
pub use iq::{IqTables, iq_tables};
pub use matmul::{QMatrix, matmul, matmul_quantized, matmul_quantized_with};
pub use packed::PackedMatrix;
pub use pool::{Parallel, RayonCurrent, ThreadPool};
pub use probe::{ProbeConfig, ProbeReport, TypeRate, probe, probe_weights};
pub use quant::{
    dequantize_row, quantize_row_q4_1, quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_k,
};
