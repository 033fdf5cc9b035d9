//! Linux's reader of the host facts: memory from `/proc/meminfo`, pressure from PSI
//! (`/proc/pressure/memory`), the CPU model from `/proc/cpuinfo`, core kinds from the hybrid PMUs'
//! CPU lists (`/sys/devices/cpu_core/cpus`, `cpu_atom/cpus`: Intel) or the CPUs' `cpu_capacity`
//! (ARM big.LITTLE), an interface's kind from `/sys/class/net/<name>`, and CPU time from
//! `/proc/stat` (parsed by [`crate::sysload`]). The parsers are pure
//! functions over the files' text, tested on fixed inputs; the readers return `None` where a file is
//! missing. Linux has no thermal *state* to read (its temperatures are [`crate::sysload`]'s).

use std::path::Path;

use shoal_placement::LinkKind;

use super::host::CpuTimes;
use super::{CoreKinds, HostMemory, OsReader, Pressure, Thermal};

/// The Linux reader.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(super) struct Linux;

impl OsReader for Linux {
    fn memory() -> Option<HostMemory> {
        meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)
    }

    fn pressure() -> Option<Pressure> {
        let share = psi_some_avg10(&std::fs::read_to_string("/proc/pressure/memory").ok()?)?;
        Some(Pressure {
            share,
            source: "PSI some avg10".to_string(),
        })
    }

    fn cpu_model() -> Option<String> {
        cpuinfo_model(&std::fs::read_to_string("/proc/cpuinfo").ok()?)
    }

    fn core_kinds() -> Option<CoreKinds> {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        if let (Some(big), Some(little)) = (
            read("/sys/devices/cpu_core/cpus"),
            read("/sys/devices/cpu_atom/cpus"),
        ) {
            return Some(CoreKinds {
                performance: cpulist_len(&big)?,
                efficiency: cpulist_len(&little)?,
            });
        }
        let mut capacities = Vec::new();
        for entry in std::fs::read_dir("/sys/devices/system/cpu").ok()?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name
                .strip_prefix("cpu")
                .is_some_and(|n| n.parse::<u32>().is_ok())
                && let Some(c) = read(&format!("{}/cpu_capacity", entry.path().display()))
                && let Ok(c) = c.trim().parse::<u32>()
            {
                capacities.push(c);
            }
        }
        kinds_from_capacities(&capacities)
    }

    fn thermal() -> Option<Thermal> {
        None
    }

    fn boot_id() -> Option<String> {
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        Some(id.trim().to_string()).filter(|id| !id.is_empty())
    }

    fn interface_kind(name: &str) -> LinkKind {
        let dir = Path::new("/sys/class/net").join(name);
        let driver = std::fs::read_link(dir.join("device/driver"))
            .ok()
            .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
            .unwrap_or_default();
        let arp_type = std::fs::read_to_string(dir.join("type"))
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok());
        kind_from_sysfs(
            dir.join("wireless").exists() || dir.join("phy80211").exists(),
            &driver,
            arp_type,
        )
    }

    fn cpu_times() -> Option<CpuTimes> {
        parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
    }
}

/// `MemTotal` and `MemAvailable` of `/proc/meminfo` (kB) in bytes; `None` without both.
pub fn meminfo(text: &str) -> Option<HostMemory> {
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    let total = field("MemTotal")?;
    Some(HostMemory {
        total,
        available: field("MemAvailable")?.min(total),
    })
}

/// The `some avg10` figure of a Linux PSI file (a percentage) as a fraction in [0, 1]; `None` when the
/// text has no such figure.
pub fn psi_some_avg10(text: &str) -> Option<f32> {
    let some = text.lines().find(|l| l.starts_with("some "))?;
    let avg10 = some
        .split_whitespace()
        .find_map(|f| f.strip_prefix("avg10="))?
        .parse::<f32>()
        .ok()?;
    avg10.is_finite().then(|| (avg10 / 100.0).clamp(0.0, 1.0))
}

/// The first `model name` of `/proc/cpuinfo` (x86; most ARM kernels print none, and the caller falls
/// back to sysinfo's name from the CPU part number).
pub fn cpuinfo_model(text: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == "model name")
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// How many CPUs a kernel CPU list (`0-7,16,18-19`) names; `None` when it does not parse.
pub fn cpulist_len(text: &str) -> Option<usize> {
    let mut n = 0;
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                b.checked_sub(a)? + 1
            }
            None => part.parse::<usize>().map(|_| 1).ok()?,
        };
    }
    Some(n)
}

/// A CPU whose `cpu_capacity` is below this share of the highest is an efficiency core.
const LITTLE_SHARE: f64 = 0.6;

/// ARM's rule: CPUs below [`LITTLE_SHARE`] of the highest `cpu_capacity` are efficiency cores, the
/// others performance cores; `None` when no capacity was read. Not "the highest capacity only": the
/// kernel scales a core's capacity by its cluster's top frequency, so a prime core (1 + 3 + 4 SoCs)
/// or a faster-binned cluster of the same cores would leave the other big cores out, and the default
/// compute threads (`shoal serve` without `--threads`) with them. Little cores sit at a quarter to a
/// half of a big one.
pub fn kinds_from_capacities(capacities: &[u32]) -> Option<CoreKinds> {
    let top = f64::from(*capacities.iter().max()?);
    let performance = capacities
        .iter()
        .filter(|&&c| f64::from(c) >= LITTLE_SHARE * top)
        .count();
    Some(CoreKinds {
        performance,
        efficiency: capacities.len() - performance,
    })
}

