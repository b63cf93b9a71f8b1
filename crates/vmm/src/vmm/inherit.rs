//! What a fork(2) copy of the VMM takes over from its source instead of receiving it
//! as bytes: the copy-on-write root disk.
//!
//! A [`CowImage`](crate::devices::virtio::block::disk::CowImage) keeps the guest's
//! disk writes in a private file mapping of this process, so a forked process already
//! holds them, copy-on-write, like guest RAM. A branch child forked at the branch
//! instant adopts its copy as it is. A warm spawner forked earlier adopts its copy
//! once it has caught up, as with guest RAM: the source records, per disk, the pages
//! written since the spawner was forked (drained with the RAM logs, see `dirty.rs`),
//! writes their contents into the spawner's mapping at the same addresses (while the
//! guest runs, and the rest in the branch's pause), and at the branch tells it which
//! pages were written ([`DiskPages`]) so that its copy's overlay is the parent's.
//! Either way the overlay is never serialized whole, which was the largest part of a
//! warm branch's state (and, in a fork child, a copy of every written page into a
//! freshly mapped image).
//!
//! A disk that will not be adopted (a persistent disk, or one the restorer replaces
//! with a file of its own) goes through `write_private_data` as before.
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::dirty;
use super::warm::wire;
use super::{Vmm, VmmError};
use crate::devices::virtio::block::disk::Disk;
use crate::devices::virtio::block::DiskMode;
use crate::devices::virtio::persist::DeviceHostConfig;
use crate::devices::virtio::state::DeviceState;
use crate::persist::VmState;

/// Per saved virtio device, the disk this process inherited for it, if it is to be
/// adopted rather than restored from bytes.
pub type InheritedDisks = Vec<Option<Arc<Mutex<Disk>>>>;

/// Pages of one disk written since a spawner was forked (4 KiB page numbers,
/// ascending): the spawner records them as written in its copy of the disk.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct DiskPages {
    /// Index of the virtio device.
    pub device: u32,
    pub pages: Vec<u64>,
}

/// How far a spawner's copy of one disk is behind: per page, one bit.
#[derive(Debug, Default, Clone)]
pub struct DiskLag {
    /// Pages whose contents it lacks: written into it by the next catch-up or branch.
    pub unsent: Vec<u64>,
    /// Every page written since its fork: told at the branch, so that its copy's
    /// record of written pages is the parent's.
    pub written: Vec<u64>,
}

impl DiskLag {
    pub fn note(&mut self, bitmap: &[u64]) {
        dirty::or_into(&mut self.unsent, bitmap);
        dirty::or_into(&mut self.written, bitmap);
    }
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

    /// Write the contents a spawner's disks lack (`lag[i].unsent`) from this process's
    /// copy-on-write mappings into the same addresses of process `pid`, clearing them.
    /// Each disk is locked meanwhile, so the block device's writes wait instead of
    /// tearing a page mid-copy. Returns the pages written.
    pub(super) fn copy_disk_pages(
        &self,
        pid: libc::pid_t,
        lag: &mut [DiskLag],
    ) -> std::io::Result<u64> {
        let mut total = 0;
        for (i, l) in lag.iter_mut().enumerate() {
            if dirty::count(&l.unsent) == 0 {
                continue;
            }
            let Some(disk) = self.devices[i].lock().unwrap().as_block().map(|b| b.disk()) else {
                continue;
            };
            let guard = disk.lock().unwrap();
            let Disk::Cow(c) = &*guard else {
                continue;
            };
            // The bitmap is the disk's own record, so this is a bug check: a page past
            // the mapping must never become an address in the spawner.
            if dirty::runs(&l.unsent)
                .last()
                .is_some_and(|(f, n)| f + n > c.page_count())
            {
                return Err(std::io::Error::other(format!(
                    "disk pages of device {i} past its end"
                )));
            }
            total += wire::copy_mapped_pages(pid, c.host_addr(), &l.unsent)?;
            l.unsent.clear();
        }
        Ok(total)
    }

    /// In a spawner: record the pages its source wrote since the fork (their contents
    /// are in place) in its own copies of the disks.
    pub(super) fn mark_disk_pages(&self, told: &[DiskPages]) -> Result<(), VmmError> {
        for d in told {
            let fail =
                |why: String| VmmError::Device(format!("disk pages of device {}: {why}", d.device));
            let dev = self
                .devices
                .get(d.device as usize)
                .ok_or_else(|| fail("no such device".into()))?
                .lock()
                .unwrap();
            let block = dev
                .as_block()
                .ok_or_else(|| fail("not a block device".into()))?;
            block
                .mark_written(&d.pages)
                .map_err(|e| fail(e.to_string()))?;
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
