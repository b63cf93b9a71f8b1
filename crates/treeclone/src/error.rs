//! The error type of tree materialization.
//!
//! Every variant that concerns a file names it: an agent handing us a tree
//! needs to know *which* entry broke, not just that `open` failed somewhere.
use std::io;
use std::path::PathBuf;

/// Why a tree could not be materialized. When any of these is returned the
/// destination does not exist and the temporary build directory is gone.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("source {path} is not a directory")]
    SourceNotDirectory { path: PathBuf },

    #[error("destination {path} already exists; refusing to overwrite it")]
    DestinationExists { path: PathBuf },

    #[error("destination {destination} lies inside the source tree {source_root}")]
    DestinationInsideSource {
        destination: PathBuf,
        source_root: PathBuf,
    },

    #[error("destination {path} has no parent directory to build in")]
    NoParent { path: PathBuf },

    #[error(
        "symlink {path} -> {target} resolves outside the source tree ({reason}); refusing to copy it"
    )]
    SymlinkEscape {
        path: PathBuf,
        target: PathBuf,
        reason: &'static str,
    },

    #[error("{path}: unsupported file type ({kind}); only regular files, directories and symlinks can be materialized")]
    UnsupportedFileType { path: PathBuf, kind: &'static str },

    #[error("reflink of {path} is impossible here (Method::Reflink was required): {source}")]
    ReflinkUnsupported { path: PathBuf, source: io::Error },

    #[error("{path} is not a btrfs subvolume (Method::Subvolume snapshots subvolumes; seal the tree into one on btrfs first)")]
    NotASubvolume { path: PathBuf },

    #[error("{path} is not a sealed tree (Method::Overlay mounts only trees made by treeclone::seal, which were checked once and do not change)")]
    NotSealed { path: PathBuf },

    #[error("method {method} is not available here: {reason}")]
    MethodUnavailable {
        method: &'static str,
        reason: String,
    },

    #[error("invalid options: {0}")]
    InvalidOptions(&'static str),

    #[error("cannot {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },

    #[error("a copy worker thread panicked")]
    WorkerPanicked,
}

impl Error {
    /// Shorthand used everywhere an OS call fails on a known path.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
