//! Thin wrappers over the Linux calls std does not expose (FICLONE,
//! copy_file_range with explicit offsets, user xattrs, nanosecond timestamps
//! without following symlinks, renameat2). Kept in one place so the unsafe
//! surface is small and every call checks its return value the same way.
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;

fn cvt(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub(crate) fn cstr(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// errno values that mean "this acceleration is not available for this pair of
/// files" (different filesystems, filesystem without the feature, unaligned or
/// otherwise unclonable file) as opposed to "the file itself is broken". Only
/// these trigger a per-file fallback to the next slower method; anything else
/// is a real error and aborts the tree.
pub(crate) fn is_unsupported(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EXDEV | libc::EOPNOTSUPP | libc::EINVAL | libc::ENOTTY | libc::ENOSYS)
    )
}

/// Whole-file reflink: `dst` ends up sharing all of `src`'s extents.
pub(crate) fn ficlone(dst: &File, src: &File) -> io::Result<()> {
    // SAFETY: FICLONE takes the source descriptor as its integer argument; both
    // descriptors stay open for the duration of the call.
    cvt(unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) })
}

/// Result of [`copy_range`]: either the whole file went through
/// copy_file_range, or the kernel refused part-way and the caller should copy
/// the rest in userspace starting at `copied`.
pub(crate) enum RangeCopy {
    Done(u64),
    Unsupported { copied: u64 },
}

/// copy_file_range until EOF. Copying to EOF (rather than to the size seen at
/// scan time) keeps us correct if a file was appended to in between; sources
/// are expected to be quiescent anyway.
pub(crate) fn copy_range(src: &File, dst: &File) -> io::Result<RangeCopy> {
    // Large chunks: on filesystems that share extents one call per file is
    // the goal; on others the kernel loops internally anyway.
    const CHUNK: usize = 1 << 30;
    let mut off_in: libc::loff_t = 0;
    let mut off_out: libc::loff_t = 0;
    loop {
        // SAFETY: valid descriptors and pointers to live offsets; flags must be 0.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                dst.as_raw_fd(),
                &mut off_out,
                CHUNK,
                0,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if is_unsupported(&err) {
                return Ok(RangeCopy::Unsupported {
                    copied: off_in as u64,
                });
            }
            return Err(err);
        }
        if n == 0 {
            return Ok(RangeCopy::Done(off_in as u64));
        }
    }
}

/// Which side of a userspace copy failed, so the error names the right path.
pub(crate) enum Side {
    Read(io::Error),
    Write(io::Error),
}

/// Plain read/write copy from byte `start` to EOF. Positional I/O so a
/// partially completed copy_file_range can be resumed without seeking.
pub(crate) fn copy_plain(src: &File, dst: &File, start: u64, buf: &mut [u8]) -> Result<u64, Side> {
    let mut off = start;
    loop {
        let n = match src.read_at(buf, off) {
            Ok(0) => return Ok(off),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Side::Read(e)),
        };
        dst.write_all_at(&buf[..n], off).map_err(Side::Write)?;
        off += n as u64;
    }
}

pub(crate) fn fchmod(f: &File, mode: u32) -> io::Result<()> {
    // SAFETY: plain syscall on an open descriptor.
    cvt(unsafe { libc::fchmod(f.as_raw_fd(), mode as libc::mode_t) })
}

/// Access and modification time with nanoseconds, as stat reports them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Times {
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
}

impl Times {
    fn to_timespecs(self) -> [libc::timespec; 2] {
        let ts = |(s, ns): (i64, i64)| libc::timespec {
            tv_sec: s as libc::time_t,
            tv_nsec: ns as _,
        };
        [ts(self.atime), ts(self.mtime)]
    }
}

pub(crate) fn set_times_fd(f: &File, times: Times) -> io::Result<()> {
    let ts = times.to_timespecs();
    // SAFETY: ts is a live two-element array as futimens requires.
    cvt(unsafe { libc::futimens(f.as_raw_fd(), ts.as_ptr()) })
}

