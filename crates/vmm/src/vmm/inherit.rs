//! What a fork(2) copy of the VMM takes over from its source instead of receiving it
//! as bytes: the copy-on-write root disk.
//!
//! A [`CowImage`](crate::devices::virtio::block::disk::CowImage) keeps the guest's
//! disk writes in a private file mapping of this process, so a forked process already
//! holds them, copy-on-write, like guest RAM. A branch child forked at the branch
//! instant adopts its copy as it is. A warm spawner forked earlier adopts its copy
//! once it has caught up: the source records, per disk, the pages written since the
//! spawner was forked (drained with the RAM logs, see `dirty.rs`), and at the branch
//! sends those pages' contents ([`DiskWrites`]) for the spawner to write over its old
//! copies. Either way the overlay is never serialized whole, which was the largest
//! part of a warm branch's state (and, in a fork child, a copy of every written page
//! into a freshly mapped image).
//!
//! A disk that will not be adopted (a persistent disk, or one the restorer replaces
//! with a file of its own) goes through `write_private_data` as before.
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::dirty::{self, PAGE_SIZE};
use super::{Vmm, VmmError};
use crate::devices::virtio::block::disk::Disk;
use crate::devices::virtio::block::DiskMode;
use crate::devices::virtio::persist::DeviceHostConfig;
use crate::devices::virtio::state::DeviceState;
use crate::persist::VmState;

/// Per saved virtio device, the disk this process inherited for it, if it is to be
/// adopted rather than restored from bytes.
pub type InheritedDisks = Vec<Option<Arc<Mutex<Disk>>>>;

/// Pages of one disk written since a spawner was forked, with their contents.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct DiskWrites {
    /// Index of the virtio device.
    pub device: u32,
    /// 4 KiB page numbers, ascending.
    pub pages: Vec<u64>,
    /// The pages' contents, in order.
    pub data: Vec<u8>,
}

impl Vmm {
    /// The copy-on-write disks of `state` this process can adopt: a block device that
    /// `host` does not give a file of its own, whose device object this process holds.
    pub(super) fn inherited_disks(
        &self,
        state: &VmState,
        host: &DeviceHostConfig,
    ) -> InheritedDisks {
        state
            .devices
            .virtio
            .iter()
            .enumerate()
            .map(|(i, saved)| match &saved.device {
                DeviceState::Block(b)
                    if b.config.mode == DiskMode::CopyOnWrite
                        && !host.disk_files.iter().any(|f| b.config.is_named(f)) =>
                {
                    let dev = self.devices.get(i)?.lock().unwrap();
                    dev.as_block().map(|blk| blk.disk())
                }
                _ => None,
            })
            .collect()
    }

    /// Each device's private data, but empty for the ones in `inherited` (adopted).
    pub(super) fn private_data_not_inherited(
        &self,
        inherited: &InheritedDisks,
    ) -> std::io::Result<Vec<Vec<u8>>> {
        self.devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let mut buf = Vec::new();
                if inherited.get(i).is_none_or(Option::is_none) {
                    d.lock().unwrap().write_private_data(&mut buf)?;
                }
                Ok(buf)
            })
            .collect()
    }

    /// Per device, the copy-on-write pages written since the last call (`None`: none,
    /// or not a copy-on-write disk). Called by `drain_dirty` only.
    pub(super) fn take_disk_writes(&self) -> Vec<Option<Vec<u64>>> {
        self.devices
            .iter()
            .map(|d| {
                d.lock()
                    .unwrap()
                    .as_block()
                    .and_then(|b| b.take_recent_writes())
            })
            .collect()
    }

    /// The contents of the pages in `written` (per device, a bitmap), read while paused.
    pub(super) fn read_disk_writes(
        &self,
        written: &[Vec<u64>],
    ) -> Result<Vec<DiskWrites>, VmmError> {
        let mut out = Vec::new();
        for (i, bitmap) in written.iter().enumerate() {
            if dirty::count(bitmap) == 0 {
                continue;
            }
            let dev = self.devices[i].lock().unwrap();
            let Some(block) = dev.as_block() else {
                continue;
            };
            let disk = block.disk();
            let disk = disk.lock().unwrap();
            let Disk::Cow(c) = &*disk else {
                continue;
            };
            let mut w = DiskWrites {
                device: i as u32,
                ..Default::default()
            };
            for (first, n) in dirty::runs(bitmap) {
                for p in first..first + n {
                    let page = c.page(p).ok_or_else(|| {
                        VmmError::Device(format!("disk page {p} of device {i} is outside it"))
                    })?;
                    w.pages.push(p);
                    w.data.extend_from_slice(page);
                }
            }
            debug_assert_eq!(w.data.len() as u64, w.pages.len() as u64 * PAGE_SIZE);
            out.push(w);
        }
        Ok(out)
    }

    /// In a spawner: write what its source sent over this process's old copies.
    pub(super) fn apply_disk_writes(&self, writes: &[DiskWrites]) -> Result<(), VmmError> {
        for w in writes {
            let dev = self
                .devices
                .get(w.device as usize)
                .ok_or_else(|| {
                    VmmError::Device(format!(
                        "disk writes for device {}: no such device",
                        w.device
                    ))
                })?
                .lock()
                .unwrap();
            let block = dev.as_block().ok_or_else(|| {
                VmmError::Device(format!(
                    "disk writes for device {}: not a block device",
                    w.device
                ))
            })?;
            block.apply_writes(&w.pages, &w.data).map_err(|e| {
                VmmError::Device(format!("disk writes for device {}: {e}", w.device))
            })?;
        }
        Ok(())
    }

    /// Verification: the pages of the inherited disks that differ from the source's
    /// overlays (`device_data`, the whole of each, in `write_private_data`'s format).
    pub(super) fn disk_mismatches(
        &self,
        state: &VmState,
        inherited: &InheritedDisks,
        device_data: &[Vec<u8>],
    ) -> u64 {
        let mut differ = 0;
        for (i, saved) in state.devices.virtio.iter().enumerate() {
            let (Some(Some(_)), DeviceState::Block(b)) = (inherited.get(i), &saved.device) else {
                continue;
            };
            let dev = self.devices[i].lock().unwrap();
            if let Some(block) = dev.as_block() {
                let data = device_data.get(i).map(Vec::as_slice).unwrap_or_default();
                differ += block.overlay_mismatches(b, data);
            }
        }
        differ
    }
}
