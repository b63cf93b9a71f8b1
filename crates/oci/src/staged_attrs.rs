//! Times and extended attributes of staged files, set by path without following a
//! final symlink (the staged tree holds the image's own links, which point anywhere).
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::error::{IoContext, OciError, Result};

pub(crate) fn cstring(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| OciError::Io {
        context: format!("{}", path.display()),
        source: io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"),
    })
}

/// Owner ids beyond 32 bits cannot exist on Linux: such an entry gets nobody.
pub(crate) fn id32(id: u64) -> u32 {
    u32::try_from(id).unwrap_or(65534)
}

pub(crate) fn set_mtime(path: &Path, mtime: i64) -> Result<()> {
    let c = cstring(path)?;
    let t = libc::timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: c is a valid path; times points at two timespecs.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error())
            .ctx(|| format!("setting times of {}", path.display()));
    }
    Ok(())
}

pub(crate) fn lsetxattr(path: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let p = CString::new(path.as_os_str().as_bytes())?;
    let n = CString::new(name)?;
    // SAFETY: p and n are valid C strings; value is a valid buffer of its length.
    let rc = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
