//! Volume disks on the qemu runtime: which disks a starting VM gets, and how a capture
//! (branch point, snapshot) freezes them.
//!
//! A sandbox a volume was mounted into at create has the volume's raw image as a disk
//! (`cache=writeback`: its writes reach the image, and survive the QEMU process). A
//! capture copies that image into the snapshot's directory while the VM is stopped
//! (QEMU drained and flushed its I/O on `stop`; the guest's dirty page cache is in the
//! saved RAM, so the copy and the RAM agree), then the VM goes on writing the volume.
//! VMs started from the capture read the copy through a qcow2 layer of their own, in
//! their VM directory: a copy-on-write view that goes with them, never the volume. A
//! VM that is itself such a view has its layer copied the same way (a qcow2 whose
//! backing file, an earlier capture's copy, its snapshot lineage keeps).
//!
//! The copy is sparse (`cp --sparse=always`, a reflink where the filesystem has them):
//! it costs what the volume holds, not its size.

use zygote_qemu::migrate::create_overlay_on;
use zygote_qemu::ExtraDisk;

use super::{BootSource, RuntimeError, StartSpec, VolumeDisk};

pub(super) use super::volume_files::{freeze, frozen_in};

/// The disks a VM started from `spec` gets, making the copy-on-write layers of a VM
/// started from a capture (in its directory, removed with it).
pub(super) fn disks_for_start(spec: &StartSpec) -> Result<Vec<VolumeDisk>, RuntimeError> {
    match &spec.source {
        BootSource::Image(_) => Ok(spec.volumes.clone()),
        // The sandbox's own disks, as they were when it paused.
        BootSource::Parked(data) => Ok(data.volumes.clone()),
        BootSource::Snapshot(data) => data
            .volumes
            .iter()
            .map(|frozen| {
                let layer = spec.dir.join(format!("{}.qcow2", frozen.volume));
                let _ = std::fs::remove_file(&layer);
                create_overlay_on(&frozen.file, &frozen.format, &layer)?;
                Ok(VolumeDisk {
                    file: layer,
                    format: "qcow2".into(),
                    writes_volume: false,
                    ..frozen.clone()
                })
            })
            .collect(),
    }
}

/// QEMU's view of `disks`.
pub(super) fn extra_disks(disks: &[VolumeDisk]) -> Vec<ExtraDisk> {
    disks
        .iter()
        .map(|d| ExtraDisk {
            file: d.file.clone(),
            format: d.format.clone(),
            serial: d.volume.clone(),
            cache: if d.writes_volume {
                "writeback"
            } else {
                "unsafe"
            },
        })
        .collect()
}
