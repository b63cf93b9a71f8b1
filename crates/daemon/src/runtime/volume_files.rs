//! Volume files both runtimes make the same way: where a capture keeps its copy of a
//! volume disk, and how that copy is made.
//!
//! A disk whose writes reach its volume (`writes_volume`) is copied while the VM is
//! stopped: a sparse copy (`cp --sparse=always`, a reflink where the filesystem has
//! them), so it costs what the volume holds, not its size. A disk that is already a
//! copy-on-write view of a frozen copy (the kvm runtime's views: a base file the VMM
//! never writes) only needs another name for the same file: a hard link, or a copy
//! across filesystems.
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{RuntimeError, VolumeDisk};

/// Where a capture into `snap_dir` keeps its copy of `disk`.
pub(super) fn frozen(disk: &VolumeDisk, snap_dir: &Path) -> VolumeDisk {
    let ext = if disk.format == "qcow2" {
        "qcow2"
    } else {
        "raw"
    };
    VolumeDisk {
        file: snap_dir.join(format!("{}.{ext}", disk.volume)),
        writes_volume: false,
        ..disk.clone()
    }
}

/// Copies each of `disks` into `snap_dir` (the VM must be stopped), synced.
pub(super) fn freeze(
    disks: &[VolumeDisk],
    snap_dir: &Path,
) -> Result<Vec<VolumeDisk>, RuntimeError> {
    freeze_by(disks, snap_dir, |d, to| sparse_copy(&d.file, to))
}

/// Freezes `disks` into `snap_dir` with `make` (which makes its copy at the path it is
/// given); all or none.
pub(super) fn freeze_by(
    disks: &[VolumeDisk],
    snap_dir: &Path,
    make: impl Fn(&VolumeDisk, &PathBuf) -> Result<(), RuntimeError>,
) -> Result<Vec<VolumeDisk>, RuntimeError> {
    let mut out = Vec::new();
    for disk in disks {
        let copy = frozen(disk, snap_dir);
        if let Err(e) = make(disk, &copy.file) {
            for done in out.iter().chain([&copy]) {
                let _ = std::fs::remove_file(&done.file);
            }
            return Err(e);
        }
        out.push(copy);
    }
    Ok(out)
}

pub(super) fn sparse_copy(from: &Path, to: &PathBuf) -> Result<(), RuntimeError> {
    let out = Command::new("cp")
        .args(["--sparse=always", "--reflink=auto", "--"])
        .arg(from)
        .arg(to)
        .output()
        .map_err(RuntimeError::io("running cp for a volume copy"))?;
    if !out.status.success() {
        return Err(RuntimeError::Io {
            context: "copying a volume disk".into(),
            source: std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        });
    }
    std::fs::File::open(to)
        .and_then(|f| f.sync_all())
        .map_err(RuntimeError::io("syncing a volume copy"))
}

/// `to` names the same file as `from` (a hard link), or, across filesystems, a sparse
/// copy of it. For files nobody writes any more (frozen copies).
pub(super) fn link_or_copy(from: &Path, to: &PathBuf) -> Result<(), RuntimeError> {
    let _ = std::fs::remove_file(to);
    match std::fs::hard_link(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => sparse_copy(from, to),
        Err(e) => Err(RuntimeError::Io {
            context: "linking a frozen volume copy".into(),
            source: e,
        }),
    }
}
