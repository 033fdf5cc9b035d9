//! This machine's GPUs as the cluster publishes them ([`GpuFacts`]): found by
//! [`shoal_gpu::Gpu::discover`] (Vulkan, Metal, DX12; software drivers such as lavapipe included)
//! and turned into facts by [`fact`], with the device's memory where the backend tells it (Vulkan's
//! device-local heaps and `VK_EXT_memory_budget`, see [`shoal_gpu::GpuMemory`]; not on Metal or
//! DX12). A machine without a GPU, a driver or a Vulkan loader simply finds none: never an error.
//!
//! The GPUs a node may use are measured ([`measure_or_load`]: [`shoal_gpu::probe()`], the CPU
//! probe's figures for shoal's GPU kernels), cached per binary, adapter, driver and probe sizes
//! in the CPU probe's cache ([`crate::compute::cached_or_measure`]) and published in
//! [`GpuFacts::compute`]. `shoal serve` runs [`discover_probe_and_log`] once at start on the
//! runtime's blocking pool (opening the Vulkan loader, asking every driver and measuring take a
//! moment), never on an async worker: `--device gpu:N` measures that GPU, `--device auto` every
//! one, `--device cpu` none. It logs one line on what was found and one per GPU measured; a GPU
//! that cannot be opened or measured is one line and `compute: None`, never a failed start.
//!
//! `--device auto` ([`resolve`]) then serves on the GPU whose measured decode rate for the
//! model's main weight type beats the CPU probe's, else on the CPU, and logs why. `shoal doctor`
//! lists the GPUs with [`discover`] and what the cache holds for them ([`cached_compute`]).

use std::path::Path;

use shoal_bench::{DeviceChoice, Rates};
use shoal_cluster::facts::{ComputeFacts, GpuFacts};
use shoal_engine::engine::Device;
use shoal_gpu::{Gpu, GpuInfo, GpuProbeConfig};

/// The published fact of one adapter (its compute unmeasured).
pub fn fact(info: &GpuInfo) -> GpuFacts {
    GpuFacts {
        name: info.name.clone(),
        vendor: info.vendor.clone(),
        device_type: info.device_type.to_string(),
        backend: info.backend.to_string(),
        driver: info.driver.clone(),
        driver_info: info.driver_info.clone(),
        memory_total: info.memory.total,
        memory_free: info.memory.free,
        compute: None,
    }
}

/// Every adapter, `[]` when there is none (a panic inside discovery is caught and counts as none).
fn adapters() -> Vec<GpuInfo> {
    std::panic::catch_unwind(Gpu::discover).unwrap_or_default()
}

/// Every GPU of this machine, in discovery order; empty when there is none (a panic inside
/// discovery is caught and counts as none). Their compute is what the cache holds for them, not
/// measured here.
pub fn discover() -> Vec<GpuFacts> {
    adapters()
        .iter()
        .map(|info| GpuFacts {
            compute: cached_compute(info),
            ..fact(info)
        })
        .collect()
}

/// The adapters `--device` lets this node use, by index: `gpu:N` that one (when it exists),
/// `auto` every one, `cpu` none.
pub fn selected(choice: DeviceChoice, found: usize) -> Vec<usize> {
    match choice {
        DeviceChoice::Cpu => Vec::new(),
        DeviceChoice::Gpu(i) => (i < found).then_some(i).into_iter().collect(),
        DeviceChoice::Auto => (0..found).collect(),
    }
}

/// What the figures of adapter `info` are valid for: this binary, the adapter and its driver, and
/// the probe's sizes.
fn cache_key(info: &GpuInfo, cfg: &GpuProbeConfig) -> String {
    format!(
        "{}; gpu {} ({} {}, {}); driver {} {}; probe {cfg:?}",
        crate::compute::build_id(),
        info.name,
        info.vendor,
        info.device_type,
        info.backend,
        info.driver,
        info.driver_info
    )
}

/// The figures cached for adapter `info`, without measuring (for `shoal doctor`).
pub fn cached_compute(info: &GpuInfo) -> Option<ComputeFacts> {
    crate::compute::cached_only(&cache_key(info, &GpuProbeConfig::for_device(info)))
}

