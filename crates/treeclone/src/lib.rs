//! Copy-on-write materialization of file trees.
//!
//! Agents hand sandboxes whole trees (a repository, an input set, a rootfs
//! layer) and branch them many times, so materializing a tree has to cost
//! O(metadata), not O(bytes). [`materialize`] clones a source directory to a
//! new destination with the cheapest safe method the filesystem offers:
//!
//! * **reflink** (`FICLONE`) on XFS (`reflink=1`) and btrfs: the clone shares
//!   every extent with the source; the first write to either side allocates
//!   new blocks for just the written range.
//! * **copy_file_range**: shares extents where the filesystem implements it
//!   as a remap, otherwise an in-kernel copy (no userspace buffer).
//! * **copy**: userspace read/write, the universal fallback.
//! * **hardlink** (explicit only): see the warning on [`Method::Hardlink`].
//!
//! Those are per-file methods: one new inode per entry, so O(N) however
//! cheap each is. Two whole-tree methods cost the same for any N:
//!
//! * **subvolume** (btrfs): a writable snapshot of a source subvolume.
//! * **overlay** (overlayfs, root): the source as a read-only lower layer
//!   under a private upper directory; the destination is the mount.
//!
//! They need a source prepared once by [`seal`] (a checked, read-only copy:
//! a subvolume on btrfs). `Method::Auto` picks subvolume, then overlay, then
//! the per-file methods; [`Report::strategy`] says which ran and [`remove`]
//! removes a tree whichever it was. See the `whole` module docs.
//!
//! # Guarantees
//!
//! * The destination must not exist. The tree is built in a hidden staging
//!   directory beside it (same filesystem, so reflinks and the final rename
//!   work) and published with one `renameat2(RENAME_NOREPLACE)`. On any error
//!   the staging directory is removed: callers see a complete tree or none.
//! * Symlinks are copied as symlinks and never followed. A symlink whose
//!   target is absolute, or whose `..` components climb out of the source
//!   tree (also via other symlinks inside it), is refused before anything is
//!   written: a sandbox must not be handed a path into the host.
//! * Permission bits (including setuid/setgid/sticky), atime/mtime, empty
//!   directories and, optionally, `user.*` xattrs and ownership are kept.
//!   FIFOs, sockets and device nodes are refused. Hardlinks *within* the
//!   source become independent files in the clone. Sparse files copied by
//!   the userspace fallback become dense (reflinks keep holes).
//! * Nothing is fsynced. The clone is as durable as any freshly written
//!   file; a caller that must survive a crash should `syncfs` afterwards.
//!
//! # Writing into a clone
//!
//! A reflinked or copied file is a new inode owned by the calling user, with
//! the source's permission bits. If the source was read-only (say `0444`),
//! so is the clone; because the caller owns it, it can always
//! `chmod u+w` and then write (or set [`Options::owner_writable`] to get
//! `u+w` on every file and directory up front). Such writes go to the clone's
//! own blocks (copy-on-write for reflinks) and never change the source.
//!
//! In [`Method::Hardlink`] mode none of this holds: the "clone" *is* the
//! source inode, so any write or chmod through it changes the source.
use std::num::NonZeroUsize;

use serde::{Deserialize, Serialize};

pub mod bench;
pub mod btrfs;
mod error;
pub mod fiemap;
pub mod loopfs;
mod materialize;
mod plan;
mod probe;
mod report;
mod seal;
mod sys;
mod whole;

pub use error::{Error, Result};
pub use materialize::materialize;
pub use probe::{probe_methods, MethodSupport};
pub use report::{FileMethod, FileRecord, MethodCounts, Report, Strategy, Validation};
pub use seal::{seal, sealed, SealInfo};
pub use sys::{fs_type_name, syncfs};
pub use whole::{materialize_owned, overlay_availability, overlay_unchecked, remove, OwnedTree};

/// How file contents reach the destination.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// The fastest method that applies: a subvolume snapshot when the
    /// source is a btrfs subvolume on the destination's filesystem, an
    /// overlay when the source is sealed and we may mount, else per file:
    /// reflink, else copy_file_range, else copy. The first file of the tree
    /// probes which one works; the rest start there and fall back per file
    /// when the kernel says the faster method is unavailable for that file
    /// (EXDEV, EOPNOTSUPP, EINVAL). With `owner_writable`, per file only.
    #[default]
    Auto,
    /// Writable btrfs snapshot of the source subvolume (constant time);
    /// fails if the source is not a subvolume on the destination's btrfs.
    Subvolume,
    /// overlayfs mount of the sealed source under a private upper directory
    /// (constant time, root only); remove it with [`remove`].
    Overlay,
    /// Reflink every file; fail (leaving nothing behind) if any cannot be.
    Reflink,
    /// Hardlink every file to its source inode. Fastest, but **only for
    /// read-only consumers**: a write or chmod through the destination
    /// mutates the source, because it is the same inode. Requires source and
    /// destination on one filesystem. Directories and symlinks are still new.
    Hardlink,
    /// Userspace read/write for every file (the portable baseline).
    Copy,
}

impl std::str::FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Method::Auto),
            "reflink" => Ok(Method::Reflink),
            "hardlink" => Ok(Method::Hardlink),
            "copy" => Ok(Method::Copy),
            "subvolume" => Ok(Method::Subvolume),
            "overlay" => Ok(Method::Overlay),
            other => Err(format!(
                "unknown method {other:?} (expected auto, subvolume, overlay, reflink, hardlink or copy)"
            )),
        }
    }
}

/// Knobs for [`materialize`]. `Options::default()` is `Auto`, one thread per
/// available core, mtimes kept, xattrs and ownership not.
#[derive(Debug, Clone)]
pub struct Options {
    pub method: Method,
    /// Worker threads for file contents; 0 means one per available core.
    pub threads: usize,
    /// Copy `user.*` extended attributes of files and directories.
    pub preserve_xattrs: bool,
    /// Copy atime and mtime (nanosecond precision).
    pub preserve_times: bool,
    /// chown entries to the source's uid/gid (normally needs root).
    pub preserve_owner: bool,
    /// Add `u+w` to every file and directory of the clone, so a consumer can
    /// write without a chmod pass. Refused with `Method::Hardlink`, where it
    /// would chmod the source's inodes.
    pub owner_writable: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            method: Method::Auto,
            threads: 0,
            preserve_xattrs: false,
            preserve_times: true,
            preserve_owner: false,
            owner_writable: false,
        }
    }
}

impl Options {
    pub(crate) fn effective_threads(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
        }
    }
}
