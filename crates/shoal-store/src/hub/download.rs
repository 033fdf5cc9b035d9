//! One file from the hub into its cache, as huggingface_hub lays it out: the bytes collect in
//! `blobs/<etag>.incomplete` (resumed with `Range: bytes=N-` when a previous run left some), are checked
//! against the size and — for LFS files, whose etag is the sha256 — the sha256, then renamed to
//! `blobs/<etag>`; `snapshots/<commit>/<file>` becomes a relative symlink to the blob and `refs/<revision>`
//! holds the commit. An exclusive lock on `.locks/<repo folder>/<etag>.lock` (huggingface_hub's) keeps two processes from writing the same
//! blob. Free space is checked first; a [`CancelToken`] stops it between reads with the
//! partial blob kept.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use hf_hub::{Cache, Repo, RepoType};
use sha2::{Digest, Sha256};

use super::{Hub, HubFile, net};
use crate::disk::ensure_space;
use crate::error::{StoreError, io};
use crate::progress::{CancelToken, Meter, Phase, Progress, ProgressFn};

/// Hashes the first `len` bytes of `path` (the part a previous run left).
fn hash_prefix(path: &Path, len: u64, cancel: &CancelToken) -> Result<Option<Sha256>, StoreError> {
    let mut f = fs::File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        if cancel.is_cancelled() {
            return Ok(None);
        }
        let want = buf.len().min(left as usize);
        let n = f.read(&mut buf[..want]).map_err(io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        left -= n as u64;
    }
    Ok(Some(h))
}

/// `Content-Range: bytes START-END/TOTAL` → START.
fn range_start(v: &str) -> Option<u64> {
    v.trim()
        .strip_prefix("bytes ")?
        .split('-')
        .next()?
        .trim()
        .parse()
        .ok()
}

pub(super) async fn download(
    hub: &Hub,
    f: &HubFile,
    progress: &ProgressFn,
    cancel: &CancelToken,
) -> Result<PathBuf, StoreError> {
    let repo_dir = hub.repo_dir(&f.repo);
    let blobs = repo_dir.join("blobs");
    fs::create_dir_all(&blobs).map_err(io(&blobs))?;
    let blob = blobs.join(&f.etag);
    if !blob.is_file() {
        let locks = match repo_dir.file_name() {
            Some(name) => hub.config().cache_dir.join(".locks").join(name),
            None => blobs.clone(),
        };
        fs::create_dir_all(&locks).map_err(io(&locks))?;
        let _lock = lock_blob(&locks.join(format!("{}.lock", f.etag)), cancel).await?;
        // Another process may have finished it while we waited for the lock.
        if !blob.is_file() {
            fetch_blob(hub, f, &blob, progress, cancel).await?;
        }
    }
    link_snapshot(hub, f, &repo_dir)
}

