//! What a node publishes about itself: resources, GPUs, models, links, and the instances it runs.
//!
//! Each fact has one owner: only node X writes X's [`NodeFacts`]; everyone else keeps the latest copy
//! it received. Collected from the OS (each OS's reader behind one interface: [`linux`] reads `/proc`
//! and `/sys`, [`macos`] sysctl, the Mach VM counters and SystemConfiguration; sysinfo fills in where
//! a reader has nothing), from the local model store, and from the compute probe `shoal serve` runs
//! at start ([`ComputeFacts`]; `crate::compute` turns it into the planner's speeds for one model). The GPUs ([`GpuFacts`]) are
//! found by the binary at start (this crate does not depend on the GPU crate) and handed in with
//! `ClusterHandle::set_gpus`.

use shoal_ids::{InstanceId, ModelId, NodeId};
use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use shoal_placement::{LinkKind, ModelCard};

mod host;
pub mod linux;
pub mod macos;

pub use host::{CoreKinds, CpuTimes, HostMemory, InterfaceFacts, Pressure, Thermal};
use host::{Os, OsReader};

/// A node's own facts, as published to every peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeFacts {
    pub id: NodeId,
    /// Host name, for humans.
    pub name: String,
    /// Base URL of this node's HTTP API, e.g. `http://10.0.0.2:52415`.
    pub api_url: Option<String>,
    /// Addresses other nodes can dial (libp2p multiaddrs with `/p2p/<id>`).
    pub addrs: Vec<String>,
    pub memory: MemoryFacts,
    pub cpu_cores: usize,
    /// The CPU's model name (`/proc/cpuinfo`, `machdep.cpu.brand_string`); empty from nodes that
    /// predate it.
    #[serde(default)]
    pub cpu_model: String,
    /// Its performance and efficiency cores, where the OS tells them apart (Apple Silicon's
    /// performance levels, hybrid Intel, ARM big.LITTLE); `None` elsewhere and from older nodes.
    #[serde(default)]
    pub core_kinds: Option<CoreKinds>,
    /// The OS's thermal state where it has one (macOS), refreshed with `memory`.
    #[serde(default)]
    pub thermal: Option<Thermal>,
    /// The machine this node runs on ([`machine`]): nodes with the same one share its cores and
    /// memory bus, which the planner prices (two processes on one box are not two boxes). `None`
    /// where the OS does not tell, and from nodes that predate it.
    #[serde(default)]
    pub machine: Option<String>,
    /// Share of all cores busy over the last refresh, in [0, 1] (Linux `/proc/stat`, macOS's load
    /// ticks); `None` until a second reading, on other OSes, and from nodes that predate it.
    /// Refreshed with `memory` ([`crate::sysload`]).
    #[serde(default)]
    pub cpu_load: Option<f32>,
    /// The hottest temperature sensor, °C (Linux thermal zones / hwmon), where the OS exposes one.
    #[serde(default)]
    pub temperature_c: Option<f32>,
    /// CPU package power over the last refresh, watts (Linux powercap RAPL), where readable.
    #[serde(default)]
    pub power_w: Option<f32>,
    /// The accelerator that runs the model: `cpu` (the only backend shoal builds today).
    pub accelerator: String,
    /// Compute backend in use, e.g. `cpu-avx2`.
    pub backend: String,
    /// The GPUs this node found at start (software ones such as lavapipe included), in discovery
    /// order (a GPU's index is its position); empty on a machine without a GPU or a Vulkan loader,
    /// and from nodes that predate it.
    #[serde(default)]
    pub gpus: Vec<GpuFacts>,
    /// Which GPU this node offers the planner for its stages' layers (`--device`); `cpu` for nodes
    /// that predate it.
    #[serde(default)]
    pub device: DevicePolicy,
    /// Compute speed in layer-steps per second of a reference layer (SmolLM2-135M's, Q4_1): from the
    /// probe ([`ComputeFacts::reference_speed`]) once it ran, else an estimate from the core count.
    /// Nodes that know [`NodeFacts::compute`] price each model from that instead; this stays for
    /// readers that predate it.
    pub speed: f64,
    /// What this node's kernels measured at start; empty (default) until measured, and from nodes that
    /// predate the probe.
    #[serde(default)]
    pub compute: ComputeFacts,
    /// Models present in this node's store, with what placement needs to know about them.
    pub models: Vec<ModelCard>,
    /// This node's links to the peers it is connected to.
    pub links: Vec<LinkFacts>,
    /// Load state of the stages this node runs, by instance id.
    pub instances: BTreeMap<InstanceId, InstanceStatus>,
    /// Tokens of KV the stages this node hosts for other nodes' instances have room for (reserved from
    /// this node's budget), by instance id; the driver never holds more.
    #[serde(default)]
    pub kv_capacity: BTreeMap<InstanceId, u64>,
    /// Model downloads on this node (running, and the last finished ones), by model id.
    #[serde(default)]
    pub downloads: Vec<DownloadFacts>,
    /// Nodes this node refuses (`shoal remove`); every member adopts the removals it hears of.
    #[serde(default)]
    pub removed: Vec<RemovedNode>,
    /// What the instances this node drives are doing (queue, measured speed), by instance id: the other
    /// members balance requests with it, and `/state` shows it next to the planner's prediction.
    #[serde(default)]
    pub load: BTreeMap<InstanceId, InstanceLoad>,
    /// Version of the instance table this node holds: a change of the table is acknowledged by every
    /// member once each publishes its version (`ClusterHandle::place` / `remove` wait for that).
    #[serde(default)]
    pub table_version: u64,
    /// Increases with every publication, so receivers keep the newest.
    pub seq: u64,
    /// Unix seconds when this node process started.
    pub started: u64,
}

