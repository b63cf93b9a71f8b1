//! Volume files both runtimes make the same way: where a capture keeps its copy of a
//! volume disk, and how that copy is made.
//!
//! A disk whose writes reach its volume (`writes_volume`) is copied while the VM is
//! stopped: a reflink where the filesystem has them, else only its data ranges, so it
//! costs what the volume holds, not its size (and needs no outside tool). A disk that is already a
//! copy-on-write view of a frozen copy (the kvm runtime's views: a base file the VMM
//! never writes) only needs another name for the same file: a hard link, or a copy
//! across filesystems.
use std::path::{Path, PathBuf};

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

/// The frozen copies a completed capture of `disks` into `dir` holds.
pub(super) fn frozen_in(disks: &[VolumeDisk], dir: &Path) -> Vec<VolumeDisk> {
    disks.iter().map(|d| frozen(d, dir)).collect()
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
    let io = |what: &str| {
        let context = format!("{what} for a volume copy");
        move |source| RuntimeError::Io { context, source }
    };
    let src = std::fs::File::open(from).map_err(io("opening the volume image"))?;
    let dst = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(to)
        .map_err(io("creating the copy"))?;
    copy_data_ranges(&src, &dst).map_err(io("copying"))?;
    dst.sync_all().map_err(io("syncing"))
}

/// Makes `dst` (empty) hold what `src` holds: a reflink where the filesystem has them,
/// else only the data ranges (`SEEK_DATA`/`SEEK_HOLE`) copied in the kernel
/// (`copy_file_range`), holes left holes. The file's length is set last.
fn copy_data_ranges(src: &std::fs::File, dst: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (s, d) = (src.as_raw_fd(), dst.as_raw_fd());
    // SAFETY: FICLONE takes the source fd as its argument; both fds are open.
    if unsafe { libc::ioctl(d, libc::FICLONE, s) } == 0 {
        return Ok(());
    }
    let len = src.metadata()?.len();
    let mut at: i64 = 0;
    while (at as u64) < len {
        // SAFETY: lseek on an open fd.
        let data = unsafe { libc::lseek(s, at, libc::SEEK_DATA) };
        if data < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole is left
            }
            return Err(e);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(s, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let (mut off_in, mut off_out) = (data, data);
        while off_in < hole {
            let want = (hole - off_in) as usize;
            // SAFETY: both offsets are ours; the kernel copies between open fds.
            let n = unsafe { libc::copy_file_range(s, &mut off_in, d, &mut off_out, want, 0) };
            match n {
                n if n > 0 => {}
                0 => {
                    return Err(std::io::Error::other(
                        "the volume image shrank while copied",
                    ))
                }
                _ => return Err(std::io::Error::last_os_error()),
            }
        }
        at = hole;
    }
    dst.set_len(len)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_sparse_copy_keeps_data_and_holes() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("vol.ext4");
        let mut f = std::fs::File::create(&from).unwrap();
        f.write_all(b"head").unwrap();
        f.seek(SeekFrom::Start(32 << 20)).unwrap();
        f.write_all(b"middle").unwrap();
        f.set_len(64 << 20).unwrap();
        drop(f);
        let to = dir.path().join("copy.raw");
        std::fs::write(&to, b"an older copy, longer than nothing").unwrap();
        sparse_copy(&from, &to).unwrap();
        let copy = std::fs::read(&to).unwrap();
        assert_eq!(copy.len(), 64 << 20);
        assert_eq!(&copy[..4], b"head");
        assert_eq!(&copy[32 << 20..(32 << 20) + 6], b"middle");
        assert!(copy[4..32 << 20].iter().all(|&b| b == 0));
        assert!(
            std::fs::metadata(&to).unwrap().blocks() * 512 < 4 << 20,
            "holes stay holes"
        );
        assert!(sparse_copy(&dir.path().join("missing"), &to).is_err());
    }
}
