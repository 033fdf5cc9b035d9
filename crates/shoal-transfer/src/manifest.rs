//! [`Manifest`]: what a complete model file is, chunk by chunk — its name, size, whole-file sha256 and
//! the sha256 of every [`CHUNK_SIZE`] chunk; [`Manifest::root`] is the sha256 over the chunk hashes (two
//! files with the same root have the same bytes).
//!
//! [`Manifest::compute`] reads a complete file once (chunk hashes and the whole hash in the same pass);
//! [`Manifest::load_or_compute`] caches the result beside the file as `.<file>.manifest.json`, keyed by the
//! file's size and modification time (a changed file is hashed again). A manifest from a peer is checked
//! with [`Manifest::validate`] before anything trusts its numbers.

use std::fs::File;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::TransferError;

/// Bytes per chunk: the unit of requests, verification and resume.
pub const CHUNK_SIZE: u64 = 4 << 20;
/// The largest chunk size a manifest from elsewhere may declare (one chunk is one blob read).
pub const MAX_CHUNK_SIZE: u64 = 16 << 20;
/// The longest file name a manifest may carry.
const MAX_NAME_LEN: usize = 512;

/// A complete file's chunk hashes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub file_name: String,
    pub size: u64,
    /// Whole-file sha256 (lowercase hex), when known.
    pub sha256: Option<String>,
    pub chunk_size: u64,
    #[serde(with = "hex_list")]
    pub chunks: Vec<[u8; 32]>,
}

/// The sidecar cache: a manifest and the file state it was computed from.
#[derive(Serialize, Deserialize)]
struct Cached {
    size: u64,
    mtime_ns: u128,
    manifest: Manifest,
}

impl Manifest {
    /// Hashes a complete file in one pass (chunk hashes and the whole-file sha256).
    pub fn compute(path: &Path) -> Result<Self, TransferError> {
        let mut file = File::open(path).map_err(TransferError::io(path))?;
        let file_name = file_name(path);
        let mut whole = Sha256::new();
        let mut chunks = Vec::new();
        let mut buf = vec![0u8; CHUNK_SIZE as usize];
        let mut size = 0u64;
        loop {
            let n = read_full(&mut file, &mut buf).map_err(TransferError::io(path))?;
            if n == 0 {
                break;
            }
            whole.update(&buf[..n]);
            chunks.push(Sha256::digest(&buf[..n]).into());
            size += n as u64;
            if n < buf.len() {
                break;
            }
        }
        Ok(Self {
            file_name,
            size,
            sha256: Some(hex(&whole.finalize())),
            chunk_size: CHUNK_SIZE,
            chunks,
        })
    }

    /// The manifest of `path` from its sidecar `.<file>.manifest.json` when that was made for the file's
    /// current size and modification time, else computed (and the sidecar rewritten; a sidecar that cannot
    /// be written is only logged: the manifest is still right).
    pub fn load_or_compute(path: &Path) -> Result<Self, TransferError> {
        let (size, mtime_ns) = stamp(path)?;
        let sidecar = sidecar_path(path);
        if let Ok(text) = std::fs::read_to_string(&sidecar)
            && let Ok(c) = serde_json::from_str::<Cached>(&text)
            && c.size == size
            && c.mtime_ns == mtime_ns
            && c.manifest.validate().is_ok()
        {
            return Ok(c.manifest);
        }
        let manifest = Self::compute(path)?;
        // The file changed while it was hashed: the manifest may mix versions.
        if stamp(path)? != (size, mtime_ns) || manifest.size != size {
            return Err(TransferError::BadManifest {
                file: manifest.file_name,
                message: "the file changed while it was being hashed".into(),
            });
        }
        let cached = Cached {
            size,
            mtime_ns,
            manifest,
        };
        match serde_json::to_vec(&cached) {
            Ok(bytes) => {
                let tmp = sidecar.with_extension("json.tmp");
                if let Err(e) =
                    std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, &sidecar))
                {
                    tracing::warn!(path = %sidecar.display(), "cannot write the manifest cache: {e}");
                }
            }
            Err(e) => tracing::warn!("cannot encode the manifest cache: {e}"),
        }
        Ok(cached.manifest)
    }

    /// The sha256 over the chunk hashes, in order (lowercase hex).
    pub fn root(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.size.to_le_bytes());
        h.update(self.chunk_size.to_le_bytes());
        for c in &self.chunks {
            h.update(c);
        }
        hex(&h.finalize())
    }

    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// The bytes of chunk `i` (the last one may be short).
    pub fn chunk_range(&self, i: usize) -> Range<u64> {
        let start = (i as u64).saturating_mul(self.chunk_size).min(self.size);
        start..start.saturating_add(self.chunk_size).min(self.size)
    }

    /// The chunks that cover any byte of `ranges` (clamped to the file), sorted, each once.
    pub fn chunks_covering(&self, ranges: &[Range<u64>]) -> Vec<usize> {
        let mut want = vec![false; self.chunks.len()];
        for r in ranges {
            let (start, end) = (r.start.min(self.size), r.end.min(self.size));
            if start >= end {
                continue;
            }
            let first = (start / self.chunk_size) as usize;
            let last = ((end - 1) / self.chunk_size) as usize;
            for w in &mut want[first..=last.min(self.chunks.len().saturating_sub(1))] {
                *w = true;
            }
        }
        (0..want.len()).filter(|&i| want[i]).collect()
    }

    /// True when `data` is exactly chunk `i`'s bytes.
    pub fn verify_chunk(&self, i: usize, data: &[u8]) -> bool {
        let r = self.chunk_range(i);
        data.len() as u64 == r.end - r.start
            && self
                .chunks
                .get(i)
                .is_some_and(|h| Sha256::digest(data)[..] == h[..])
    }

    /// Checks the numbers of a manifest from elsewhere: a sane name and chunk size, and exactly one hash per
    /// chunk of `size` bytes.
    pub fn validate(&self) -> Result<(), TransferError> {
        let bad = |message: String| TransferError::BadManifest {
            file: self.file_name.chars().take(80).collect(),
            message,
        };
        if self.file_name.is_empty()
            || self.file_name.len() > MAX_NAME_LEN
            || self.file_name.contains(['/', '\\', '\0'])
            || self.file_name.starts_with('.')
        {
            return Err(bad(
                "the file name is empty, too long or not a plain name".into()
            ));
        }
        if self.chunk_size == 0 || self.chunk_size > MAX_CHUNK_SIZE {
            return Err(bad(format!(
                "chunk size {} is out of range",
                self.chunk_size
            )));
        }
        let expected = self.size.div_ceil(self.chunk_size);
        if self.chunks.len() as u64 != expected {
            return Err(bad(format!(
                "{} chunk hashes for {} bytes in chunks of {} (expected {expected})",
                self.chunks.len(),
                self.size,
                self.chunk_size
            )));
        }
        if let Some(s) = &self.sha256
            && (s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(bad("the whole-file sha256 is not 64 hex digits".into()));
        }
        Ok(())
    }
}

