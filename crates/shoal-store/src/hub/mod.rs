//! The Hugging Face hub, its conventions and its cache. [`HubConfig`] reads `HF_ENDPOINT`, `HF_TOKEN` (else
//! the token file), `HF_HOME` / `HF_HUB_CACHE` and `HF_HUB_OFFLINE`; [`Hub`] lists a revision
//! (`/api/models/{repo}/revision/{rev}` → commit + files), finds a file already in the cache (another
//! tool's download, no network: [`Hub::cached`]), asks the hub about one file (`HEAD /resolve/`: commit,
//! etag, size → [`HubFile`]) and gives the URL + headers a ranged reader needs ([`Hub::resolve_url`]).
//! The download itself (resume, sha256, cache layout) is in [`download`].

mod download;

use std::path::{Path, PathBuf};
use std::time::Duration;

use hf_hub::{Cache, Repo, RepoType};
use serde::Deserialize;

use crate::error::StoreError;
use crate::modelref::{HubRef, Select, select_gguf};

/// Default hub address.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where the hub is, who we are to it and where its cache lives.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// `HF_ENDPOINT`, without a trailing `/`.
    pub endpoint: String,
    /// `HF_TOKEN`, else the token file (`HF_TOKEN_PATH`, else `$HF_HOME/token`).
    pub token: Option<String>,
    /// The hub cache (`HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`).
    pub cache_dir: PathBuf,
    /// `HF_HUB_OFFLINE`: use only complete files of the cache.
    pub offline: bool,
    /// Bytes that must stay free on the disk after a download.
    pub keep_free: u64,
}

/// Default [`HubConfig::keep_free`].
pub const DEFAULT_KEEP_FREE: u64 = 64 << 20;

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn truthy(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "on" | "yes" | "true"
    )
}

impl HubConfig {
    /// The configuration the environment describes, as huggingface_hub reads it.
    pub fn from_env() -> Self {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let hf_home = env_nonempty("HF_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                env_nonempty("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .or_else(|| home.clone().map(|h| h.join(".cache")))
                    .unwrap_or_else(|| PathBuf::from(".cache"))
                    .join("huggingface")
            });
        let cache_dir = env_nonempty("HF_HUB_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("hub"));
        let token = env_nonempty("HF_TOKEN")
            .map(|t| t.trim().to_string())
            .or_else(|| match env_nonempty("HF_TOKEN_PATH") {
                Some(p) => read_token(Path::new(&p)),
                // hf-hub's Cache keeps the token beside its `hub` folder: `$HF_HOME/token`.
                None => Cache::new(hf_home.join("hub")).token(),
            });
        Self {
            endpoint: env_nonempty("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_ENDPOINT.into())
                .trim_end_matches('/')
                .to_string(),
            token,
            cache_dir,
            offline: env_nonempty("HF_HUB_OFFLINE").is_some_and(|v| truthy(&v)),
            keep_free: DEFAULT_KEEP_FREE,
        }
    }
}

fn read_token(path: &Path) -> Option<String> {
    let t = std::fs::read_to_string(path).ok()?;
    let t = t.trim();
    (!t.is_empty()).then(|| t.to_string())
}

/// One file of one commit of a hub repository, as the hub described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubFile {
    pub repo: String,
    /// The revision it was asked under (branch, tag or commit).
    pub revision: String,
    /// The commit the revision pointed to.
    pub commit: String,
    /// Path inside the repository.
    pub file: String,
    pub size: u64,
    /// The etag without quotes: the sha256 (hex) of the content for LFS files, a git hash otherwise.
    pub etag: String,
}

impl HubFile {
    /// The etag is a sha256 of the content (LFS files): the download is checked against it.
    pub fn sha256(&self) -> Option<&str> {
        is_sha256(&self.etag).then_some(self.etag.as_str())
    }
}

pub(crate) fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A revision's commit and files, from the hub's API.
#[derive(Debug, Clone)]
pub struct RepoListing {
    pub commit: String,
    pub files: Vec<String>,
}

/// A complete file found in the hub cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedFile {
    pub file: String,
    pub commit: String,
    /// `snapshots/<commit>/<file>` (a symlink to the blob).
    pub path: PathBuf,
}

#[derive(Deserialize)]
struct ApiRevision {
    sha: String,
    #[serde(default)]
    siblings: Vec<ApiSibling>,
}

#[derive(Deserialize)]
struct ApiSibling {
    rfilename: String,
}

