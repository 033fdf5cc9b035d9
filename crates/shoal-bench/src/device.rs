//! `--device cpu|gpu|gpu:N|auto`: where an engine's layers run. `shoal serve`, `chat` and `bench` all
//! take it; it lives here, below the binary, so `shoal bench` resolves it without an import cycle.
//! `auto` compares measured decode rates ([`Rates`]: the CPU probe's and each GPU probe's, for the
//! model's main weight type) that the binary gathers; without them it is the CPU.

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

/// Measured decode rates (weight bytes per second) for the served model's main weight type, which
/// `--device auto` compares: the CPU's (the compute probe) and each GPU's (shoal-gpu's probe), in
/// discovery order; `None` where not measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rates {
    /// The model's main weight type, lowercase (`q4_k`), for the reason given.
    pub weight_type: String,
    pub cpu: Option<f64>,
    pub gpus: Vec<Option<f64>>,
}

impl DeviceChoice {
    /// The engine's device and why. `auto` takes the GPU whose measured rate for the model's main
    /// weight type is the highest, when it beats the CPU's measured rate for that type; otherwise
    /// (nothing measured, a GPU slower than the CPU — lavapipe is) the CPU. `rates` is asked only
    /// for `auto`.
    pub fn resolve(self, rates: impl FnOnce() -> Rates) -> (Device, String) {
        match self {
            DeviceChoice::Cpu => (Device::Cpu, "--device cpu".into()),
            DeviceChoice::Gpu(i) => (Device::Gpu(i), format!("--device gpu:{i}")),
            DeviceChoice::Auto => auto(&rates()),
        }
    }

    /// [`DeviceChoice::resolve`] without figures: `auto` is the CPU (nothing says a GPU is faster).
    /// The binary resolves `auto` against measured figures before it gets here.
    pub fn resolve_here(self) -> Device {
        self.resolve(Rates::default).0
    }
}

/// `--device auto` against `r` (see [`DeviceChoice::resolve`]).
fn auto(r: &Rates) -> (Device, String) {
    let gb = |v: f64| format!("{:.2} GB/s", v / 1e9);
    let ty = if r.weight_type.is_empty() {
        "the model's weights"
    } else {
        r.weight_type.as_str()
    };
    let best = r
        .gpus
        .iter()
        .enumerate()
        .filter_map(|(i, g)| g.filter(|v| v.is_finite() && *v > 0.0).map(|v| (i, v)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let Some((i, gpu)) = best else {
        return (
            Device::Cpu,
            format!("--device auto: no GPU measured on {ty}: serving on CPU"),
        );
    };
    match r.cpu.filter(|v| v.is_finite() && *v > 0.0) {
        Some(cpu) if gpu > cpu => (
            Device::Gpu(i),
            format!(
                "--device auto: gpu:{i} measures {} on {ty}, faster than the CPU's {}: serving on gpu:{i}",
                gb(gpu),
                gb(cpu)
            ),
        ),
        Some(cpu) => (
            Device::Cpu,
            format!(
                "--device auto: gpu:{i} measures {} on {ty}, not faster than the CPU's {}: serving on CPU",
                gb(gpu),
                gb(cpu)
            ),
        ),
        None => (
            Device::Cpu,
            format!(
                "--device auto: gpu:{i} measures {} on {ty} but the CPU was not measured: serving on CPU",
                gb(gpu)
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_choices_parse() {
        assert_eq!(parse_device("cpu"), Ok(DeviceChoice::Cpu));
        assert_eq!(parse_device("GPU"), Ok(DeviceChoice::Gpu(0)));
        assert_eq!(parse_device("gpu:2"), Ok(DeviceChoice::Gpu(2)));
        assert_eq!(parse_device("auto"), Ok(DeviceChoice::Auto));
        for bad in ["", "gpu:", "gpu:x", "gpu:-1", "tpu", "cuda"] {
            assert!(parse_device(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            DeviceChoice::Gpu(3).resolve(|| unreachable!()).0,
            Device::Gpu(3)
        );
        assert_eq!(DeviceChoice::Cpu.resolve(|| unreachable!()).0, Device::Cpu);
    }

    /// `auto` takes the fastest measured GPU only when it beats the CPU on the model's type.
    #[test]
    fn auto_goes_by_the_measured_rates() {
        let auto = |cpu: Option<f64>, gpus: Vec<Option<f64>>| {
            DeviceChoice::Auto.resolve(|| Rates {
                weight_type: "q4_k".into(),
                cpu,
                gpus,
            })
        };
        assert_eq!(auto(Some(10e9), vec![]).0, Device::Cpu);
        // lavapipe: measured, slower than the CPU path it stands in for.
        let (d, why) = auto(Some(10e9), vec![Some(1.5e9)]);
        assert_eq!(d, Device::Cpu);
        assert_eq!(
            why,
            "--device auto: gpu:0 measures 1.50 GB/s on q4_k, not faster than the CPU's 10.00 GB/s: serving on CPU"
        );
        let (d, why) = auto(
            Some(10e9),
            vec![Some(1.5e9), None, Some(900e9), Some(300e9)],
        );
        assert_eq!(d, Device::Gpu(2));
        assert!(why.ends_with("serving on gpu:2"), "{why}");
        assert_eq!(auto(Some(10e9), vec![None, Some(f64::NAN)]).0, Device::Cpu);
        assert_eq!(auto(None, vec![Some(900e9)]).0, Device::Cpu);
        assert_eq!(
            auto(Some(10e9), vec![Some(10e9)]).0,
            Device::Cpu,
            "a tie stays on CPU"
        );
        assert_eq!(DeviceChoice::Auto.resolve_here(), Device::Cpu);
    }
}
