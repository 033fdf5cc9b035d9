//! The compute probe at `shoal serve` start: what this node's kernels measure
//! ([`shoal_kernels::probe()`]: decode bytes/s per weight type, batched flops/s, decode attention
//! flops/s, sampling entries/s) as the
//! [`ComputeFacts`] the node publishes, cached so a restart — and every node started on the same
//! machine, as the tests start many — reads the figures back instead of measuring again.
//!
//! The cache is one JSON file per key under `~/.cache/shoal/compute/`; the key names this binary
//! (version, size and modification time: a rebuild measures again), the CPU model, the kernels'
//! backend (its features) and the thread count, and a file whose key differs is measured again.
//! A lock file there makes nodes that start together measure one after the other, the later ones
//! reading what the first wrote (several probes at once would measure a shared CPU). Nothing here
//! fails a start: without a home, a writable cache or a working probe the node publishes what it has
//! (unmeasured facts make the cluster fall back to its core-count estimate), and says so in the log.
//! The GPU probes' figures use the same cache and lock ([`cached_or_measure`], keys from
//! `crate::gpus`). `serve --compute FILE` skips the probe and publishes the figures in FILE ([`from_file`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use std::time::UNIX_EPOCH;

use shoal_cluster::facts::{ComputeFacts, cpu_model};
use shoal_kernels::{Backend, ProbeConfig, ThreadPool, TypeRate, probe};

/// The figures for `threads` threads: from the cache when its key matches, else measured now (about
/// 1.5 s) and cached.
pub fn measure_or_load(threads: usize) -> ComputeFacts {
    let threads = threads.max(1);
    let key = cache_key(threads);
    cached(cache_dir(), &key, || measure(threads, key.clone()))
}

/// The figures cached under `key` in this node's cache, else `measure()`'s (cached when measured):
/// the one cache, and lock, that the CPU probe and the GPU probes ([`crate::gpus`]) share, so
/// nodes starting together measure one device at a time.
pub fn cached_or_measure(key: &str, measure: impl FnOnce() -> ComputeFacts) -> ComputeFacts {
    cached(cache_dir(), key, measure)
}

/// Figures given by the user (`serve --compute FILE`), in the shape `/state` shows them.
pub fn from_file(file: &Path) -> anyhow::Result<ComputeFacts> {
    let bytes = std::fs::read(file)
        .with_context(|| format!("cannot read the compute figures in {}", file.display()))?;
    let facts: ComputeFacts = serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "{} does not hold compute figures (JSON like /state's nodes[].compute)",
            file.display()
        )
    })?;
    anyhow::ensure!(
        facts.is_measured(),
        "{} gives no usable decode rate (weight_bytes_per_s is empty or not positive)",
        file.display()
    );
    tracing::info!(file = %file.display(), "compute figures given, not measured");
    Ok(facts)
}

/// The facts cached in `dir` under `key`, else `measure()`'s (written there when measured).
fn cached(dir: Option<PathBuf>, key: &str, measure: impl FnOnce() -> ComputeFacts) -> ComputeFacts {
    let Some(dir) = dir else {
        tracing::warn!("no home directory: the compute probe's figures are not cached");
        return measure();
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::warn!(dir = %dir.display(), "compute probe cache: {e}");
        return measure();
    }
    // Held until this function returns (dropping the file releases it).
    let _lock = File::create(dir.join("probe.lock"))
        .and_then(|f| f.lock().map(|()| f))
        .map_err(|e| tracing::warn!(dir = %dir.display(), "compute probe lock: {e}"))
        .ok();
    let path = dir.join(format!("{:016x}.json", hash(key)));
    if let Some(cached) = read_cached(&path, key) {
        tracing::info!(file = %path.display(), "compute probe: cached figures");
        return cached;
    }
    let facts = measure();
    if facts.is_measured()
        && let Err(e) = write_atomically(&path, &facts)
    {
        tracing::warn!(file = %path.display(), "compute probe cache: {e}");
    }
    facts
}

/// The measured facts in `path` when their key is `key`.
fn read_cached(path: &Path, key: &str) -> Option<ComputeFacts> {
    std::fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<ComputeFacts>(&bytes).ok())
        .filter(|c| c.key == key && c.is_measured())
}

/// The figures cached under `key`, without measuring (`shoal doctor`).
pub fn cached_only(key: &str) -> Option<ComputeFacts> {
    read_cached(&cache_dir()?.join(format!("{:016x}.json", hash(key))), key)
}

/// `~/.cache/shoal/compute` (`$XDG_CACHE_HOME/shoal/compute` when set).
fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("shoal").join("compute"))
}

/// What the figures are valid for (see the module docs).
fn cache_key(threads: usize) -> String {
    format!(
        "{}; cpu {}; kernels {}; threads {threads}",
        build_id(),
        cpu_model(),
        Backend::detect().name(),
    )
}

/// This binary, as the cache keys name it: `shoal VERSION (SIZE bytes, modified NANOS)`, so a
/// rebuild measures again.
pub fn build_id() -> String {
    let build = std::env::current_exe()
        .and_then(std::fs::metadata)
        .map(|m| {
            let modified = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            format!("{} bytes, modified {modified}", m.len())
        })
        .unwrap_or_else(|_| "unknown build".into());
    format!("shoal {} ({build})", env!("CARGO_PKG_VERSION"))
}

