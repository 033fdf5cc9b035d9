//! [`PartialFile`]: a download in progress — `<dest>.partial`, sparse and as long as the whole file, with a
//! sidecar `.<name>.partial.chunks` listing the chunks already verified.
//!
//! The sidecar is a first line naming the manifest root (`shoal-chunks 1 <root>`), then one
//! little-endian `u32` per verified chunk, appended as chunks land. On open, a sidecar for another root is
//! discarded, and every recorded chunk is hashed again against the manifest: one whose bytes no longer
//! match is fetched again.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::TransferError;
use crate::manifest::Manifest;

const MAGIC: &str = "shoal-chunks 1";

/// The `.partial` file of a download and its record of verified chunks.
pub struct PartialFile {
    path: PathBuf,
    sidecar: PathBuf,
    file: File,
    record: File,
    /// Chunk `i` verified and recorded.
    verified: Vec<bool>,
}

/// `<dest>.partial`.
pub fn partial_path(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    dest.with_file_name(name)
}

/// `.<dest name>.partial.chunks` beside `dest`.
pub fn chunks_path(dest: &Path) -> PathBuf {
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    dest.with_file_name(format!(".{name}.partial.chunks"))
}

impl PartialFile {
    /// Opens (or creates) the partial file of `dest` for `manifest`, re-verifying the chunks a previous
    /// run recorded. Blocking: run it on the blocking pool.
    pub fn open(dest: &Path, manifest: &Manifest) -> Result<Self, TransferError> {
        let path = partial_path(dest);
        let sidecar = chunks_path(dest);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(TransferError::io(&path))?;
        let len = file.metadata().map_err(TransferError::io(&path))?.len();
        if len != manifest.size {
            file.set_len(manifest.size)
                .map_err(TransferError::io(&path))?;
        }
        let header = format!("{MAGIC} {}\n", manifest.root());
        let recorded = match std::fs::read(&sidecar) {
            Ok(bytes) if bytes.starts_with(header.as_bytes()) => bytes[header.len()..]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize)
                .collect(),
            _ => Vec::new(),
        };
        let mut verified = vec![false; manifest.chunk_count()];
        let mut buf = Vec::new();
        for i in recorded {
            if i >= verified.len() || verified[i] {
                continue;
            }
            let r = manifest.chunk_range(i);
            buf.resize((r.end - r.start) as usize, 0);
            if file.read_exact_at(&mut buf, r.start).is_ok() && manifest.verify_chunk(i, &buf) {
                verified[i] = true;
            } else {
                tracing::warn!(path = %path.display(), chunk = i, "a recorded chunk no longer verifies; fetching it again");
            }
        }
        // Rewrite the record with what holds now.
        let mut record = File::create(&sidecar).map_err(TransferError::io(&sidecar))?;
        let mut out = header.into_bytes();
        for (i, _) in verified.iter().enumerate().filter(|(_, v)| **v) {
            out.extend_from_slice(&(i as u32).to_le_bytes());
        }
        record
            .write_all(&out)
            .map_err(TransferError::io(&sidecar))?;
        Ok(Self {
            path,
            sidecar,
            file,
            record,
            verified,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Which chunks are verified, by index.
    pub fn verified(&self) -> &[bool] {
        &self.verified
    }

    pub fn is_verified(&self, i: usize) -> bool {
        self.verified.get(i).copied().unwrap_or(false)
    }

    /// A second handle on the data file, for writing chunks off the fetcher's loop.
    pub fn writer(&self) -> Result<File, TransferError> {
        self.file.try_clone().map_err(TransferError::io(&self.path))
    }

    /// Records chunk `i` as verified (its bytes were written first).
    pub fn mark(&mut self, i: usize) -> Result<(), TransferError> {
        if self.verified.get(i).copied().unwrap_or(true) {
            return Ok(());
        }
        self.record
            .write_all(&(i as u32).to_le_bytes())
            .map_err(TransferError::io(&self.sidecar))?;
        self.verified[i] = true;
        Ok(())
    }

    /// All chunks verified: checks the whole-file sha256 (when the manifest has one; `hashed` is that
    /// hash if it was computed on the way, else the file is read once more), moves the data to `dest` and
    /// removes the record. Blocking.
    pub fn finish(
        self,
        dest: &Path,
        manifest: &Manifest,
        hashed: Option<String>,
    ) -> Result<(), TransferError> {
        if let Some(expected) = &manifest.sha256 {
            let got = match hashed {
                Some(h) => h,
                None => whole_sha256(&self.path)?,
            };
            if !got.eq_ignore_ascii_case(expected) {
                return Err(TransferError::WholeHashMismatch {
                    file: manifest.file_name.clone(),
                    got,
                    expected: expected.clone(),
                });
            }
        }
        self.file
            .sync_all()
            .map_err(TransferError::io(&self.path))?;
        std::fs::rename(&self.path, dest).map_err(TransferError::io(dest))?;
        let _ = std::fs::remove_file(&self.sidecar);
        Ok(())
    }
}

fn whole_sha256(path: &Path) -> Result<String, TransferError> {
    use sha2::{Digest, Sha256};
    let mut f = File::open(path).map_err(TransferError::io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = crate::manifest::read_full(&mut f, &mut buf).map_err(TransferError::io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(crate::manifest::hex(&h.finalize()))
}
