//! Whole-tree methods: clone a tree without creating an inode per entry.
//!
//! * **Subvolume** (btrfs): a writable snapshot of the source subvolume.
//!   The clone is a subvolume of its own; the filesystem shares every block
//!   copy-on-write, so writes on either side stay on that side.
//! * **Overlay** (overlayfs, root only): the sealed source is the read-only
//!   lower layer, a fresh upper and work directory beside the destination
//!   take the writes, and the destination is the mount. Writes never reach
//!   the lower layer; copy-up makes private copies of what is written.
//!
//! Both keep what the source has (owners, modes, times, xattrs; hard links
//! stay linked in a snapshot of an unsealed subvolume, while a sealed tree,
//! copied per file by [`crate::seal`], has none) and cost the same for ten
//! files or a million. A source must
//! have been checked: a sealed one ([`crate::seal`]) was checked once; an
//! unsealed subvolume is snapshotted first and the *snapshot* is scanned
//! (it cannot change under us; the source could), then deleted if it fails.
//! Overlay needs a sealed source, because overlayfs forbids changing a lower
//! tree while it is mounted.
use std::ffi::OsString;
use std::fs::{self, DirBuilder, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::materialize::{remove_tree, Staging, Target};
use crate::report::{MethodCounts, Report, Strategy, Validation};
use crate::seal::{self, SealInfo};
use crate::{btrfs, plan, sys, Method, Options};

/// statfs `f_type` of overlayfs (linux/magic.h).
const OVERLAYFS_SUPER_MAGIC: u64 = 0x794c_7630;

/// Try a whole-tree method for `opts.method`. `Ok(None)`: use the per-file
/// path (a per-file method was asked for, or `Auto` found no whole-tree
/// method that applies here).
pub(crate) fn materialize_whole(
    source: &Path,
    target: &Target,
    opts: &Options,
    started: Instant,
) -> Result<Option<Report>> {
    match opts.method {
        Method::Subvolume => subvolume(source, target, opts, started).map(Some),
        Method::Overlay => overlay(source, target, opts, started).map(Some),
        Method::Auto if !opts.owner_writable => {
            // Another btrfs than the source's makes the ioctl fail with EXDEV
            // (statfs cannot tell: btrfs mixes the subvolume into f_fsid).
            if btrfs::is_subvolume(source) && btrfs::is_btrfs(target.parent) {
                match subvolume(source, target, opts, started) {
                    Ok(r) => return Ok(Some(r)),
                    // Refusals about the content stand; anything else (a
                    // kernel or permission surprise) falls back per file.
                    Err(e @ (Error::SymlinkEscape { .. } | Error::UnsupportedFileType { .. })) => {
                        return Err(e)
                    }
                    Err(Error::DestinationExists { path }) => {
                        return Err(Error::DestinationExists { path })
                    }
                    Err(_) => {}
                }
            }
            if seal::sealed(source).is_some() && overlay_availability().is_ok() {
                match overlay(source, target, opts, started) {
                    Ok(r) => return Ok(Some(r)),
                    Err(Error::DestinationExists { path }) => {
                        return Err(Error::DestinationExists { path })
                    }
                    Err(_) => {}
                }
            }
            Ok(None)
        }
        _ => Ok(None),
    }
}

fn whole_report(
    source: &Path,
    target: &Target,
    opts: &Options,
    strategy: Strategy,
    validation: Validation,
    info: SealInfo,
    started: Instant,
) -> Report {
    Report {
        source: source.into(),
        destination: target.path.into(),
        requested_method: opts.method,
        strategy,
        validation,
        probed_method: None,
        threads: 1,
        files: info.files,
        dirs: info.dirs,
        symlinks: info.symlinks,
        bytes: info.bytes,
        by_method: MethodCounts::default(),
        elapsed_secs: started.elapsed().as_secs_f64(),
        per_file: Vec::new(),
    }
}

fn subvolume(source: &Path, target: &Target, opts: &Options, started: Instant) -> Result<Report> {
    if !btrfs::is_subvolume(source) {
        return Err(Error::NotASubvolume {
            path: source.into(),
        });
    }
    let sealed = seal::sealed(source);
    let staging = Staging::unique_name(target.parent, target.name);
    let name = staging.file_name().expect("unique_name has a file name");
    btrfs::snapshot(source, target.parent, name)
        .map_err(|e| Error::io("snapshot subvolume into", target.parent, e))?;
    let mut staging = Staging::adopt(staging);
    // The clone is writable: it must not pass for the sealed tree.
    seal::strip_mark(&staging.path);
    let (validation, info) = match sealed {
        Some(info) => (Validation::Sealed, info),
        None => {
            let plan =
                plan::scan(&staging.path).map_err(|e| in_source(e, &staging.path, source))?;
            let info = SealInfo {
                files: plan.files.len() as u64,
                dirs: plan.dirs.len() as u64,
                symlinks: plan.links.len() as u64,
                bytes: plan.files.iter().map(|f| f.size).sum(),
            };
            (Validation::Scanned, info)
        }
    };
    staging.publish(target.path)?;
    let r = whole_report(
        source,
        target,
        opts,
        Strategy::Subvolume,
        validation,
        info,
        started,
    );
    Ok(r)
}

/// Where an overlay clone at `dest` keeps its upper and work directories:
/// a hidden sibling, so [`remove`] finds it from the destination alone.
fn overlay_state_dir(dest: &Path) -> Option<PathBuf> {
    let name = dest.file_name()?;
    let mut n = OsString::from(".");
    n.push(name);
    n.push(".treeclone-overlay");
    Some(dest.with_file_name(n))
}

/// Whether this process can mount overlayfs (Ok) or why not.
pub fn overlay_availability() -> std::result::Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(
            "overlay needs root (CAP_SYS_ADMIN) to mount; an unprivileged user can \
                    mount overlayfs only inside its own user and mount namespace (Linux >= \
                    5.11), where no other process would see the tree"
                .into(),
        );
    }
    let fss = fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fss
        .lines()
        .any(|l| l.split_whitespace().last() == Some("overlay"))
    {
        return Err("the kernel has no overlay filesystem (modprobe overlay)".into());
    }
    Ok(())
}

