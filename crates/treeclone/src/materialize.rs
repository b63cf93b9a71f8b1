//! The materialization pipeline: validate, scan, build in a staging
//! directory, publish with one rename.
use std::ffi::{OsStr, OsString};
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{fchown, lchown, DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::plan::{self, FileEntry, Meta, Plan};
use crate::report::{FileMethod, FileRecord, MethodCounts, Report, Strategy, Validation};
use crate::sys::{self, RangeCopy, Side};
use crate::whole;
use crate::{Method, Options};

/// Materialize the directory tree at `source` as a new tree at `destination`.
///
/// `destination` must not exist; its parent must. See the crate docs for the
/// guarantees (all-or-nothing, symlink confinement, metadata kept).
pub fn materialize(source: &Path, destination: &Path, opts: &Options) -> Result<Report> {
    let started = Instant::now();
    let target = Target::check(source, destination, opts)?;
    if let Some(report) = whole::materialize_whole(source, &target, opts, started)? {
        return Ok(report);
    }
    // Every refusal that depends on the tree's content happens in here,
    // before anything exists on the destination side.
    let plan = plan::scan(source)?;

    let mut staging = Staging::create(target.parent, target.name)?;
    let built = fill(&plan, source, &staging.path, opts)?;
    staging.publish(destination)?;
    Ok(per_file_report(
        source,
        destination,
        opts,
        &plan,
        built,
        started,
    ))
}

/// A validated destination: it does not exist, its parent does, and it is
/// not inside the source.
pub(crate) struct Target<'a> {
    pub path: &'a Path,
    pub parent: &'a Path,
    pub name: &'a OsStr,
}

impl<'a> Target<'a> {
    pub(crate) fn check(source: &Path, destination: &'a Path, opts: &Options) -> Result<Self> {
        if matches!(
            opts.method,
            Method::Hardlink | Method::Subvolume | Method::Overlay
        ) && opts.owner_writable
        {
            return Err(Error::InvalidOptions(
                "owner_writable needs a per-file method (auto, reflink or copy): hardlink would \
                 chmod the source's own inodes, subvolume and overlay clone the tree as it is",
            ));
        }
        if fs::symlink_metadata(destination).is_ok() {
            return Err(Error::DestinationExists {
                path: destination.into(),
            });
        }
        let no_parent = || Error::NoParent {
            path: destination.into(),
        };
        let name = destination.file_name().ok_or_else(no_parent)?;
        let parent = match destination.parent() {
            Some(p) if p.as_os_str().is_empty() => Path::new("."),
            Some(p) => p,
            None => return Err(no_parent()),
        };
        let src_canon =
            fs::canonicalize(source).map_err(|e| Error::io("resolve source", source, e))?;
        if !src_canon.is_dir() {
            return Err(Error::SourceNotDirectory {
                path: source.into(),
            });
        }
        let parent_canon = fs::canonicalize(parent)
            .map_err(|e| Error::io("resolve destination parent", parent, e))?;
        // Building inside the source would make the tree contain its own copy
        // (and our staging directory) the next time it is materialized.
        if parent_canon.starts_with(&src_canon) {
            return Err(Error::DestinationInsideSource {
                destination: destination.into(),
                source_root: source.into(),
            });
        }
        Ok(Target {
            path: destination,
            parent,
            name,
        })
    }
}

/// Copy the scanned tree `plan` of `source` into the existing, empty
/// directory `dst` (which takes the source root's metadata).
pub(crate) fn fill(plan: &Plan, source: &Path, dst: &Path, opts: &Options) -> Result<Built> {
    let ctx = Ctx {
        src: source,
        dst,
        opts,
        umask: if sys::has_default_acl(dst) {
            None
        } else {
            sys::current_umask()
        },
    };
    build(plan, &ctx)
}

pub(crate) fn per_file_report(
    source: &Path,
    destination: &Path,
    opts: &Options,
    plan: &Plan,
    built: Built,
    started: Instant,
) -> Report {
    let mut by_method = MethodCounts::default();
    let mut bytes = 0;
    for r in &built.records {
        by_method.add(r.method);
        bytes += r.bytes;
    }
    Report {
        source: source.into(),
        destination: destination.into(),
        requested_method: opts.method,
        strategy: Strategy::PerFile,
        validation: Validation::Scanned,
        probed_method: built.probed,
        threads: built.threads,
        files: plan.files.len() as u64,
        dirs: plan.dirs.len() as u64,
        symlinks: plan.links.len() as u64,
        bytes,
        by_method,
        elapsed_secs: started.elapsed().as_secs_f64(),
        per_file: built.records,
    }
}

