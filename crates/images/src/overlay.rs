//! Staging a cached debootstrap tree for `mkfs.ext4 -d`, in constant time
//! where the host allows it.
//!
//! The cached tree is a guest root: device nodes, absolute symlinks (resolved
//! inside the guest). zygote-treeclone's checked methods refuse those, so it
//! is staged as a caller-trusted overlay (`zygote_treeclone::overlay_unchecked`):
//! as root, with overlayfs available, the cached tree is the read-only lower
//! layer under a fresh upper directory, and the mount is the staging tree.
//! What the build adds lands in the upper layer (`put_file` unlinks before
//! writing: a whiteout, then a new upper file; chmod of a directory copies it
//! up), so the cache is never modified, and `mkfs.ext4 -d` reads the merged
//! view. The tree is never followed on the host (only packed into the image).
//! Otherwise (not root, no overlayfs, a mount that fails) the tree is
//! hard-linked with `cp -al` as before.
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use zygote_treeclone::OwnedTree;

use crate::error::{IoContext, Result};
use crate::exec::{run_quiet, Progress};

/// Make `staging` (which must not exist) a writable view of the cached
/// `tree`: an overlay (the returned handle unmounts it and removes its upper
/// layer when dropped: keep it while the tree is used), else a `cp -al` copy
/// (`None`: the caller's own clean-up of `staging` removes it).
pub(crate) fn stage_cached_tree(
    tree: &Path,
    staging: &Path,
    progress: Progress,
) -> Result<Option<OwnedTree>> {
    let started = Instant::now();
    let why = match zygote_treeclone::overlay_availability() {
        Ok(()) => match zygote_treeclone::overlay_unchecked(tree, staging) {
            Ok(handle) => {
                progress(&format!(
                    "staging tree: overlay on the cached tree (mounted in {:.1} ms)",
                    started.elapsed().as_secs_f64() * 1e3
                ));
                return Ok(Some(handle));
            }
            Err(e) => format!("mounting an overlay failed ({e})"),
        },
        Err(reason) => reason,
    };
    progress(&format!(
        "staging tree: hard-linking the cached tree (cp -al), not an overlay: {why}"
    ));
    // Hard links make this fast; every file the build adds later is unlinked
    // and recreated, so the cached tree is never modified.
    run_quiet(
        Command::new("cp").arg("-al").arg(tree).arg(staging),
        "cp -al (staging tree)",
    )?;
    progress(&format!(
        "staging tree linked in {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    ));
    Ok(None)
}

/// Remove a staging directory whatever it is: an overlay left mounted by a
/// killed build (with its upper layer beside it), or a plain tree.
pub(crate) fn remove_dir_tree(path: &Path) -> Result<()> {
    zygote_treeclone::remove(path).ctx(|| format!("removing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn mounted(path: &Path) -> bool {
        let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let p = path.display().to_string();
        mounts
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(p.as_str()))
    }

    #[test]
    fn staging_overlay_or_hard_links_leave_the_tree_alone() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        fs::create_dir_all(tree.join("etc")).unwrap();
        fs::write(tree.join("etc/hostname"), b"cached\n").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", tree.join("abs")).unwrap();
        let staging = dir.path().join("x.root");
        let mut lines = Vec::new();
        let handle = stage_cached_tree(&tree, &staging, &mut |l| lines.push(l.to_owned())).unwrap();
        // As root on a filesystem that can hold an upper layer, it is an overlay.
        let fs = zygote_treeclone::fs_type_name(dir.path()).unwrap();
        if zygote_treeclone::overlay_availability().is_ok()
            && ["ext2/3/4", "xfs", "btrfs", "tmpfs"].contains(&fs.as_str())
        {
            assert!(handle.is_some(), "{lines:?}");
            assert!(mounted(&staging));
        }
        crate::pack::put_file(&staging, "/etc/hostname", b"built\n", 0o644).unwrap();
        assert_eq!(fs::read(staging.join("etc/hostname")).unwrap(), b"built\n");
        assert_eq!(
            fs::read_link(staging.join("abs")).unwrap(),
            Path::new("/etc/hostname")
        );
        assert_eq!(fs::read(tree.join("etc/hostname")).unwrap(), b"cached\n");
        drop(handle);
        assert!(!mounted(&staging), "still mounted");
        remove_dir_tree(&staging).unwrap();
        let left: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["tree"], "nothing but the cached tree is left");
        assert_eq!(fs::read(tree.join("etc/hostname")).unwrap(), b"cached\n");
    }
}
