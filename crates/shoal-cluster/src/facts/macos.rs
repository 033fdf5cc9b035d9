//! macOS's reader of the host facts, written against Apple's documented interfaces:
//! - memory: the total from `sysctl hw.memsize`; what is available from the Mach VM counters
//!   (`host_statistics64(HOST_VM_INFO64)`, what `vm_stat` prints): free pages (speculative ones
//!   included) + file-backed pages (`external_page_count`, the page cache the kernel drops first) +
//!   purgeable pages — the counterpart of Linux's `MemAvailable`;
//! - pressure: the kernel's memory-pressure level (`sysctl kern.memorystatus_vm_pressure_level`:
//!   1 normal, 2 warn, 4 critical), published as 0, 0.5 and 1 (Linux publishes PSI's share of time);
//! - CPU model: `sysctl machdep.cpu.brand_string` (`Apple M2 Pro`);
//! - core kinds: `hw.perflevel0.physicalcpu` (performance) and `hw.perflevel1.physicalcpu`
//!   (efficiency) when `hw.nperflevels` is 2 (Apple Silicon); one level (Intel Macs) is all
//!   performance cores;
//! - thermal state: the thermal-pressure level Apple's `OSThermalNotification.h` names
//!   (`com.apple.system.thermalpressurelevel` through `notify_get_state`: nominal, moderate, heavy,
//!   trapping, sleeping) — there is no temperature sysctl on Apple Silicon;
//! - link kinds: the SystemConfiguration framework's interfaces (`SCNetworkInterfaceCopyAll`, what
//!   `networksetup -listallhardwareports` lists): type `IEEE80211` → Wi-Fi; a display name with
//!   "Thunderbolt" (the `Thunderbolt Bridge` service on `bridge0` and the `Thunderbolt N` ports) →
//!   Thunderbolt; `Ethernet` (and USB/PCI LAN adapters) → Ethernet. An interface SystemConfiguration
//!   does not list is classed from `getifaddrs`' link type and its media (`SIOCGIFMEDIA`): loopback;
//!   Ethernet-typed with 802.11 media → Wi-Fi, else Ethernet; a bridge named `bridge0`…`bridge99` →
//!   Thunderbolt (a heuristic: macOS creates the Thunderbolt Bridge as `bridge0`, while Internet
//!   Sharing and virtual machines' bridges are `bridge100` and up, which stay unknown).
//! - CPU time: the Mach host's load ticks (`host_statistics(HOST_CPU_LOAD_INFO)`): busy = user +
//!   system + nice, total = busy + idle.
//!
//! The rules are pure functions, compiled and tested on every OS; the system calls (module `sys`)
//! build only for macOS (type-checked here with `cargo check --target aarch64-apple-darwin`).

use shoal_placement::LinkKind;

use super::host::CpuTimes;
use super::{CoreKinds, Pressure, Thermal};

/// CPU time from the host's load ticks `[user, system, idle, nice]` (`CPU_STATE_*` order).
pub fn cpu_times_from_ticks(ticks: [u32; 4]) -> CpuTimes {
    let [user, system, idle, nice] = ticks.map(u64::from);
    let busy = user + system + nice;
    CpuTimes {
        busy,
        total: busy + idle,
    }
}

/// The VM counters that make up available memory, in pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VmPages {
    /// `free_count`: free pages, speculative ones included.
    pub free: u64,
    /// `external_page_count`: file-backed pages.
    pub external: u64,
    /// `purgeable_count`: pages their owner marked as droppable.
    pub purgeable: u64,
}

/// Available bytes from the VM counters and the page size, at most `total`.
pub fn available_bytes(pages: VmPages, page_size: u64, total: u64) -> u64 {
    (pages.free + pages.external + pages.purgeable)
        .saturating_mul(page_size)
        .min(total)
}

/// The kernel's memory-pressure level as a share in [0, 1], with its name; `None` for an unknown level.
pub fn pressure_from_level(level: i64) -> Option<Pressure> {
    let (share, name) = match level {
        1 => (0.0, "normal"),
        2 => (0.5, "warn"),
        4 => (1.0, "critical"),
        _ => return None,
    };
    Some(Pressure {
        share,
        source: format!("kernel level {name}"),
    })
}