/// Which GPU a node offers the planner for the layers of the stages placed on it (its `--device`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DevicePolicy {
    /// None: every layer on the CPU.
    #[default]
    Cpu,
    /// This GPU (its index in [`NodeFacts::gpus`]), for every layer that fits, whatever it measured.
    Gpu(usize),
    /// The GPU measured fastest, when it is faster than the CPU.
    Auto,
}

/// One GPU of a node, as published.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuFacts {
    /// The adapter's name as its driver gives it (`NVIDIA H100 80GB HBM3`, `llvmpipe (LLVM 15.0.6,
    /// 256 bits)`).
    pub name: String,
    /// The vendor's name from the PCI vendor id (`NVIDIA`, `AMD`, `Intel`, `Apple`, `Mesa`, …; the id
    /// in hex when unknown).
    pub vendor: String,
    /// `discrete`, `integrated`, `virtual`, `cpu` (a software driver such as lavapipe) or `other`.
    pub device_type: String,
    /// The API it runs through: `vulkan`, `metal` or `dx12`.
    pub backend: String,
    /// The driver's name and its version string (`llvmpipe`, `Mesa 22.3.6 (LLVM 15.0.6)`).
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub driver_info: String,
    /// The device's memory, total and free, in bytes, as its driver tells it: on Vulkan the
    /// device-local heaps (host memory on an integrated GPU or lavapipe) and, where the driver has
    /// `VK_EXT_memory_budget`, what may still be allocated; `None` where not read (Metal, DX12).
    #[serde(default)]
    pub memory_total: Option<u64>,
    #[serde(default)]
    pub memory_free: Option<u64>,
    /// What shoal's GPU kernels measured on this device (the same figures the CPU probe gives:
    /// weight bytes/s per type, batched flop/s, attention flop/s); `None` until measured.
    #[serde(default)]
    pub compute: Option<ComputeFacts>,
}

/// A node taken out of the cluster with `shoal remove`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovedNode {
    pub id: NodeId,
    /// Its host name when it was removed (empty when it was removed by id while away).
    pub name: String,
    /// Unix seconds.
    pub at: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryFacts {
    pub total: u64,
    pub available: u64,
    /// Memory pressure in [0, 1]: on Linux the share of the last 10 s in which some task waited for
    /// memory (PSI `/proc/pressure/memory`, `some avg10` / 100); on macOS the kernel's pressure level
    /// (normal 0, warn 0.5, critical 1); 0 where neither is readable (kernels without PSI).
    pub pressure: f32,
    /// Used fraction in [0, 1]: `1 − available / total` (what `pressure` meant before PSI).
    #[serde(default)]
    pub used: f32,
}

