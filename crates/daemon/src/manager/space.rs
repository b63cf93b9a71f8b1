//! Disk space checked before big writes (snapshot captures, pack imports): refusing up
//! front, saying how much is free and how much was needed, beats a write failing
//! half-way on a full disk (which also stops every VM whose disk layer is there).
//! Errors name the filesystem by its role, never by its host path.
use std::path::Path;

use crate::error::{Error, Result};

/// What an import leaves free on a filesystem it writes to: the VMs' disk layers and
/// the state database live there too.
pub(crate) const KEEP_FREE_BYTES: u64 = 128 << 20;

/// Free bytes for unprivileged writers on the filesystem holding `path`.
pub(crate) fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let dir = if path.is_dir() { path } else { path.parent()? };
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct we pass; c is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Refuses `needed` bytes on the filesystem holding `dir` (`what` names it) when fewer
/// are free. A filesystem that cannot be asked is not refused.
pub(crate) fn require(what: &str, dir: &Path, needed: u64) -> Result<()> {
    match free_bytes(dir) {
        Some(free) if free < needed => Err(no_space(what, free, needed)),
        _ => Ok(()),
    }
}

/// Bytes an import may still write on the filesystem holding `dir`: what is free
/// beyond [`KEEP_FREE_BYTES`] (unbounded if the filesystem cannot be asked).
pub(crate) fn spare_bytes(dir: &Path) -> u64 {
    free_bytes(dir).map_or(u64::MAX, |f| f.saturating_sub(KEEP_FREE_BYTES))
}

pub(crate) fn no_space(what: &str, free: u64, needed: u64) -> Error {
    Error::NoSpace {
        what: what.to_string(),
        free_mib: free >> 20,
        needed_mib: needed.div_ceil(1 << 20),
    }
}