/// The probe's figures for adapter `info` (see the module docs), measured now or read from the
/// cache; `sample_entries_per_s` is the CPU's (`cpu`): sampling stays on the host. `None`, logged
/// in one line, when the GPU cannot be opened or measured.
pub fn measure_or_load(info: &GpuInfo, cpu: &ComputeFacts) -> Option<ComputeFacts> {
    let cfg = GpuProbeConfig::for_device(info);
    let key = cache_key(info, &cfg);
    let mut facts = crate::compute::cached_or_measure(&key, || measure(info, &cfg, key.clone()));
    facts.sample_entries_per_s = cpu.sample_entries_per_s;
    facts.is_measured().then_some(facts)
}

/// Opens adapter `info` and runs the probe; unmeasured facts (logged) when that fails or panics.
fn measure(info: &GpuInfo, cfg: &GpuProbeConfig, key: String) -> ComputeFacts {
    let tag = format!("gpu:{} {}", info.index, info.name);
    let run = || shoal_gpu::probe(&Gpu::open(info.index)?, cfg);
    let report = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(Ok(report)) => report,
        Ok(Err(e)) => {
            tracing::warn!("{tag}: GPU probe failed: {e}; its compute is not published");
            return ComputeFacts::default();
        }
        Err(_) => {
            tracing::warn!("{tag}: GPU probe panicked; its compute is not published");
            return ComputeFacts::default();
        }
    };
    let (weight_bytes_per_s, rates) = crate::compute::published(&report.rates);
    tracing::info!(
        ms = report.elapsed.as_millis() as u64,
        gflops = report.flops_per_s / 1e9,
        attention_gflops = report.attention_flops_per_s / 1e9,
        "{tag}: GPU probe: GB/s {rates}"
    );
    ComputeFacts {
        weight_bytes_per_s,
        flops_per_s: report.flops_per_s,
        attention_flops_per_s: report.attention_flops_per_s,
        sample_entries_per_s: 0.0,
        // One host thread drives the device.
        threads: 1,
        key,
    }
}

/// Every GPU, the ones `choice` selects measured (or read from the cache), with the lines
/// `shoal serve` logs (see the module docs).
pub fn discover_probe_and_log(choice: DeviceChoice, cpu: &ComputeFacts) -> Vec<GpuFacts> {
    let found = adapters();
    let mut gpus: Vec<GpuFacts> = found.iter().map(fact).collect();
    tracing::info!("{}", summary(&gpus));
    for i in selected(choice, found.len()) {
        gpus[i].compute = measure_or_load(&found[i], cpu);
    }
    gpus
}

/// The main weight type (lowercase ggml name) of the GGUF at `path`; "" when it cannot be read.
pub fn weight_type(path: &Path) -> String {
    shoal_model::gguf::GgufFile::open(path)
        .and_then(|g| shoal_model::Footprint::from_gguf(&g))
        .map(|f| f.weight_type.to_ascii_lowercase())
        .unwrap_or_default()
}

/// Whether the model at `path` has mixture-of-experts layers (a token reads less of a layer than it
/// holds), which `--device auto` keeps on the CPU: the GPU stage runs them, but its prefill is not
/// grouped by expert yet.
pub fn has_experts(path: &Path) -> bool {
    shoal_model::gguf::GgufFile::open(path)
        .and_then(|g| shoal_model::Footprint::from_gguf(&g))
        .is_ok_and(|f| f.active_layer_bytes < f.layer_bytes)
}

/// The engine's device for `choice`: `auto` compares the measured rates of `weight_type` on the
/// CPU (`cpu`) and the GPUs (`gpus`); the reason is logged.
pub fn resolve(
    choice: DeviceChoice,
    weight_type: &str,
    cpu: &ComputeFacts,
    gpus: &[GpuFacts],
) -> Device {
    let (device, why) = choice.resolve(|| rates(weight_type, cpu, gpus));
    if choice == DeviceChoice::Auto {
        tracing::info!("{why}");
    }
    device
}