/// `.<file>.manifest.json` beside `path`.
pub fn sidecar_path(path: &Path) -> PathBuf {
    path.with_file_name(format!(".{}.manifest.json", file_name(path)))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The file's size and modification time (nanoseconds since the epoch).
fn stamp(path: &Path) -> Result<(u64, u128), TransferError> {
    let meta = std::fs::metadata(path).map_err(TransferError::io(path))?;
    let mtime = meta.modified().map_err(TransferError::io(path))?;
    let ns = mtime.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    Ok((meta.len(), ns))
}

/// Reads until `buf` is full or the file ends; the number of bytes read.
pub(crate) fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// The 32 bytes of a 64-digit hex string.
fn unhex32(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = digit(b[2 * i])? << 4 | digit(b[2 * i + 1])?;
    }
    Some(out)
}

/// Chunk hashes as a JSON list of hex strings.
mod hex_list {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(chunks: &[[u8; 32]], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(chunks.iter().map(|c| super::hex(c)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<[u8; 32]>, D::Error> {
        let list = Vec::<String>::deserialize(d)?;
        list.iter()
            .map(|s| {
                super::unhex32(s)
                    .ok_or_else(|| D::Error::custom("a chunk hash is not 64 hex digits"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, len: usize) -> PathBuf {
        let p = dir.join(name);
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4099) as u8).collect();
        std::fs::write(&p, data).unwrap();
        p
    }

    #[test]
    fn chunks_cover_the_file_and_verify_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "m.gguf", (2 * CHUNK_SIZE + 5) as usize);
        let m = Manifest::compute(&p).unwrap();
        assert_eq!((m.size, m.chunk_count()), (2 * CHUNK_SIZE + 5, 3));
        assert_eq!(m.chunk_range(2), 2 * CHUNK_SIZE..2 * CHUNK_SIZE + 5);
        let data = std::fs::read(&p).unwrap();
        assert_eq!(
            m.sha256.as_deref(),
            Some(hex(&Sha256::digest(&data)).as_str())
        );
        let c1 = &data[CHUNK_SIZE as usize..2 * CHUNK_SIZE as usize];
        assert!(m.verify_chunk(1, c1));
        assert!(!m.verify_chunk(0, c1));
        let mut bad = c1.to_vec();
        bad[17] ^= 1;
        assert!(!m.verify_chunk(1, &bad));
        assert_eq!(
            m.chunks_covering(&[5..6, CHUNK_SIZE * 2..CHUNK_SIZE * 9]),
            vec![0, 2]
        );
        assert_eq!(
            m.chunks_covering(&[CHUNK_SIZE - 1..CHUNK_SIZE + 1, 0..1]),
            vec![0, 1]
        );
        m.validate().unwrap();
    }

    #[test]
    fn the_sidecar_is_reused_until_the_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "m.gguf", 1000);
        let m = Manifest::load_or_compute(&p).unwrap();
        let side = sidecar_path(&p);
        assert!(side.ends_with(".m.gguf.manifest.json"));
        // A sidecar with a planted root is taken as long as size and mtime match...
        let mut cached: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&side).unwrap()).unwrap();
        cached["manifest"]["sha256"] = serde_json::json!("ab".repeat(32));
        std::fs::write(&side, cached.to_string()).unwrap();
        assert_eq!(
            Manifest::load_or_compute(&p).unwrap().sha256,
            Some("ab".repeat(32))
        );
        // ...and recomputed once the file changes.
        std::fs::write(&p, vec![1u8; 1001]).unwrap();
        let m2 = Manifest::load_or_compute(&p).unwrap();
        assert_eq!(m2.size, 1001);
        assert_ne!(m2.root(), m.root());
    }

    #[test]
    fn a_manifest_with_wrong_numbers_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let m = Manifest::compute(&write(dir.path(), "m.gguf", 10)).unwrap();
        let mut more = m.clone();
        more.size = CHUNK_SIZE * 3;
        assert!(more.validate().is_err());
        let mut name = m.clone();
        name.file_name = "../etc/passwd".into();
        assert!(name.validate().is_err());
        let mut zero = m;
        zero.chunk_size = 0;
        assert!(zero.validate().is_err());
        assert!(
            serde_json::from_str::<Manifest>(
                r#"{"file_name":"a","size":1,"sha256":null,"chunk_size":4,"chunks":["zz"]}"#
            )
            .is_err()
        );
    }
}
