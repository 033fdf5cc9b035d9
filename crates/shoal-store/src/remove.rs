//! [`Store::remove`]: deletes a model from the models dir — only what shoal wrote in its folder, then the
//! folder if nothing else is left in it ([`Removal`] says what went and what stayed).
//!
//! What shoal writes in a model's folder, and so what a delete takes:
//! - `model.json` and its temporary `.model.json.partial` (`store`);
//! - the model's gguf — a file (catalog, peer) or a link into the hub cache (hub) — named by
//!   `model.json`, the catalog, or (a folder the user dropped a gguf in) the gguf the folder lists as its
//!   model;
//! - any `*.partial`: a download's partial file (`pip`, shoal-transfer's peer fetch) or a hub download's
//!   link to the cache's `.incomplete` blob;
//! - pip's hidden download folder `.download.partial` (any hidden folder whose name ends in `.partial`);
//! - shoal-transfer's hidden files beside a gguf: the verified-chunk record `.<file>.partial.chunks` and
//!   the manifest cache `.<file>.manifest.json` (and its temporary `.<file>.manifest.json.tmp`).
//!
//! Links are removed, never followed. Anything else (a user's notes, another gguf) stays, and so does
//! the folder with it. With `purge`, a hub model's blob, snapshot link and partial blob in the hub cache
//! go too — named by `model.json`, whose parts must be plain names (no `..`) inside the cache.

use std::fs;
use std::path::{Path, PathBuf};

use crate::catalog;
use crate::error::{StoreError, io};
use crate::hub::is_sha256;
use crate::store::{MODEL_JSON, ModelInfo, Source, Store};

/// What [`Store::remove`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removal {
    /// What was deleted: the folder's files, then the folder when it went, then the hub cache's files.
    pub removed: Vec<PathBuf>,
    /// What stayed in the folder because shoal did not write it; the folder stays with them.
    pub kept: Vec<PathBuf>,
}

/// How a name in a model's folder is removed, if shoal wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    /// A file or a link: unlinked.
    File,
    /// pip's download folder: removed with what is in it.
    Folder,
}

/// Whether shoal wrote `name` (of type `kind`, not followed) in the folder of the model whose gguf is
/// `model_file` (see the module doc).
fn written_by_shoal(name: &str, kind: fs::FileType, model_file: Option<&str>) -> Option<Written> {
    if kind.is_dir() {
        return (name.starts_with('.') && name.ends_with(".partial")).then_some(Written::Folder);
    }
    let hidden_sidecar = name.starts_with('.')
        && (name.ends_with(".partial.chunks")
            || name.ends_with(".manifest.json")
            || name.ends_with(".manifest.json.tmp"));
    let known = name == MODEL_JSON
        || Some(name) == model_file
        || name.ends_with(".partial")
        || hidden_sidecar;
    known.then_some(Written::File)
}

/// A part of a path inside the hub cache that stays where it is put: no `..`, no separators.
fn plain(part: &str) -> bool {
    !part.is_empty()
        && part != "."
        && part != ".."
        && !part.contains('\\')
        && !part.chars().any(char::is_control)
}

