//! A device's memory, read below wgpu's portable API: [`GpuMemory`].
//!
//! wgpu tells neither the memory a device has nor how much of it is free, so this asks the
//! backend through wgpu's hal:
//! - **Vulkan**: the total is the sum of the physical device's `DEVICE_LOCAL` memory heaps, as its
//!   driver lists them. On a discrete card that is its VRAM; on an integrated GPU or a software
//!   driver (lavapipe) the heap *is* host memory, and the number is still the driver's (lavapipe
//!   reports a share of the machine's RAM). The free memory comes from `VK_EXT_memory_budget`
//!   (`heapBudget − heapUsage` summed over the same heaps: what this process may still allocate,
//!   other processes' use counted by the driver) when the device supports that extension, else it
//!   is unknown.
//! - **Metal** and **DX12**: not read. Metal's `recommendedMaxWorkingSetSize` and DXGI's
//!   `QueryVideoMemoryInfo` sit behind the hal's raw device types, which cannot be built or run on
//!   the Linux machines this is developed on; both stay `None` there rather than guessed.
//!
//! Nothing here fails or panics: any missing piece (another backend, an old Vulkan instance, a
//! driver listing no device-local heap) is `None`.

/// What a device's driver says about its memory, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuMemory {
    /// The device-local heaps' size; `None` where it cannot be read (see the module docs).
    pub total: Option<u64>,
    /// What may still be allocated in them (`VK_EXT_memory_budget`); `None` without it.
    pub free: Option<u64>,
}

/// The memory of `adapter`, as far as its backend tells (see the module docs).
pub(crate) fn read(adapter: &wgpu::Adapter) -> GpuMemory {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| vulkan(adapter)))
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Vulkan's heaps and budget; `None` on another backend. wgpu has no Vulkan backend on Apple's
/// systems (Metal is theirs), so there this is always `None`.
#[cfg(target_vendor = "apple")]
fn vulkan(_adapter: &wgpu::Adapter) -> Option<GpuMemory> {
    None
}

/// Vulkan's heaps and budget; `None` on another backend.
#[cfg(not(target_vendor = "apple"))]
fn vulkan(adapter: &wgpu::Adapter) -> Option<GpuMemory> {
    use ash::vk;
    // SAFETY: only queries of the physical device are made (nothing is created or destroyed),
    // while the guard keeps the adapter and its instance alive.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let shared = hal.shared_instance();
    let instance = shared.raw_instance();
    let device = hal.raw_physical_device();
    let caps = hal.physical_device_capabilities();
    let v1_1 = shared.instance_api_version() >= vk::API_VERSION_1_1
        && caps.properties().api_version >= vk::API_VERSION_1_1;
    let budget_ext = v1_1 && caps.supports_extension(ash::ext::memory_budget::NAME);
    let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
    let props = if budget_ext {
        let mut props2 = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
        // SAFETY: a Vulkan 1.1 instance and device (checked above), the budget structure chained
        // only when the device supports its extension.
        unsafe { instance.get_physical_device_memory_properties2(device, &mut props2) };
        props2.memory_properties
    } else {
        // SAFETY: a Vulkan 1.0 query on a physical device of this instance.
        unsafe { instance.get_physical_device_memory_properties(device) }
    };
    let heaps = props.memory_heaps_as_slice();
    let local: Vec<usize> = (0..heaps.len())
        .filter(|&i| heaps[i].flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
        .collect();
    let total: u64 = local.iter().map(|&i| heaps[i].size).sum();
    let free = budget_ext.then(|| {
        local
            .iter()
            .map(|&i| budget.heap_budget[i].saturating_sub(budget.heap_usage[i]))
            .sum::<u64>()
            .min(total)
    });
    Some(GpuMemory {
        total: (total > 0).then_some(total),
        free: free.filter(|_| total > 0),
    })
}

#[cfg(test)]
mod tests {
    use crate::Gpu;

    /// On lavapipe (Vulkan, host memory as its device-local heap) the total is read and the free
    /// memory, when the driver has the budget extension, is within it.
    #[test]
    fn vulkan_memory_is_read() {
        let found = Gpu::discover();
        if found.is_empty() && std::env::var("SHOAL_GPU_TESTS").is_ok_and(|v| v == "skip") {
            return;
        }
        let vulkan: Vec<_> = found.iter().filter(|g| g.backend == "vulkan").collect();
        assert!(!vulkan.is_empty(), "no Vulkan adapter: {found:?}");
        for g in vulkan {
            let total = g.memory.total.expect("a Vulkan device lists its heaps");
            assert!(total > 0, "{g:?}");
            if let Some(free) = g.memory.free {
                assert!(free <= total, "{g:?}");
            }
            eprintln!("{}: {:?}", g.name, g.memory);
        }
    }
}
