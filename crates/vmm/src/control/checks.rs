//! What the control server checks before it acts for a client: a branch's children, a snapshot's destination, and whether the control socket's path may be
//! taken. Each refusal is a typed error whose text is the reply's message.
use std::collections::HashSet;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::path::{Component, Path, PathBuf};

use super::protocol::ChildSpec;
use crate::devices::virtio::vsock::conn::connect_nonblocking;

#[derive(Debug, thiserror::Error)]
pub enum BranchCheckError {
    #[error("branch needs at least one child: children is empty")]
    NoChildren,
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

/// May the VMM branch into `children`? At least one, each with a fresh socket in an
/// existing directory, and any cgroup or network namespace it names existing.
///
/// No upper count is checked here: how many children one branch makes is the daemon's
/// limit (its API's `MAX_BRANCH_COUNT`), and only the daemon reaches this socket. What a
/// request can make the VMM parse is bounded by the request line limit
/// ([`super::conn::MAX_REQUEST_LINE`]).
pub fn check_branch(children: &[ChildSpec]) -> Result<(), BranchCheckError> {
    if children.is_empty() {
        return Err(BranchCheckError::NoChildren);
    }
    for ns in children.iter().filter_map(|c| c.netns.as_ref()) {
        if !ns.is_absolute() || !ns.is_file() {
            return Err(BranchCheckError::NotANetns(ns.clone()));
        }
    }
    for cg in children.iter().filter_map(|c| c.cgroup.as_ref()) {
        if !cg.join("cgroup.procs").is_file() {
            return Err(BranchCheckError::NotACgroup(cg.clone()));
        }
    }
    let mut seen = HashSet::new();
    for s in children.iter().map(|c| &c.socket) {
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

/// Where `snapshot` may write: anywhere [`SnapshotConfinement::check`] allows, or
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

    fn children(n: usize) -> Vec<ChildSpec> {
        (0..n)
            .map(|i| ChildSpec {
                socket: PathBuf::from(format!("/x/{i}.sock")),
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn branch_children_are_checked() {
        assert!(matches!(
            check_branch(&children(0)),
            Err(BranchCheckError::NoChildren)
        ));
        // Any count is judged on its children (here: /x does not exist).
        assert!(matches!(
            check_branch(&children(1000)),
            Err(BranchCheckError::NoSocketDir(_))
        ));
        let dir = tempfile::tempdir().unwrap();
        let mut two = children(2);
        for c in &mut two {
            c.socket = dir.path().join("same.sock");
        }
        assert!(matches!(
            check_branch(&two),
            Err(BranchCheckError::DuplicateSocket(_))
        ));
        two[1].socket = dir.path().join("other.sock");
        assert!(check_branch(&two).is_ok());
        two[1].cgroup = Some(dir.path().to_path_buf());
        assert!(matches!(
            check_branch(&two),
            Err(BranchCheckError::NotACgroup(_))
        ));
        two[1].cgroup = None;
        two[0].netns = Some("relative/ns".into());
        assert!(matches!(
            check_branch(&two),
            Err(BranchCheckError::NotANetns(_))
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
