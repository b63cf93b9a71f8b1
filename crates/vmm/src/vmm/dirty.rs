//! Which guest pages changed: one reader of the dirty logs, several consumers.
//!
//! Two sources record writes to guest RAM: KVM's dirty log (the guest's own writes,
//! while logging is on) and vm-memory's bitmap (the VMM's writes: virtio devices
//! filling buffers and rings). Reading either clears it, yet two features need "what
//! changed since my point": diff snapshots (since the last snapshot) and each warm
//! spawner (since it was forked). So every read goes through [`Vmm::drain_dirty`],
//! which hands what it found to every consumer: each spawner's own bitmap, and the
//! pages owed to the next diff snapshot. The same read takes the copy-on-write disks'
//! records of written pages, which only spawners need (they hold old copies of the
//! disks too; see `inherit`).
//!
//! Bitmaps are one bit per 4 KiB page over all RAM in `GuestRam::ranges()` order
//! (KVM's dirty-log layout), in `u64` words.
use super::{Vmm, VmmError};

pub const PAGE_SIZE: u64 = 4096;

/// `dst |= src`, growing `dst` to `src`'s length.
pub fn or_into(dst: &mut Vec<u64>, src: &[u64]) {
    if dst.len() < src.len() {
        dst.resize(src.len(), 0);
    }
    for (d, s) in dst.iter_mut().zip(src) {
        *d |= s;
    }
}

/// Pages set in `bitmap`.
pub fn count(bitmap: &[u64]) -> u64 {
    bitmap.iter().map(|w| u64::from(w.count_ones())).sum()
}

/// Runs of consecutive set pages as (first page, pages), in order.
pub fn runs(bitmap: &[u64]) -> impl Iterator<Item = (u64, u64)> + '_ {
    let mut page = 0u64;
    let end = bitmap.len() as u64 * 64;
    let set = move |p: u64| bitmap[(p / 64) as usize] & (1 << (p % 64)) != 0;
    std::iter::from_fn(move || {
        // Skip clear pages, a whole zero word at a time.
        while page < end {
            let word = bitmap[(page / 64) as usize] >> (page % 64);
            if word == 0 {
                page = (page / 64 + 1) * 64;
            } else {
                page += u64::from(word.trailing_zeros());
                break;
            }
        }
        if page >= end {
            return None;
        }
        let first = page;
        while page < end && set(page) {
            page += 1;
        }
        Some((first, page - first))
    })
}

/// The sources of dirty pages warm spawners are told about (both, outside tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirtySources {
    /// KVM's dirty log: the guest's writes.
    pub kvm: bool,
    /// vm-memory's bitmap: the VMM's own writes.
    pub host: bool,
    /// Copy-on-write disks' records of the pages written (see `inherit`).
    pub disk: bool,
}

impl Default for DirtySources {
    fn default() -> Self {
        Self {
            kvm: true,
            host: true,
            disk: true,
        }
    }
}

impl Vmm {
    /// Read (and clear) both dirty sources and hand the pages to every consumer: each
    /// warm spawner's bitmap, and, once a snapshot is the base for diffs, the pages
    /// owed to the next one. Returns what this read found.
    pub(super) fn drain_dirty(&mut self) -> Result<Vec<u64>, VmmError> {
        let kvm = if self.kvm_log_on {
            self.vm.take_dirty_log(&self.ram)?
        } else {
            Vec::new()
        };
        let host = self.ram.take_host_dirty();
        let mut fresh = kvm.clone();
        or_into(&mut fresh, &host);
        let told = self.spawner_sources;
        if !self.spawners.is_empty() {
            let for_spawners = match (told.kvm, told.host) {
                (true, true) => fresh.clone(),
                (true, false) => kvm,
                (false, true) => host,
                (false, false) => Vec::new(),
            };
            for s in &mut self.spawners {
                s.note_dirty(&for_spawners);
            }
        }
        // The VMM's writes to copy-on-write disks, which spawners hold copies of too.
        // Drained even with no spawner, so that a new one starts from nothing.
        let disk_writes = self.take_disk_writes();
        if told.disk {
            for s in &mut self.spawners {
                for (device, written) in disk_writes.iter().enumerate() {
                    if let Some(w) = written {
                        s.note_disk_writes(device, w);
                    }
                }
            }
        }
        if self.dirty_logging {
            or_into(&mut self.unsaved_dirty, &fresh);
        }
        Ok(fresh)
    }

    /// Tests only: keep one source of dirty pages from the warm spawners, to show that
    /// a branch's verification catches the pages missed.
    #[doc(hidden)]
    pub fn set_spawner_dirty_sources(&mut self, sources: DirtySources) {
        self.spawner_sources = sources;
    }

    /// Turn KVM's dirty log on (if it is not) and drain it: from here on, every page
    /// written is seen by the next [`Vmm::drain_dirty`].
    pub(super) fn ensure_kvm_log(&mut self) -> Result<(), VmmError> {
        if !self.kvm_log_on {
            self.vm.set_dirty_logging(&self.ram, true)?;
            self.kvm_log_on = true;
        }
        self.drain_dirty()?;
        Ok(())
    }

    /// Pages written since the last snapshot: the guest's, the VMM's for it, and any a
    /// failed snapshot left owed (or a spawner's read took out of the logs).
    pub(super) fn take_dirty_pages(&mut self) -> Result<Vec<u64>, VmmError> {
        self.drain_dirty()?;
        Ok(std::mem::take(&mut self.unsaved_dirty))
    }

    /// Make this instant the base for the next diff snapshot.
    pub(super) fn start_dirty_log(&mut self) -> Result<(), VmmError> {
        self.ensure_kvm_log()?;
        self.unsaved_dirty.clear();
        self.dirty_logging = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bitmap(pages: &[u64], words: usize) -> Vec<u64> {
        let mut b = vec![0u64; words];
        for &p in pages {
            b[(p / 64) as usize] |= 1 << (p % 64);
        }
        b
    }

    #[test]
    fn runs_cover_exactly_the_set_pages() {
        let pages = [0, 1, 2, 63, 64, 65, 130, 191, 192, 255];
        let b = bitmap(&pages, 4);
        let got: Vec<_> = runs(&b).collect();
        assert_eq!(got, vec![(0, 3), (63, 3), (130, 1), (191, 2), (255, 1)]);
        assert_eq!(count(&b), pages.len() as u64);
        assert_eq!(runs(&[0, 0]).count(), 0);
        assert_eq!(
            runs(&[u64::MAX, u64::MAX]).collect::<Vec<_>>(),
            vec![(0, 128)]
        );
    }

    #[test]
    fn or_into_grows_and_merges() {
        let mut a = Vec::new();
        or_into(&mut a, &bitmap(&[3, 70], 2));
        or_into(&mut a, &bitmap(&[4], 1));
        assert_eq!(a, bitmap(&[3, 4, 70], 2));
    }
}
