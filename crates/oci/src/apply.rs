//! Applying image layers, bottom first, to a staging tree that is only ever packed into
//! an ext4 image (never run on the host).
//!
//! Each layer is a tar stream (gzip, zstd or plain: sniffed, whatever the media type
//! says). Its entries follow the OCI image spec's changeset rules:
//! - `dir/.wh.NAME` deletes `NAME` of the layers below; `dir/.wh..wh..opq` hides
//!   everything the layers below had in `dir`. Neither touches what the same layer
//!   adds, in whatever order the tar lists them (the spec's rule), so the applier
//!   remembers what the current layer created. `NAME` must name an entry of `dir`:
//!   `.wh.`, `.wh..` and `.wh...` (empty, `.`, `..`) are refused, since `dir/..` is
//!   the directory holding `dir`, and for the tree's root that is outside the tree.
//! - A file replaces whatever was at its path (a directory with all it held); a
//!   directory entry over a directory only changes its metadata.
//! - Hard links point at a path of this layer or one below and are made with link(2),
//!   so `mkfs.ext4 -d` keeps them as one inode.
//! - Device nodes are skipped (counted): the agent mounts devtmpfs at /dev.
//!
//! Hostile input: a path with a `..` component or one that is not UTF-8 is refused;
//! leading `/` and `.` components are dropped. Every path is resolved inside the tree
//! with symlinks followed chroot-style (an absolute link restarts at the tree's root,
//! `..` stops there), and the final component is never followed, nor ever `.` or `..`:
//! a file is written by unlinking what was there and creating it with
//! O_EXCL|O_NOFOLLOW. Nothing outside the staging tree is ever read or written. What
//! unpacking costs is bounded ([`Limits`], `budget.rs`: stream, expansion ratio,
//! apparent size, disk bytes, free space, entries), and files are written with their
//! all-zero blocks as holes (`sparse.rs`), GNU sparse entries included.
//!
//! Owners and extended attributes: as root they are set on the staged files
//! ([`Ownership::Apply`]); otherwise the staged tree is owned by the caller and what
//! each entry should have is returned as [`Fixup`]s, applied to the packed image with
//! debugfs (see `ext4.rs`), so no root-only trick is needed.
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use sha2::Digest;
use tar::EntryType;
use zygote_images::pack::{find_parent, resolve_parent};

pub use crate::budget::Limits;
use crate::budget::{limit_hit, Budget, BLOCK_BYTES};
use crate::entry_path::{entry_name, final_component, guest_path};
use crate::error::{IoContext, OciError, Result};
use crate::layer_stream::{decompress, Hashing};
use crate::sparse::copy_sparse;
use crate::staged_attrs::{cstring, id32, lsetxattr, set_mtime};

/// Who sets owners and security xattrs: the applier (as root) or debugfs afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    Apply,
    Record,
}

impl Ownership {
    /// `Apply` when this process may chown, else `Record`.
    pub fn for_this_process() -> Ownership {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            Ownership::Apply
        } else {
            Ownership::Record
        }
    }
}

/// What a path of the packed image must get that the staged file could not have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixup {
    /// Absolute path inside the image.
    pub guest: String,
    pub uid: u64,
    pub gid: u64,
    /// Permission bits including setuid/setgid/sticky; None for symlinks.
    pub mode: Option<u32>,
    pub xattrs: Vec<(String, Vec<u8>)>,
}

/// One layer applied.
#[derive(Debug, Clone)]
pub struct LayerApplied {
    /// sha256 of the uncompressed tar stream: the config's `rootfs.diff_ids` entry.
    pub diff_id: String,
    pub entries: u64,
}

/// The whole tree applied.
#[derive(Debug, Clone, Default)]
pub struct Applied {
    pub fixups: Vec<Fixup>,
    pub entries: u64,
    /// Logical sizes of the files written (holes included).
    pub file_bytes: u64,
    /// Bytes written to the staging tree (holes not).
    pub disk_bytes: u64,
    pub skipped_devices: u64,
    pub skipped_xattrs: u64,
}

/// Metadata a directory gets once everything has been written into it.
struct DirMeta {
    mode: u32,
    mtime: i64,
}

/// Applies layers in order to `root`; [`Applier::finish`] completes directories.
pub struct Applier {
    root: PathBuf,
    ownership: Ownership,
    budget: Budget,
    done: Applied,
    dirs: BTreeMap<PathBuf, DirMeta>,
    fixups: BTreeMap<String, Fixup>,
}