impl Store {
    /// Deletes the model `id` from the models dir (see the module doc): what shoal wrote in its folder,
    /// then the folder when nothing else is left. With `purge`, a hub model's blob, snapshot link and
    /// partial blob in the hub cache go too (otherwise the cache — maybe shared with other tools — is
    /// left alone). An id that is not a model id (`..`, empty, absolute, NUL, over-long) or whose folder
    /// is a symbolic link is an error, and nothing is touched.
    pub fn remove(&self, id: &str, purge: bool) -> Result<Removal, StoreError> {
        let dir = self
            .find_dir(id)?
            .ok_or_else(|| StoreError::NotPresent(id.to_string(), self.root().to_path_buf()))?;
        let info = if purge {
            self.info(&dir)?
        } else {
            self.info(&dir).ok().flatten()
        };
        // The cache's paths are checked before anything is deleted: a bad model.json deletes nothing.
        let cache_files = match &info {
            Some(info) if purge && info.source == Source::Hub => self.hub_files(&dir, info)?,
            _ => Vec::new(),
        };
        let model_file = self.model_file_name(&dir, info.as_ref());
        let mut out = Removal::default();
        for e in fs::read_dir(&dir).map_err(io(&dir))?.flatten() {
            let path = e.path();
            let written = match (e.file_name().to_str(), e.file_type()) {
                (Some(name), Ok(kind)) => written_by_shoal(name, kind, model_file.as_deref()),
                _ => None,
            };
            match written {
                Some(Written::File) => fs::remove_file(&path).map_err(io(&path))?,
                Some(Written::Folder) => fs::remove_dir_all(&path).map_err(io(&path))?,
                None => {
                    out.kept.push(path);
                    continue;
                }
            }
            out.removed.push(path);
        }
        out.kept.sort();
        if out.kept.is_empty() {
            match fs::remove_dir(&dir) {
                Ok(()) => out.removed.push(dir.clone()),
                // Something arrived meanwhile (a download): it stays, and the folder with it.
                Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
                    out.kept.push(dir.clone())
                }
                Err(e) => return Err(io(&dir)(e)),
            }
        }
        for p in cache_files {
            if fs::symlink_metadata(&p).is_ok() {
                fs::remove_file(&p).map_err(io(&p))?;
                out.removed.push(p);
            }
        }
        Ok(out)
    }

    /// The name of the model's gguf in `dir`: `model.json`'s file, the catalog's, or the gguf the folder
    /// lists as its model.
    fn model_file_name(&self, dir: &Path, info: Option<&ModelInfo>) -> Option<String> {
        let base = |f: &str| f.rsplit('/').next().unwrap_or(f).to_string();
        info.map(|i| base(&i.file))
            .or_else(|| {
                let name = dir.file_name()?.to_str()?;
                catalog::find(name).map(|e| e.file_name.to_string())
            })
            .or_else(|| {
                let file = self.entry(dir)?.file?;
                Some(file.file_name()?.to_str()?.to_string())
            })
    }

    /// A hub model's snapshot link, blob and partial blob in the hub cache, as its `model.json` names
    /// them: an error when a part of it is not a plain name that stays in the cache.
    fn hub_files(&self, dir: &Path, info: &ModelInfo) -> Result<Vec<PathBuf>, StoreError> {
        let (Some(repo), Some(commit)) = (&info.repo, &info.commit) else {
            return Ok(Vec::new());
        };
        let repo_ok = repo.split_once('/').is_some_and(|(org, name)| {
            plain(org) && plain(name) && !name.contains('/') && !org.starts_with('.')
        });
        let sha_ok = info.sha256.as_deref().is_none_or(is_sha256);
        if !repo_ok || !plain(commit) || commit.contains('/') || !sha_ok {
            return Err(StoreError::BadModelJson {
                path: dir.join(MODEL_JSON),
                message: "its repo, commit or sha256 does not name a place in the hub cache".into(),
            });
        }
        if !info.file.split('/').all(plain) {
            return Err(StoreError::BadModelJson {
                path: dir.join(MODEL_JSON),
                message: format!("file '{}' is not a path inside a repository", info.file),
            });
        }
        let repo_dir = self.hub()?.repo_dir(repo);
        let mut paths = vec![repo_dir.join("snapshots").join(commit).join(&info.file)];
        if let Some(sha) = &info.sha256 {
            paths.push(repo_dir.join("blobs").join(sha));
            paths.push(repo_dir.join("blobs").join(format!("{sha}.incomplete")));
        }
        Ok(paths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_shoal_writes_are_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        fs::create_dir(d.join(".download.partial")).expect("pip folder");
        fs::create_dir(d.join("photos")).expect("user folder");
        let kind = |name: &str| {
            let p = d.join(name);
            if !p.exists() {
                fs::write(&p, b"x").expect("write");
            }
            let t = fs::symlink_metadata(&p).expect("meta").file_type();
            written_by_shoal(name, t, Some("m.gguf"))
        };
        for name in [
            "model.json",
            ".model.json.partial",
            "m.gguf",
            "m.gguf.partial",
            ".m.gguf.partial.chunks",
            ".m.gguf.manifest.json",
            ".m.gguf.manifest.json.tmp",
        ] {
            assert_eq!(kind(name), Some(Written::File), "{name}");
        }
        assert_eq!(kind(".download.partial"), Some(Written::Folder));
        for name in ["other.gguf", "notes.txt", "photos", "model.json.bak"] {
            assert_eq!(kind(name), None, "{name}");
        }
    }
}