/// Core kinds from `hw.nperflevels` and the first two levels' physical cores.
pub fn core_kinds(levels: u64, perf0: Option<u64>, perf1: Option<u64>) -> Option<CoreKinds> {
    let performance = perf0? as usize;
    let efficiency = match levels {
        0 => return None,
        1 => 0,
        _ => perf1? as usize,
    };
    Some(CoreKinds {
        performance,
        efficiency,
    })
}

/// The thermal-pressure level of `OSThermalNotification.h` by its value.
pub fn thermal_from_level(level: u64) -> Option<Thermal> {
    Some(Thermal {
        state: match level {
            0 => "nominal",
            1 => "moderate",
            2 => "heavy",
            3 => "trapping",
            4 => "sleeping",
            _ => return None,
        }
        .to_string(),
        throttled: level >= 2,
    })
}

/// SystemConfiguration's rule: `kind` is the interface type string (`IEEE80211`, `Ethernet`,
/// `Bridge`, …), `display` its localized display name (`Wi-Fi`, `Thunderbolt Bridge`,
/// `Thunderbolt 1`, `USB 10/100/1000 LAN`).
pub fn kind_from_system_configuration(kind: &str, display: &str) -> LinkKind {
    if kind == "IEEE80211" {
        LinkKind::Wifi
    } else if display.to_lowercase().contains("thunderbolt") {
        LinkKind::Thunderbolt
    } else if kind == "Ethernet" {
        LinkKind::Ethernet
    } else {
        LinkKind::Unknown
    }
}

/// `if_types.h` values used below.
const IFT_ETHER: u8 = 0x06;
const IFT_LOOP: u8 = 0x18;
const IFT_BRIDGE: u8 = 0xd1;
/// `if_media.h`: the media type bits of `ifm_current`, and 802.11's.
const IFM_NMASK: i32 = 0xe0;
const IFM_IEEE80211: i32 = 0x80;

/// The rule for an interface SystemConfiguration does not list, from its link-level type
/// (`if_data.ifi_type`) and its current media word (`SIOCGIFMEDIA`, when the ioctl answers).
pub fn kind_from_link(name: &str, ifi_type: u8, media: Option<i32>) -> LinkKind {
    match ifi_type {
        IFT_LOOP => LinkKind::Loopback,
        IFT_ETHER if media.is_some_and(|m| m & IFM_NMASK == IFM_IEEE80211) => LinkKind::Wifi,
        IFT_ETHER => LinkKind::Ethernet,
        IFT_BRIDGE
            if name
                .strip_prefix("bridge")
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|n| n < 100) =>
        {
            LinkKind::Thunderbolt
        }
        _ => LinkKind::Unknown,
    }
}

#[cfg(target_os = "macos")]
pub(super) use sys::MacOs;

/// The system calls: `sysctlbyname`, `host_statistics64`, `notify_get_state`, SystemConfiguration,
/// `getifaddrs` and `SIOCGIFMEDIA`.
#[cfg(target_os = "macos")]
mod sys {
    use std::ffi::{CStr, CString, c_char, c_int, c_void};

    use shoal_placement::LinkKind;
    use system_configuration::network_configuration::get_interfaces;

    use super::super::CpuTimes;
    use super::super::{CoreKinds, HostMemory, OsReader, Pressure, Thermal};
    use super::VmPages;

    /// The host's Mach port, taken once: each `mach_host_self()` call adds a send right to it that
    /// would have to be given back, and the facts are read every second.
    // libc marks mach_host_self deprecated in favour of the mach2 crate; the call is the same.
    #[allow(deprecated)]
    fn host_port() -> libc::mach_port_t {
        static PORT: std::sync::OnceLock<libc::mach_port_t> = std::sync::OnceLock::new();
        // SAFETY: mach_host_self has no preconditions; it returns the host's name port.
        *PORT.get_or_init(|| unsafe { libc::mach_host_self() })
    }

    /// The macOS reader.
    pub(in crate::facts) struct MacOs;

