//! Finding adapters and opening one: [`Gpu::discover`], [`Gpu::open`], [`Gpu::open_first`].

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use futures::executor::block_on;

use crate::pipelines::{Kernel, PipelineKey};
use crate::{GpuError, GpuMemory};

/// The backends shoal uses: Vulkan (Linux, Windows; the loader is opened at run time, never
/// linked), Metal (macOS) and DX12 (Windows). GL and WebGPU are not built.
pub(crate) const BACKENDS: wgpu::Backends = wgpu::Backends::VULKAN
    .union(wgpu::Backends::METAL)
    .union(wgpu::Backends::DX12);

/// What wgpu tells about one adapter, without opening it.
///
/// The device's memory is not in wgpu's portable API: [`GpuInfo::memory`] reads it through the
/// hal where the backend allows (Vulkan; see [`GpuMemory`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Index for [`Gpu::open`], in the order the backends enumerate adapters.
    pub index: usize,
    /// The adapter's name, as the driver gives it ("NVIDIA H100 80GB HBM3", "llvmpipe (LLVM 15.0.6, 256 bits)").
    pub name: String,
    /// The vendor's name from the PCI vendor id ("NVIDIA", "AMD", "Intel", "Apple", "Mesa", or the id in hex).
    pub vendor: String,
    /// The backend-specific vendor id (a PCI id on Vulkan and DX12).
    pub vendor_id: u32,
    /// The backend-specific device id.
    pub device_id: u32,
    /// "discrete", "integrated", "virtual", "cpu" (a software rasterizer such as lavapipe) or "other".
    pub device_type: &'static str,
    /// "vulkan", "metal" or "dx12".
    pub backend: &'static str,
    /// The driver's name and its version string ("llvmpipe", "Mesa 22.3.6 (LLVM 15.0.6)").
    pub driver: String,
    pub driver_info: String,
    /// The largest storage buffer binding a kernel can read: tensors above it are split by rows.
    pub max_storage_binding: u64,
    /// The largest buffer the device can create.
    pub max_buffer: u64,
    /// The range of subgroup widths the driver may use (the kernels never assume one).
    pub subgroup_sizes: (u32, u32),
    /// The device's memory, total and free, as its driver tells it when asked (at discovery).
    pub memory: GpuMemory,
}

/// Options for [`Gpu::open_with`].
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// Cap the storage binding size below the adapter's own limit (tests use it to split small
    /// tensors into several bindings).
    pub max_binding: Option<u64>,
}

/// One opened GPU: its device and queue, the adapter's limits (requested in full) and one cache of
/// compiled pipelines.
pub struct Gpu {
    pub(crate) info: GpuInfo,
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    /// The largest binding the kernels use, after [`OpenOptions::max_binding`].
    pub(crate) max_binding: u64,
    pub(crate) max_groups_per_dim: u32,
    pub(crate) max_invocations: u32,
    pub(crate) pipelines: Mutex<HashMap<PipelineKey, wgpu::ComputePipeline>>,
    /// The IQ formats' lookup tables, uploaded with the first IQ matrix (`iq`).
    pub(crate) iq_tables: OnceLock<wgpu::Buffer>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = BACKENDS;
    wgpu::Instance::new(desc)
}

fn adapters() -> Vec<wgpu::Adapter> {
    block_on(instance().enumerate_adapters(BACKENDS))
}

fn vendor_name(id: u32) -> String {
    match id {
        0x10de => "NVIDIA".into(),
        0x1002 | 0x1022 => "AMD".into(),
        0x8086 => "Intel".into(),
        0x106b => "Apple".into(),
        0x10005 => "Mesa".into(),
        0x13b5 => "ARM".into(),
        0x5143 => "Qualcomm".into(),
        0x1414 => "Microsoft".into(),
        other => format!("{other:#06x}"),
    }
}

fn info_of(index: usize, adapter: &wgpu::Adapter) -> GpuInfo {
    let a = adapter.get_info();
    let limits = adapter.limits();
    GpuInfo {
        index,
        name: a.name,
        vendor: vendor_name(a.vendor),
        vendor_id: a.vendor,
        device_id: a.device,
        device_type: match a.device_type {
            wgpu::DeviceType::DiscreteGpu => "discrete",
            wgpu::DeviceType::IntegratedGpu => "integrated",
            wgpu::DeviceType::VirtualGpu => "virtual",
            wgpu::DeviceType::Cpu => "cpu",
            wgpu::DeviceType::Other => "other",
        },
        backend: match a.backend {
            wgpu::Backend::Vulkan => "vulkan",
            wgpu::Backend::Metal => "metal",
            wgpu::Backend::Dx12 => "dx12",
            wgpu::Backend::Gl => "gl",
            wgpu::Backend::BrowserWebGpu => "webgpu",
            _ => "other",
        },
        driver: a.driver,
        driver_info: a.driver_info,
        max_storage_binding: limits.max_storage_buffer_binding_size,
        max_buffer: limits.max_buffer_size,
        subgroup_sizes: (a.subgroup_min_size, a.subgroup_max_size),
        memory: crate::memory::read(adapter),
    }
}

