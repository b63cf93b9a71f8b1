//! What the control server checks before it acts for a client: a branch's child count
//! and paths, a snapshot's destination, and whether the control socket's path may be
//! taken. Each refusal is a typed error whose text is the reply's message.
use std::collections::HashSet;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::path::{Component, Path, PathBuf};

use crate::devices::virtio::vsock::conn::connect_nonblocking;

/// Most children one branch request may ask for. Children share guest memory
/// copy-on-write, so the host's memory is not what bounds them up front; each still
/// costs a process, a KVM VM with its kernel threads and a readiness record, and a
/// request for thousands is a bug or an attack rather than a plan (the daemon asks for
/// at most 16).
pub const MAX_BRANCH_COUNT: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum BranchCheckError {
    #[error("branch needs at least one child: child_sockets is empty")]
    NoChildren,
    #[error("branch of {0} children refused: at most {MAX_BRANCH_COUNT} per request")]
    TooManyChildren(usize),
    #[error("{field} has {len} entries: it must be empty or match child_sockets ({count})")]
    LengthMismatch {
        field: &'static str,
        len: usize,
        count: usize,
    },
    #[error("{0} is not a cgroup directory")]
    NotACgroup(PathBuf),
    #[error("{0} is not a network namespace file")]
    NotANetns(PathBuf),
    #[error("duplicate child socket {0}")]
    DuplicateSocket(PathBuf),
    #[error("child socket {0} already exists")]
    SocketExists(PathBuf),
    #[error("directory of child socket {0} does not exist")]
    NoSocketDir(PathBuf),
}

/// Per-child host paths of one branch request.
pub struct BranchPaths {
    pub sockets: Vec<PathBuf>,
    pub consoles: Vec<PathBuf>,
    pub vsock: Vec<PathBuf>,
    pub taps: Vec<String>,
    pub cgroups: Vec<Option<PathBuf>>,
    pub netns: Vec<Option<PathBuf>>,
}

