//! Free disk space as an unprivileged writer sees it (`statvfs`'s `f_bavail`, which
//! leaves out the blocks reserved for root: a daemon running as root could use those,
//! but the rest of the system then finds its disk full). One measurement for everything
//! that checks before and while writing something large: snapshots (the daemon) and
//! image unpacking (zygote-oci).
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Free bytes for unprivileged writers on the filesystem holding `path` (a directory,
/// or a file whose parent is measured); None if it cannot be measured.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let dir = if path.is_dir() { path } else { path.parent()? };
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct we pass; c is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_directory_or_a_files_parent() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let free = free_bytes(dir.path()).expect("statvfs of a tempdir");
        assert!(free > 0);
        // The same filesystem, measured moments apart: within a few MiB.
        let again = free_bytes(&file).unwrap();
        assert!(free.abs_diff(again) < 64 << 20, "{free} vs {again}");
        assert_eq!(free_bytes(Path::new("/nonexistent/zygote/dir/f")), None);
    }
}
