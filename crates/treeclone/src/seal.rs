//! Sealed trees: the cache side of constant-time materialization.
//!
//! A constant-time clone (subvolume snapshot, overlay mount) never looks at
//! the entries of the tree, so the checks every other method makes per entry
//! (symlinks confined to the tree, only regular files, directories and
//! symlinks) have to have been made before. [`seal`] ingests a tree once:
//! it materializes it (with those checks) into a new place, then marks the
//! new tree's root with an extended attribute recording what it holds and
//! which inode it is. On btrfs the new tree is a subvolume made read-only,
//! so the filesystem itself keeps it as checked; elsewhere it is a plain
//! directory the caller promises not to change (overlayfs requires that of
//! a lower tree anyway). Sealing copies per file with the given options:
//! set `preserve_xattrs` (and, as root, `preserve_owner`) for clones of the
//! sealed tree to have them; hard links become separate files.
//!
//! The mark is `trusted.zygote.treeclone` when sealing as root (only
//! CAP_SYS_ADMIN can set `trusted.*`, so unprivileged users cannot forge
//! it) and `user.zygote.treeclone` otherwise; root trusts only the former.
//! The mark names the root's device and inode, so a copy of a sealed tree
//! (a per-file clone keeping xattrs, an overlay showing the lower root's
//! attributes) is not sealed; writable clones also have the mark removed.
use std::ffi::CStr;
use std::fs::{self, File};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::materialize::{fill, per_file_report, Staging, Target};
use crate::report::{Report, Strategy, Validation};
use crate::{btrfs, plan, sys, Method, Options};

const MARK_ROOT: &CStr = c"trusted.zygote.treeclone";
const MARK_USER: &CStr = c"user.zygote.treeclone";

/// What a sealed tree holds, recorded when it was sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealInfo {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub bytes: u64,
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn mark_name() -> &'static CStr {
    if is_root() {
        MARK_ROOT
    } else {
        MARK_USER
    }
}

fn encode(m: &fs::Metadata, btrfs: bool, info: &SealInfo) -> String {
    // A btrfs subvolume's st_dev is allocated at mount time and may change
    // across remounts; its read-only flag stands in for the device check.
    let dev = if btrfs { 0 } else { m.dev() };
    format!(
        "v1 dev={dev} ino={} files={} dirs={} symlinks={} bytes={}",
        m.ino(),
        info.files,
        info.dirs,
        info.symlinks,
        info.bytes
    )
}

fn decode(s: &str) -> Option<(u64, u64, SealInfo)> {
    let mut it = s.split(' ');
    if it.next()? != "v1" {
        return None;
    }
    let mut field = |key: &str| -> Option<u64> { it.next()?.strip_prefix(key)?.parse().ok() };
    let dev = field("dev=")?;
    let ino = field("ino=")?;
    let info = SealInfo {
        files: field("files=")?,
        dirs: field("dirs=")?,
        symlinks: field("symlinks=")?,
        bytes: field("bytes=")?,
    };
    Some((dev, ino, info))
}

/// If `path` is a sealed tree (made by [`seal`] and unchanged in identity),
/// what it holds; otherwise None.
pub fn sealed(path: &Path) -> Option<SealInfo> {
    let m = fs::symlink_metadata(path).ok()?;
    if !m.is_dir() {
        return None;
    }
    let f = File::open(path).ok()?;
    let raw = sys::get_xattr(&f, mark_name()).ok()?;
    let (dev, ino, info) = decode(std::str::from_utf8(&raw).ok()?)?;
    let on_btrfs = btrfs::is_btrfs(path);
    let identity_ok = if on_btrfs {
        // Only the read-only subvolume we sealed; a snapshot of it is writable.
        dev == 0 && btrfs::is_subvolume(path) && btrfs::is_readonly(path).unwrap_or(false)
    } else {
        dev != 0 && dev == m.dev()
    };
    (identity_ok && ino == m.ino()).then_some(info)
}

/// Whether an xattr name is the seal mark (never copied to a clone).
pub(crate) fn is_mark(name: &CStr) -> bool {
    name == MARK_ROOT || name == MARK_USER
}

/// Remove the seal mark from a writable clone's root (best effort: where it
/// cannot be removed, the identity check in [`sealed`] still refuses it).
pub(crate) fn strip_mark(path: &Path) {
    let Ok(c) = sys::cstr(path) else { return };
    for name in [MARK_ROOT, MARK_USER] {
        // SAFETY: both strings are NUL-terminated.
        unsafe { libc::lremovexattr(c.as_ptr(), name.as_ptr()) };
    }
}

