//! Free disk space ([`free_bytes`], statvfs) and the check made before a download ([`ensure_space`]).

use std::path::Path;

use crate::error::{StoreError, io};

/// Bytes available to this user on the file system holding `path`.
pub fn free_bytes(path: &Path) -> Result<u64, StoreError> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| StoreError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "path holds a NUL byte"),
    })?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated string and `st` a writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(io(path)(std::io::Error::last_os_error()));
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Fails with [`StoreError::DiskSpace`] unless `dir` has room for `needed` bytes plus `keep_free`.
pub fn ensure_space(dir: &Path, needed: u64, keep_free: u64) -> Result<(), StoreError> {
    let free = free_bytes(dir)?;
    let want = needed.saturating_add(keep_free);
    if free < want {
        return Err(StoreError::DiskSpace {
            path: dir.to_path_buf(),
            needed: want,
            free,
        });
    }
    Ok(())
}
