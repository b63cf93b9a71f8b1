//! Which methods work in a given directory, found by trying each one on a
//! scratch tree there (what `zygote doctor` reports).
use std::fs::{self, File};
use std::path::Path;

use serde::Serialize;

use crate::{btrfs, fs_type_name, sys, whole};

/// Whether one method works in the probed directory, and why (not).
#[derive(Debug, Clone, Serialize)]
pub struct MethodSupport {
    pub method: &'static str,
    pub available: bool,
    pub detail: String,
}

fn support(method: &'static str, r: Result<String, String>) -> MethodSupport {
    let (available, detail) = match r {
        Ok(d) => (true, d),
        Err(d) => (false, d),
    };
    MethodSupport {
        method,
        available,
        detail,
    }
}

/// Try the subvolume, overlay and reflink methods in a scratch directory
/// under `dir` (removed afterwards). Per-file copy always works and is not
/// listed.
pub fn probe_methods(dir: &Path) -> Vec<MethodSupport> {
    let fs = fs_type_name(dir).unwrap_or_else(|e| format!("unknown ({e})"));
    let scratch = match tempfile::Builder::new()
        .prefix(".treeclone-probe-")
        .tempdir_in(dir)
    {
        Ok(t) => t,
        Err(e) => {
            let why = format!("cannot make a scratch directory in {}: {e}", dir.display());
            return ["subvolume", "overlay", "reflink"]
                .into_iter()
                .map(|m| support(m, Err(why.clone())))
                .collect();
        }
    };
    let s = scratch.path();
    vec![
        support("subvolume", probe_subvolume(s, &fs)),
        support("overlay", probe_overlay(s)),
        support("reflink", probe_reflink(s, &fs)),
    ]
}

fn probe_subvolume(s: &Path, fs: &str) -> Result<String, String> {
    if !btrfs::is_btrfs(s) {
        return Err(format!("{fs}, not btrfs"));
    }
    let (a, b) = (s.join("sub"), s.join("snap"));
    btrfs::create_subvolume(s, a.file_name().unwrap())
        .map_err(|e| format!("btrfs, but creating a subvolume failed: {e}"))?;
    let snap = btrfs::snapshot(&a, s, b.file_name().unwrap());
    let cleanup = btrfs::delete_subvolume(&b).and(btrfs::delete_subvolume(&a));
    snap.map_err(|e| format!("btrfs, but snapshotting a subvolume failed: {e}"))?;
    cleanup.map_err(|e| format!("btrfs, but deleting a subvolume failed: {e}"))?;
    Ok("btrfs: writable subvolume snapshots".into())
}

fn probe_overlay(s: &Path) -> Result<String, String> {
    whole::overlay_availability()?;
    let dirs = ["lower", "upper", "work", "merged"].map(|d| s.join(d));
    for d in &dirs {
        fs::create_dir(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
    }
    whole::mount_overlay(&dirs[0], &dirs[1], &dirs[2], &dirs[3])
        .map_err(|e| format!("mounting overlayfs with an upper layer here failed: {e}"))?;
    whole::unmount(&dirs[3]).map_err(|e| format!("unmounting the probe overlay: {e}"))?;
    Ok("overlayfs with its upper layer on this filesystem".into())
}

fn probe_reflink(s: &Path, fs: &str) -> Result<String, String> {
    let (a, b) = (s.join("a"), s.join("b"));
    fs::write(&a, [7u8; 4096]).map_err(|e| format!("writing {}: {e}", a.display()))?;
    let src = File::open(&a).map_err(|e| e.to_string())?;
    let dst = File::create(&b).map_err(|e| e.to_string())?;
    sys::ficlone(&dst, &src).map_err(|e| format!("{fs}: FICLONE failed: {e}"))?;
    Ok(format!("{fs}: FICLONE"))
}