    impl OsReader for MacOs {
        fn memory() -> Option<HostMemory> {
            let total = sysctl_u64("hw.memsize")?;
            let pages = vm_pages()?;
            // SAFETY: sysconf has no preconditions.
            let page_size = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
            Some(HostMemory {
                total,
                available: super::available_bytes(pages, page_size, total),
            })
        }

        fn pressure() -> Option<Pressure> {
            super::pressure_from_level(sysctl_u64("kern.memorystatus_vm_pressure_level")? as i64)
        }

        fn cpu_model() -> Option<String> {
            sysctl_string("machdep.cpu.brand_string")
        }

        fn core_kinds() -> Option<CoreKinds> {
            super::core_kinds(
                sysctl_u64("hw.nperflevels").unwrap_or(1),
                sysctl_u64("hw.perflevel0.physicalcpu").or_else(|| sysctl_u64("hw.physicalcpu")),
                sysctl_u64("hw.perflevel1.physicalcpu"),
            )
        }

        fn thermal() -> Option<Thermal> {
            super::thermal_from_level(thermal_level()?)
        }

        fn boot_id() -> Option<String> {
            sysctl_string("kern.bootsessionuuid")
        }

        fn interface_kind(name: &str) -> LinkKind {
            for iface in get_interfaces().iter() {
                if iface.bsd_name().is_some_and(|n| n == name) {
                    let kind = iface
                        .interface_type_string()
                        .map(|s| s.to_string())
                        .unwrap_or_default();
                    let display = iface
                        .display_name()
                        .map(|s| s.to_string())
                        .unwrap_or_default();
                    return super::kind_from_system_configuration(&kind, &display);
                }
            }
            match link_type(name) {
                Some(t) => super::kind_from_link(name, t, media(name)),
                None => LinkKind::Unknown,
            }
        }

        #[allow(deprecated)] // libc points to the mach2 crate for these; the calls are the same
        fn cpu_times() -> Option<CpuTimes> {
            // SAFETY: an all-zero host_cpu_load_info is valid; the count is its size in integers,
            // as HOST_CPU_LOAD_INFO requires; the host port is this task's own.
            unsafe {
                let mut info: libc::host_cpu_load_info = std::mem::zeroed();
                let mut count = libc::HOST_CPU_LOAD_INFO_COUNT;
                let rc = libc::host_statistics(
                    host_port(),
                    libc::HOST_CPU_LOAD_INFO,
                    (&raw mut info).cast::<libc::integer_t>(),
                    &mut count,
                );
                (rc == libc::KERN_SUCCESS).then(|| super::cpu_times_from_ticks(info.cpu_ticks))
            }
        }
    }