pub fn check_branch(p: &BranchPaths) -> Result<(), BranchCheckError> {
    let count = p.sockets.len();
    if count == 0 {
        return Err(BranchCheckError::NoChildren);
    }
    if count > MAX_BRANCH_COUNT {
        return Err(BranchCheckError::TooManyChildren(count));
    }
    for (field, len) in [
        ("child_consoles", p.consoles.len()),
        ("child_vsock", p.vsock.len()),
        ("child_taps", p.taps.len()),
        ("child_cgroups", p.cgroups.len()),
        ("child_netns", p.netns.len()),
    ] {
        if len != 0 && len != count {
            return Err(BranchCheckError::LengthMismatch { field, len, count });
        }
    }
    for ns in p.netns.iter().flatten() {
        if !ns.is_absolute() || !ns.is_file() {
            return Err(BranchCheckError::NotANetns(ns.clone()));
        }
    }
    for cg in p.cgroups.iter().flatten() {
        if !cg.join("cgroup.procs").is_file() {
            return Err(BranchCheckError::NotACgroup(cg.clone()));
        }
    }
    let mut seen = HashSet::new();
    for s in &p.sockets {
        if !seen.insert(s) {
            return Err(BranchCheckError::DuplicateSocket(s.clone()));
        }
        if s.symlink_metadata().is_ok() {
            return Err(BranchCheckError::SocketExists(s.clone()));
        }
        match s.parent() {
            Some(dir) if dir.as_os_str().is_empty() || dir.is_dir() => {}
            _ => return Err(BranchCheckError::NoSocketDir(s.clone())),
        }
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotPathError {
    #[error("snapshot path {0} must be absolute")]
    NotAbsolute(PathBuf),
    #[error("snapshot path {0} must not contain `..`")]
    DotDot(PathBuf),
    #[error("snapshot path {0} names no directory to create")]
    NoName(PathBuf),
    #[error("snapshot path {0} already exists")]
    Exists(PathBuf),
    #[error("the directory {0} that would hold the snapshot does not exist")]
    NoParent(PathBuf),
    #[error("snapshot path {path} is outside the snapshot root {root}")]
    OutsideRoot { path: PathBuf, root: PathBuf },
    // The cause is in the message, not a `source`: replies carry only the message, and
    // a chain printer would repeat it.
    #[error("snapshot root {path} is unusable: {cause}")]
    Root { path: PathBuf, cause: io::Error },
}

/// Where `snapshot` may write: anywhere the checks of [`check_snapshot_path`] allow, or
/// only below one directory.
#[derive(Debug, Clone, Default)]
pub struct SnapshotConfinement {
    /// Canonical (symlink-free) root; None: no confinement.
    root: Option<PathBuf>,
}

impl SnapshotConfinement {
    /// Confine snapshots to the existing directory `dir`.
    pub fn under(dir: &Path) -> Result<Self, SnapshotPathError> {
        let root = dir
            .canonicalize()
            .map_err(|cause| SnapshotPathError::Root {
                path: dir.to_path_buf(),
                cause,
            })?;
        if !root.is_dir() {
            return Err(SnapshotPathError::Root {
                path: dir.to_path_buf(),
                cause: io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
            });
        }
        Ok(Self { root: Some(root) })
    }

    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// May a snapshot be written to the new directory `path`? It must be absolute,
    /// without `..`, not exist yet (not even as a dangling symlink), and its parent must
    /// exist; with a root, the parent with its symlinks resolved must lie under it (so a
    /// symlink inside the root cannot lead the write out).
    pub fn check(&self, path: &Path) -> Result<(), SnapshotPathError> {
        if !path.is_absolute() {
            return Err(SnapshotPathError::NotAbsolute(path.to_path_buf()));
        }
        if path.components().any(|c| c == Component::ParentDir) {
            return Err(SnapshotPathError::DotDot(path.to_path_buf()));
        }
        let (Some(parent), Some(_)) = (path.parent(), path.file_name()) else {
            return Err(SnapshotPathError::NoName(path.to_path_buf()));
        };
        if path.symlink_metadata().is_ok() {
            return Err(SnapshotPathError::Exists(path.to_path_buf()));
        }
        let real_parent = match parent.canonicalize() {
            Ok(p) if p.is_dir() => p,
            _ => return Err(SnapshotPathError::NoParent(parent.to_path_buf())),
        };
        if let Some(root) = &self.root {
            if !real_parent.starts_with(root) {
                return Err(SnapshotPathError::OutsideRoot {
                    path: path.to_path_buf(),
                    root: root.clone(),
                });
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("another process is serving {0}: refusing to take its control socket over")]
    InUse(PathBuf),
    #[error("{0} exists and is not a socket: refusing to replace it")]
    NotASocket(PathBuf),
    // The cause is in the message (see `SnapshotPathError::Root`).
    #[error("cannot listen on {path}: {cause}")]
    Io { path: PathBuf, cause: io::Error },
}

/// Bind a control socket at `socket`. A socket file nobody listens on (left by a VMM
/// that crashed) is replaced; a live one, or anything that is not a socket, is not.
pub fn bind(socket: &Path) -> Result<UnixListener, BindError> {
    let io_err = |cause| BindError::Io {
        path: socket.to_path_buf(),
        cause,
    };
    match UnixListener::bind(socket) {
        Ok(l) => return Ok(l),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {}
        Err(e) => return Err(io_err(e)),
    }
    let meta = socket.symlink_metadata().map_err(io_err)?;
    if !meta.file_type().is_socket() {
        return Err(BindError::NotASocket(socket.to_path_buf()));
    }
    if someone_listens(socket).map_err(io_err)? {
        return Err(BindError::InUse(socket.to_path_buf()));
    }
    std::fs::remove_file(socket).map_err(io_err)?;
    UnixListener::bind(socket).map_err(io_err)
}

/// Whether a process listens on the Unix socket `path`: a non-blocking connect succeeds
/// or finds the backlog full (EAGAIN) when one does, and is refused when the socket file
/// is stale. Non-blocking, so that a live but stuck VMM cannot hang the caller.
fn someone_listens(path: &Path) -> io::Result<bool> {
    match connect_nonblocking(path) {
        Ok(_) => Ok(true),
        Err(e) => match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINPROGRESS) => Ok(true),
            Some(libc::ECONNREFUSED) => Ok(false),
            _ => Err(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(n: usize) -> BranchPaths {
        BranchPaths {
            sockets: (0..n)
                .map(|i| PathBuf::from(format!("/x/{i}.sock")))
                .collect(),
            consoles: vec![],
            vsock: vec![],
            taps: vec![],
            cgroups: vec![],
            netns: vec![],
        }
    }

    #[test]
    fn branch_counts_outside_one_to_max_are_refused() {
        assert!(matches!(
            check_branch(&paths(0)),
            Err(BranchCheckError::NoChildren)
        ));
        let e = check_branch(&paths(MAX_BRANCH_COUNT + 1)).unwrap_err();
        assert!(matches!(e, BranchCheckError::TooManyChildren(257)), "{e}");
        assert!(e.to_string().contains("at most 256"), "{e}");
        // Within the bound the next check (here: /x does not exist) decides.
        assert!(matches!(
            check_branch(&paths(MAX_BRANCH_COUNT)),
            Err(BranchCheckError::NoSocketDir(_))
        ));
        let mut p = paths(2);
        p.taps = vec!["tap0".into()];
        assert!(matches!(
            check_branch(&p),
            Err(BranchCheckError::LengthMismatch {
                field: "child_taps",
                len: 1,
                count: 2
            })
        ));
    }

    #[test]
    fn snapshot_paths_are_checked_and_confined() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("snaps");
        let outside = dir.path().join("other");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        std::os::unix::fs::symlink("/nonexistent", root.join("dangling")).unwrap();

        let free = SnapshotConfinement::default();
        assert!(free.check(&outside.join("s")).is_ok());
        assert!(matches!(
            free.check(Path::new("snaps/s")),
            Err(SnapshotPathError::NotAbsolute(_))
        ));
        assert!(matches!(
            free.check(&root.join("../other/s")),
            Err(SnapshotPathError::DotDot(_))
        ));
        assert!(matches!(
            free.check(Path::new("/")),
            Err(SnapshotPathError::NoName(_))
        ));
        assert!(matches!(
            free.check(&outside),
            Err(SnapshotPathError::Exists(_))
        ));
        assert!(matches!(
            free.check(&root.join("dangling")),
            Err(SnapshotPathError::Exists(_))
        ));
        assert!(matches!(
            free.check(&root.join("missing/s")),
            Err(SnapshotPathError::NoParent(_))
        ));

        let confined = SnapshotConfinement::under(&root).unwrap();
        assert!(confined.check(&root.join("s")).is_ok());
        assert!(matches!(
            confined.check(&outside.join("s")),
            Err(SnapshotPathError::OutsideRoot { .. })
        ));
        // A symlink inside the root does not lead out of it.
        assert!(matches!(
            confined.check(&root.join("link/s")),
            Err(SnapshotPathError::OutsideRoot { .. })
        ));
        assert!(SnapshotConfinement::under(&dir.path().join("none")).is_err());
    }

    #[test]
    fn bind_replaces_stale_sockets_and_refuses_live_ones_and_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        // A dropped listener leaves its socket file behind: stale.
        drop(UnixListener::bind(&sock).unwrap());
        let live = bind(&sock).expect("a stale socket is replaced");
        assert!(matches!(bind(&sock), Err(BindError::InUse(_))));
        // The live listener still owns the path.
        let _c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        assert!(live.accept().is_ok());
        let file = dir.path().join("f");
        std::fs::write(&file, "keep").unwrap();
        assert!(matches!(bind(&file), Err(BindError::NotASocket(_))));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    }
}