/// Ingest the tree at `source` as a new sealed tree at `destination`: a
/// read-only subvolume when `destination`'s parent is on btrfs, a plain
/// directory elsewhere. Every entry is checked as [`crate::materialize`]
/// checks it (opts.method picks how contents are copied: the defaults
/// reflink where they can); on any error nothing is left behind.
///
/// Everything later cloned from it with `Method::Subvolume`,
/// `Method::Overlay` (or `Auto`) skips the per-entry checks. Do not modify a
/// sealed tree that is not a read-only subvolume: its clones trust it.
pub fn seal(source: &Path, destination: &Path, opts: &Options) -> Result<Report> {
    let started = Instant::now();
    if !matches!(opts.method, Method::Auto | Method::Reflink | Method::Copy) {
        return Err(Error::InvalidOptions(
            "seal copies the tree: use method auto, reflink or copy",
        ));
    }
    let target = Target::check(source, destination, opts)?;
    let plan = plan::scan(source)?;
    let on_btrfs = btrfs::is_btrfs(target.parent);
    let mut staging = if on_btrfs {
        let path = Staging::unique_name(target.parent, target.name);
        let name = path.file_name().expect("unique_name has a file name");
        btrfs::create_subvolume(target.parent, name)
            .map_err(|e| Error::io("create subvolume", &path, e))?;
        Staging::adopt(path)
    } else {
        Staging::create(target.parent, target.name)?
    };
    let built = fill(&plan, source, &staging.path, opts)?;
    let mut report = per_file_report(source, destination, opts, &plan, built, started);
    let info = SealInfo {
        files: report.files,
        dirs: report.dirs,
        symlinks: report.symlinks,
        bytes: report.bytes,
    };
    write_mark(&staging.path, on_btrfs, &info)?;
    if on_btrfs {
        btrfs::set_readonly(&staging.path, true)
            .map_err(|e| Error::io("make read-only", &staging.path, e))?;
    }
    staging.publish(destination)?;
    report.strategy = if on_btrfs {
        Strategy::Subvolume
    } else {
        Strategy::PerFile
    };
    report.validation = Validation::Scanned;
    report.elapsed_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

fn write_mark(root: &Path, on_btrfs: bool, info: &SealInfo) -> Result<()> {
    let m = fs::symlink_metadata(root).map_err(|e| Error::io("stat", root, e))?;
    // The inode and device are the same after the rename that publishes it.
    let value = encode(&m, on_btrfs, info);
    let f = File::open(root).map_err(|e| Error::io("open", root, e))?;
    // Setting a user.* attribute needs write permission on the directory,
    // which a sealed tree's root (say 0555) may not give its owner.
    let mode = m.permissions().mode() & 0o7777;
    let opened_up = !is_root() && mode & 0o200 == 0;
    if opened_up {
        sys::fchmod(&f, mode | 0o200).map_err(|e| Error::io("chmod", root, e))?;
    }
    let set = sys::set_xattr(&f, mark_name(), value.as_bytes());
    if opened_up {
        sys::fchmod(&f, mode).map_err(|e| Error::io("chmod", root, e))?;
    }
    set.map_err(|e| Error::io("mark as sealed (set xattr on)", root, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_round_trips_and_rejects_garbage() {
        let info = SealInfo {
            files: 3,
            dirs: 2,
            symlinks: 1,
            bytes: 99,
        };
        let s = "v1 dev=7 ino=42 files=3 dirs=2 symlinks=1 bytes=99";
        assert_eq!(decode(s), Some((7, 42, info)));
        assert_eq!(
            decode("v2 dev=7 ino=42 files=3 dirs=2 symlinks=1 bytes=99"),
            None
        );
        assert_eq!(
            decode("v1 ino=42 dev=7 files=3 dirs=2 symlinks=1 bytes=99"),
            None
        );
        assert_eq!(decode("v1 dev=7"), None);
    }

    #[test]
    fn a_plain_directory_is_not_sealed_and_a_sealed_copy_is_not_either() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        fs::create_dir(&src).unwrap();
        fs::write(src.join("a"), b"x").unwrap();
        assert_eq!(sealed(&src), None);
        let sealed_path = t.path().join("sealed");
        match seal(&src, &sealed_path, &Options::default()) {
            Ok(r) => assert_eq!(r.files, 1),
            // tmpfs without user xattrs (older kernels): nothing to check here.
            Err(Error::Io { source, .. }) if source.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                eprintln!("skipping: no xattrs on {}", t.path().display());
                return;
            }
            Err(e) => panic!("seal: {e}"),
        }
        let info = sealed(&sealed_path).expect("sealed tree is recognised");
        assert_eq!((info.files, info.dirs), (1, 1));
        // A per-file copy that keeps user.* xattrs carries the mark, but it
        // names another inode.
        let copy = t.path().join("copy");
        // A per-file method: as root, Auto would mount an overlay of the sealed tree.
        let opts = Options {
            method: crate::Method::Copy,
            preserve_xattrs: true,
            ..Options::default()
        };
        crate::materialize(&sealed_path, &copy, &opts).unwrap();
        assert_eq!(sealed(&copy), None);
    }
}
