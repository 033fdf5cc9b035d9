//! shoal-gpu: shoal's GPU kernels, written once in WGSL and run through wgpu on Vulkan (Linux,
//! Windows: NVIDIA, AMD, Intel, and Mesa's software lavapipe), Metal (Apple) and DX12 (Windows).
//! See `docs/decisions/016-gpu-wgpu-wgsl.md` for why this and not CUDA/Metal per vendor, CubeCL or
//! ggml.
//!
//! Main types and data flow:
//! - [`Gpu::discover`] lists the adapters ([`GpuInfo`]: name, vendor, type, backend, driver,
//!   binding limits) and is empty, never a panic, on a machine with no GPU or no Vulkan loader:
//!   the loader is opened at run time (`libvulkan.so.1` through `ash`'s loader), never linked.
//! - [`Gpu::open`] opens one with the adapter's own limits; a [`Gpu`] owns the device, its queue
//!   and one cache of compiled pipelines (a kernel plus its override constants).
//! - [`Gpu::upload_matrix`] takes a GGUF weight matrix as shoal-kernels' [`shoal_kernels::QMatrix`]
//!   (every format it reads: `F32`, `F16`, `BF16`, `Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, the
//!   K-quants `Q2_K` … `Q6_K`, and the IQ formats `IQ4_NL`, `IQ4_XS`, `IQ3_S`, `IQ3_XXS`,
//!   `IQ2_XXS`, `IQ2_XS`, `IQ2_S`, `IQ1_S`, `IQ1_M` and `MXFP4`) and repacks it into a layout WGSL
//!   reads well: quants u32-aligned in one buffer, the blocks' f16 scales in another (see `matrix`
//!   and, for the IQ formats, `iq`, which also uploads their lookup grids once per device from
//!   shoal-kernels' tables); a matrix above the largest storage binding is split by rows into
//!   chunks, a row above it is refused.
//! - [`GpuVec`]: f32 activations on the device ([`Gpu::upload`], [`Gpu::zeros`], [`Gpu::read`]).
//! - [`Commands`] records kernels into one command buffer: [`Commands::matvec`] (decode's
//!   matrix-vector product, f32 in and out, workgroup size and rows per workgroup as WGSL override
//!   constants via [`MatvecConfig`], no subgroup width assumed), [`Commands::rms_norm`] and
//!   [`Commands::swiglu`] (the SiLU-gated product of a decoder layer's MLP; gpt-oss's clamped one
//!   is [`Commands::swiglu_oai`]), [`Commands::add`]
//!   (the residual add), [`Commands::matmat`] (prefill's and batches' `Y = X · Wᵀ`, tiled: a
//!   workgroup dequantizes a tile of weight rows once per 32 values of k into workgroup memory
//!   and multiplies it with a tile of X's rows; tile sizes as override constants via
//!   [`MatmatConfig`]).
//! - The attention half of a decode step (`layer`): [`Commands::rope`] rotates heads in place
//!   for one position ([`Rope`]: interleaved/"normal" for Llama and Mistral, NEOX for Qwen,
//!   Gemma and Phi-3; base, linear scale, partial `dims`, frequency factors, YaRN ([`RopeYarn`]:
//!   gpt-oss); the angle computed with the CPU's f32 operations); [`GpuKvCache`] (from [`Gpu::kv_cache`]) holds f16 keys and
//!   values `[layer][pos][kv_head][head_dim]`, two per u32, written by [`Commands::kv_write`]
//!   (one position) or [`Commands::kv_write_rows`] (a chunk's consecutive positions from fused
//!   QKV rows, one dispatch); [`Commands::attention`] is decode attention of one query over it
//!   (grouped-query heads, either scale convention, a sliding window; llama.cpp's CPU numerics:
//!   f16 query, f16-rounded softmax weights; attention sinks through
//!   [`Commands::attention_rows_with`]: gpt-oss; a score scale of its own: latent attention), one
//!   workgroup per query head;
//!   [`Commands::attention_rows`] is causal attention of a prefill chunk (row `r` at position
//!   `pos + r` attends to positions up to its own, within the window), one workgroup per (query
//!   head, row), each row bitwise what decode attention gives at its position, as shoal-model's
//!   CPU attention computes a chunk row by row.
//! - [`Commands::embed`]: one row of an embedding table of any format, uploaded as a
//!   [`GpuMatrix`], dequantized by its format's matrix decode (times Gemma's scale) into a
//!   [`GpuVec`] (`embed.wgsl`, a third frame for the format files).
//!
//! The kernels live in `src/kernels/*.wgsl` (`include_str!`): `matvec.wgsl` (matrix-vector: the
//! workgroup reduction, with a row locator: `matvec_direct.wgsl`, or `matvec_id.wgsl` for experts) and `matmat.wgsl` (matrix-matrix: the tile loop) are the two frames; to
//! either is appended `matvec_plain.wgsl` (the plain formats' row loop over vec4s) or
//! `matvec_blocks.wgsl` (the block formats' row loop over 32-value units and shared decode
//! helpers), then one `matvec_<type>.wgsl`: its weight bindings and decode (`w4` for the plain
//! formats; `block_dot` for matvec and `dequant4` for the tiles for the block formats; the IQ
//! formats and `MXFP4` come after their tables' generated offsets and `matvec_iq.wgsl`, which makes
//! both from the format's `iq_scale` and `iq4`). The one-thread-per-item kernels share
//! `grid.wgsl`'s entry point.
//!
//! - For a whole layer over a batch: [`Commands::rope_rows`] (every row at its own position in
//!   one dispatch), [`Commands::geglu`] (Gemma's GELU-gated product, ggml's f16-table numerics),
//!   [`Commands::add_rows`] (a bias added to every row), [`Commands::copy_rows`] (splitting a
//!   fused product, picking rows) and [`Gpu::kv_copy`] (a sequence's KV into a bigger cache, a
//!   prefix or a fork). shoal-model's `gpu::GpuDecoderStage` chains them into a stage.
//!
//! - Mixture-of-experts layers (`moe`), as llama.cpp's `mul_mat_id`: [`Gpu::upload_experts`]
//!   uploads a 3-D expert tensor as one stacked [`GpuMatrix`] (chunked only between experts);
//!   [`Commands::moe_route`] turns router logits into each token's top-k expert ids and weights
//!   on the device ([`MoeRouting`], [`MoeGating`]: softmax then top-k, top-k then softmax, or
//!   sigmoid with a selection bias; renormalised, scaled; first index on a tie);
//!   [`Commands::matvec_id`] multiplies each (token, slot) pair by the expert its id names (every
//!   format's matvec kernel with `matvec_id.wgsl`'s row locator in place of `matvec_direct.wgsl`'s,
//!   plus the experts' bias rows); [`Commands::moe_combine`] adds the weighted slots and a shared
//!   expert (sigmoid-gated or not). A decode step stays one command buffer with no host round trip.
//!
//! - [`GpuInfo::memory`] ([`GpuMemory`], module `memory`): the device's memory read through
//!   wgpu's Vulkan hal (device-local heaps, `VK_EXT_memory_budget`); not read on Metal or DX12.
//! - [`probe()`] ([`GpuProbeConfig`], [`GpuProbe`]): the CPU compute probe's figures measured with
//!   these kernels — decode weight bytes/s per format, the tiled product's and decode
//!   attention's flop/s — many dispatches per command buffer, the fastest of a few rounds.
//!
//! Not here yet: a split-K attention for long contexts (one workgroup per (head, row) reads
//! every key).
//!
//! Tests (tests/kernels.rs, tests/matmat.rs, tests/prefill_attention.rs, tests/moe.rs,
//! tests/gpt_oss.rs; helpers in
//! tests/common) compare every kernel against the CPU path on lavapipe at small and odd shapes;
//! they fail when no adapter exists unless `SHOAL_GPU_TESTS=skip`.

mod buffer;
mod device;
mod error;
mod iq;
mod layer;
mod matmat;
mod matrix;
mod memory;
mod moe;
mod ops;
mod pipelines;
mod probe;

pub use buffer::GpuVec;
pub use device::{Gpu, GpuInfo, OpenOptions};
pub use error::GpuError;
pub use layer::{Attend, AttendWith, GpuKvCache, KvShape, Rope, RopeMode, RopeYarn};
pub use matmat::MatmatConfig;
pub use matrix::GpuMatrix;
pub use memory::GpuMemory;
pub use moe::{MoeGating, MoeRouting};
pub use ops::{Commands, MatvecConfig};
pub use probe::{GPU_TYPES, GpuProbe, GpuProbeConfig, MAX_REPS, probe};