fn overlay(source: &Path, target: &Target, opts: &Options, started: Instant) -> Result<Report> {
    let info = seal::sealed(source).ok_or_else(|| Error::NotSealed {
        path: source.into(),
    })?;
    mount_clone(source, target)?;
    Ok(whole_report(
        source,
        target,
        opts,
        Strategy::Overlay,
        Validation::Sealed,
        info,
        started,
    ))
}

/// An overlay clone of a tree the caller vouches for, with no checks of its
/// content: for trees that are interpreted elsewhere, such as a guest's root
/// filesystem (device nodes, absolute symlinks that mean paths *inside* the
/// guest) about to be packed into a disk image. Never hand such a clone to
/// code that follows its symlinks on the host. `lower` must not change while
/// the clone exists. Root only; removed when the handle drops.
pub fn overlay_unchecked(lower: &Path, destination: &Path) -> Result<OwnedTree> {
    let started = Instant::now();
    let opts = Options {
        method: Method::Overlay,
        ..Options::default()
    };
    let target = Target::check(lower, destination, &opts)?;
    mount_clone(lower, &target)?;
    let info = SealInfo {
        files: 0,
        dirs: 0,
        symlinks: 0,
        bytes: 0,
    };
    let mut report = whole_report(
        lower,
        &target,
        &opts,
        Strategy::Overlay,
        Validation::Scanned,
        info,
        started,
    );
    report.elapsed_secs = started.elapsed().as_secs_f64();
    Ok(OwnedTree {
        report,
        kept: false,
    })
}

