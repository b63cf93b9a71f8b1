//! Scanning the source tree into a flat plan before anything is written.
//!
//! Scanning first means every refusal (symlink escape, FIFO, unreadable
//! directory) happens before we create a single destination entry, and the
//! copy phase can hand files to workers by index with no shared traversal.
use std::ffi::OsString;
use std::fs::{self, Metadata};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};
use crate::sys::Times;

/// Metadata we reproduce on the clone.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Meta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub times: Times,
}

impl Meta {
    fn of(m: &Metadata) -> Self {
        Meta {
            mode: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
            times: Times {
                atime: (m.atime(), m.atime_nsec()),
                mtime: (m.mtime(), m.mtime_nsec()),
            },
        }
    }
}

pub(crate) struct DirEntry {
    /// Relative to the tree root; the root itself is the empty path.
    pub rel: PathBuf,
    pub meta: Meta,
}

pub(crate) struct FileEntry {
    pub rel: PathBuf,
    pub size: u64,
    pub meta: Meta,
}

pub(crate) struct LinkEntry {
    pub rel: PathBuf,
    pub target: PathBuf,
    pub meta: Meta,
}

pub(crate) struct Plan {
    /// Parents always precede their children, so creating in order never
    /// hits a missing parent, and walking it backwards finishes every child
    /// before its parent (needed to apply final directory modes and mtimes).
    pub dirs: Vec<DirEntry>,
    pub files: Vec<FileEntry>,
    pub links: Vec<LinkEntry>,
}

pub(crate) fn scan(root: &Path) -> Result<Plan> {
    let root_meta = fs::metadata(root).map_err(|e| Error::io("stat source", root, e))?;
    if !root_meta.is_dir() {
        return Err(Error::SourceNotDirectory { path: root.into() });
    }
    let mut plan = Plan {
        dirs: vec![DirEntry {
            rel: PathBuf::new(),
            meta: Meta::of(&root_meta),
        }],
        files: Vec::new(),
        links: Vec::new(),
    };
    // Explicit stack instead of recursion: trees can be deeper than a
    // thread's stack is comfortable with.
    let mut pending = vec![PathBuf::new()];
    while let Some(dir_rel) = pending.pop() {
        let dir_abs = root.join(&dir_rel);
        let mut entries = fs::read_dir(&dir_abs)
            .map_err(|e| Error::io("read directory", &dir_abs, e))?
            .map(|r| r.map_err(|e| Error::io("read directory", &dir_abs, e)))
            .collect::<Result<Vec<_>>>()?;
        // Sorted so plans, reports and failures are reproducible.
        entries.sort_by_key(|e| e.file_name());
        let mut subdirs = Vec::new();
        for entry in entries {
            let rel = dir_rel.join(entry.file_name());
            let abs = root.join(&rel);
            // DirEntry::metadata is lstat: symlinks are seen, never followed.
            let m = entry.metadata().map_err(|e| Error::io("stat", &abs, e))?;
            let ft = m.file_type();
            let meta = Meta::of(&m);
            if ft.is_dir() {
                plan.dirs.push(DirEntry {
                    rel: rel.clone(),
                    meta,
                });
                subdirs.push(rel);
            } else if ft.is_file() {
                plan.files.push(FileEntry {
                    rel,
                    size: m.len(),
                    meta,
                });
            } else if ft.is_symlink() {
                let target = fs::read_link(&abs).map_err(|e| Error::io("read symlink", &abs, e))?;
                if let Err(reason) = check_symlink(root, &rel, &target) {
                    return Err(Error::SymlinkEscape {
                        path: abs,
                        target,
                        reason,
                    });
                }
                plan.links.push(LinkEntry { rel, target, meta });
            } else {
                let kind = if ft.is_fifo() {
                    "fifo"
                } else if ft.is_socket() {
                    "socket"
                } else if ft.is_block_device() {
                    "block device"
                } else if ft.is_char_device() {
                    "character device"
                } else {
                    "unknown"
                };
                return Err(Error::UnsupportedFileType { path: abs, kind });
            }
        }
        // Reverse so popping visits subdirectories in name order.
        pending.extend(subdirs.into_iter().rev());
    }
    Ok(plan)
}

/// Same limit as the kernel's path walk: past this many symlink hops the
/// kernel answers ELOOP, so such a link resolves to nothing at all.
const MAX_HOPS: usize = 40;

/// Decide whether `target`, stored in the symlink at `link_rel`, can resolve
/// outside the tree rooted at `root`.
///
/// Purely lexical `..` counting is not enough: `a -> sub/up/..` escapes if
/// `sub/up` is itself a symlink to `..`. So components that are symlinks in
/// the source tree are expanded (the clone has the same symlinks, so it
/// resolves the same way). Components that do not exist, or are not
/// directories, are treated as directories: the kernel would fail there today,
/// but a consumer may create them later, so we judge the path as if it could.
fn check_symlink(root: &Path, link_rel: &Path, target: &Path) -> Result<(), &'static str> {
    let mut stack: Vec<OsString> = link_rel
        .parent()
        .unwrap_or(Path::new(""))
        .components()
        .map(|c| c.as_os_str().to_owned())
        .collect();
    let mut hops = 0;
    match walk(root, &mut stack, target, &mut hops) {
        Err(Walk::Escape(reason)) => Err(reason),
        // A symlink loop resolves to nothing, so it cannot reach outside.
        Err(Walk::Loop) | Ok(()) => Ok(()),
    }
}

