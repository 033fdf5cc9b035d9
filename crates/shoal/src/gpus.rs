//! This machine's GPUs as the cluster publishes them ([`GpuFacts`]): found by
//! [`shoal_gpu::Gpu::discover`] (Vulkan, Metal, DX12; software drivers such as lavapipe included)
//! and turned into facts by [`fact`]. `shoal serve` runs [`discover_and_log`] once at start on the
//! runtime's blocking pool (opening the Vulkan loader and asking every driver can take a moment), so
//! never on an async worker, and logs one line: the GPUs found, or that none was and the node serves
//! on CPU. A machine without a GPU, a driver or a Vulkan loader simply finds none: never an error.
//! `shoal doctor` lists them with [`discover`].
//!
//! The device's memory is not known: wgpu tells neither total nor free, so both stay `None`.

use shoal_cluster::facts::GpuFacts;
use shoal_gpu::{Gpu, GpuInfo};

/// The published fact of one adapter.
pub fn fact(info: &GpuInfo) -> GpuFacts {
    GpuFacts {
        name: info.name.clone(),
        vendor: info.vendor.clone(),
        device_type: info.device_type.to_string(),
        backend: info.backend.to_string(),
        driver: info.driver.clone(),
        driver_info: info.driver_info.clone(),
        // wgpu exposes no memory size or budget (see `shoal_gpu::GpuInfo`).
        memory_total: None,
        memory_free: None,
        // Measured later, by the GPU probe.
        compute: None,
    }
}

/// Every GPU of this machine, in discovery order; empty when there is none (a panic inside
/// discovery is caught and counts as none).
pub fn discover() -> Vec<GpuFacts> {
    std::panic::catch_unwind(Gpu::discover)
        .map(|found| found.iter().map(fact).collect())
        .unwrap_or_default()
}

/// [`discover`], then the one line `shoal serve` logs about it.
pub fn discover_and_log() -> Vec<GpuFacts> {
    let gpus = discover();
    tracing::info!("{}", summary(&gpus));
    gpus
}

/// One line on what was found: "no GPU found: serving on CPU", or each GPU with its vendor, type and
/// backend.
pub fn summary(gpus: &[GpuFacts]) -> String {
    if gpus.is_empty() {
        return "no GPU found: serving on CPU".to_string();
    }
    let list: Vec<String> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| describe(i, g))
        .collect();
    let noun = if gpus.len() == 1 { "GPU" } else { "GPUs" };
    format!("{} {noun} found: {}", gpus.len(), list.join("; "))
}

/// `gpu:N NAME (VENDOR, TYPE, BACKEND)`.
pub fn describe(index: usize, g: &GpuFacts) -> String {
    format!(
        "gpu:{index} {} ({}, {}, {})",
        g.name, g.vendor, g.device_type, g.backend
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lavapipe() -> GpuInfo {
        GpuInfo {
            index: 0,
            name: "llvmpipe (LLVM 15.0.6, 256 bits)".into(),
            vendor: "Mesa".into(),
            vendor_id: 0x10005,
            device_id: 0,
            device_type: "cpu",
            backend: "vulkan",
            driver: "llvmpipe".into(),
            driver_info: "Mesa 22.3.6 (LLVM 15.0.6)".into(),
            max_storage_binding: 128 << 20,
            max_buffer: 1 << 31,
            subgroup_sizes: (8, 8),
        }
    }

    #[test]
    fn an_adapter_becomes_a_fact_with_its_name_vendor_type_backend_driver_and_no_memory() {
        let g = fact(&lavapipe());
        assert_eq!(
            g,
            GpuFacts {
                name: "llvmpipe (LLVM 15.0.6, 256 bits)".into(),
                vendor: "Mesa".into(),
                device_type: "cpu".into(),
                backend: "vulkan".into(),
                driver: "llvmpipe".into(),
                driver_info: "Mesa 22.3.6 (LLVM 15.0.6)".into(),
                memory_total: None,
                memory_free: None,
                compute: None,
            }
        );
        let json = serde_json::to_value(&g).expect("serializes");
        assert_eq!(json["memory_total"], serde_json::Value::Null);
        let back: GpuFacts = serde_json::from_value(json).expect("round trip");
        assert_eq!(back, g);
    }

    #[test]
    fn the_start_line_names_each_gpu_or_says_none_was_found() {
        assert_eq!(summary(&[]), "no GPU found: serving on CPU");
        let g = fact(&lavapipe());
        assert_eq!(
            summary(std::slice::from_ref(&g)),
            "1 GPU found: gpu:0 llvmpipe (LLVM 15.0.6, 256 bits) (Mesa, cpu, vulkan)"
        );
        assert!(summary(&[g.clone(), g]).starts_with("2 GPUs found: gpu:0 "));
    }
}
