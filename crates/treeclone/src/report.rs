//! What a materialization did, for logs, benches and callers that need to
//! know whether they actually got copy-on-write.
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::Method;

/// How one regular file reached the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileMethod {
    /// FICLONE: the clone shares every extent with the source (O(metadata)).
    Reflink,
    /// copy_file_range: the kernel copies, or shares extents where the
    /// filesystem can (XFS/btrfs remap, NFS server-side copy). On ext4/tmpfs
    /// it is an in-kernel byte copy: no userspace buffer, but O(bytes).
    CopyFileRange,
    /// Userspace read + write.
    Copy,
    /// A new name for the source inode (hardlink mode only).
    Hardlink,
}

impl FileMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            FileMethod::Reflink => "reflink",
            FileMethod::CopyFileRange => "copy_file_range",
            FileMethod::Copy => "copy",
            FileMethod::Hardlink => "hardlink",
        }
    }
}

impl fmt::Display for FileMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Number of files materialized by each method.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MethodCounts {
    pub reflink: u64,
    pub copy_file_range: u64,
    pub copy: u64,
    pub hardlink: u64,
}

impl MethodCounts {
    pub(crate) fn add(&mut self, m: FileMethod) {
        match m {
            FileMethod::Reflink => self.reflink += 1,
            FileMethod::CopyFileRange => self.copy_file_range += 1,
            FileMethod::Copy => self.copy += 1,
            FileMethod::Hardlink => self.hardlink += 1,
        }
    }

    /// The method used for the most files (ties go to the faster method).
    pub fn dominant(&self) -> Option<FileMethod> {
        [
            (FileMethod::Reflink, self.reflink),
            (FileMethod::Hardlink, self.hardlink),
            (FileMethod::CopyFileRange, self.copy_file_range),
            (FileMethod::Copy, self.copy),
        ]
        .into_iter()
        .filter(|&(_, n)| n > 0)
        .fold(None, |best: Option<(FileMethod, u64)>, cur| match best {
            Some(b) if b.1 >= cur.1 => Some(b),
            _ => Some(cur),
        })
        .map(|(m, _)| m)
    }
}

impl fmt::Display for MethodCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = [
            ("reflink", self.reflink),
            ("copy_file_range", self.copy_file_range),
            ("copy", self.copy),
            ("hardlink", self.hardlink),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| format!("{name}:{n}"))
        .collect();
        if parts.is_empty() {
            f.write_str("-")
        } else {
            f.write_str(&parts.join(","))
        }
    }
}

/// How the tree as a whole was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// One new inode per entry; `by_method` says how each file's contents came.
    #[default]
    PerFile,
    /// A writable btrfs snapshot of the source subvolume: constant time.
    Subvolume,
    /// An overlayfs mount over the (sealed) source with a private upper
    /// directory: constant time; remove it with [`crate::remove`].
    Overlay,
}

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::PerFile => "per_file",
            Strategy::Subvolume => "subvolume",
            Strategy::Overlay => "overlay",
        }
    }
}

/// How the source's content (symlink confinement, file types) was checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Validation {
    /// Every entry was looked at during this call.
    #[default]
    Scanned,
    /// The source is a sealed tree made by [`crate::seal`], checked when it
    /// was sealed and unchangeable since (or promised so, see `seal`).
    Sealed,
}

/// One regular file of the tree.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileRecord {
    /// Relative to the tree root.
    pub path: PathBuf,
    pub method: FileMethod,
    pub bytes: u64,
}

/// Summary of one [`crate::materialize`] call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub source: PathBuf,
    pub destination: PathBuf,
    pub requested_method: Method,
    /// Per-file, or one of the constant-time whole-tree methods.
    #[serde(default)]
    pub strategy: Strategy,
    #[serde(default)]
    pub validation: Validation,
    /// For `Method::Auto`: the method the one-per-tree probe settled on,
    /// which every other file starts from.
    pub probed_method: Option<FileMethod>,
    pub threads: usize,
    pub files: u64,
    /// Directories created, the tree root included.
    pub dirs: u64,
    pub symlinks: u64,
    /// Bytes of regular-file content materialized (shared or copied).
    pub bytes: u64,
    pub by_method: MethodCounts,
    pub elapsed_secs: f64,
    pub per_file: Vec<FileRecord>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -> {}: {} files, {} dirs, {} symlinks, {} bytes in {:.3}s (",
            self.source.display(),
            self.destination.display(),
            self.files,
            self.dirs,
            self.symlinks,
            self.bytes,
            self.elapsed_secs,
        )?;
        match self.strategy {
            Strategy::PerFile => write!(f, "{}; {} threads)", self.by_method, self.threads),
            s => write!(f, "{}, source {:?})", s.as_str(), self.validation),
        }
    }
}