/// Mount an overlay of `source` on the (new) destination, its upper and
/// work directories in the destination's hidden sibling.
fn mount_clone(source: &Path, target: &Target) -> Result<()> {
    overlay_availability().map_err(|reason| Error::MethodUnavailable {
        method: "overlay",
        reason,
    })?;
    let state = overlay_state_dir(target.path).ok_or_else(|| Error::NoParent {
        path: target.path.into(),
    })?;
    // Claim the destination first: mkdir is the atomic "does not exist yet".
    // Until the mount lands it is an empty 0700 directory.
    match DirBuilder::new().mode(0o700).create(target.path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            return Err(Error::DestinationExists {
                path: target.path.into(),
            })
        }
        Err(e) => return Err(Error::io("create mount point", target.path, e)),
    }
    let mut claimed = Claimed {
        dest: target.path,
        state: &state,
        mounted: false,
        keep: false,
    };
    // We own the destination name, so a state directory here is a leftover
    // of a clone of the same name that died before cleaning up.
    if fs::symlink_metadata(&state).is_ok() {
        remove_tree(&state);
    }
    let (upper, work) = (state.join("upper"), state.join("work"));
    for d in [&state, &upper, &work] {
        DirBuilder::new()
            .mode(0o700)
            .create(d)
            .map_err(|e| Error::io("create overlay directory", d, e))?;
    }
    // overlayfs shows the upper directory as the root of the mount, so it
    // must look like the source's root (made private to us above).
    copy_root_attributes(source, &upper)?;
    mount_overlay(source, &upper, &work, target.path)
        .map_err(|e| Error::io("mount overlay on", target.path, e))?;
    claimed.mounted = true;
    claimed.keep = true;
    Ok(())
}

/// Give `dst` (an empty directory) the owner, mode, `user.*` xattrs and times
/// of the directory `src`, the seal mark excepted.
fn copy_root_attributes(src: &Path, dst: &Path) -> Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let m = fs::metadata(src).map_err(|e| Error::io("stat", src, e))?;
    let (s, d) = (
        File::open(src).map_err(|e| Error::io("open", src, e))?,
        File::open(dst).map_err(|e| Error::io("open", dst, e))?,
    );
    let names = sys::list_user_xattrs(&s).map_err(|e| Error::io("list xattrs of", src, e))?;
    for name in names.iter().filter(|n| !seal::is_mark(n)) {
        let value = sys::get_xattr(&s, name).map_err(|e| Error::io("read xattr of", src, e))?;
        sys::set_xattr(&d, name, &value).map_err(|e| Error::io("set xattr on", dst, e))?;
    }
    std::os::unix::fs::fchown(&d, Some(m.uid()), Some(m.gid()))
        .map_err(|e| Error::io("chown", dst, e))?;
    // After chown, which clears setuid/setgid.
    fs::set_permissions(dst, fs::Permissions::from_mode(m.mode() & 0o7777))
        .map_err(|e| Error::io("chmod", dst, e))?;
    let times = sys::Times {
        atime: (m.atime(), m.atime_nsec()),
        mtime: (m.mtime(), m.mtime_nsec()),
    };
    sys::set_times_nofollow(dst, times).map_err(|e| Error::io("set times on", dst, e))
}

/// A refusal found while scanning the snapshot at `staging` names the entry
/// by its place in `source`: the snapshot is gone when the caller reads it.
fn in_source(e: Error, staging: &Path, source: &Path) -> Error {
    let rebase = |p: PathBuf| match p.strip_prefix(staging) {
        Ok(rel) => source.join(rel),
        Err(_) => p,
    };
    match e {
        Error::SymlinkEscape {
            path,
            target,
            reason,
        } => Error::SymlinkEscape {
            path: rebase(path),
            target,
            reason,
        },
        Error::UnsupportedFileType { path, kind } => Error::UnsupportedFileType {
            path: rebase(path),
            kind,
        },
        Error::Io { op, path, source } => Error::Io {
            op,
            path: rebase(path),
            source,
        },
        other => other,
    }
}

/// Undoes a half-made overlay clone on every early return.
struct Claimed<'a> {
    dest: &'a Path,
    state: &'a Path,
    mounted: bool,
    keep: bool,
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if self.mounted {
            let _ = unmount(self.dest);
        }
        remove_tree(self.state);
        let _ = fs::remove_dir(self.dest);
    }
}