/// A client of one hub (async; cheap to clone).
#[derive(Debug, Clone)]
pub struct Hub {
    cfg: HubConfig,
    /// For metadata: redirects are not followed (the hub's headers are on its own answer).
    meta: reqwest::Client,
    /// For content: follows the hub's redirect to its file servers.
    data: reqwest::Client,
}

fn build_client(redirects: bool) -> Result<reqwest::Client, StoreError> {
    let policy = if redirects {
        reqwest::redirect::Policy::limited(10)
    } else {
        reqwest::redirect::Policy::none()
    };
    reqwest::Client::builder()
        .redirect(policy)
        .connect_timeout(Duration::from_secs(20))
        .read_timeout(Duration::from_secs(60))
        .user_agent(concat!("shoal/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| StoreError::Network {
            url: String::new(),
            message: format!("building the HTTP client: {e}"),
        })
}

pub(crate) fn net(url: &str) -> impl FnOnce(reqwest::Error) -> StoreError + '_ {
    move |e| {
        let message = error_chain(&e);
        StoreError::Network {
            url: url.into(),
            message,
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.to_string())
}

/// `"abc"` / `W/"abc"` → `abc`.
fn unquote_etag(s: &str) -> String {
    s.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_string()
}

impl Hub {
    pub fn new(cfg: HubConfig) -> Result<Self, StoreError> {
        Ok(Self {
            cfg,
            meta: build_client(false)?,
            data: build_client(true)?,
        })
    }

    pub fn config(&self) -> &HubConfig {
        &self.cfg
    }

