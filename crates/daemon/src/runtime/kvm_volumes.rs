//! Volume disks on the kvm runtime: which disks a VMM gets, and how a capture (snapshot,
//! branch) freezes them.
//!
//! The sandbox a volume was mounted into at create has the volume's image as a
//! persistent disk (`vm serve --volume ID=FILE`): the VMM `pwrite`s the guest's writes
//! into it. Every other VM sees a *view*: a frozen copy of the volume opened
//! copy-on-write (`--volume-view ID=FILE`, mapped `MAP_PRIVATE` like the root disk), so
//! its writes stay in its own memory and travel with its snapshots and forks like the
//! root disk's.
//!
//! A capture of a VM that writes a volume pauses the VM around the copy (the VMM's
//! writes are synchronous, so a paused VM has nothing in flight, and the guest's dirty
//! page cache is in the captured RAM: the copy and the RAM agree), then freezes:
//! * a snapshot: the copy goes into the snapshot's directory, and VMs started from it
//!   get a view of it (a hard link in their own directory, so that their own captures
//!   never depend on the snapshot staying);
//! * a branch: the copy goes into the first child's directory and is linked into the
//!   others'; each child's VMM is told to use its link instead of the parent's file
//!   (`disk_files` of the `branch` request: the VMM refuses a branch without them).
//!
//! A view needs no pause: its base file is never written, so a capture links it (its
//! written pages are in the VMM's state files, or inherited by the fork).
use std::path::{Path, PathBuf};

use zygote_vmm::devices::virtio::block::DiskFile;

pub(super) use super::volume_files::frozen_in;
use super::volume_files::{freeze_by, link_or_copy, sparse_copy};
use super::{BootSource, RuntimeError, StartSpec, VolumeDisk};

/// The disks a VM started from `spec` gets (linking a snapshot's frozen copies into
/// the VM's directory).
pub(super) fn disks_for_start(spec: &StartSpec) -> Result<Vec<VolumeDisk>, RuntimeError> {
    match &spec.source {
        BootSource::Image(_) => Ok(spec.volumes.clone()),
        // The sandbox's own disks, as they were when it paused.
        BootSource::Parked(data) => Ok(data.volumes.clone()),
        BootSource::Snapshot(data) => {
            freeze_by(&data.volumes, &spec.dir, |d, to| link_or_copy(&d.file, to))
        }
    }
}

/// `vm serve` arguments attaching `disks` (or, with `--restore`, naming their files).
pub(super) fn serve_args(disks: &[VolumeDisk]) -> Vec<String> {
    disks
        .iter()
        .flat_map(|d| {
            let flag = if d.writes_volume {
                "--volume"
            } else {
                "--volume-view"
            };
            [
                flag.to_string(),
                format!("{}={}", d.volume, d.file.display()),
            ]
        })
        .collect()
}

/// Whether a capture of a VM with `disks` must pause it around the copies.
pub(super) fn need_pause(disks: &[VolumeDisk]) -> bool {
    disks.iter().any(|d| d.writes_volume)
}

/// Freezes `disks` into `dir`: a volume's image is copied (the VM must be paused), a
/// view's base linked. All or none.
pub(super) fn freeze(disks: &[VolumeDisk], dir: &Path) -> Result<Vec<VolumeDisk>, RuntimeError> {
    freeze_by(disks, dir, |d, to| {
        if d.writes_volume {
            sparse_copy(&d.file, to)
        } else {
            link_or_copy(&d.file, to)
        }
    })
}

/// Each branch child's disks (one list per directory of `dirs`): frozen once into the
/// first directory and linked into the others. All or none.
pub(super) fn freeze_for_children(
    disks: &[VolumeDisk],
    dirs: &[PathBuf],
) -> Result<Vec<Vec<VolumeDisk>>, RuntimeError> {
    let Some((first_dir, others)) = dirs.split_first() else {
        return Ok(Vec::new());
    };
    let first = freeze(disks, first_dir)?;
    let mut all = vec![first.clone()];
    for dir in others {
        match freeze_by(&first, dir, |d, to| link_or_copy(&d.file, to)) {
            Ok(linked) => all.push(linked),
            Err(e) => {
                remove(all.iter().flatten());
                return Err(e);
            }
        }
    }
    Ok(all)
}