/// The decode rates `--device auto` compares: of `weight_type` (a GPU whose cached figures predate
/// that type's kernel did not measure it: none); for an unknown type ("") or one the CPU probe did
/// not measure, the slowest measured type's.
fn rates(weight_type: &str, cpu: &ComputeFacts, gpus: &[GpuFacts]) -> Rates {
    let slowest = |c: &ComputeFacts| c.slowest().filter(|_| weight_type.is_empty());
    Rates {
        weight_type: weight_type.to_string(),
        cpu: cpu.bytes_per_s(weight_type).or_else(|| cpu.slowest()),
        gpus: gpus
            .iter()
            .map(|g| {
                let c = g.compute.as_ref()?;
                c.bytes_per_s(weight_type).or_else(|| slowest(c))
            })
            .collect(),
    }
}

/// [`resolve`] for an engine started in this process (`shoal chat`, `shoal bench`) on the model
/// at `path`: `auto` measures (or reads from the cache) the CPU at `threads` threads and every
/// GPU first; the other choices measure nothing.
pub fn resolve_for_model(choice: DeviceChoice, path: &Path, threads: usize) -> Device {
    if choice != DeviceChoice::Auto {
        return choice.resolve_here();
    }
    if has_experts(path) {
        tracing::info!(
            "--device auto: a mixture-of-experts model runs on the CPU (--device gpu:N puts it on a GPU, whose prefill is not grouped by expert yet)"
        );
        return Device::Cpu;
    }
    let cpu = crate::compute::measure_or_load(threads);
    let gpus = discover_probe_and_log(choice, &cpu);
    resolve(choice, &weight_type(path), &cpu, &gpus)
}

/// The types `shoal doctor` shows a GPU's decode rate for (the ones models mostly ship in).
const MAIN_TYPES: [&str; 7] = ["q4_0", "q4_1", "q4_k", "q5_k", "q6_k", "q8_0", "f16"];

/// `memory 24.0 GiB (23.1 GiB free)`, or why it is unknown.
pub fn memory_text(g: &GpuFacts) -> String {
    let gib = |b: u64| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64);
    match (g.memory_total, g.memory_free) {
        (Some(total), Some(free)) => format!("memory {} ({} free)", gib(total), gib(free)),
        (Some(total), None) => format!("memory {}", gib(total)),
        _ => "memory unknown (not read on this backend)".into(),
    }
}