/// What this node's kernels measured (the compute probe of `shoal_kernels`), as published.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ComputeFacts {
    /// Weight bytes one matrix × vector product streams per second, by GGUF type name in lowercase
    /// (`q4_0`, `q4_k`, `f16`, …): a decode step's rate for a layer of that type.
    #[serde(default)]
    pub weight_bytes_per_s: BTreeMap<String, f64>,
    /// Floating-point operations per second of a batched product (32 activation rows): the
    /// compute-bound rate of prompt processing. 0 when not measured.
    #[serde(default)]
    pub flops_per_s: f64,
    /// Floating-point operations per second of one decode token's attention over cached f16 keys and
    /// values (`4 · head_dim` per query head and position). 0 when not measured.
    #[serde(default)]
    pub attention_flops_per_s: f64,
    /// Logit entries per second of the sampler's passes over a row (a greedy pick). 0 when not measured.
    #[serde(default)]
    pub sample_entries_per_s: f64,
    /// Threads the probe ran on (the engine's thread count).
    #[serde(default)]
    pub threads: usize,
    /// What the figures are valid for: binary version, CPU model and features, thread count (a node
    /// measures again when it changes).
    #[serde(default)]
    pub key: String,
}

/// The layer [`NodeFacts::speed`] is counted in: one layer of SmolLM2-135M in Q4_1 (2,216,448 bytes),
/// the model the estimate from cores was calibrated on, so old and new nodes publish comparable speeds.
pub const REFERENCE_LAYER: (&str, u64) = ("q4_1", 2_216_448);

impl ComputeFacts {
    /// Whether the probe ran (some type has a usable rate).
    pub fn is_measured(&self) -> bool {
        self.weight_bytes_per_s.values().any(|r| usable(*r))
    }

    /// The decode rate for weights of type `ty` (lowercase GGUF name), when measured.
    pub fn bytes_per_s(&self, ty: &str) -> Option<f64> {
        self.weight_bytes_per_s
            .get(ty)
            .copied()
            .filter(|r| usable(*r))
    }

    /// The slowest measured decode rate (for a type the probe did not measure).
    pub fn slowest(&self) -> Option<f64> {
        self.weight_bytes_per_s
            .values()
            .copied()
            .filter(|r| usable(*r))
            .min_by(f64::total_cmp)
    }

    /// Layer-steps per second of [`REFERENCE_LAYER`], for [`NodeFacts::speed`]; `None` unmeasured.
    pub fn reference_speed(&self) -> Option<f64> {
        let (ty, bytes) = REFERENCE_LAYER;
        let rate = self.bytes_per_s(ty).or_else(|| self.slowest())?;
        Some(rate / bytes as f64)
    }
}

/// A measured rate worth using: finite and positive.
pub(crate) fn usable(rate: f64) -> bool {
    rate.is_finite() && rate > 0.0
}

/// What one instance is doing, as its driver publishes it (refreshed with the node's facts, every second).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstanceLoad {
    /// Sequences running in the instance's engine.
    pub running: u32,
    /// Requests waiting for admission.
    pub queued: u32,
    /// Measured decode rate of one stream, tokens per second (recent requests); `None` until measured.
    #[serde(default)]
    pub decode_tok_s: Option<f64>,
    /// Measured time to first token of recent requests, milliseconds.
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    /// Requests finished since the instance started.
    #[serde(default)]
    pub finished: u64,
    /// Tokens generated since the instance started (the dashboard's served tok/s is its rate).
    #[serde(default)]
    pub generated_tokens: u64,
    /// Speculative decoding since the instance started: passes that verified a draft, tokens drafted,
    /// drafted tokens accepted (the dashboard's acceptance rate and tokens per pass).
    #[serde(default)]
    pub spec_passes: u64,
    #[serde(default)]
    pub drafted_tokens: u64,
    #[serde(default)]
    pub accepted_tokens: u64,
}

