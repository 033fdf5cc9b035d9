//! The compute probe at `shoal serve` start: what this node's kernels measure
//! ([`shoal_kernels::probe()`]: decode bytes/s per weight type, batched flops/s) as the
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

use std::fs::File;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::path::PathBuf;
use std::time::UNIX_EPOCH;

use shoal_cluster::facts::{ComputeFacts, cpu_model};
use shoal_kernels::{Backend, ProbeConfig, ThreadPool, probe};

/// The figures for `threads` threads: from the cache when its key matches, else measured now (about
/// 1.5 s) and cached.
pub fn measure_or_load(threads: usize) -> ComputeFacts {
    let threads = threads.max(1);
    let key = cache_key(threads);
    let Some(dir) = cache_dir() else {
        tracing::warn!("no home directory: the compute probe's figures are not cached");
        return measure(threads, key);
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::warn!(dir = %dir.display(), "compute probe cache: {e}");
        return measure(threads, key);
    }
    // Held until this function returns (dropping the file releases it).
    let _lock = File::create(dir.join("probe.lock"))
        .and_then(|f| f.lock().map(|()| f))
        .map_err(|e| tracing::warn!(dir = %dir.display(), "compute probe lock: {e}"))
        .ok();
    let path = dir.join(format!("{:016x}.json", hash(&key)));
    if let Some(cached) = std::fs::read(&path)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<ComputeFacts>(&bytes).ok())
        .filter(|c| c.key == key && c.is_measured())
    {
        tracing::info!(file = %path.display(), "compute probe: cached figures");
        return cached;
    }
    let facts = measure(threads, key);
    if facts.is_measured()
        && let Err(e) = write_atomically(&path, &facts)
    {
        tracing::warn!(file = %path.display(), "compute probe cache: {e}");
    }
    facts
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
    format!(
        "shoal {} ({build}); cpu {}; kernels {}; threads {threads}",
        env!("CARGO_PKG_VERSION"),
        cpu_model(),
        Backend::detect().name(),
    )
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
            let rates: Vec<String> = report
                .rates
                .iter()
                .map(|r| format!("{} {:.2}", r.qtype.name(), r.bytes_per_s / 1e9))
                .collect();
            tracing::info!(
                ms = report.elapsed.as_millis() as u64,
                gflops = report.flops_per_s / 1e9,
                backend = report.backend.name(),
                threads,
                "compute probe: GB/s {}",
                rates.join(", ")
            );
            ComputeFacts {
                weight_bytes_per_s: report
                    .rates
                    .iter()
                    .map(|r| (r.qtype.name().to_ascii_lowercase(), r.bytes_per_s))
                    .collect(),
                flops_per_s: report.flops_per_s,
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

/// Writes `facts` to a temporary file beside `path`, then renames it over `path`, so a reader never
/// sees half a file.
fn write_atomically(path: &std::path::Path, facts: &ComputeFacts) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(facts).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}