/// Hidden directory beside the destination that the tree is built in. It is
/// removed on drop unless the build was published, so every early return
/// (and a panic unwinding through us) cleans up.
pub(crate) struct Staging {
    pub path: PathBuf,
    pub keep: bool,
}

impl Staging {
    /// A hidden name beside the destination, unique to this process and call.
    pub(crate) fn unique_name(parent: &Path, name: &OsStr) -> PathBuf {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        // Keep the derived name under NAME_MAX (255) whatever `name` is.
        let stem = &name.as_bytes()[..name.len().min(160)];
        let mut n = OsString::from(".");
        n.push(OsStr::from_bytes(stem));
        n.push(format!(
            ".treeclone-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        parent.join(n)
    }

    /// Claim `path` (made by the caller, e.g. a new subvolume): removed on
    /// drop unless published.
    pub(crate) fn adopt(path: PathBuf) -> Self {
        Staging { path, keep: false }
    }

    /// Rename the finished tree to `destination` (which must still not exist) and
    /// keep it from then on.
    pub(crate) fn publish(&mut self, destination: &Path) -> Result<()> {
        match sys::rename_noreplace(&self.path, destination) {
            Ok(()) => {
                self.keep = true;
                Ok(())
            }
            // Someone created it while we were building; theirs wins.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST | libc::ENOTEMPTY)) => {
                Err(Error::DestinationExists {
                    path: destination.into(),
                })
            }
            Err(e) => Err(Error::io("publish (rename) to", destination, e)),
        }
    }

    pub(crate) fn create(parent: &Path, name: &OsStr) -> Result<Self> {
        loop {
            let path = Self::unique_name(parent, name);
            // 0700 while building: nobody else sees a half-made tree, and we
            // can always write into (and remove) our own directories.
            match DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(Staging { path, keep: false }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io("create staging directory in", parent, e)),
            }
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.keep {
            if crate::btrfs::is_subvolume(&self.path) {
                let _ = crate::btrfs::delete_subvolume(&self.path);
            } else {
                remove_tree(&self.path);
            }
        }
    }
}

/// Best-effort removal of a staging tree. If final (possibly read-only)
/// directory modes were already applied, a non-root caller cannot unlink
/// inside them, so on failure grant ourselves u+rwx on every directory and
/// retry.
pub(crate) fn remove_tree(path: &Path) {
    if fs::remove_dir_all(path).is_ok() {
        return;
    }
    fn open_up(p: &Path) {
        let Ok(m) = fs::symlink_metadata(p) else {
            return;
        };
        if !m.is_dir() {
            return;
        }
        let mode = m.permissions().mode() & 0o7777;
        let _ = fs::set_permissions(p, fs::Permissions::from_mode(mode | 0o700));
        if let Ok(rd) = fs::read_dir(p) {
            for e in rd.flatten() {
                open_up(&e.path());
            }
        }
    }
    open_up(path);
    let _ = fs::remove_dir_all(path);
}

struct Ctx<'a> {
    src: &'a Path,
    dst: &'a Path,
    opts: &'a Options,
    /// Known umask of new files in the staging tree; None when unknown or
    /// overridden by a default ACL.
    umask: Option<u32>,
}

impl Ctx<'_> {
    fn final_mode(&self, meta: Meta) -> u32 {
        meta.mode | if self.opts.owner_writable { 0o200 } else { 0 }
    }

    /// Whether a file can be created with its final mode right away,
    /// saving an fchmod per file (a transaction on most filesystems; about
    /// 6% of a reflinked tree's time). Not when: xattrs must be set later
    /// (setting them needs write permission on a possibly read-only inode),
    /// chown follows (it clears setuid/setgid), the mode has special bits
    /// (creation may drop setgid), or the umask would strip bits.
    fn create_with_final_mode(&self, mode: u32) -> bool {
        !self.opts.preserve_xattrs
            && !self.opts.preserve_owner
            && mode & 0o7000 == 0
            && self.umask.is_some_and(|u| mode & u == 0)
    }
}

pub(crate) struct Built {
    records: Vec<FileRecord>,
    probed: Option<FileMethod>,
    threads: usize,
}

