//! The error type of the crate.

use shoal_kernels::KernelError;

/// Everything that can go wrong opening a GPU, uploading to it or running a kernel on it. No
/// function of this crate panics on a missing GPU or a missing Vulkan loader: that is
/// [`crate::Gpu::discover`] returning an empty list, or [`GpuError::NoAdapter`].
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No adapter with this index (`found` adapters exist, possibly none).
    #[error("no GPU adapter {index} ({found} found)")]
    NoAdapter { index: usize, found: usize },
    /// The adapter refused to give a device.
    #[error("opening a device on {adapter} failed: {source}")]
    RequestDevice {
        adapter: String,
        #[source]
        source: wgpu::RequestDeviceError,
    },
    /// A tensor (or one row of it) needs a larger buffer binding than the adapter allows.
    #[error("{what} needs {bytes} bytes in one buffer binding; this adapter allows {limit}")]
    TooLarge {
        what: &'static str,
        bytes: u64,
        limit: u64,
    },
    /// Operands whose shapes do not fit together.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// A kernel configuration the kernels cannot run (workgroup size, rows per workgroup).
    #[error("bad kernel configuration: {0}")]
    Config(String),
    /// wgpu reported a validation or out-of-memory error.
    #[error("GPU error: {0}")]
    Wgpu(String),
    /// Reading a buffer back from the device failed.
    #[error("reading back from the GPU failed: {0}")]
    Readback(String),
    /// The GGUF bytes do not match the stated shape and format.
    #[error(transparent)]
    Kernel(#[from] KernelError),
}
