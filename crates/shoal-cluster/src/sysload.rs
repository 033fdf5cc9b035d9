//! What a node measures about its machine between two fact refreshes: CPU load (the share of all cores
//! busy, from deltas of the OS's CPU time: `/proc/stat`, macOS's load ticks, read by
//! [`crate::facts`]' per-OS readers), temperature (the hottest thermal zone or hwmon sensor) and power
//! (powercap RAPL `energy_uj` deltas), each where the OS exposes it.
//!
//! [`HostSampler`] keeps the previous readings (the network task owns one and samples it with the
//! node's memory facts every refresh); [`HostLoad`] is one sample. The parsers are pure functions over
//! the files' text, tested on fixed inputs; the readers return `None` where the OS does not expose a
//! figure (temperature and power off Linux) or a file is missing or unreadable, never an error.

use crate::facts::CpuTimes;
use std::path::Path;
use std::time::Instant;

/// One sample: each figure `None` where the OS does not expose it (or, for the rates, on the first
/// sample, which has nothing to compare with).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostLoad {
    /// Share of all cores busy since the previous sample, in [0, 1].
    pub cpu_load: Option<f32>,
    /// The hottest temperature sensor, degrees Celsius.
    pub temperature_c: Option<f32>,
    /// Power drawn by the CPU packages (RAPL) since the previous sample, watts.
    pub power_w: Option<f32>,
}

/// The previous readings the next sample's rates are measured against.
#[derive(Debug, Default)]
pub struct HostSampler {
    cpu: Option<CpuTimes>,
    energy: Option<(u64, Instant)>,
}

impl HostSampler {
    /// Reads the machine now; rates cover the time since the previous call.
    pub fn sample(&mut self) -> HostLoad {
        let now = Instant::now();
        let cpu = crate::facts::cpu_times();
        let cpu_load = match (self.cpu, cpu) {
            (Some(a), Some(b)) => busy_share(a, b),
            _ => None,
        };
        if cpu.is_some() {
            self.cpu = cpu;
        }
        let energy = rapl_energy_uj(Path::new("/sys/class/powercap"));
        let power_w = match (self.energy, energy) {
            (Some((a, at)), Some(b)) => {
                watts(a, b, now.saturating_duration_since(at).as_secs_f64())
            }
            _ => None,
        };
        self.energy = energy.map(|e| (e, now));
        HostLoad {
            cpu_load,
            temperature_c: hottest(
                Path::new("/sys/class/thermal"),
                Path::new("/sys/class/hwmon"),
            ),
            power_w,
        }
    }
}

/// Share of the time between two readings the CPUs were busy; `None` when no time passed.
pub fn busy_share(a: CpuTimes, b: CpuTimes) -> Option<f32> {
    let total = b.total.checked_sub(a.total)?;
    let busy = b.busy.checked_sub(a.busy)?;
    (total > 0).then(|| (busy as f64 / total as f64).clamp(0.0, 1.0) as f32)
}

/// Watts from two energy readings in microjoules `secs` apart; `None` when the counter wrapped or no
/// time passed.
pub fn watts(a_uj: u64, b_uj: u64, secs: f64) -> Option<f32> {
    let joules = b_uj.checked_sub(a_uj)? as f64 / 1e6;
    (secs > 0.0).then(|| (joules / secs) as f32)
}

/// Total energy of the top-level RAPL zones (`intel-rapl:N/energy_uj`, one per CPU package; their
/// sub-zones are parts of it); `None` when there are none or none is readable (often root-only).
pub fn rapl_energy_uj(powercap: &Path) -> Option<u64> {
    let mut total = None;
    for entry in std::fs::read_dir(powercap).ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // `intel-rapl:0` is a package; `intel-rapl:0:1` one of its sub-zones.
        if !name.contains("rapl:") || name.matches(':').count() != 1 {
            continue;
        }
        if let Some(uj) = read_number(&entry.path().join("energy_uj")) {
            total = Some(total.unwrap_or(0) + uj);
        }
    }
    total
}

