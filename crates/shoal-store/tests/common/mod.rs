//! Shared by the hub tests: `scripts/fakehub` on 127.0.0.1 (a free port) over a folder of repositories the
//! test writes, its request log, and a store whose hub config points at it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use shoal_store::{HubConfig, Store};

pub struct FakeHub {
    child: Child,
    pub url: String,
    pub root: tempfile::TempDir,
    pub log: PathBuf,
}

/// One request of the fakehub log.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub status: u16,
    pub bytes: u64,
    pub auth: bool,
}

impl FakeHub {
    /// Starts fakehub over an empty root with extra arguments (`--token`, `--rate`, ...).
    pub fn start(args: &[&str]) -> FakeHub {
        let root = tempfile::tempdir().unwrap();
        let log = root.path().join(".requests.jsonl");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fakehub");
        let mut child = Command::new("python3")
            .arg(script)
            .arg("--root")
            .arg(root.path())
            .arg("--log")
            .arg(&log)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs scripts/fakehub");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("fakehub: listening on ")
            .unwrap_or_else(|| panic!("fakehub said {line:?}"))
            .to_string();
        FakeHub {
            child,
            url,
            root,
            log,
        }
    }

    /// Writes `bytes` as `repo/file` of the served tree.
    pub fn add(&self, repo: &str, file: &str, bytes: &[u8]) -> PathBuf {
        let path = self.root.path().join(repo).join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
        path
    }

    pub fn requests(&self) -> Vec<Logged> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The content requests (the file server's GETs).
    pub fn content_gets(&self) -> Vec<Logged> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "GET" && r.path.starts_with("/cdn/"))
            .collect()
    }

    /// The content requests once `n` of them are logged (a request is logged after its last byte went
    /// out, which may be just after the client has them all).
    pub fn wait_content_gets(&self, n: usize) -> Vec<Logged> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let gets = self.content_gets();
            if gets.len() >= n || std::time::Instant::now() > deadline {
                return gets;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A models dir and a hub cache in temporary folders, the hub at `endpoint`.
pub struct Dirs {
    pub models: tempfile::TempDir,
    pub cache: tempfile::TempDir,
}

impl Dirs {
    pub fn new() -> Dirs {
        Dirs {
            models: tempfile::tempdir().unwrap(),
            cache: tempfile::tempdir().unwrap(),
        }
    }

    pub fn config(&self, endpoint: &str) -> HubConfig {
        HubConfig {
            endpoint: endpoint.to_string(),
            token: None,
            cache_dir: self.cache.path().to_path_buf(),
            offline: false,
            keep_free: 0,
        }
    }

    pub fn store(&self, endpoint: &str) -> Store {
        Store::new(self.models.path()).with_hub(self.config(endpoint))
    }
}

/// Deterministic pseudo-random bytes (xorshift), so files differ and compress badly.
pub fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(b))
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}
