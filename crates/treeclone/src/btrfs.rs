//! btrfs subvolumes: the one place where a whole tree can be cloned in
//! constant time by the filesystem itself.
//!
//! A subvolume is a separately snapshottable tree inside a btrfs filesystem;
//! its root directory always has inode number 256. `BTRFS_IOC_SNAP_CREATE_V2`
//! makes a new subvolume that shares every metadata and data block with the
//! source (copy-on-write at the B-tree level), so the cost does not depend on
//! the number of files. The ioctls and structures used here are the stable
//! user API of `include/uapi/linux/btrfs.h`.
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// statfs `f_type` of btrfs (linux/magic.h).
pub(crate) const BTRFS_SUPER_MAGIC: u64 = 0x9123_683e;
/// Inode number of every subvolume's root directory (BTRFS_FIRST_FREE_OBJECTID).
const SUBVOLUME_ROOT_INO: u64 = 256;
/// Subvolume flag: read-only (BTRFS_SUBVOL_RDONLY).
const SUBVOL_RDONLY: u64 = 1 << 1;

const IOCTL_MAGIC: u64 = 0x94;
/// `_IOW`/`_IOR` of the asm-generic ioctl encoding, as the kernel headers build them.
const fn iow(nr: u64, size: u64) -> u64 {
    (1 << 30) | (size << 16) | (IOCTL_MAGIC << 8) | nr
}
const fn ior(nr: u64, size: u64) -> u64 {
    (2 << 30) | (size << 16) | (IOCTL_MAGIC << 8) | nr
}
const VOL_ARGS_SIZE: u64 = 4096;
const IOC_SUBVOL_CREATE: u64 = iow(14, VOL_ARGS_SIZE);
const IOC_SNAP_DESTROY: u64 = iow(15, VOL_ARGS_SIZE);
const IOC_SNAP_CREATE_V2: u64 = iow(23, VOL_ARGS_SIZE);
const IOC_SUBVOL_GETFLAGS: u64 = ior(25, 8);
const IOC_SUBVOL_SETFLAGS: u64 = iow(26, 8);

/// `struct btrfs_ioctl_vol_args`: an fd and a NUL-terminated name, 4096 bytes.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; 4088],
}

/// `struct btrfs_ioctl_vol_args_v2`, 4096 bytes. The qgroup-inherit union is
/// left zeroed (no quota group inheritance).
#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; 4040],
}

const _: () = assert!(std::mem::size_of::<VolArgs>() == VOL_ARGS_SIZE as usize);
const _: () = assert!(std::mem::size_of::<VolArgsV2>() == VOL_ARGS_SIZE as usize);

fn copy_name(dst: &mut [u8], name: &OsStr) -> io::Result<()> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() >= dst.len() || b.contains(&b'/') || b.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    dst[..b.len()].copy_from_slice(b);
    Ok(())
}

fn ioctl<T>(fd: &File, request: u64, arg: *mut T) -> io::Result<()> {
    // SAFETY: every caller passes the request number that matches `T`'s
    // layout (checked by the size assertions above) and a valid pointer.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether `path` is on btrfs.
pub(crate) fn is_btrfs(path: &Path) -> bool {
    crate::sys::statfs_magic(path).is_ok_and(|m| m == BTRFS_SUPER_MAGIC)
}

/// Whether `path` is the root directory of a btrfs subvolume.
pub fn is_subvolume(path: &Path) -> bool {
    is_btrfs(path)
        && std::fs::symlink_metadata(path)
            .is_ok_and(|m| m.is_dir() && m.ino() == SUBVOLUME_ROOT_INO)
}

/// Create an empty subvolume `name` in the directory `parent`.
pub(crate) fn create_subvolume(parent: &Path, name: &OsStr) -> io::Result<()> {
    let dir = File::open(parent)?;
    let mut args = VolArgs {
        fd: 0,
        name: [0; 4088],
    };
    copy_name(&mut args.name, name)?;
    ioctl(&dir, IOC_SUBVOL_CREATE, &mut args)
}

/// Snapshot the subvolume at `source` as a new writable subvolume `name` in
/// `parent` (which must be on the same btrfs filesystem).
pub(crate) fn snapshot(source: &Path, parent: &Path, name: &OsStr) -> io::Result<()> {
    let src = File::open(source)?;
    let dir = File::open(parent)?;
    let mut args = VolArgsV2 {
        fd: i64::from(src.as_raw_fd()),
        transid: 0,
        flags: 0,
        unused: [0; 4],
        name: [0; 4040],
    };
    copy_name(&mut args.name, name)?;
    ioctl(&dir, IOC_SNAP_CREATE_V2, &mut args)
}

/// Whether the subvolume at `path` is read-only.
pub(crate) fn is_readonly(path: &Path) -> io::Result<bool> {
    let f = File::open(path)?;
    let mut flags: u64 = 0;
    ioctl(&f, IOC_SUBVOL_GETFLAGS, &mut flags)?;
    Ok(flags & SUBVOL_RDONLY != 0)
}

/// Make the subvolume at `path` read-only (or writable again).
pub(crate) fn set_readonly(path: &Path, readonly: bool) -> io::Result<()> {
    let f = File::open(path)?;
    let mut flags: u64 = 0;
    ioctl(&f, IOC_SUBVOL_GETFLAGS, &mut flags)?;
    flags = if readonly {
        flags | SUBVOL_RDONLY
    } else {
        flags & !SUBVOL_RDONLY
    };
    ioctl(&f, IOC_SUBVOL_SETFLAGS, &mut flags)
}

/// Delete the subvolume at `path`.
///
/// `BTRFS_IOC_SNAP_DESTROY` needs CAP_SYS_ADMIN (or the `user_subvol_rm_allowed`
/// mount option). Without it, an owner can still empty the subvolume and
/// rmdir(2) it (Linux >= 4.18), after making it writable if it was sealed.
pub(crate) fn delete_subvolume(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    let dir = File::open(parent)?;
    let mut args = VolArgs {
        fd: 0,
        name: [0; 4088],
    };
    copy_name(&mut args.name, name)?;
    match ioctl(&dir, IOC_SNAP_DESTROY, &mut args) {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) => {
            if is_readonly(path).unwrap_or(false) {
                set_readonly(path, false)?;
            }
            crate::materialize::remove_tree(path);
            match std::fs::symlink_metadata(path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}