/// Linux rule: wireless → wifi; the thunderbolt-net driver → thunderbolt; ARP type 772 → loopback;
/// ARP type 1 (ethernet, veth, bridges) → ethernet; anything else → unknown.
pub fn kind_from_sysfs(wireless: bool, driver: &str, arp_type: Option<u32>) -> LinkKind {
    if wireless {
        LinkKind::Wifi
    } else if driver.contains("thunderbolt") {
        LinkKind::Thunderbolt
    } else {
        match arp_type {
            Some(772) => LinkKind::Loopback,
            Some(1) => LinkKind::Ethernet,
            _ => LinkKind::Unknown,
        }
    }
}

/// The `cpu ` line of `/proc/stat`: busy = user + nice + system + irq + softirq + steal, total = those
/// + idle + iowait (guest time is already inside user).
pub fn parse_proc_stat(text: &str) -> Option<CpuTimes> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    if f.len() < 4 {
        return None;
    }
    let idle = at(3) + at(4);
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    Some(CpuTimes {
        busy,
        total: busy + idle,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_busy_and_total() {
        let text = "cpu  100 5 50 800 20 3 2 10 0 0\ncpu0 50 2 25 400 10 1 1 5 0 0\nintr 1\n";
        let t = parse_proc_stat(text).expect("cpu line");
        assert_eq!(t.busy, 100 + 5 + 50 + 3 + 2 + 10);
        assert_eq!(t.total, t.busy + 800 + 20);
        assert_eq!(
            parse_proc_stat("cpu0 1 2 3 4\n"),
            None,
            "only the all-CPU line"
        );
        assert_eq!(parse_proc_stat("cpu  1 x 3 4\n"), None);
        assert_eq!(parse_proc_stat("cpu  1 2\n"), None);
    }

    #[test]
    fn sysfs_rules() {
        assert_eq!(kind_from_sysfs(true, "iwlwifi", Some(1)), LinkKind::Wifi);
        assert_eq!(
            kind_from_sysfs(false, "thunderbolt-net", Some(1)),
            LinkKind::Thunderbolt
        );
        assert_eq!(
            kind_from_sysfs(false, "e1000e", Some(1)),
            LinkKind::Ethernet
        );
        assert_eq!(kind_from_sysfs(false, "", Some(772)), LinkKind::Loopback);
        assert_eq!(kind_from_sysfs(false, "", Some(65534)), LinkKind::Unknown);
        assert_eq!(kind_from_sysfs(false, "", None), LinkKind::Unknown);
    }

    #[test]
    fn psi_reads_some_avg10() {
        let text = "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\n\
                    full avg10=40.00 avg60=0.00 avg300=0.00 total=9\n";
        assert_eq!(psi_some_avg10(text), Some(0.125));
        assert_eq!(
            psi_some_avg10("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"),
            Some(0.0)
        );
        assert_eq!(psi_some_avg10("full avg10=5.00\n"), None);
        assert_eq!(psi_some_avg10("some avg10=x\n"), None);
        assert_eq!(psi_some_avg10(""), None);
    }

    #[test]
    fn meminfo_reads_total_and_available() {
        let text = "MemTotal:       16318400 kB\nMemFree:         1000000 kB\n\
                    MemAvailable:    8159200 kB\nBuffers: 1 kB\n";
        assert_eq!(
            meminfo(text),
            Some(HostMemory {
                total: 16_318_400 * 1024,
                available: 8_159_200 * 1024
            })
        );
        assert_eq!(meminfo("MemTotal: 100 kB\n"), None);
        assert_eq!(meminfo("MemTotalX: 100 kB\nMemAvailable: 1 kB\n"), None);
    }

    #[test]
    fn cpuinfo_model_and_cpu_lists() {
        let x86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n\n\
                   processor\t: 1\nmodel name\t: AMD EPYC 7B13\n";
        assert_eq!(cpuinfo_model(x86).as_deref(), Some("AMD EPYC 7B13"));
        let arm = "processor\t: 0\nBogoMIPS\t: 48.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n";
        assert_eq!(cpuinfo_model(arm), None);
        assert_eq!(cpulist_len("0-15\n"), Some(16));
        assert_eq!(cpulist_len("0-7,16,18-19"), Some(11));
        assert_eq!(cpulist_len("3"), Some(1));
        assert_eq!(cpulist_len("7-3"), None);
        assert_eq!(cpulist_len("a-b"), None);
    }

    #[test]
    fn big_little_capacities() {
        // A Raspberry-Pi-like machine: four equal cores.
        assert_eq!(
            kinds_from_capacities(&[1024; 4]),
            Some(CoreKinds {
                performance: 4,
                efficiency: 0
            })
        );
        // A phone SoC: 2 big cores, 6 little ones.
        assert_eq!(
            kinds_from_capacities(&[1024, 1024, 446, 446, 446, 446, 446, 446]),
            Some(CoreKinds {
                performance: 2,
                efficiency: 6
            })
        );
        // A prime core, three big ones and four little ones: the big ones compute too.
        assert_eq!(
            kinds_from_capacities(&[1024, 870, 870, 870, 410, 410, 410, 410]),
            Some(CoreKinds {
                performance: 4,
                efficiency: 4
            })
        );
        // One kind of core in two clusters of different top frequencies: no efficiency cores.
        assert_eq!(
            kinds_from_capacities(&[1024, 1024, 1024, 1024, 915, 915, 915, 915]),
            Some(CoreKinds {
                performance: 8,
                efficiency: 0
            })
        );
        assert_eq!(kinds_from_capacities(&[]), None);
    }
}
