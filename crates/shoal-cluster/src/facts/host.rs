//! The one interface every OS's reader of the host facts implements ([`OsReader`]), what it answers,
//! and which reader this build uses ([`Os`]): [`super::linux`] on Linux, [`super::macos`] on macOS,
//! [`Other`] (nothing read; sysinfo's figures stand in) elsewhere.

use serde::{Deserialize, Serialize};
use shoal_placement::LinkKind;

/// Busy and total jiffies of all CPUs together (Linux: the `cpu ` line of `/proc/stat`; macOS: the host's load ticks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    pub busy: u64,
    pub total: u64,
}

/// Total and available memory, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostMemory {
    pub total: u64,
    pub available: u64,
}

/// Memory pressure as a share in [0, 1], and what it was read from (`PSI some avg10`, `kernel level
/// warn`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pressure {
    pub share: f32,
    pub source: String,
}

/// How many cores of each kind the CPU has (every core is a performance core on a CPU of one kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoreKinds {
    pub performance: usize,
    pub efficiency: usize,
}

/// The OS's thermal state: its name for it (`nominal`, `moderate`, `heavy`, …) and whether the OS
/// is holding the CPU back because of heat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Thermal {
    pub state: String,
    pub throttled: bool,
}

/// One network interface with addresses, and the kind of link it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InterfaceFacts {
    pub name: String,
    pub kind: LinkKind,
    /// `address/prefix`.
    pub addrs: Vec<String>,
}

/// What each OS's reader answers; `None` where that OS does not tell (the caller falls back or
/// publishes nothing, never a guess).
pub(crate) trait OsReader {
    fn memory() -> Option<HostMemory>;
    fn pressure() -> Option<Pressure>;
    fn cpu_model() -> Option<String>;
    fn core_kinds() -> Option<CoreKinds>;
    fn thermal() -> Option<Thermal>;
    /// What names this running kernel (Linux's boot id, macOS's boot session UUID): processes that
    /// read the same share one machine's cores and memory bus (containers and network namespaces
    /// included); a VM has its own.
    fn boot_id() -> Option<String>;
    /// The kind of the link the interface `name` (`eth0`, `en0`, `bridge0`) is.
    fn interface_kind(name: &str) -> LinkKind;
    /// Busy and total CPU time of all cores so far (for [`crate::sysload`]'s load share).
    fn cpu_times() -> Option<CpuTimes>;
}

/// The reader of this build's OS.
#[cfg(target_os = "linux")]
pub(crate) type Os = super::linux::Linux;
#[cfg(target_os = "macos")]
pub(crate) type Os = super::macos::MacOs;
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub(crate) type Os = Other;

/// The reader of any other OS: reads nothing.
#[cfg_attr(any(target_os = "linux", target_os = "macos"), allow(dead_code))]
pub(crate) struct Other;

impl OsReader for Other {
    fn memory() -> Option<HostMemory> {
        None
    }
    fn pressure() -> Option<Pressure> {
        None
    }
    fn cpu_model() -> Option<String> {
        None
    }
    fn core_kinds() -> Option<CoreKinds> {
        None
    }
    fn thermal() -> Option<Thermal> {
        None
    }

    fn boot_id() -> Option<String> {
        None
    }
    fn interface_kind(_name: &str) -> LinkKind {
        LinkKind::Unknown
    }
    fn cpu_times() -> Option<CpuTimes> {
        None
    }
}