enum Walk {
    Escape(&'static str),
    Loop,
}

fn walk(
    root: &Path,
    stack: &mut Vec<OsString>,
    target: &Path,
    hops: &mut usize,
) -> Result<(), Walk> {
    for comp in target.components() {
        match comp {
            Component::RootDir | Component::Prefix(_) => {
                return Err(Walk::Escape("absolute target"));
            }
            Component::CurDir => {}
            Component::ParentDir => {
                if stack.pop().is_none() {
                    return Err(Walk::Escape("`..` climbs above the tree root"));
                }
            }
            Component::Normal(name) => {
                stack.push(name.to_owned());
                let here: PathBuf = std::iter::once(root.as_os_str())
                    .chain(stack.iter().map(|s| s.as_os_str()))
                    .collect();
                let is_link = fs::symlink_metadata(&here)
                    .map(|m| m.file_type().is_symlink())
                    .unwrap_or(false);
                if is_link {
                    *hops += 1;
                    if *hops > MAX_HOPS {
                        return Err(Walk::Loop);
                    }
                    let inner = fs::read_link(&here)
                        .map_err(|_| Walk::Escape("intermediate symlink is unreadable"))?;
                    // The inner target is relative to the directory holding
                    // the intermediate link.
                    stack.pop();
                    if inner.is_absolute() {
                        return Err(Walk::Escape(
                            "passes through a symlink with an absolute target",
                        ));
                    }
                    walk(root, stack, &inner, hops)?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir_all(t.path().join("a/b")).unwrap();
        fs::write(t.path().join("a/b/f"), b"x").unwrap();
        t
    }

    #[test]
    fn lexical_cases() {
        let t = tree();
        let r = t.path();
        assert!(check_symlink(r, Path::new("a/b/l"), Path::new("f")).is_ok());
        assert!(check_symlink(r, Path::new("a/b/l"), Path::new("../../a/b/f")).is_ok());
        assert!(check_symlink(r, Path::new("l"), Path::new("./a/./b/f")).is_ok());
        assert_eq!(
            check_symlink(r, Path::new("a/b/l"), Path::new("../../../etc/passwd")),
            Err("`..` climbs above the tree root")
        );
        assert_eq!(
            check_symlink(r, Path::new("l"), Path::new("/etc/passwd")),
            Err("absolute target")
        );
        // Dangling and through-a-file paths are judged lexically.
        assert!(check_symlink(r, Path::new("l"), Path::new("missing/../a")).is_ok());
        assert!(check_symlink(r, Path::new("l"), Path::new("missing/../..")).is_err());
        assert!(check_symlink(r, Path::new("a/l"), Path::new("b/f/../../..")).is_ok());
        assert!(check_symlink(r, Path::new("a/l"), Path::new("b/f/../../../..")).is_err());
    }

    #[test]
    fn escapes_through_intermediate_symlinks_are_caught() {
        let t = tree();
        let r = t.path();
        // a/up -> .. is harmless on its own (it names the root) ...
        symlink("..", r.join("a/up")).unwrap();
        assert!(check_symlink(r, Path::new("a/up"), Path::new("..")).is_ok());
        // ... but a/up/.. is the root's parent, although `a/up/..` looks
        // lexically like `a`.
        assert_eq!(
            check_symlink(r, Path::new("l"), Path::new("a/up/..")),
            Err("`..` climbs above the tree root")
        );
        // Through a link with an absolute target.
        symlink("/tmp", r.join("a/abs")).unwrap();
        assert!(check_symlink(r, Path::new("l"), Path::new("a/abs/x")).is_err());
        // Loops resolve to nothing and so cannot escape.
        symlink("loop2", r.join("loop1")).unwrap();
        symlink("loop1", r.join("loop2")).unwrap();
        assert!(check_symlink(r, Path::new("l"), Path::new("loop1")).is_ok());
    }

    #[test]
    fn scan_orders_parents_before_children() {
        let t = tree();
        fs::create_dir_all(t.path().join("a/c/d")).unwrap();
        fs::create_dir(t.path().join("z")).unwrap();
        let plan = scan(t.path()).unwrap();
        let dirs: Vec<_> = plan.dirs.iter().map(|d| d.rel.clone()).collect();
        assert_eq!(dirs.len(), 6);
        assert_eq!(dirs[0], Path::new(""));
        for (i, d) in dirs.iter().enumerate().skip(1) {
            let parent = d.parent().unwrap();
            let pos = dirs.iter().position(|x| x == parent).unwrap();
            assert!(pos < i, "{parent:?} must precede {d:?}");
        }
        assert_eq!(plan.files.len(), 1);
        assert_eq!(plan.files[0].rel, Path::new("a/b/f"));
    }
}