/// What one tar entry says about the file it describes.
struct Meta {
    mode: u32,
    uid: u64,
    gid: u64,
    mtime: i64,
    xattrs: Vec<(String, Vec<u8>)>,
}

impl Applier {
    /// An applier for the staging tree at `root`; refuses to start when its
    /// filesystem is below the reserve (see [`Limits`]).
    pub fn new(root: &Path, ownership: Ownership, limits: Limits) -> Result<Applier> {
        Ok(Applier {
            root: root.to_path_buf(),
            ownership,
            budget: Budget::new(root, limits)?,
            done: Applied::default(),
            dirs: BTreeMap::new(),
            fixups: BTreeMap::new(),
        })
    }

    /// Applies the layer at `blob` (compressed or not). `index` and `digest` name it in
    /// errors.
    pub fn apply_blob(&mut self, index: usize, digest: &str, blob: &Path) -> Result<LayerApplied> {
        let file = File::open(blob).ctx(|| format!("opening layer {}", blob.display()))?;
        let (reader, compressed) =
            decompress(file).map_err(|e| bad_layer(index, digest, e.to_string()))?;
        self.apply_stream(index, digest, reader, Some(compressed))
    }

    /// Applies one uncompressed tar stream.
    pub fn apply(&mut self, index: usize, digest: &str, tar: impl Read) -> Result<LayerApplied> {
        self.apply_stream(index, digest, tar, None)
    }

    /// Applies a layer's uncompressed stream; `compressed` counts the blob's bytes
    /// read so far, for the expansion ratio.
    fn apply_stream(
        &mut self,
        index: usize,
        digest: &str,
        tar: impl Read,
        compressed: Option<Arc<AtomicU64>>,
    ) -> Result<LayerApplied> {
        let hashing = Hashing::new(self.budget.meter(tar, compressed));
        let mut archive = tar::Archive::new(hashing);
        let mut layer = Layer {
            index,
            digest,
            created: HashSet::new(),
        };
        let mut entries = 0;
        let iter = archive
            .entries()
            .map_err(|e| bad_layer(index, digest, format!("not a tar stream: {e}")))?;
        for entry in iter {
            let mut entry = entry.map_err(|e| layer.read_error(e))?;
            if self.entry(&mut layer, &mut entry)? {
                entries += 1;
            }
        }
        // The diff id covers the whole stream, including the end-of-archive blocks.
        let mut rest = archive.into_inner();
        io::copy(&mut rest, &mut io::sink()).map_err(|e| layer.read_error(e))?;
        self.budget.stream_done(&rest.inner);
        Ok(LayerApplied {
            diff_id: format!("sha256:{}", hex::encode(rest.hasher.finalize())),
            entries,
        })
    }

    /// Sets directories' modes and times (after everything was written into them) and
    /// returns what the tree holds and the owners still to set.
    pub fn finish(mut self) -> Result<Applied> {
        for (host, meta) in self.dirs.iter().rev() {
            match std::fs::symlink_metadata(host) {
                Ok(m) if m.is_dir() => {}
                _ => continue,
            }
            let mode = match self.ownership {
                Ownership::Apply => meta.mode,
                Ownership::Record => meta.mode | 0o700,
            };
            std::fs::set_permissions(host, std::fs::Permissions::from_mode(mode))
                .ctx(|| format!("chmod {}", host.display()))?;
            set_mtime(host, meta.mtime)?;
        }
        self.done.fixups = std::mem::take(&mut self.fixups).into_values().collect();
        (self.done.disk_bytes, self.done.file_bytes) = self.budget.written();
        Ok(self.done)
    }