/// One direction of a link, as measured by its owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkFacts {
    pub peer: NodeId,
    pub kind: LinkKind,
    /// The preferred path's round trip (the least ping of the last ten seconds), microseconds.
    pub rtt_us: Option<f64>,
    /// Measured bandwidth (bytes per second) from the last probe.
    pub bandwidth_bps: Option<f64>,
    /// Data-plane bytes per second sent to / received from the peer over the last second.
    pub tx_bytes_per_s: f64,
    pub rx_bytes_per_s: f64,
    /// Data-plane bytes sent to / received from the peer since this node started.
    #[serde(default)]
    pub tx_bytes: u64,
    #[serde(default)]
    pub rx_bytes: u64,
    /// The paths to the peer (one per address it is connected over), cheapest first; `rtt_us` and
    /// `bandwidth_bps` above are the preferred path's. Empty from nodes that predate paths.
    #[serde(default)]
    pub paths: Vec<PathFacts>,
}

/// One path of a link: the connections to the peer over one of its addresses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathFacts {
    /// The peer's address on this path.
    pub addr: String,
    /// The least ping round trip on it over the last ten seconds, microseconds.
    pub rtt_us: Option<f64>,
    /// Bytes per second measured by its last probe.
    pub bandwidth_bps: Option<f64>,
    /// Predicted microseconds to carry a reference batch (64 KiB) over it: rtt + bytes / bandwidth.
    pub cost_us: f64,
    /// Whether the data plane opens its streams to the peer on this path.
    pub preferred: bool,
    /// Instances whose data-plane streams from this node run on it now (the pipeline hops it carries).
    #[serde(default)]
    pub instances: Vec<InstanceId>,
    /// Those of them relayed: their frames go through the cluster connection, not a direct one (a lane
    /// could not be made, or `--no-lanes`).
    #[serde(default)]
    pub relayed: Vec<InstanceId>,
}

/// One model download on a node, as its owner publishes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DownloadFacts {
    pub model: ModelId,
    /// `running`, `done`, `failed` or `cancelled`.
    pub state: String,
    /// Bytes this node needs (the whole file, or the chunks holding one stage's tensors).
    pub needed: u64,
    /// Of those, bytes fetched and verified.
    pub done: u64,
    /// Size of the whole model file.
    pub file_size: u64,
    pub bytes_per_s: f64,
    /// Seconds left at the current speed.
    pub eta_s: Option<f64>,
    /// Where the bytes came from (peer ids, `hub`, `pip`), with bytes from each.
    #[serde(default)]
    pub sources: BTreeMap<String, u64>,
    /// Chunks that failed verification and were fetched again elsewhere.
    #[serde(default)]
    pub refused_chunks: u64,
    /// Why it failed.
    #[serde(default)]
    pub error: Option<String>,
}

/// Load state of one stage of an instance on its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum InstanceStatus {
    /// The stage's bytes are still arriving (from peers or the internet): `done` of `needed` bytes.
    Downloading {
        done: u64,
        needed: u64,
    },
    Loading,
    Ready,
    Failed {
        error: String,
    },
}

/// Memory, cores and accelerator of this machine: the OS reader's memory (sysinfo's where it has
/// none), its pressure (0 where unread).
pub fn local_resources() -> (MemoryFacts, usize) {
    let HostMemory { total, available } =
        Os::memory().unwrap_or_else(|| match sysinfo::System::new() {
            Ok(mut sys) => {
                sys.refresh_memory();
                HostMemory {
                    total: sys.total_memory(),
                    available: sys.available_memory(),
                }
            }
            Err(_) => HostMemory::default(),
        });
    let used = if total > 0 {
        (1.0 - available as f64 / total as f64) as f32
    } else {
        0.0
    };
    let pressure = memory_pressure().map_or(0.0, |p| p.share);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    (
        MemoryFacts {
            total,
            available,
            pressure,
            used,
        },
        cores,
    )
}

/// The OS's memory pressure now, where it tells one (Linux PSI, macOS's pressure level).
pub fn memory_pressure() -> Option<Pressure> {
    Os::pressure()
}

/// The machine this process runs on, as 16 hex digits of a hash of its running kernel's boot id
/// (the id itself is not published); `None` where the OS does not tell.
pub fn machine() -> Option<String> {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("shoal machine {}", Os::boot_id()?));
    Some(digest[..8].iter().map(|b| format!("{b:02x}")).collect())
}