/// utimensat without following a final symlink: symlinks get their own
/// timestamps rather than stamping whatever they point at.
pub(crate) fn set_times_nofollow(path: &Path, times: Times) -> io::Result<()> {
    let c = cstr(path)?;
    let ts = times.to_timespecs();
    // SAFETY: NUL-terminated path and a live two-element timespec array.
    cvt(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// Names of the `user.*` extended attributes of an open file or directory.
/// Other namespaces (security.*, trusted.*, system.*) are deliberately left
/// alone: they carry policy (SELinux labels, ACLs, capabilities) that should
/// not silently travel into a sandbox.
pub(crate) fn list_user_xattrs(f: &File) -> io::Result<Vec<CString>> {
    let fd = f.as_raw_fd();
    loop {
        // SAFETY: a null buffer with size 0 asks only for the needed length.
        let need = unsafe { libc::flistxattr(fd, std::ptr::null_mut(), 0) };
        if need < 0 {
            return Err(io::Error::last_os_error());
        }
        if need == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; need as usize];
        // SAFETY: buf is writable for buf.len() bytes.
        let got = unsafe { libc::flistxattr(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if got < 0 {
            let err = io::Error::last_os_error();
            // The list grew between the two calls: ask again.
            if err.raw_os_error() == Some(libc::ERANGE) {
                continue;
            }
            return Err(err);
        }
        buf.truncate(got as usize);
        return Ok(buf
            .split(|&b| b == 0)
            .filter(|name| name.starts_with(b"user."))
            .map(|name| CString::new(name).expect("split on NUL leaves no NUL"))
            .collect());
    }
}

pub(crate) fn get_xattr(f: &File, name: &CStr) -> io::Result<Vec<u8>> {
    let fd = f.as_raw_fd();
    loop {
        // SAFETY: size query with a null buffer.
        let need = unsafe { libc::fgetxattr(fd, name.as_ptr(), std::ptr::null_mut(), 0) };
        if need < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; need as usize];
        // SAFETY: buf is writable for buf.len() bytes.
        let got = unsafe { libc::fgetxattr(fd, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if got < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ERANGE) {
                continue;
            }
            return Err(err);
        }
        buf.truncate(got as usize);
        return Ok(buf);
    }
}

pub(crate) fn set_xattr(f: &File, name: &CStr, value: &[u8]) -> io::Result<()> {
    // SAFETY: name is NUL-terminated, value is readable for its length.
    cvt(unsafe {
        libc::fsetxattr(
            f.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
}

/// rename(2) that fails with EEXIST instead of replacing an existing (empty)
/// directory, which plain rename would happily do. This closes the race
/// between our "destination must not exist" check and the final publish.
pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: both paths are NUL-terminated.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    // Filesystems without RENAME_NOREPLACE support: best effort check-then-rename.
    if matches!(err.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) {
        if std::fs::symlink_metadata(to).is_ok() {
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        return std::fs::rename(from, to);
    }
    Err(err)
}

/// The process umask, read without the racy set-and-restore dance of
/// umask(2) (which would briefly change it for every other thread).
pub(crate) fn current_umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(line.trim(), 8).ok()
}

/// Whether new entries in `dir` get their mode from a default POSIX ACL
/// (in which case the umask does not apply and the mode asked for at
/// creation is not the mode we get). Errors other than "no such attribute"
/// or "no xattr support" count as yes: the answer only enables a shortcut.
pub(crate) fn has_default_acl(dir: &Path) -> bool {
    let Ok(c) = cstr(dir) else { return true };
    let name = c"system.posix_acl_default";
    // SAFETY: size query with a null buffer.
    let rc = unsafe { libc::lgetxattr(c.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    if rc >= 0 {
        return true;
    }
    !matches!(
        io::Error::last_os_error().raw_os_error(),
        Some(libc::ENODATA | libc::EOPNOTSUPP)
    )
}

/// Flush every dirty page and metadata of the filesystem holding `path`.
pub fn syncfs(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    // SAFETY: plain syscall on an open descriptor.
    cvt(unsafe { libc::syncfs(f.as_raw_fd()) })
}

/// statfs `f_type` (the filesystem's magic number) of `path`.
pub(crate) fn statfs_magic(path: &Path) -> io::Result<u64> {
    let c = cstr(path)?;
    // SAFETY: statfs fills the zeroed struct we pass.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::statfs(c.as_ptr(), &mut st) })?;
    Ok(st.f_type as u64)
}

/// Filesystem type name of `path` (e.g. "xfs", "ext4"), from statfs magic.
pub fn fs_type_name(path: &Path) -> io::Result<String> {
    // Magic numbers from linux/magic.h for the filesystems we care about.
    let name = match statfs_magic(path)? {
        0x5846_5342 => "xfs",
        0x9123_683e => "btrfs",
        0xef53 => "ext2/3/4",
        0x0102_1994 => "tmpfs",
        0x794c_7630 => "overlayfs",
        0x2fc1_2fc1 => "zfs",
        0x6969 => "nfs",
        other => return Ok(format!("unknown(0x{other:x})")),
    };
    Ok(name.to_string())
}