    /// Applies one entry; false for entries that describe no file (PAX globals).
    fn entry<R: Read>(&mut self, layer: &mut Layer, entry: &mut tar::Entry<R>) -> Result<bool> {
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() || kind.is_pax_local_extensions() {
            return Ok(false);
        }
        let raw_path = entry.path_bytes().into_owned();
        let guest = guest_path(&raw_path).map_err(|m| layer.bad(m))?;
        self.done.entries += 1;
        self.budget.entry()?;
        let Some(guest) = guest else {
            // The root directory itself: its metadata only.
            if kind.is_dir() {
                let meta = self.meta(layer, entry)?;
                let root = self.root.clone();
                self.set_owner(&root, "/", &meta, Kind::Dir)?;
                self.dirs.insert(root, DirMeta::from(&meta));
            }
            return Ok(true);
        };
        let (parent_guest, name) = guest.rsplit_once('/').expect("guest paths start with /");
        if let Some(hidden) = name.strip_prefix(".wh.") {
            if entry_name(hidden).is_err() {
                return Err(layer.bad(format!(
                    "{guest}: a whiteout must name an entry of its directory, and {hidden:?} \
                     names none"
                )));
            }
            if hidden == ".wh..opq" {
                self.opaque(layer, parent_guest)?;
            } else if !hidden.starts_with(".wh.") {
                // (`.wh..wh.*` names other than the opaque marker are aufs
                // bookkeeping: they describe nothing.)
                let target = format!("{parent_guest}/{hidden}");
                self.whiteout(layer, &target)?;
            }
            return Ok(true);
        }
        let meta = self.meta(layer, entry)?;
        match kind {
            EntryType::Directory => self.directory(layer, &guest, meta)?,
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.file(layer, &guest, meta, entry)?
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| layer.bad(format!("symlink {guest} has no target")))?
                    .into_owned();
                self.symlink(layer, &guest, meta, &target)?
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| layer.bad(format!("hard link {guest} has no target")))?
                    .into_owned();
                self.hard_link(layer, &guest, &target)?
            }
            EntryType::Fifo => self.fifo(layer, &guest, meta)?,
            EntryType::Char | EntryType::Block => self.done.skipped_devices += 1,
            other => {
                return Err(layer.bad(format!("{guest}: unsupported tar entry type {other:?}")))
            }
        }
        layer.created.insert(guest);
        Ok(true)
    }

    fn meta<R: Read>(&mut self, layer: &Layer, entry: &mut tar::Entry<R>) -> Result<Meta> {
        let h = entry.header();
        let mut meta = Meta {
            mode: h.mode().map_err(|e| layer.read_error(e))? & 0o7777,
            uid: h.uid().map_err(|e| layer.read_error(e))?,
            gid: h.gid().map_err(|e| layer.read_error(e))?,
            mtime: h.mtime().map_err(|e| layer.read_error(e))? as i64,
            xattrs: Vec::new(),
        };
        if let Some(pax) = entry.pax_extensions().map_err(|e| layer.read_error(e))? {
            for ext in pax {
                let ext = ext.map_err(|e| layer.read_error(e))?;
                let Ok(key) = ext.key() else { continue };
                let number = || std::str::from_utf8(ext.value_bytes()).ok();
                match key {
                    "uid" => meta.uid = number().and_then(|v| v.parse().ok()).unwrap_or(meta.uid),
                    "gid" => meta.gid = number().and_then(|v| v.parse().ok()).unwrap_or(meta.gid),
                    "mtime" => {
                        meta.mtime = number()
                            .and_then(|v| v.split('.').next()?.parse().ok())
                            .unwrap_or(meta.mtime)
                    }
                    _ => {
                        if let Some(name) = key.strip_prefix("SCHILY.xattr.") {
                            meta.xattrs
                                .push((name.to_string(), ext.value_bytes().to_vec()));
                        }
                    }
                }
            }
        }
        Ok(meta)
    }

    fn opaque(&mut self, layer: &Layer, dir_guest: &str) -> Result<()> {
        let dir_guest = if dir_guest.is_empty() { "/" } else { dir_guest };
        let Some(dir) = self.existing(layer, dir_guest)? else {
            return Ok(());
        };
        if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            return Ok(());
        }
        self.clear_lower(layer, &dir, dir_guest.trim_end_matches('/'))
    }

    /// Removes what `dir` holds that the current layer did not create, recursively.
    fn clear_lower(&mut self, layer: &Layer, dir: &Path, dir_guest: &str) -> Result<()> {
        let children = std::fs::read_dir(dir).ctx(|| format!("listing {}", dir.display()))?;
        for child in children {
            let child = child.ctx(|| format!("listing {}", dir.display()))?;
            let name = child.file_name();
            let name = name.to_string_lossy();
            let guest = format!("{dir_guest}/{name}");
            let host = child.path();
            if !layer.created.contains(&guest) {
                self.remove(&host, &guest)?;
            } else if child.file_type().is_ok_and(|t| t.is_dir()) {
                self.clear_lower(layer, &host, &guest)?;
            }
        }
        Ok(())
    }

    fn whiteout(&mut self, layer: &Layer, guest: &str) -> Result<()> {
        if layer.created.contains(guest) {
            return Ok(());
        }
        if let Some(host) = self.existing(layer, guest)? {
            self.remove(&host, guest)?;
        }
        Ok(())
    }

    fn directory(&mut self, layer: &Layer, guest: &str, meta: Meta) -> Result<()> {
        let host = self.place(layer, guest, true)?;
        if !host.is_dir() {
            self.budget.disk(BLOCK_BYTES)?;
            std::fs::create_dir(&host).ctx(|| format!("creating {}", host.display()))?;
        }
        self.set_owner(&host, guest, &meta, Kind::Dir)?;
        self.dirs.insert(host, DirMeta::from(&meta));
        Ok(())
    }

    fn file<R: Read>(
        &mut self,
        layer: &Layer,
        guest: &str,
        meta: Meta,
        entry: &mut tar::Entry<R>,
    ) -> Result<()> {
        // The logical size (a sparse entry's holes included) is charged before
        // anything is written.
        let size = entry.size();
        self.budget.apparent(size, guest)?;
        let host = self.place(layer, guest, false)?;
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&host)
            .ctx(|| format!("creating {}", host.display()))?;
        let written = copy_sparse(entry, &out, &host, size, &mut self.budget, &|e| {
            layer.read_error(e)
        })?;
        if written != size {
            return Err(layer.bad(format!("{guest}: {written} of {size} bytes in the stream")));
        }
        drop(out);
        self.set_owner(&host, guest, &meta, Kind::Other)?;
        set_mtime(&host, meta.mtime)
    }

    fn symlink(&mut self, layer: &Layer, guest: &str, meta: Meta, target: &[u8]) -> Result<()> {
        let host = self.place(layer, guest, false)?;
        // ext4 keeps targets under 60 bytes in the inode; longer ones take a block.
        if target.len() >= 60 {
            self.budget.disk(BLOCK_BYTES)?;
        }
        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), &host)
            .ctx(|| format!("creating symlink {}", host.display()))?;
        self.set_owner(&host, guest, &meta, Kind::Symlink)?;
        set_mtime(&host, meta.mtime)
    }

    fn hard_link(&mut self, layer: &Layer, guest: &str, target: &[u8]) -> Result<()> {
        let target_guest = guest_path(target)
            .map_err(|m| layer.bad(format!("hard link {guest}: target {m}")))?
            .ok_or_else(|| layer.bad(format!("hard link {guest} points at the root")))?;
        let source = self
            .existing(layer, &target_guest)?
            .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| !m.is_dir()))
            .ok_or_else(|| {
                layer.bad(format!(
                    "hard link {guest}: target {target_guest} is not a file of this image"
                ))
            })?;
        if target_guest == guest {
            return Ok(());
        }
        let host = self.place(layer, guest, false)?;
        if std::fs::symlink_metadata(&source).is_err() {
            return Err(layer.bad(format!(
                "hard link {guest}: target {target_guest} was inside what the link replaces"
            )));
        }
        std::fs::hard_link(&source, &host).ctx(|| format!("linking {}", host.display()))?;
        if let Some(f) = self.fixups.get(&target_guest).cloned() {
            self.fixups.insert(
                guest.to_string(),
                Fixup {
                    guest: guest.to_string(),
                    ..f
                },
            );
        }
        Ok(())
    }

    fn fifo(&mut self, layer: &Layer, guest: &str, meta: Meta) -> Result<()> {
        let host = self.place(layer, guest, false)?;
        let c = cstring(&host)?;
        // SAFETY: c is a valid NUL-terminated path.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            return Err(io::Error::last_os_error()).ctx(|| format!("mkfifo {}", host.display()));
        }
        self.set_owner(&host, guest, &meta, Kind::Other)?;
        set_mtime(&host, meta.mtime)
    }

    /// The host path for a new entry at `guest`, with what lay there removed (a
    /// directory is kept when `keep_dir`, for a directory entry over one).
    fn place(&mut self, layer: &Layer, guest: &str, keep_dir: bool) -> Result<PathBuf> {
        let name = entry_name(final_component(guest)).map_err(|m| layer.bad(m))?;
        let parent = resolve_parent(&self.root, guest).map_err(|e| layer.bad(e.to_string()))?;
        let host = parent.join(name);
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.is_dir() && keep_dir => {}
            Ok(_) => self.remove(&host, guest)?,
            Err(_) => {}
        }
        Ok(host)
    }

    /// The host path of an existing `guest` path (its final component not followed).
    fn existing(&self, layer: &Layer, guest: &str) -> Result<Option<PathBuf>> {
        if guest == "/" {
            return Ok(Some(self.root.clone()));
        }
        let name = entry_name(final_component(guest)).map_err(|m| layer.bad(m))?;
        let parent = find_parent(&self.root, guest).map_err(|e| layer.bad(e.to_string()))?;
        let Some(parent) = parent else {
            return Ok(None);
        };
        let host = parent.join(name);
        Ok(std::fs::symlink_metadata(&host).is_ok().then_some(host))
    }

    /// Removes a file or a whole tree (never following symlinks) and forgets its
    /// pending directory metadata and fixups.
    fn remove(&mut self, host: &Path, guest: &str) -> Result<()> {
        let m = std::fs::symlink_metadata(host).ctx(|| format!("stat {}", host.display()))?;
        if m.is_dir() {
            std::fs::remove_dir_all(host).ctx(|| format!("removing {}", host.display()))?;
        } else {
            std::fs::remove_file(host).ctx(|| format!("removing {}", host.display()))?;
        }
        let stale: Vec<PathBuf> = self
            .dirs
            .range(host.to_path_buf()..)
            .take_while(|(p, _)| p.starts_with(host))
            .map(|(p, _)| p.clone())
            .collect();
        for p in stale {
            self.dirs.remove(&p);
        }
        let prefix = format!("{guest}/");
        self.fixups
            .retain(|g, _| g != guest && !g.starts_with(&prefix));
        Ok(())
    }

    /// Owner, permission bits and xattrs of a new entry (a directory's mode waits for
    /// [`Applier::finish`]).
    fn set_owner(&mut self, host: &Path, guest: &str, meta: &Meta, kind: Kind) -> Result<()> {
        // Symlinks have no mode of their own; directories get theirs last.
        let chmod_now = kind == Kind::Other;
        match self.ownership {
            Ownership::Apply => {
                let c = cstring(host)?;
                let (uid, gid) = (id32(meta.uid), id32(meta.gid));
                // SAFETY: c is a valid NUL-terminated path.
                if unsafe { libc::lchown(c.as_ptr(), uid, gid) } != 0 {
                    return Err(io::Error::last_os_error())
                        .ctx(|| format!("chown {}", host.display()));
                }
                if chmod_now {
                    // After the chown, which clears setuid/setgid.
                    std::fs::set_permissions(host, std::fs::Permissions::from_mode(meta.mode))
                        .ctx(|| format!("chmod {}", host.display()))?;
                }
                for (name, value) in &meta.xattrs {
                    if lsetxattr(host, name, value).is_err() {
                        self.done.skipped_xattrs += 1;
                    }
                }
            }
            Ownership::Record => {
                if chmod_now {
                    // Readable for mkfs and writable for later layers; the real bits
                    // come with the fixup.
                    std::fs::set_permissions(
                        host,
                        std::fs::Permissions::from_mode(meta.mode | 0o600),
                    )
                    .ctx(|| format!("chmod {}", host.display()))?;
                }
                self.fixups.insert(
                    guest.to_string(),
                    Fixup {
                        guest: guest.to_string(),
                        uid: meta.uid,
                        gid: meta.gid,
                        mode: (kind != Kind::Symlink).then_some(meta.mode),
                        xattrs: meta.xattrs.clone(),
                    },
                );
            }
        }
        Ok(())
    }
}

/// What [`Applier::set_owner`] is setting: which bits apply when.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    Symlink,
    Other,
}

impl From<&Meta> for DirMeta {
    fn from(m: &Meta) -> DirMeta {
        DirMeta {
            mode: m.mode,
            mtime: m.mtime,
        }
    }
}

/// The layer being applied: for error messages, and what it created so far (which
/// its own whiteouts must not remove).
struct Layer<'a> {
    index: usize,
    digest: &'a str,
    created: HashSet<String>,
}

impl Layer<'_> {
    fn bad(&self, message: impl Into<String>) -> OciError {
        bad_layer(self.index, self.digest, message.into())
    }

    /// A read error of the layer's stream: a limit hit on the way, or a bad stream.
    fn read_error(&self, e: io::Error) -> OciError {
        let name = format!("layer {} ({})", self.index, self.digest);
        limit_hit(&e, &name).unwrap_or_else(|| self.bad(format!("reading the tar stream: {e}")))
    }
}

fn bad_layer(layer: usize, digest: &str, message: String) -> OciError {
    OciError::BadLayer {
        layer,
        digest: digest.to_string(),
        message,
    }
}

#[cfg(test)]
#[path = "apply_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "apply_limit_tests.rs"]
mod limit_tests;