/// The CPU's model name as the OS reports it (`AMD EPYC`, `Apple M2`, …); "" when unknown.
pub fn cpu_model() -> String {
    if let Some(model) = Os::cpu_model() {
        return model;
    }
    let Ok(mut sys) = sysinfo::System::new() else {
        return String::new();
    };
    sys.refresh_cpu_list(sysinfo::CpuRefreshKind::nothing());
    sys.cpus()
        .first()
        .map(|c| c.brand().trim().to_string())
        .unwrap_or_default()
}

/// The machine's performance and efficiency cores, where the OS tells them apart.
pub fn core_kinds() -> Option<CoreKinds> {
    Os::core_kinds()
}

/// Busy and total CPU time of all cores so far, where the OS tells it (Linux `/proc/stat`, macOS's
/// load ticks).
pub fn cpu_times() -> Option<CpuTimes> {
    Os::cpu_times()
}

/// The OS's thermal state, where it has one to read (macOS).
pub fn thermal() -> Option<Thermal> {
    Os::thermal()
}

/// This machine's host name (`gethostname`); `None` when the call fails or the name is empty.
pub fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its length; the result is NUL-terminated when it fits, and
    // the last byte stays 0 either way.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return None;
    }
    let name = std::ffi::CStr::from_bytes_until_nul(&buf).ok()?;
    let name = name.to_string_lossy().trim().to_string();
    (!name.is_empty()).then_some(name)
}

