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
//!   (`F32`, `F16`, `Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, and the K-quants `Q4_K` and
//!   `Q6_K` of a Q4_K_M file) and repacks it into a layout WGSL reads well: quants
//!   u32-aligned in one buffer, the blocks' f16 scales in another (see `matrix`); a matrix above
//!   the largest storage binding is split by rows into chunks, a row above it is refused.
//! - [`GpuVec`]: f32 activations on the device ([`Gpu::upload`], [`Gpu::zeros`], [`Gpu::read`]).
//! - [`Commands`] records kernels into one command buffer: [`Commands::matvec`] (decode's
//!   matrix-vector product, f32 in and out, workgroup size and rows per workgroup as WGSL override
//!   constants via [`MatvecConfig`], no subgroup width assumed), [`Commands::rms_norm`] and
//!   [`Commands::swiglu`] (the SiLU-gated product of a decoder layer's MLP).
//!
//! The kernels live in `src/kernels/*.wgsl` (`include_str!`): `matvec.wgsl` is the frame shared by
//! the matrix-vector kernels (bindings, the workgroup reduction), to which one `matvec_<type>.wgsl`
//! (weight bindings and `row_dot`) is appended; the block formats share `matvec_blocks.wgsl`'s row
//! loop over 32-value units and define only `block_dot`.
//!
//! Tests (tests/kernels.rs) compare every kernel against the CPU path on lavapipe at small and odd
//! shapes; they fail when no adapter exists unless `SHOAL_GPU_TESTS=skip`.

mod buffer;
mod device;
mod error;
mod matrix;
mod ops;
mod pipelines;

pub use buffer::GpuVec;
pub use device::{Gpu, GpuInfo, OpenOptions};
pub use error::GpuError;
pub use matrix::GpuMatrix;
pub use ops::{Commands, MatvecConfig};