impl Gpu {
    /// Every adapter of the Vulkan, Metal and DX12 backends, software ones (lavapipe) included.
    /// Empty, never a panic, when there is no GPU, no driver or no Vulkan loader.
    pub fn discover() -> Vec<GpuInfo> {
        adapters()
            .iter()
            .enumerate()
            .map(|(i, a)| info_of(i, a))
            .collect()
    }

    /// Opens adapter `index` of [`Gpu::discover`] with the adapter's own limits.
    pub fn open(index: usize) -> Result<Gpu, GpuError> {
        Self::open_with(index, OpenOptions::default())
    }

    /// The first adapter, opened; `Ok(None)` when there is none.
    pub fn open_first() -> Result<Option<Gpu>, GpuError> {
        match Self::open(0) {
            Ok(gpu) => Ok(Some(gpu)),
            Err(GpuError::NoAdapter { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`Gpu::open`] with options.
    pub fn open_with(index: usize, options: OpenOptions) -> Result<Gpu, GpuError> {
        let mut all = adapters();
        let found = all.len();
        if index >= found {
            return Err(GpuError::NoAdapter { index, found });
        }
        let adapter = all.swap_remove(index);
        let info = info_of(index, &adapter);
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("shoal"),
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) =
            block_on(adapter.request_device(&desc)).map_err(|source| GpuError::RequestDevice {
                adapter: info.name.clone(),
                source,
            })?;
        // wgpu's default handler panics on an error nobody captured; every call here captures
        // its own, so anything left is logged instead.
        device.on_uncaptured_error(std::sync::Arc::new(|e: wgpu::Error| {
            tracing::error!(error = %e, "uncaptured GPU error");
        }));
        let binding = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        let max_binding = options.max_binding.map_or(binding, |cap| cap.min(binding));
        tracing::debug!(gpu = %info.name, backend = info.backend, max_binding, "opened GPU");
        Ok(Gpu {
            info,
            device,
            queue,
            max_binding,
            max_groups_per_dim: limits.max_compute_workgroups_per_dimension,
            max_invocations: limits.max_compute_invocations_per_workgroup,
            pipelines: Mutex::new(HashMap::new()),
            iq_tables: OnceLock::new(),
        })
    }

    /// What [`Gpu::discover`] said about this adapter.
    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    /// The largest storage binding a kernel reads or writes (the adapter's limit, or the cap of
    /// [`OpenOptions::max_binding`]).
    pub fn max_binding(&self) -> u64 {
        self.max_binding
    }

    /// Runs `f` with wgpu's validation and out-of-memory errors captured into a [`GpuError`].
    pub(crate) fn checked<T>(&self, f: impl FnOnce() -> T) -> Result<T, GpuError> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        let v = block_on(validation.pop());
        let o = block_on(oom.pop());
        match v.or(o) {
            Some(e) => Err(GpuError::Wgpu(e.to_string())),
            None => Ok(out),
        }
    }

    /// The pipeline of `kernel` with these override constants, compiled once per device.
    pub(crate) fn pipeline(
        &self,
        kernel: Kernel,
        constants: &[(&'static str, u32)],
    ) -> Result<wgpu::ComputePipeline, GpuError> {
        let key = PipelineKey::new(kernel, constants);
        let mut cache = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = cache.get(&key) {
            return Ok(p.clone());
        }
        let source = kernel.source();
        let values: Vec<(&str, f64)> = constants.iter().map(|&(n, v)| (n, f64::from(v))).collect();
        let pipeline = self.checked(|| {
            let module = self
                .device
                .create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(kernel.name()),
                    source: wgpu::ShaderSource::Wgsl(source),
                });
            self.device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(kernel.name()),
                    layout: None,
                    module: &module,
                    entry_point: Some("main"),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        constants: &values,
                        ..Default::default()
                    },
                    cache: None,
                })
        })?;
        cache.insert(key, pipeline.clone());
        Ok(pipeline)
    }

    /// The dispatch grid for `groups` workgroups: x up to the per-dimension limit, then y.
    pub(crate) fn grid(&self, groups: u32) -> Result<(u32, u32), GpuError> {
        let max = self.max_groups_per_dim.max(1);
        let x = groups.clamp(1, max);
        let y = groups.div_ceil(x).max(1);
        if y > max {
            return Err(GpuError::TooLarge {
                what: "dispatch",
                bytes: u64::from(groups),
                limit: u64::from(max) * u64::from(max),
            });
        }
        Ok((x, y))
    }
}