fn build(plan: &Plan, ctx: &Ctx) -> Result<Built> {
    for d in plan.dirs.iter().skip(1) {
        let p = ctx.dst.join(&d.rel);
        DirBuilder::new()
            .mode(0o700)
            .create(&p)
            .map_err(|e| Error::io("create directory", &p, e))?;
    }
    for l in &plan.links {
        let p = ctx.dst.join(&l.rel);
        std::os::unix::fs::symlink(&l.target, &p)
            .map_err(|e| Error::io("create symlink", &p, e))?;
        if ctx.opts.preserve_owner {
            lchown(&p, Some(l.meta.uid), Some(l.meta.gid))
                .map_err(|e| Error::io("chown", &p, e))?;
        }
        if ctx.opts.preserve_times {
            sys::set_times_nofollow(&p, l.meta.times)
                .map_err(|e| Error::io("set times on", &p, e))?;
        }
    }
    let built = copy_files(&plan.files, ctx)?;
    // Children before parents: creating entries bumps a directory's mtime,
    // and a read-only mode would stop us creating them at all.
    for d in plan.dirs.iter().rev() {
        finish_dir(ctx, &d.rel, d.meta)?;
    }
    Ok(built)
}

fn finish_dir(ctx: &Ctx, rel: &Path, meta: Meta) -> Result<()> {
    let (src, dst) = (ctx.src.join(rel), ctx.dst.join(rel));
    let d = File::open(&dst).map_err(|e| Error::io("open directory", &dst, e))?;
    if ctx.opts.preserve_xattrs {
        let s = File::open(&src).map_err(|e| Error::io("open directory", &src, e))?;
        copy_xattrs(&s, &d, &src, &dst)?;
    }
    apply_meta(&d, &dst, meta, Some(ctx.final_mode(meta)), ctx.opts)
}

/// Ownership, then mode (chown clears setuid/setgid, so it must come first),
/// then times (last, since nothing after may touch them). `mode` None: the
/// entry was created with its final mode already.
fn apply_meta(f: &File, path: &Path, meta: Meta, mode: Option<u32>, opts: &Options) -> Result<()> {
    if opts.preserve_owner {
        fchown(f, Some(meta.uid), Some(meta.gid)).map_err(|e| Error::io("chown", path, e))?;
    }
    if let Some(mode) = mode {
        sys::fchmod(f, mode).map_err(|e| Error::io("chmod", path, e))?;
    }
    if opts.preserve_times {
        sys::set_times_fd(f, meta.times).map_err(|e| Error::io("set times on", path, e))?;
    }
    Ok(())
}

fn copy_xattrs(src: &File, dst: &File, src_path: &Path, dst_path: &Path) -> Result<()> {
    let names = sys::list_user_xattrs(src).map_err(|e| Error::io("list xattrs of", src_path, e))?;
    for name in names {
        let value = match sys::get_xattr(src, &name) {
            Ok(v) => v,
            // Removed between list and get: nothing to copy.
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => continue,
            Err(e) => return Err(Error::io("read xattr of", src_path, e)),
        };
        sys::set_xattr(dst, &name, &value).map_err(|e| Error::io("set xattr on", dst_path, e))?;
    }
    Ok(())
}