/// What the VMM is told to use for `disks` (a branch child's `disk_files`).
pub(super) fn disk_files(disks: &[VolumeDisk]) -> Vec<DiskFile> {
    disks
        .iter()
        .map(|d| DiskFile {
            id: d.volume.clone(),
            path: d.file.clone(),
            copy_on_write: !d.writes_volume,
        })
        .collect()
}

/// Where a kept branch point finds its copies: links to the first child's.
pub(super) fn link_point(
    child_disks: &[VolumeDisk],
    point_dir: &Path,
) -> Result<Vec<VolumeDisk>, RuntimeError> {
    freeze_by(child_disks, point_dir, |d, to| link_or_copy(&d.file, to))
}

/// Removes the files of frozen `disks` (a capture that failed).
pub(super) fn remove<'a>(disks: impl IntoIterator<Item = &'a VolumeDisk>) {
    for d in disks {
        let _ = std::fs::remove_file(&d.file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(dir: &Path, id: &str, writes_volume: bool) -> VolumeDisk {
        let file = dir.join(format!("{id}.img"));
        std::fs::write(&file, vec![7u8; 8192]).unwrap();
        VolumeDisk {
            volume: id.into(),
            name: format!("name-{id}"),
            path: "/data".into(),
            file,
            format: "raw".into(),
            writes_volume,
        }
    }

    #[test]
    fn a_volume_is_the_owners_and_every_other_vm_gets_a_view() {
        let dir = tempfile::tempdir().unwrap();
        let own = disk(dir.path(), "vol-a", true);
        let args = serve_args(std::slice::from_ref(&own));
        assert_eq!(args[0], "--volume");
        assert_eq!(args[1], format!("vol-a={}", own.file.display()));
        assert!(need_pause(std::slice::from_ref(&own)));

        let snap = dir.path().join("snap");
        std::fs::create_dir(&snap).unwrap();
        let frozen = freeze(std::slice::from_ref(&own), &snap).unwrap();
        assert_eq!(frozen[0].file, snap.join("vol-a.raw"));
        assert!(!frozen[0].writes_volume);
        assert_eq!(std::fs::read(&frozen[0].file).unwrap(), vec![7u8; 8192]);
        // A copy, not another name: the owner's later writes do not reach it.
        std::fs::write(&own.file, vec![9u8; 8192]).unwrap();
        assert_eq!(std::fs::read(&frozen[0].file).unwrap(), vec![7u8; 8192]);
        assert_eq!(serve_args(&frozen)[0], "--volume-view");
        assert!(!need_pause(&frozen));
        assert_eq!(disk_files(&frozen)[0].id, "vol-a");
        assert!(disk_files(&frozen)[0].copy_on_write);
        assert!(!disk_files(std::slice::from_ref(&own))[0].copy_on_write);
    }

    #[test]
    fn branch_children_share_one_copy_under_names_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let own = disk(dir.path(), "vol-b", true);
        let dirs: Vec<PathBuf> = (0..3).map(|i| dir.path().join(format!("c{i}"))).collect();
        for d in &dirs {
            std::fs::create_dir(d).unwrap();
        }
        let all = freeze_for_children(std::slice::from_ref(&own), &dirs).unwrap();
        assert_eq!(all.len(), 3);
        use std::os::unix::fs::MetadataExt;
        let inode = |p: &Path| std::fs::metadata(p).unwrap().ino();
        for (i, disks) in all.iter().enumerate() {
            assert_eq!(disks[0].file, dirs[i].join("vol-b.raw"));
            assert_eq!(inode(&disks[0].file), inode(&all[0][0].file));
        }
        assert_ne!(inode(&all[0][0].file), inode(&own.file));
        // A child dir that cannot take its link undoes the whole freeze.
        remove(all.iter().flatten());
        std::fs::remove_dir(&dirs[2]).unwrap();
        assert!(freeze_for_children(std::slice::from_ref(&own), &dirs).is_err());
        assert!(!dirs[0].join("vol-b.raw").exists());
        assert!(!dirs[1].join("vol-b.raw").exists());
    }
}