/// `decode GB/s q4_0 1.20, q4_k 1.10; batched 4.0 GFLOP/s, attention 2.0 GFLOP/s` for the main
/// types measured, or that the GPU was not measured yet.
pub fn compute_text(c: Option<&ComputeFacts>) -> String {
    let Some(c) = c.filter(|c| c.is_measured()) else {
        return "not measured yet (shoal serve --device auto or gpu:N measures it)".into();
    };
    let rates: Vec<String> = MAIN_TYPES
        .iter()
        .filter_map(|t| c.bytes_per_s(t).map(|r| format!("{t} {:.2}", r / 1e9)))
        .collect();
    format!(
        "decode GB/s {}; batched {:.1} GFLOP/s, attention {:.1} GFLOP/s",
        rates.join(", "),
        c.flops_per_s / 1e9,
        c.attention_flops_per_s / 1e9
    )
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
            memory: shoal_gpu::GpuMemory {
                total: Some(2 << 30),
                free: None,
            },
        }
    }

    #[test]
    fn an_adapter_becomes_a_fact_with_its_name_vendor_type_backend_driver_and_memory() {
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
                memory_total: Some(2 << 30),
                memory_free: None,
                compute: None,
            }
        );
        let json = serde_json::to_value(&g).expect("serializes");
        assert_eq!(json["memory_total"], 2u64 << 30);
        assert_eq!(json["memory_free"], serde_json::Value::Null);
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

    #[test]
    fn device_selects_the_gpus_to_measure() {
        assert_eq!(selected(DeviceChoice::Cpu, 2), Vec::<usize>::new());
        assert_eq!(selected(DeviceChoice::Gpu(1), 2), vec![1]);
        assert_eq!(selected(DeviceChoice::Gpu(2), 2), Vec::<usize>::new());
        assert_eq!(selected(DeviceChoice::Auto, 3), vec![0, 1, 2]);
    }

    fn measured(rates: &[(&str, f64)]) -> ComputeFacts {
        ComputeFacts {
            weight_bytes_per_s: rates.iter().map(|(t, r)| (t.to_string(), *r)).collect(),
            ..ComputeFacts::default()
        }
    }

    /// `auto` compares the model's main type's rates; a type a probe did not measure counts at
    /// its slowest measured rate; an unmeasured GPU is none.
    #[test]
    fn auto_compares_the_model_types_measured_rates() {
        let cpu = measured(&[("q4_k", 10e9), ("q8_0", 12e9)]);
        let gpu = |c: Option<ComputeFacts>| GpuFacts {
            compute: c,
            ..fact(&lavapipe())
        };
        let slow = gpu(Some(measured(&[("q4_k", 1e9), ("q8_0", 20e9)])));
        let fast = gpu(Some(measured(&[("q4_k", 500e9)])));
        let gpus = [slow.clone(), gpu(None), fast];
        let r = rates("q4_k", &cpu, &gpus);
        assert_eq!(
            (r.cpu, r.gpus.clone()),
            (Some(10e9), vec![Some(1e9), None, Some(500e9)])
        );
        assert_eq!(
            resolve(DeviceChoice::Auto, "q4_k", &cpu, &gpus),
            Device::Gpu(2)
        );
        assert_eq!(
            resolve(DeviceChoice::Auto, "q4_k", &cpu, &gpus[..2]),
            Device::Cpu
        );
        assert_eq!(
            resolve(DeviceChoice::Auto, "q8_0", &cpu, &gpus[..1]),
            Device::Gpu(0)
        );
        // A type the GPU did not measure (figures cached before its kernel existed): the CPU; the
        // CPU counts a type it did not measure at its slowest.
        let r = rates("iq4_xs", &cpu, &gpus);
        assert_eq!((r.cpu, r.gpus), (Some(10e9), vec![None, None, None]));
        assert_eq!(
            resolve(DeviceChoice::Auto, "iq4_xs", &cpu, &gpus),
            Device::Cpu
        );
        // The model's type unknown: each at its slowest (10 vs 1 and 500 GB/s).
        assert_eq!(
            rates("", &cpu, &gpus).gpus,
            vec![Some(1e9), None, Some(500e9)]
        );
        assert_eq!(resolve(DeviceChoice::Auto, "", &cpu, &gpus), Device::Gpu(2));
        assert_eq!(resolve(DeviceChoice::Cpu, "q4_k", &cpu, &gpus), Device::Cpu);
        assert_eq!(
            resolve(DeviceChoice::Gpu(1), "q4_k", &cpu, &gpus),
            Device::Gpu(1)
        );
    }

    /// The probe on this machine's first adapter (lavapipe here) fills every GPU type with a
    /// positive rate, under a key naming the adapter and the sizes.
    #[test]
    fn the_first_adapter_is_measured() {
        let found = adapters();
        if found.is_empty() && std::env::var("SHOAL_GPU_TESTS").is_ok_and(|v| v == "skip") {
            return;
        }
        let info = found.first().expect("an adapter (lavapipe)");
        let cfg = GpuProbeConfig {
            matrix_bytes: 1 << 20,
            rounds: 1,
            ..GpuProbeConfig::software()
        };
        let key = cache_key(info, &cfg);
        assert!(
            key.contains(&info.name) && key.contains(&info.driver_info),
            "{key}"
        );
        assert_ne!(key, cache_key(info, &GpuProbeConfig::software()));
        let facts = measure(info, &cfg, key.clone());
        assert_eq!(facts.key, key);
        assert_eq!(facts.weight_bytes_per_s.len(), shoal_gpu::GPU_TYPES.len());
        for t in shoal_gpu::GPU_TYPES {
            let rate = facts.bytes_per_s(&t.name().to_ascii_lowercase());
            assert!(rate.is_some_and(|r| r > 0.0), "{t:?}: {rate:?}");
        }
        assert!(facts.flops_per_s > 0.0 && facts.attention_flops_per_s > 0.0);
    }
}