/// Copy all regular files. For `Auto` the first file is the probe: it walks
/// the whole reflink -> copy_file_range -> copy ladder on this thread, and
/// whichever rung worked is where every other file starts. That avoids
/// paying a failing FICLONE per file on filesystems without reflink while
/// still letting individual files fall further down the ladder.
fn copy_files(files: &[FileEntry], ctx: &Ctx) -> Result<Built> {
    let mut slots: Vec<Option<(FileMethod, u64)>> = vec![None; files.len()];
    let (mut start, fallback) = match ctx.opts.method {
        // The whole-tree methods are handled before any per-file work; were
        // one to get here, copying like Auto is the safe reading.
        Method::Auto | Method::Subvolume | Method::Overlay => (FileMethod::Reflink, true),
        Method::Reflink => (FileMethod::Reflink, false),
        Method::Copy => (FileMethod::Copy, false),
        Method::Hardlink => (FileMethod::Hardlink, false),
    };
    let mut probed = None;
    let mut first = 0;
    if fallback && !files.is_empty() {
        let r = clone_file(ctx, &files[0], start, fallback, &mut Vec::new())?;
        start = r.0;
        probed = Some(r.0);
        slots[0] = Some(r);
        first = 1;
    }

    let remaining = files.len() - first;
    let threads = ctx.opts.effective_threads().min(remaining).max(1);
    let next = AtomicUsize::new(first);
    let failed = AtomicBool::new(false);
    let worker = || -> Result<Vec<(usize, FileMethod, u64)>> {
        let mut buf = Vec::new();
        let mut done = Vec::new();
        // Stop taking work as soon as any worker failed: the tree is doomed.
        while !failed.load(Ordering::Relaxed) {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(entry) = files.get(i) else { break };
            match clone_file(ctx, entry, start, fallback, &mut buf) {
                Ok((m, n)) => done.push((i, m, n)),
                Err(e) => {
                    failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        Ok(done)
    };
    let outcomes: Vec<Result<Vec<(usize, FileMethod, u64)>>> = if threads == 1 {
        vec![worker()]
    } else {
        thread::scope(|s| {
            let handles: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(Error::WorkerPanicked)))
                .collect()
        })
    };
    for outcome in outcomes {
        for (i, m, n) in outcome? {
            slots[i] = Some((m, n));
        }
    }
    let records = files
        .iter()
        .zip(slots)
        .map(|(f, slot)| {
            let (method, bytes) = slot.expect("every file is copied once no worker failed");
            FileRecord {
                path: f.rel.clone(),
                method,
                bytes,
            }
        })
        .collect();
    Ok(Built {
        records,
        probed,
        threads,
    })
}

fn clone_file(
    ctx: &Ctx,
    entry: &FileEntry,
    start: FileMethod,
    fallback: bool,
    buf: &mut Vec<u8>,
) -> Result<(FileMethod, u64)> {
    let src_path = ctx.src.join(&entry.rel);
    let dst_path = ctx.dst.join(&entry.rel);
    if start == FileMethod::Hardlink {
        // Same inode: mode, times, xattrs and owner are the source's by
        // construction, and must not be touched (that would change the source).
        fs::hard_link(&src_path, &dst_path).map_err(|e| Error::io("hard-link", &src_path, e))?;
        return Ok((FileMethod::Hardlink, entry.size));
    }
    let src = File::open(&src_path).map_err(|e| Error::io("open for reading", &src_path, e))?;
    // A descriptor opened by O_CREAT is writable whatever mode the new
    // inode gets, so even a 0444 file can be created with its final mode
    // and then filled. Otherwise 0600 now and the real mode at the end.
    let mode = ctx.final_mode(entry.meta);
    let direct = ctx.create_with_final_mode(mode);
    let dst = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if direct { mode } else { 0o600 })
        .open(&dst_path)
        .map_err(|e| Error::io("create", &dst_path, e))?;
    let result = write_contents(
        &src, &dst, entry, &src_path, &dst_path, start, fallback, buf,
    )?;
    if ctx.opts.preserve_xattrs {
        copy_xattrs(&src, &dst, &src_path, &dst_path)?;
    }
    apply_meta(
        &dst,
        &dst_path,
        entry.meta,
        (!direct).then_some(mode),
        ctx.opts,
    )?;
    Ok(result)
}

#[allow(clippy::too_many_arguments)] // all plain borrows; a struct would only rename them
fn write_contents(
    src: &File,
    dst: &File,
    entry: &FileEntry,
    src_path: &Path,
    dst_path: &Path,
    start: FileMethod,
    fallback: bool,
    buf: &mut Vec<u8>,
) -> Result<(FileMethod, u64)> {
    let mut method = start;
    loop {
        match method {
            FileMethod::Reflink => match sys::ficlone(dst, src) {
                // Size as scanned: sources are expected to be quiescent, and
                // an fstat per file just to report bytes costs ~3%.
                Ok(()) => return Ok((FileMethod::Reflink, entry.size)),
                Err(e) if sys::is_unsupported(&e) && fallback => method = FileMethod::CopyFileRange,
                Err(e) if sys::is_unsupported(&e) => {
                    return Err(Error::ReflinkUnsupported {
                        path: src_path.into(),
                        source: e,
                    })
                }
                Err(e) => return Err(Error::io("reflink", src_path, e)),
            },
            FileMethod::CopyFileRange => {
                match sys::copy_range(src, dst)
                    .map_err(|e| Error::io("copy_file_range from", src_path, e))?
                {
                    RangeCopy::Done(n) => return Ok((FileMethod::CopyFileRange, n)),
                    // Resume in userspace where the kernel stopped.
                    RangeCopy::Unsupported { copied } => {
                        let n = plain_copy(src, dst, src_path, dst_path, copied, buf)?;
                        return Ok((FileMethod::Copy, n));
                    }
                }
            }
            FileMethod::Copy => {
                let n = plain_copy(src, dst, src_path, dst_path, 0, buf)?;
                return Ok((FileMethod::Copy, n));
            }
            FileMethod::Hardlink => unreachable!("hardlinks are made before opening files"),
        }
    }
}

fn plain_copy(
    src: &File,
    dst: &File,
    src_path: &Path,
    dst_path: &Path,
    start: u64,
    buf: &mut Vec<u8>,
) -> Result<u64> {
    // One buffer per worker, allocated on first use: reflink-only runs
    // never pay for it.
    if buf.is_empty() {
        buf.resize(1 << 20, 0);
    }
    sys::copy_plain(src, dst, start, buf).map_err(|side| match side {
        Side::Read(e) => Error::io("read", src_path, e),
        Side::Write(e) => Error::io("write", dst_path, e),
    })
}