    /// A sysctl's raw bytes.
    fn sysctl_bytes(name: &str) -> Option<Vec<u8>> {
        let cname = CString::new(name).ok()?;
        let mut len = 0usize;
        // SAFETY: a size query (null buffer) of a NUL-terminated name.
        let rc = unsafe {
            libc::sysctlbyname(
                cname.as_ptr(),
                std::ptr::null_mut(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        if rc != 0 || len == 0 {
            return None;
        }
        let mut buf = vec![0u8; len];
        // SAFETY: `buf` holds `len` bytes, the size the kernel asked for.
        let rc = unsafe {
            libc::sysctlbyname(
                cname.as_ptr(),
                buf.as_mut_ptr().cast::<c_void>(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        (rc == 0).then(|| {
            buf.truncate(len);
            buf
        })
    }

    /// An integer sysctl (4 or 8 bytes, native endianness).
    fn sysctl_u64(name: &str) -> Option<u64> {
        let b = sysctl_bytes(name)?;
        match b.len() {
            4 => Some(u64::from(u32::from_ne_bytes(b.try_into().ok()?))),
            8 => Some(u64::from_ne_bytes(b.try_into().ok()?)),
            _ => None,
        }
    }

    /// A string sysctl.
    fn sysctl_string(name: &str) -> Option<String> {
        let b = sysctl_bytes(name)?;
        let s = CStr::from_bytes_until_nul(&b)
            .ok()?
            .to_string_lossy()
            .trim()
            .to_string();
        (!s.is_empty()).then_some(s)
    }

    /// The VM counters `vm_stat` prints.
    #[allow(deprecated)] // libc points to the mach2 crate for these; the calls are the same
    fn vm_pages() -> Option<VmPages> {
        // SAFETY: an all-zero vm_statistics64 is valid; the count is its size in integers, as
        // HOST_VM_INFO64 requires; the host port is this task's own.
        unsafe {
            let mut stats: libc::vm_statistics64 = std::mem::zeroed();
            let mut count = libc::HOST_VM_INFO64_COUNT;
            let rc = libc::host_statistics64(
                host_port(),
                libc::HOST_VM_INFO64,
                (&raw mut stats).cast::<libc::integer_t>(),
                &mut count,
            );
            (rc == libc::KERN_SUCCESS).then(|| VmPages {
                free: u64::from(stats.free_count),
                external: u64::from(stats.external_page_count),
                purgeable: u64::from(stats.purgeable_count),
            })
        }
    }

    unsafe extern "C" {
        // libSystem's notify(3) API (`notify.h`).
        fn notify_register_check(name: *const c_char, out_token: *mut c_int) -> u32;
        fn notify_get_state(token: c_int, state64: *mut u64) -> u32;
        fn notify_cancel(token: c_int) -> u32;
    }

    /// The thermal-pressure level, `kOSThermalNotificationPressureLevelName`'s state.
    fn thermal_level() -> Option<u64> {
        let name = c"com.apple.system.thermalpressurelevel";
        let mut token: c_int = 0;
        // SAFETY: a NUL-terminated name and an out pointer to a local; the token is cancelled
        // after one read.
        unsafe {
            if notify_register_check(name.as_ptr(), &mut token) != 0 {
                return None;
            }
            let mut state = 0u64;
            let ok = notify_get_state(token, &mut state) == 0;
            notify_cancel(token);
            ok.then_some(state)
        }
    }

    /// The link-level type (`if_data.ifi_type`) of the interface `name`, from `getifaddrs`.
    fn link_type(name: &str) -> Option<u8> {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: getifaddrs fills `head` with a list freed below; each entry's name is a C string,
        // and an AF_LINK entry's `ifa_data` points to its `if_data`.
        unsafe {
            if libc::getifaddrs(&mut head) != 0 {
                return None;
            }
            let mut found = None;
            let mut at = head;
            while !at.is_null() {
                let a = &*at;
                if !a.ifa_addr.is_null()
                    && i32::from((*a.ifa_addr).sa_family) == libc::AF_LINK
                    && !a.ifa_data.is_null()
                    && CStr::from_ptr(a.ifa_name).to_bytes() == name.as_bytes()
                {
                    found = Some((*a.ifa_data.cast::<libc::if_data>()).ifi_type);
                    break;
                }
                at = a.ifa_next;
            }
            libc::freeifaddrs(head);
            found
        }
    }

    /// `struct ifmediareq` of `net/if_media.h`.
    #[repr(C)]
    struct IfMediaReq {
        name: [c_char; libc::IFNAMSIZ],
        current: c_int,
        mask: c_int,
        status: c_int,
        active: c_int,
        count: c_int,
        list: *mut c_int,
    }

    /// `SIOCGIFMEDIA`: `_IOWR('i', 56, struct ifmediareq)`.
    const SIOCGIFMEDIA: libc::c_ulong = 0xc000_0000
        | ((std::mem::size_of::<IfMediaReq>() as libc::c_ulong & 0x1fff) << 16)
        | ((b'i' as libc::c_ulong) << 8)
        | 56;

    /// The current media word of the interface `name`, when the driver answers `SIOCGIFMEDIA`.
    fn media(name: &str) -> Option<i32> {
        if name.len() >= libc::IFNAMSIZ {
            return None;
        }
        // SAFETY: a datagram socket only for the ioctl, closed below; the request is zeroed with a
        // NUL-terminated name and no media list (count 0).
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
            if fd < 0 {
                return None;
            }
            let mut req: IfMediaReq = std::mem::zeroed();
            for (d, s) in req.name.iter_mut().zip(name.bytes()) {
                *d = s as c_char;
            }
            let rc = libc::ioctl(fd, SIOCGIFMEDIA, &mut req);
            libc::close(fd);
            (rc == 0).then_some(req.current)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn available_memory_counts_free_file_backed_and_purgeable_pages() {
        let pages = VmPages {
            free: 100,
            external: 50,
            purgeable: 10,
        };
        assert_eq!(available_bytes(pages, 16384, u64::MAX), 160 * 16384);
        assert_eq!(available_bytes(pages, 16384, 1000), 1000, "capped by total");
    }

    #[test]
    fn load_ticks() {
        // user 30, system 10, idle 50, nice 10.
        let t = cpu_times_from_ticks([30, 10, 50, 10]);
        assert_eq!((t.busy, t.total), (50, 100));
    }

    #[test]
    fn pressure_levels() {
        let share = |l| pressure_from_level(l).map(|p| p.share);
        assert_eq!(share(1), Some(0.0));
        assert_eq!(share(2), Some(0.5));
        assert_eq!(share(4), Some(1.0));
        assert_eq!(share(3), None);
        assert_eq!(
            pressure_from_level(2).map(|p| p.source).as_deref(),
            Some("kernel level warn")
        );
    }

    #[test]
    fn perf_levels() {
        let kinds = |p, e| {
            Some(CoreKinds {
                performance: p,
                efficiency: e,
            })
        };
        // An M2 Pro: 8 performance and 4 efficiency cores.
        assert_eq!(core_kinds(2, Some(8), Some(4)), kinds(8, 4));
        // An Intel Mac: one level.
        assert_eq!(core_kinds(1, Some(6), None), kinds(6, 0));
        assert_eq!(core_kinds(2, Some(8), None), None);
        assert_eq!(core_kinds(0, Some(8), None), None);
    }

    #[test]
    fn thermal_levels() {
        let t = |l| thermal_from_level(l).map(|t| (t.state, t.throttled));
        assert_eq!(t(0), Some(("nominal".to_string(), false)));
        assert_eq!(t(1), Some(("moderate".to_string(), false)));
        assert_eq!(t(2), Some(("heavy".to_string(), true)));
        assert_eq!(t(4), Some(("sleeping".to_string(), true)));
        assert_eq!(t(9), None);
    }

    #[test]
    fn system_configuration_rules() {
        let k = kind_from_system_configuration;
        assert_eq!(k("IEEE80211", "Wi-Fi"), LinkKind::Wifi);
        assert_eq!(k("Bridge", "Thunderbolt Bridge"), LinkKind::Thunderbolt);
        assert_eq!(k("Ethernet", "Thunderbolt 1"), LinkKind::Thunderbolt);
        assert_eq!(k("Ethernet", "USB 10/100/1000 LAN"), LinkKind::Ethernet);
        assert_eq!(k("Ethernet", "Ethernet"), LinkKind::Ethernet);
        assert_eq!(k("Bridge", "Bridge"), LinkKind::Unknown);
        assert_eq!(k("Bluetooth", "Bluetooth PAN"), LinkKind::Unknown);
    }

    #[test]
    fn link_level_rules() {
        assert_eq!(kind_from_link("lo0", IFT_LOOP, None), LinkKind::Loopback);
        // en0 of a MacBook: Ethernet-typed, 802.11 media (IFM_IEEE80211 | IFM_AUTO).
        assert_eq!(kind_from_link("en0", IFT_ETHER, Some(0x80)), LinkKind::Wifi);
        assert_eq!(
            kind_from_link("en5", IFT_ETHER, Some(0x20)),
            LinkKind::Ethernet
        );
        assert_eq!(kind_from_link("en5", IFT_ETHER, None), LinkKind::Ethernet);
        assert_eq!(
            kind_from_link("bridge0", IFT_BRIDGE, None),
            LinkKind::Thunderbolt
        );
        assert_eq!(
            kind_from_link("bridge100", IFT_BRIDGE, None),
            LinkKind::Unknown
        );
        assert_eq!(kind_from_link("utun3", 0xff, None), LinkKind::Unknown);
    }
}
