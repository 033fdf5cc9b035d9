//! `--device cpu|gpu|gpu:N|auto`: where an engine's layers run. `shoal serve`, `chat` and `bench` all
//! take it; it lives here, below the binary, so `shoal bench` resolves it without an import cycle.

use shoal_engine::engine::Device;

/// `--device`, as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    Cpu,
    Gpu(usize),
    Auto,
}

/// Parses `--device`: `cpu`, `gpu` (adapter 0), `gpu:N` or `auto`, in any case.
pub fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    let s = s.trim().to_ascii_lowercase();
    match s.as_str() {
        "cpu" => Ok(DeviceChoice::Cpu),
        "gpu" => Ok(DeviceChoice::Gpu(0)),
        "auto" => Ok(DeviceChoice::Auto),
        _ => s
            .strip_prefix("gpu:")
            .and_then(|n| n.parse().ok())
            .map(DeviceChoice::Gpu)
            .ok_or_else(|| format!("'{s}': expected cpu, gpu, gpu:N or auto")),
    }
}

impl DeviceChoice {
    /// The engine's device: `auto` asks the GPUs found (`device_type` of each, in discovery order) and
    /// takes the first hardware one — never a software driver such as lavapipe — else the CPU.
    pub fn resolve(self, device_types: impl FnOnce() -> Vec<&'static str>) -> Device {
        match self {
            DeviceChoice::Cpu => Device::Cpu,
            DeviceChoice::Gpu(i) => Device::Gpu(i),
            DeviceChoice::Auto => device_types()
                .iter()
                .position(|t| matches!(*t, "discrete" | "integrated" | "virtual"))
                .map_or(Device::Cpu, Device::Gpu),
        }
    }

    /// [`DeviceChoice::resolve`] against the adapters this machine has ([`shoal_gpu::Gpu::discover`],
    /// asked only for `auto`).
    pub fn resolve_here(self) -> Device {
        self.resolve(|| {
            shoal_gpu::Gpu::discover()
                .iter()
                .map(|g| g.device_type)
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_choices_parse_and_auto_skips_software_drivers() {
        assert_eq!(parse_device("cpu"), Ok(DeviceChoice::Cpu));
        assert_eq!(parse_device("GPU"), Ok(DeviceChoice::Gpu(0)));
        assert_eq!(parse_device("gpu:2"), Ok(DeviceChoice::Gpu(2)));
        assert_eq!(parse_device("auto"), Ok(DeviceChoice::Auto));
        for bad in ["", "gpu:", "gpu:x", "gpu:-1", "tpu", "cuda"] {
            assert!(parse_device(bad).is_err(), "{bad:?}");
        }
        let auto = |types: Vec<&'static str>| DeviceChoice::Auto.resolve(|| types);
        assert_eq!(auto(vec![]), Device::Cpu);
        // lavapipe is slower than the CPU path it stands in for.
        assert_eq!(auto(vec!["cpu"]), Device::Cpu);
        assert_eq!(auto(vec!["cpu", "discrete"]), Device::Gpu(1));
        assert_eq!(auto(vec!["integrated"]), Device::Gpu(0));
        assert_eq!(
            DeviceChoice::Gpu(3).resolve(|| unreachable!()),
            Device::Gpu(3)
        );
    }
}
