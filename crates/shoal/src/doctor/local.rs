//! This node's part of the doctor's report, read on this machine without any running node: host, CPU
//! (cores and their kinds, model, the kernels' SIMD level detected at run time and every level the CPU
//! supports, the OS's thermal state where it has one), memory and its pressure (Linux PSI, macOS's
//! pressure level), the network interfaces and the kind of link each is (all through
//! `shoal_cluster::facts`' per-OS readers), the GPUs found ([`crate::gpus::discover`]; none is fine: shoal
//! then computes on the CPU), and the models directory (each model present, complete or
//! partial, its size against what `model.json` recorded, and its sha256: recorded, verified with
//! `--verify`, or not matching).

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};
use shoal_store::{State, Store};

/// This machine.
#[derive(Debug, Clone, Serialize)]
pub struct LocalReport {
    pub host: String,
    pub cpu_model: String,
    pub cores: usize,
    /// The kernels' backend in use (`avx512vnni`, `avxvnni`, `avx2`, `scalar`).
    pub simd: String,
    /// Every backend this CPU can run, slowest first.
    pub simd_supported: Vec<String>,
    pub memory_total_bytes: u64,
    pub memory_available_bytes: u64,
    /// Memory pressure in [0, 1]: on Linux the share of the last 10 s in which some task waited for
    /// memory (PSI `some avg10`), on macOS the kernel's level (normal 0, warn 0.5, critical 1); `None`
    /// where neither is readable.
    pub memory_pressure: Option<f32>,
    /// What the pressure was read from (`PSI some avg10`, `kernel level warn`).
    pub memory_pressure_source: Option<String>,
    /// Performance and efficiency cores, where the OS tells them apart.
    pub core_kinds: Option<shoal_cluster::facts::CoreKinds>,
    /// The OS's thermal state, where readable (macOS's thermal-pressure level).
    pub thermal: Option<shoal_cluster::facts::Thermal>,
    /// The network interfaces with addresses, and the kind of link each is.
    pub interfaces: Vec<shoal_cluster::facts::InterfaceFacts>,
    /// The GPUs found (Vulkan, Metal, DX12; software ones such as lavapipe included); empty without a
    /// GPU, a driver or a Vulkan loader; their memory where the backend tells it (Vulkan), their
    /// compute as the GPU probe's cache holds it.
    pub gpus: Vec<shoal_cluster::facts::GpuFacts>,
    pub models_dir: PathBuf,
    pub models: Vec<ModelCheck>,
}

/// One model of the models directory.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ModelCheck {
    pub id: String,
    /// `complete` or `partial`.
    pub state: String,
    /// Bytes of the complete file (expected size while partial; 0 when unknown).
    pub size: u64,
    /// Bytes present.
    pub have: u64,
    pub file: Option<PathBuf>,
    pub checksum: Checksum,
}

/// What is known of a model file's integrity.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Checksum {
    /// `model.json` records no sha256 (a local path, an older download).
    NoneRecorded,
    /// Recorded at download; not hashed again (`--verify` does).
    Recorded { sha256: String },
    /// Hashed now: the same as recorded.
    Verified { sha256: String },
    /// Hashed now: not what was recorded.
    Mismatch { expected: String, got: String },
    /// The file's size differs from the recorded one (no need to hash).
    WrongSize { expected: u64, got: u64 },
    /// The file could not be read.
    Unreadable { error: String },
}

/// Reads this machine's facts; with `verify`, hashes every complete model with a recorded sha256.
pub fn gather(models_dir: &Path, verify: bool) -> LocalReport {
    let (memory, cores) = shoal_cluster::facts::local_resources();
    let pressure = shoal_cluster::facts::memory_pressure();
    let store = Store::new(models_dir.to_path_buf());
    let models = store
        .list()
        .into_iter()
        .map(|e| {
            let recorded = store.info(&e.dir).ok().flatten();
            let (state, have) = match e.state {
                State::Complete => ("complete", e.size),
                State::Partial { have } => ("partial", have),
            };
            let checksum = match (&e.file, recorded.as_ref()) {
                (Some(file), Some(info)) => {
                    check_file(file, info.size, info.sha256.as_deref(), verify)
                }
                (Some(file), None) => check_file(file, 0, None, verify),
                (None, _) => Checksum::NoneRecorded,
            };
            ModelCheck {
                id: e.id,
                state: state.to_string(),
                size: e.size,
                have,
                file: e.file,
                checksum,
            }
        })
        .collect();
    LocalReport {
        host: shoal_cluster::facts::host_name().unwrap_or_else(|| "this machine".to_string()),
        cpu_model: shoal_cluster::facts::cpu_model(),
        cores,
        simd: shoal_kernels::Backend::detect().name().to_string(),
        simd_supported: shoal_kernels::Backend::supported()
            .into_iter()
            .map(|b| b.name().to_string())
            .collect(),
        memory_total_bytes: memory.total,
        memory_available_bytes: memory.available,
        memory_pressure: pressure.as_ref().map(|p| p.share),
        memory_pressure_source: pressure.map(|p| p.source),
        core_kinds: shoal_cluster::facts::core_kinds(),
        thermal: shoal_cluster::facts::thermal(),
        interfaces: shoal_cluster::facts::interfaces(),
        gpus: crate::gpus::discover(),
        models_dir: models_dir.to_path_buf(),
        models,
    }
}

/// A complete file against its recorded size and sha256 (hashed only with `verify`).
fn check_file(file: &Path, size: u64, sha256: Option<&str>, verify: bool) -> Checksum {
    let got = match std::fs::metadata(file) {
        Ok(m) => m.len(),
        Err(e) => {
            return Checksum::Unreadable {
                error: e.to_string(),
            };
        }
    };
    if size > 0 && got != size {
        return Checksum::WrongSize {
            expected: size,
            got,
        };
    }
    let Some(expected) = sha256 else {
        return Checksum::NoneRecorded;
    };
    if !verify {
        return Checksum::Recorded {
            sha256: expected.to_string(),
        };
    }
    match sha256_of(file) {
        Ok(got) if got.eq_ignore_ascii_case(expected) => Checksum::Verified { sha256: got },
        Ok(got) => Checksum::Mismatch {
            expected: expected.to_string(),
            got,
        },
        Err(e) => Checksum::Unreadable {
            error: e.to_string(),
        },
    }
}

/// The sha256 of a file, in lowercase hex.
pub fn sha256_of(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_checked_against_its_recorded_size_and_hash() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("m.gguf");
        std::fs::write(&file, b"abc").expect("write");
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_of(&file).expect("hash"), abc);
        assert_eq!(
            check_file(&file, 3, Some(abc), true),
            Checksum::Verified { sha256: abc.into() }
        );
        assert_eq!(
            check_file(&file, 3, Some(abc), false),
            Checksum::Recorded { sha256: abc.into() }
        );
        assert_eq!(
            check_file(&file, 4, Some(abc), true),
            Checksum::WrongSize {
                expected: 4,
                got: 3
            }
        );
        let other = "00".repeat(32);
        assert!(matches!(
            check_file(&file, 0, Some(&other), true),
            Checksum::Mismatch { .. }
        ));
        assert_eq!(check_file(&file, 0, None, true), Checksum::NoneRecorded);
    }
}