/// An exclusive `flock` on `<cache>/.locks/models--org--repo/<etag>.lock` (where huggingface_hub takes one), so two processes never
/// append to the same `.incomplete`; released when the file is dropped. Waits, checking `cancel`.
async fn lock_blob(path: &Path, cancel: &CancelToken) -> Result<fs::File, StoreError> {
    use std::os::fd::AsRawFd;
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io(path))?;
    loop {
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(file);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(io(path)(err));
        }
        if cancel.is_cancelled() {
            return Err(cancelled(path, 0, 0));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

async fn fetch_blob(
    hub: &Hub,
    f: &HubFile,
    blob: &Path,
    progress: &ProgressFn,
    cancel: &CancelToken,
) -> Result<(), StoreError> {
    let partial = hub.incomplete_path(f);
    let mut have = fs::metadata(&partial).map(|m| m.len()).unwrap_or(0);
    if have > f.size {
        have = 0;
    }
    let dir = blob.parent().unwrap_or(Path::new("."));
    ensure_space(dir, f.size - have, hub.config().keep_free)?;
    let mut p = Progress::new(&f.file, Phase::Rehashing, f.size, have);
    let mut hasher = if have > 0 {
        progress(&p);
        let (path, c) = (partial.clone(), cancel.clone());
        let h = tokio::task::spawn_blocking(move || hash_prefix(&path, have, &c))
            .await
            .map_err(|e| StoreError::Io {
                path: partial.clone(),
                source: std::io::Error::other(e.to_string()),
            })??;
        match h {
            Some(h) => h,
            None => return Err(cancelled(&partial, have, f.size)),
        }
    } else {
        Sha256::new()
    };
    let mut out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&partial)
        .map_err(io(&partial))?;
    if fs::metadata(&partial).map(|m| m.len()).unwrap_or(0) != have {
        out.set_len(have).map_err(io(&partial))?;
    }
    p.phase = Phase::Downloading;
    p.resumed_from = have;
    progress(&p);
    if have < f.size {
        let (url, _) = hub.resolve_url(f);
        let mut rb = hub.get(&hub.data, reqwest::Method::GET, &url);
        if have > 0 {
            rb = rb.header("Range", format!("bytes={have}-"));
        }
        let mut resp = rb.send().await.map_err(net(&url))?;
        hub.check(&url, &resp)?;
        if resp.status().as_u16() == 206 {
            let start = resp
                .headers()
                .get("content-range")
                .and_then(|v| v.to_str().ok())
                .and_then(range_start);
            if start != Some(have) {
                return Err(StoreError::BadAnswer {
                    url,
                    message: format!(
                        "asked for bytes {have}-, got {}",
                        match start {
                            Some(s) => format!("a Content-Range starting at {s}"),
                            None => "no usable Content-Range".to_string(),
                        }
                    ),
                });
            }
        } else if have > 0 {
            // The server sent the whole file: start over.
            have = 0;
            hasher = Sha256::new();
            out.set_len(0).map_err(io(&partial))?;
        }
        let mut meter = Meter::new(have);
        let mut done = have;
        loop {
            if cancel.is_cancelled() {
                out.flush().map_err(io(&partial))?;
                return Err(cancelled(&partial, done, f.size));
            }
            let chunk = match resp.chunk().await {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => {
                    let _ = out.flush();
                    return Err(StoreError::Network {
                        url: url.clone(),
                        message: format!(
                            "{} after {done} of {} bytes (kept in {}; the next pull resumes)",
                            super::error_chain(&e),
                            f.size,
                            partial.display()
                        ),
                    });
                }
            };
            if done + chunk.len() as u64 > f.size {
                drop(out);
                let _ = fs::remove_file(&partial);
                return Err(StoreError::SizeMismatch {
                    file: f.file.clone(),
                    expected: f.size,
                    got: done + chunk.len() as u64,
                });
            }
            out.write_all(&chunk).map_err(io(&partial))?;
            hasher.update(&chunk);
            done += chunk.len() as u64;
            if meter.tick(done) {
                p.at(done, meter.speed());
                progress(&p);
            }
        }
        out.sync_all().map_err(io(&partial))?;
        if done != f.size {
            return Err(StoreError::Network {
                url,
                message: format!(
                    "the connection ended after {done} of {} bytes (kept in {}; the next pull resumes)",
                    f.size,
                    partial.display()
                ),
            });
        }
        p.at(done, meter.speed());
    }
    drop(out);
    p.phase = Phase::Verifying;
    progress(&p);
    if let Some(expected) = f.sha256() {
        let got = format!("{:x}", hasher.finalize());
        if !got.eq_ignore_ascii_case(expected) {
            let _ = fs::remove_file(&partial);
            return Err(StoreError::EtagMismatch {
                file: f.file.clone(),
                expected: expected.into(),
                got,
            });
        }
    }
    fs::rename(&partial, blob).map_err(io(blob))?;
    p.phase = Phase::Done;
    progress(&p);
    Ok(())
}

fn cancelled(partial: &Path, done: u64, total: u64) -> StoreError {
    StoreError::Cancelled {
        partial: partial.to_path_buf(),
        done,
        total,
    }
}

/// `snapshots/<commit>/<file>` → `../../blobs/<etag>` (one more `..` per folder in the file's path), and
/// `refs/<revision>` = commit when the revision is not the commit itself.
fn link_snapshot(hub: &Hub, f: &HubFile, repo_dir: &Path) -> Result<PathBuf, StoreError> {
    let snap = repo_dir.join("snapshots").join(&f.commit).join(&f.file);
    if let Some(parent) = snap.parent() {
        fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let depth = 2 + f.file.matches('/').count();
    let mut target = PathBuf::new();
    for _ in 0..depth {
        target.push("..");
    }
    target.push("blobs");
    target.push(&f.etag);
    if fs::symlink_metadata(&snap).is_ok() {
        fs::remove_file(&snap).map_err(io(&snap))?;
    }
    std::os::unix::fs::symlink(&target, &snap).map_err(io(&snap))?;
    if f.revision != f.commit {
        let repo = Repo::with_revision(f.repo.clone(), RepoType::Model, f.revision.clone());
        let refs = repo_dir.join("refs");
        Cache::new(hub.config().cache_dir.clone())
            .repo(repo)
            .create_ref(&f.commit)
            .map_err(io(&refs))?;
    }
    Ok(snap)
}