    /// `models--org--repo` in the cache.
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.cfg
            .cache_dir
            .join(Repo::new(repo.into(), RepoType::Model).folder_name())
    }

    fn auth(&self) -> Vec<(String, String)> {
        self.cfg
            .token
            .iter()
            .map(|t| ("Authorization".to_string(), format!("Bearer {t}")))
            .collect()
    }

    fn get(
        &self,
        client: &reqwest::Client,
        method: reqwest::Method,
        url: &str,
    ) -> reqwest::RequestBuilder {
        let mut rb = client.request(method, url);
        for (k, v) in self.auth() {
            rb = rb.header(k, v);
        }
        rb
    }

    /// The URL of a file's content at its commit and the headers to send with it (authorization);
    /// ranged readers add their own `Range`.
    pub fn resolve_url(&self, f: &HubFile) -> (String, Vec<(String, String)>) {
        (
            format!(
                "{}/{}/resolve/{}/{}",
                self.cfg.endpoint, f.repo, f.commit, f.file
            ),
            self.auth(),
        )
    }

    /// Maps an unsuccessful answer to an error (hub's `X-Error-Code` included).
    pub(crate) fn check(&self, url: &str, resp: &reqwest::Response) -> Result<(), StoreError> {
        let status = resp.status();
        if status.is_success() || status.is_redirection() {
            return Ok(());
        }
        let code = header(resp, "x-error-code").unwrap_or_default();
        let message = header(resp, "x-error-message").unwrap_or_default();
        Err(match status.as_u16() {
            401 | 403 if code != "RepoNotFound" => StoreError::Unauthorized {
                url: url.into(),
                status: status.as_u16(),
                token_sent: self.cfg.token.is_some(),
            },
            401 | 404 => StoreError::HubNotFound {
                url: url.into(),
                code: if code.is_empty() { "404".into() } else { code },
            },
            s => StoreError::Http {
                url: url.into(),
                status: s,
                message,
            },
        })
    }

    /// The commit a revision points to and the repository's files there.
    pub async fn list(&self, repo: &str, revision: &str) -> Result<RepoListing, StoreError> {
        let url = format!(
            "{}/api/models/{repo}/revision/{}",
            self.cfg.endpoint,
            revision.replace('/', "%2F")
        );
        let resp = self
            .get(&self.data, reqwest::Method::GET, &url)
            .send()
            .await
            .map_err(net(&url))?;
        self.check(&url, &resp)?;
        let body = resp.bytes().await.map_err(net(&url))?;
        let api: ApiRevision =
            serde_json::from_slice(&body).map_err(|e| StoreError::BadAnswer {
                url: url.clone(),
                message: e.to_string(),
            })?;
        // The commit and the file names become folders of the hub cache: a hub (or a stand-in named by
        // HF_ENDPOINT) that answers anything else is refused, never followed out of the cache.
        if !is_commit(&api.sha) {
            return Err(StoreError::BadAnswer {
                url,
                message: "the revision's commit is not a 40-digit hash".into(),
            });
        }
        Ok(RepoListing {
            commit: api.sha,
            files: api.siblings.into_iter().map(|s| s.rfilename).collect(),
        })
    }

    /// Asks the hub (`HEAD /resolve/`) for a file's commit, size and etag.
    pub async fn head(
        &self,
        repo: &str,
        revision: &str,
        file: &str,
    ) -> Result<HubFile, StoreError> {
        let url = format!(
            "{}/{repo}/resolve/{}/{file}",
            self.cfg.endpoint,
            revision.replace('/', "%2F")
        );
        let resp = self
            .get(&self.meta, reqwest::Method::HEAD, &url)
            .send()
            .await
            .map_err(net(&url))?;
        self.check(&url, &resp)?;
        let bad = |m: &str| StoreError::BadAnswer {
            url: url.clone(),
            message: m.into(),
        };
        // The commit, the file and the etag become paths in the hub cache: only plain names pass.
        if !crate::modelref::valid_repo_path(file) {
            return Err(bad("the file name could leave the repository's folder"));
        }
        let commit = header(&resp, "x-repo-commit")
            .filter(|c| is_commit(c))
            .ok_or_else(|| bad("no X-Repo-Commit header holding a 40-digit hash"))?;
        let etag = header(&resp, "x-linked-etag")
            .or_else(|| header(&resp, "etag"))
            .map(|e| unquote_etag(&e))
            .filter(|e| !e.is_empty() && e.bytes().all(|b| b.is_ascii_alphanumeric()))
            .ok_or_else(|| bad("no usable ETag / X-Linked-Etag header"))?;
        let size = header(&resp, "x-linked-size")
            .or_else(|| header(&resp, "content-length"))
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| bad("no X-Linked-Size / Content-Length header"))?;
        Ok(HubFile {
            repo: repo.into(),
            revision: revision.into(),
            commit,
            file: file.into(),
            size,
            etag,
        })
    }

    /// Names the file a reference means (listing the revision when it names a tag or nothing) and asks
    /// the hub about it.
    pub async fn resolve(&self, r: &HubRef) -> Result<HubFile, StoreError> {
        let file = match &r.select {
            Select::File(f) => f.clone(),
            sel => {
                let listing = self.list(&r.repo, &r.revision).await?;
                select_gguf(&r.repo, &listing.files, sel)?
            }
        };
        self.head(&r.repo, &r.revision, &file).await
    }

    /// The commit the cache's `refs/<revision>` holds (or the revision itself when it is a commit).
    fn cached_commit(&self, repo: &str, revision: &str) -> Option<String> {
        if is_commit(revision) {
            return Some(revision.to_string());
        }
        let path = self.repo_dir(repo).join("refs").join(revision);
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }

    /// The complete file `r` means, when the cache has it (no network): the revision's ref, then the file
    /// (named, or chosen among the snapshot's files by the tag) whose symlink reaches a blob.
    pub fn cached(&self, r: &HubRef) -> Option<CachedFile> {
        let commit = self.cached_commit(&r.repo, &r.revision)?;
        let snap = self.repo_dir(&r.repo).join("snapshots").join(&commit);
        let file = match &r.select {
            Select::File(f) => f.clone(),
            sel => {
                let mut files = Vec::new();
                list_files(&snap, "", &mut files);
                select_gguf(&r.repo, &files, sel).ok()?
            }
        };
        let path = if is_commit(&r.revision) {
            snap.join(&file)
        } else {
            let repo = Repo::with_revision(r.repo.clone(), RepoType::Model, r.revision.clone());
            Cache::new(self.cfg.cache_dir.clone())
                .repo(repo)
                .get(&file)?
        };
        // `exists` follows the symlink: a link whose blob is missing (or still .incomplete) does not count.
        path.exists().then_some(CachedFile { file, commit, path })
    }

    /// Downloads a file into the cache (resuming a partial blob) and returns its snapshot path.
    pub async fn download(
        &self,
        f: &HubFile,
        progress: &crate::progress::ProgressFn,
        cancel: &crate::progress::CancelToken,
    ) -> Result<PathBuf, StoreError> {
        download::download(self, f, progress, cancel).await
    }

    /// `blobs/<etag>.incomplete`: where a download of `f` collects its bytes.
    pub fn incomplete_path(&self, f: &HubFile) -> PathBuf {
        self.repo_dir(&f.repo)
            .join("blobs")
            .join(format!("{}.incomplete", f.etag))
    }
}

/// Files under `dir` (recursively), as repository paths with `/`.
fn list_files(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let p = e.path();
        if p.is_dir() {
            list_files(&p, &rel, out);
        } else {
            out.push(rel);
        }
    }
    out.sort();
}