/// The hottest reading of the thermal zones (`thermal_zone*/temp`) and hwmon sensors
/// (`hwmon*/temp*_input`), millidegrees → degrees; implausible readings (≤ 0 or ≥ 150 °C) are skipped.
pub fn hottest(thermal: &Path, hwmon: &Path) -> Option<f32> {
    let mut readings = Vec::new();
    if let Ok(zones) = std::fs::read_dir(thermal) {
        for z in zones.flatten() {
            if z.file_name().to_string_lossy().starts_with("thermal_zone") {
                readings.extend(read_number(&z.path().join("temp")));
            }
        }
    }
    if let Ok(chips) = std::fs::read_dir(hwmon) {
        for chip in chips.flatten() {
            let Ok(files) = std::fs::read_dir(chip.path()) else {
                continue;
            };
            for f in files.flatten() {
                let n = f.file_name().to_string_lossy().into_owned();
                if n.starts_with("temp") && n.ends_with("_input") {
                    readings.extend(read_number(&f.path()));
                }
            }
        }
    }
    readings
        .into_iter()
        .map(|milli| milli as f32 / 1000.0)
        .filter(|c| *c > 0.0 && *c < 150.0)
        .max_by(f32::total_cmp)
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_share_is_the_delta_ratio() {
        let a = CpuTimes {
            busy: 100,
            total: 1000,
        };
        let b = CpuTimes {
            busy: 175,
            total: 1100,
        };
        assert_eq!(busy_share(a, b), Some(0.75));
        assert_eq!(busy_share(a, a), None, "no time passed");
        assert_eq!(busy_share(b, a), None, "went backwards");
    }

    #[test]
    fn watts_from_energy_deltas() {
        assert_eq!(watts(1_000_000, 31_000_000, 2.0), Some(15.0));
        assert_eq!(watts(5, 1, 1.0), None, "wrapped");
        assert_eq!(watts(1, 5, 0.0), None);
    }

    #[test]
    fn sensors_are_read_from_sysfs_shaped_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let thermal = dir.path().join("thermal");
        let hwmon = dir.path().join("hwmon");
        let powercap = dir.path().join("powercap");
        for d in [
            thermal.join("thermal_zone0"),
            thermal.join("cooling_device0"),
            hwmon.join("hwmon0"),
            powercap.join("intel-rapl:0"),
            powercap.join("intel-rapl:0:0"),
            powercap.join("intel-rapl:1"),
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(thermal.join("thermal_zone0/temp"), "45000\n").unwrap();
        std::fs::write(hwmon.join("hwmon0/temp1_input"), "61500\n").unwrap();
        std::fs::write(hwmon.join("hwmon0/temp2_input"), "-1\n").unwrap();
        assert_eq!(hottest(&thermal, &hwmon), Some(61.5));
        assert_eq!(
            hottest(&dir.path().join("none"), &dir.path().join("none")),
            None
        );
        std::fs::write(powercap.join("intel-rapl:0/energy_uj"), "1000\n").unwrap();
        std::fs::write(powercap.join("intel-rapl:0:0/energy_uj"), "600\n").unwrap();
        std::fs::write(powercap.join("intel-rapl:1/energy_uj"), "500\n").unwrap();
        assert_eq!(rapl_energy_uj(&powercap), Some(1500), "packages only");
        assert_eq!(rapl_energy_uj(&dir.path().join("none")), None);
    }

    #[test]
    fn a_second_sample_on_linux_has_a_cpu_load() {
        let mut s = HostSampler::default();
        let first = s.sample();
        assert_eq!(first.cpu_load, None, "nothing to compare with yet");
        // Some jiffies must pass between the readings.
        let until = Instant::now() + std::time::Duration::from_millis(60);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        let second = s.sample();
        if cfg!(target_os = "linux") {
            let load = second.cpu_load.expect("Linux has /proc/stat");
            assert!((0.0..=1.0).contains(&load) && load > 0.0, "{load}");
        }
    }
}