/// This machine's network interfaces with addresses, with the kind of link each is.
pub fn interfaces() -> Vec<InterfaceFacts> {
    let Ok(networks) = sysinfo::Networks::new_with_refreshed_list() else {
        return Vec::new();
    };
    let mut out: Vec<InterfaceFacts> = networks
        .iter()
        .filter(|(_, data)| !data.ip_networks().is_empty())
        .map(|(name, data)| {
            let name = name.to_string_lossy().into_owned();
            InterfaceFacts {
                kind: Os::interface_kind(&name),
                addrs: data
                    .ip_networks()
                    .iter()
                    .map(|n| format!("{}/{}", n.addr, n.prefix))
                    .collect(),
                name,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Layer-steps per second assumed per core: one core of this VM decodes the 30-layer default model at
/// ~150 tok/s when alone, i.e. ~4,500 layer-steps/s; memory bandwidth caps it near two cores.
const LAYER_STEPS_PER_CORE: f64 = 4_500.0;

/// A rough compute speed for the placement cost model, from the core count.
pub fn estimate_speed(cores: usize) -> f64 {
    LAYER_STEPS_PER_CORE * (cores.clamp(1, 8) as f64).sqrt()
}

/// This machine's IPv4 addresses other machines may reach (not loopback, not link-local).
pub fn reachable_ipv4s() -> Vec<std::net::Ipv4Addr> {
    let Ok(networks) = sysinfo::Networks::new_with_refreshed_list() else {
        return Vec::new();
    };
    let mut out: Vec<std::net::Ipv4Addr> = networks
        .values()
        .flat_map(|data| data.ip_networks().iter().map(|n| n.addr))
        .filter_map(|a| match a {
            IpAddr::V4(v4) if !v4.is_loopback() && !v4.is_link_local() => Some(v4),
            _ => None,
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The kind of the link to a peer at `remote`: loopback for this machine's own addresses, else the kind
/// of the interface whose subnet holds the peer.
pub fn link_kind(remote: IpAddr) -> LinkKind {
    if remote.is_loopback() {
        return LinkKind::Loopback;
    }
    let Ok(networks) = sysinfo::Networks::new_with_refreshed_list() else {
        return LinkKind::Unknown;
    };
    let mut found = None;
    for (name, data) in &networks {
        for n in data.ip_networks() {
            if n.addr == remote {
                return LinkKind::Loopback;
            }
            if found.is_none() && same_subnet(n.addr, remote, n.prefix) {
                found = Some(name.to_string_lossy().into_owned());
            }
        }
    }
    found.map_or(LinkKind::Unknown, |name| Os::interface_kind(&name))
}

/// Whether `a` and `b` share their first `prefix` bits (same address family only).
pub fn same_subnet(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    let (a, b, bits): (u128, u128, u32) = match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (u32::from(a).into(), u32::from(b).into(), 32),
        (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128),
        _ => return false,
    };
    let prefix = u32::from(prefix).min(bits);
    if prefix == 0 {
        return false; // a default route is not a shared link
    }
    (a ^ b) >> (bits - prefix) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(same_subnet(ip("10.77.0.10"), ip("10.77.0.11"), 24));
        assert!(!same_subnet(ip("10.77.0.10"), ip("10.77.1.11"), 24));
        assert!(same_subnet(ip("10.77.0.10"), ip("10.77.1.11"), 16));
        assert!(!same_subnet(ip("10.0.0.1"), ip("::1"), 8));
        assert!(same_subnet(ip("fe80::1"), ip("fe80::2"), 64));
        assert!(!same_subnet(ip("1.2.3.4"), ip("1.2.3.4"), 0));
    }

    #[test]
    fn loopback_addresses_are_loopback_links() {
        assert_eq!(link_kind("127.0.0.1".parse().unwrap()), LinkKind::Loopback);
        assert_eq!(link_kind("::1".parse().unwrap()), LinkKind::Loopback);
    }

    #[test]
    fn compute_rates_and_the_reference_speed() {
        let mut c = ComputeFacts::default();
        assert!(!c.is_measured());
        assert_eq!(c.reference_speed(), None);
        c.weight_bytes_per_s.insert("q8_0".into(), 8e9);
        c.weight_bytes_per_s.insert("q4_k".into(), 4e9);
        c.weight_bytes_per_s.insert("bad".into(), f64::NAN);
        assert!(c.is_measured());
        assert_eq!(c.bytes_per_s("q8_0"), Some(8e9));
        assert_eq!(c.bytes_per_s("bad"), None);
        assert_eq!(c.slowest(), Some(4e9));
        // No q4_1 measured: the slowest type stands in.
        assert_eq!(c.reference_speed(), Some(4e9 / 2_216_448.0));
        c.weight_bytes_per_s.insert("q4_1".into(), 5e9);
        assert_eq!(c.reference_speed(), Some(5e9 / 2_216_448.0));
    }

    #[test]
    fn gpus_default_to_none_from_nodes_that_predate_them() {
        let old = serde_json::json!({
            "id": "a", "name": "a", "api_url": null, "addrs": [],
            "memory": {"total": 1, "available": 1, "pressure": 0.0},
            "cpu_cores": 1, "accelerator": "cpu", "backend": "cpu", "speed": 1.0,
            "models": [], "links": [], "instances": {}, "seq": 1, "started": 0,
        });
        let facts: NodeFacts = serde_json::from_value(old).expect("older facts still parse");
        assert!(facts.gpus.is_empty());
        let gpu: GpuFacts = serde_json::from_value(serde_json::json!({
            "name": "g", "vendor": "AMD", "device_type": "discrete", "backend": "vulkan",
        }))
        .expect("a GPU without driver or memory parses");
        assert_eq!((gpu.driver.as_str(), gpu.memory_total), ("", None));
    }

    #[test]
    fn resources_are_plausible() {
        let (mem, cores) = local_resources();
        assert!(mem.total > 0 && mem.available <= mem.total);
        assert!((0.0..=1.0).contains(&mem.pressure));
        assert!((0.0..=1.0).contains(&mem.used) && mem.used > 0.0);
        assert!(cores >= 1);
        assert!(!cpu_model().is_empty(), "this machine names its CPU");
        if cfg!(target_os = "linux") {
            let m = machine().expect("Linux tells the boot id");
            assert_eq!(m.len(), 16, "{m}");
            assert_eq!(machine(), Some(m), "one machine, one id");
        }
        assert!(host_name().is_some_and(|h| !h.contains('\0')));
        #[cfg(target_os = "linux")]
        {
            // This machine has PSI (a kernel without it would read `None`) and a loopback device.
            let p = memory_pressure().expect("PSI is readable here");
            assert!((0.0..=1.0).contains(&p.share) && p.source == "PSI some avg10");
            let lo = interfaces()
                .into_iter()
                .find(|i| i.name == "lo")
                .expect("lo listed");
            assert_eq!(lo.kind, LinkKind::Loopback);
            assert!(
                lo.addrs.iter().any(|a| a == "127.0.0.1/8"),
                "{:?}",
                lo.addrs
            );
        }
    }
}