pub(crate) fn mount_overlay(
    lower: &Path,
    upper: &Path,
    work: &Path,
    dest: &Path,
) -> io::Result<()> {
    // Name the layers by /proc/self/fd/N: option strings split on ',' and
    // ':' and any path could contain them.
    let open = |p: &Path| {
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_PATH)
            .open(p)
    };
    use std::os::unix::fs::OpenOptionsExt;
    let (l, u, w): (File, File, File) = (open(lower)?, open(upper)?, open(work)?);
    let data = format!(
        "lowerdir=/proc/self/fd/{},upperdir=/proc/self/fd/{},workdir=/proc/self/fd/{}",
        l.as_raw_fd(),
        u.as_raw_fd(),
        w.as_raw_fd()
    );
    let data = std::ffi::CString::new(data).expect("no NUL in a formatted string");
    let target = sys::cstr(dest)?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            c"overlay".as_ptr(),
            target.as_ptr(),
            c"overlay".as_ptr(),
            0,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn unmount(dest: &Path) -> io::Result<()> {
    let c = sys::cstr(dest)?;
    // SAFETY: c is NUL-terminated.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EBUSY) {
        // Something still has a file open in it: detach now, the kernel
        // finishes when the last user goes away.
        // SAFETY: as above.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            return Ok(());
        }
        return Err(io::Error::last_os_error());
    }
    Err(err)
}

fn is_treeclone_overlay(path: &Path) -> bool {
    sys::statfs_magic(path).is_ok_and(|m| m == OVERLAYFS_SUPER_MAGIC)
        && overlay_state_dir(path).is_some_and(|s| s.join("upper").is_dir())
}

/// Remove a tree made by [`crate::materialize`] or [`crate::seal`], whatever
/// the method: unmount an overlay clone and delete its upper layer, delete a
/// subvolume, or remove a plain tree (even one with read-only directories).
pub fn remove(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(m) if !m.is_dir() => return fs::remove_file(path),
        Ok(_) => {}
    }
    if is_treeclone_overlay(path) {
        unmount(path)?;
        if let Some(state) = overlay_state_dir(path) {
            remove_tree(&state);
        }
        return fs::remove_dir(path);
    }
    if btrfs::is_subvolume(path) {
        return btrfs::delete_subvolume(path);
    }
    // An overlay clone that is no longer mounted (say, after a reboot) is a
    // plain directory now, but its upper layer is still beside it.
    if let Some(state) = overlay_state_dir(path).filter(|s| s.join("upper").is_dir()) {
        remove_tree(&state);
    }
    remove_tree(path);
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Ok(_) => Err(io::Error::other(format!(
            "{} could not be removed completely",
            path.display()
        ))),
        Err(e) => Err(e),
    }
}

/// A materialized tree that is removed when dropped, unless [`OwnedTree::keep`]
/// is called: the handle form of [`crate::materialize`], for callers that
/// need a scratch clone (an overlay clone, in particular, must be unmounted).
pub struct OwnedTree {
    report: Report,
    kept: bool,
}

impl OwnedTree {
    pub fn path(&self) -> &Path {
        &self.report.destination
    }

    pub fn report(&self) -> &Report {
        &self.report
    }

    /// Keep the tree; it outlives the handle (remove it with [`remove`]).
    pub fn keep(mut self) -> Report {
        self.kept = true;
        std::mem::replace(&mut self.report, empty_report())
    }

    /// Remove the tree now, reporting failure (drop does it silently).
    pub fn remove(mut self) -> io::Result<()> {
        self.kept = true;
        remove(&self.report.destination)
    }
}

fn empty_report() -> Report {
    Report {
        source: PathBuf::new(),
        destination: PathBuf::new(),
        requested_method: Method::Auto,
        strategy: Strategy::PerFile,
        validation: Validation::Scanned,
        probed_method: None,
        threads: 0,
        files: 0,
        dirs: 0,
        symlinks: 0,
        bytes: 0,
        by_method: MethodCounts::default(),
        elapsed_secs: 0.0,
        per_file: Vec::new(),
    }
}

impl Drop for OwnedTree {
    fn drop(&mut self) {
        if !self.kept {
            let _ = remove(&self.report.destination);
        }
    }
}

/// [`crate::materialize`], returning a handle that removes the tree on drop.
pub fn materialize_owned(source: &Path, destination: &Path, opts: &Options) -> Result<OwnedTree> {
    let report = crate::materialize(source, destination, opts)?;
    Ok(OwnedTree {
        report,
        kept: false,
    })
}