fn hash(key: &str) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// Runs the probe on a pool of `threads`; unmeasured facts (logged) when it fails.
fn measure(threads: usize, key: String) -> ComputeFacts {
    let pool = ThreadPool::new(threads);
    match probe(&pool, &ProbeConfig::default()) {
        Ok(report) => {
            let (weight_bytes_per_s, rates) = published(&report.rates);
            tracing::info!(
                ms = report.elapsed.as_millis() as u64,
                gflops = report.flops_per_s / 1e9,
                attention_gflops = report.attention_flops_per_s / 1e9,
                sample_ns_per_entry = 1e9 / report.sample_entries_per_s,
                backend = report.backend.name(),
                threads,
                "compute probe: GB/s {rates}"
            );
            ComputeFacts {
                weight_bytes_per_s,
                flops_per_s: report.flops_per_s,
                attention_flops_per_s: report.attention_flops_per_s,
                sample_entries_per_s: report.sample_entries_per_s,
                threads,
                key,
            }
        }
        Err(e) => {
            tracing::warn!("compute probe failed: {e}; the cluster estimates this node's speed");
            ComputeFacts {
                threads,
                key,
                ..ComputeFacts::default()
            }
        }
    }
}

/// Decode rates as published (by lowercase type name) and as logged (`Q4_0 1.23, …` in GB/s): the
/// CPU probe's and the GPU probes' ([`crate::gpus`]).
pub fn published(rates: &[TypeRate]) -> (BTreeMap<String, f64>, String) {
    let map = rates
        .iter()
        .map(|r| (r.qtype.name().to_ascii_lowercase(), r.bytes_per_s))
        .collect();
    let text: Vec<String> = rates
        .iter()
        .map(|r| format!("{} {:.2}", r.qtype.name(), r.bytes_per_s / 1e9))
        .collect();
    (map, text.join(", "))
}

/// Writes `facts` to a temporary file beside `path`, then renames it over `path`, so a reader never
/// sees half a file.
fn write_atomically(path: &std::path::Path, facts: &ComputeFacts) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(facts).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn facts(key: &str, rate: f64) -> ComputeFacts {
        ComputeFacts {
            weight_bytes_per_s: [("q4_0".to_string(), rate)].into(),
            flops_per_s: 1e9,
            attention_flops_per_s: 2e9,
            sample_entries_per_s: 5e8,
            threads: 1,
            key: key.into(),
        }
    }

    /// Measured once per key; read back after; measured again for another key or a damaged file;
    /// an unmeasured result is not kept.
    #[test]
    fn figures_are_cached_per_key() {
        let dir = std::env::temp_dir().join(format!("shoal-compute-test-{}", std::process::id()));
        let cache = || Some(dir.join("compute"));
        let probes = Cell::new(0);
        let probe = |key: &str, rate: f64| {
            let key = key.to_string();
            let probes = &probes;
            move || {
                probes.set(probes.get() + 1);
                facts(&key, rate)
            }
        };
        assert_eq!(cached(cache(), "a", probe("a", 5e9)), facts("a", 5e9));
        assert_eq!(cached(cache(), "a", probe("a", 7e9)), facts("a", 5e9));
        assert_eq!(probes.get(), 1, "the second start reads the cache");
        assert_eq!(cached(cache(), "b", probe("b", 7e9)), facts("b", 7e9));
        assert_eq!(probes.get(), 2, "another key measures");
        let file = cache()
            .expect("dir")
            .join(format!("{:016x}.json", hash("a")));
        std::fs::write(&file, b"{ not json").expect("write");
        assert_eq!(cached(cache(), "a", probe("a", 6e9)), facts("a", 6e9));
        assert_eq!(probes.get(), 3, "a damaged file measures again");
        let unmeasured = || ComputeFacts {
            key: "c".into(),
            ..ComputeFacts::default()
        };
        assert!(!cached(cache(), "c", unmeasured).is_measured());
        assert_eq!(cached(cache(), "c", probe("c", 1e9)), facts("c", 1e9));
        // No cache directory at all: measured each time.
        assert_eq!(cached(None, "a", probe("a", 2e9)), facts("a", 2e9));
        assert_eq!(probes.get(), 5);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn the_key_names_the_build_cpu_backend_and_threads() {
        let key = cache_key(3);
        assert!(
            key.starts_with(&format!("shoal {} (", env!("CARGO_PKG_VERSION"))),
            "{key}"
        );
        assert!(
            key.contains(Backend::detect().name()) && key.ends_with("threads 3"),
            "{key}"
        );
        assert_ne!(key, cache_key(2));
    }

    /// Given figures are read back as written; a file without a usable rate, or not JSON, is a
    /// sentence naming the file.
    #[test]
    fn given_figures_are_used_and_bad_ones_refused() {
        let dir = std::env::temp_dir().join(format!("shoal-compute-given-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.json");
        std::fs::write(&good, serde_json::to_vec(&facts("given", 5e9)).unwrap()).unwrap();
        assert_eq!(from_file(&good).unwrap(), facts("given", 5e9));
        let empty = dir.join("empty.json");
        std::fs::write(&empty, serde_json::to_vec(&facts("given", 0.0)).unwrap()).unwrap();
        let err = from_file(&empty).unwrap_err().to_string();
        assert!(err.contains("no usable decode rate"), "{err}");
        let junk = dir.join("junk.json");
        std::fs::write(&junk, b"not json").unwrap();
        let err = from_file(&junk).unwrap_err().to_string();
        assert!(err.contains("does not hold compute figures"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
