//! Guest RAM: private anonymous memory, 2 MiB aligned and `MADV_HUGEPAGE`.
//!
//! Private anonymous memory is what makes branching cheap: `fork(2)` gives the child a
//! copy-on-write view, and with transparent huge pages the kernel copies about one PMD
//! per 2 MiB instead of one PTE per 4 KiB.
use std::io;
use std::sync::Arc;

use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{GuestAddress, MmapRegion};

/// Guest memory as every part of the VMM sees it. The per-page dirty bitmap records
/// writes the VMM itself makes through vm-memory (virtio devices filling buffers and
/// rings), which KVM's dirty log cannot see; diff snapshots need both.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<AtomicBitmap>;
type GuestRegionMmap = vm_memory::GuestRegionMmap<AtomicBitmap>;

use crate::arch::layout::{MIB, MMIO_GAP_END, MMIO_GAP_START};

/// The smallest VM we build: room for boot structures and a kernel loaded at 16 MiB.
pub const MIN_MEM_MIB: u64 = 32;
const HUGE_PAGE: usize = 2 << 20;

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("memory size {0} MiB is below the minimum of {MIN_MEM_MIB} MiB")]
    TooSmall(u64),
    #[error("memory size {requested} MiB exceeds host memory ({host} MiB total)")]
    BeyondHost { requested: u64, host: u64 },
    #[error("mmap of {size} bytes of guest memory failed: {source}")]
    Mmap { size: usize, source: io::Error },
    #[error("building the guest memory map failed: {0}")]
    Layout(String),
}

/// A guest-physical RAM range and where it lives in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RamRange {
    pub guest_addr: u64,
    pub size: u64,
    /// Host virtual address. Identical in a forked child, which is what lets it rebuild a
    /// KVM VM over the inherited mapping.
    pub host_addr: u64,
}

/// Split `mem_bytes` of RAM around the 32-bit MMIO hole.
pub fn ram_ranges(mem_bytes: u64) -> Vec<(u64, u64)> {
    if mem_bytes <= MMIO_GAP_START {
        vec![(0, mem_bytes)]
    } else {
        vec![
            (0, MMIO_GAP_START),
            (MMIO_GAP_END, mem_bytes - MMIO_GAP_START),
        ]
    }
}

/// Put the first `pages` bits of `words` at bit `at` of `bitmap` (grown to fit). Whole
/// words when `at` is word-aligned, as it is for RAM ranges (2 MiB multiples): reading
/// a 1 GiB guest's log must not cost a loop over its 262144 pages while it is paused.
pub(crate) fn append_bits(bitmap: &mut Vec<u64>, at: usize, words: &[u64], pages: usize) {
    bitmap.resize((at + pages).div_ceil(64), 0);
    let bit = |p: usize| words.get(p / 64).is_some_and(|w| w & (1 << (p % 64)) != 0);
    if at.is_multiple_of(64) {
        let whole = pages / 64;
        for (dst, src) in bitmap[at / 64..].iter_mut().zip(words.iter().take(whole)) {
            *dst |= src;
        }
        for p in whole * 64..pages {
            if bit(p) {
                bitmap[(at + p) / 64] |= 1 << ((at + p) % 64);
            }
        }
    } else {
        for p in 0..pages {
            if bit(p) {
                bitmap[(at + p) / 64] |= 1 << ((at + p) % 64);
            }
        }
    }
}

/// Owns the host mapping that backs guest RAM; unmapped on drop.
pub struct GuestRam {
    base: *mut u8,
    mapped_len: usize,
    ranges: Vec<RamRange>,
    memory: GuestMemoryMmap,
}

// SAFETY: the mapping is plain memory shared with vCPU threads through KVM; every access
// from Rust goes through vm-memory's volatile accessors.
unsafe impl Send for GuestRam {}
// SAFETY: see above.
unsafe impl Sync for GuestRam {}

impl GuestRam {
    /// Map `mem_mib` MiB of guest RAM. `host_total_mib` guards against requests the host
    /// cannot possibly back (we map with MAP_NORESERVE, so the kernel would not stop us).
    pub fn new(mem_mib: u64, host_total_mib: u64) -> Result<Arc<Self>, MemoryError> {
        if mem_mib < MIN_MEM_MIB {
            return Err(MemoryError::TooSmall(mem_mib));
        }
        if mem_mib > host_total_mib {
            return Err(MemoryError::BeyondHost {
                requested: mem_mib,
                host: host_total_mib,
            });
        }
        let mem_bytes = mem_mib * MIB;
        let size = mem_bytes as usize;
        // Over-allocate by one huge page so the guest base can be 2 MiB aligned: THP only
        // backs ranges whose host and guest addresses agree modulo 2 MiB.
        let reserve = size + HUGE_PAGE;
        // SAFETY: anonymous private mapping with no fixed address; checked below.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(MemoryError::Mmap {
                size: reserve,
                source: io::Error::last_os_error(),
            });
        }
        let raw = raw as *mut u8;
        let misalign = (raw as usize) % HUGE_PAGE;
        let lead = if misalign == 0 {
            0
        } else {
            HUGE_PAGE - misalign
        };
        // SAFETY: trimming the unaligned head and the unused tail of our own mapping.
        unsafe {
            if lead > 0 {
                libc::munmap(raw as *mut libc::c_void, lead);
            }
            let tail = reserve - lead - size;
            if tail > 0 {
                libc::munmap(raw.add(lead + size) as *mut libc::c_void, tail);
            }
        }
        // SAFETY: `lead` is within the reservation.
        let base = unsafe { raw.add(lead) };
        // Advice failures only cost performance (e.g. THP disabled); don't fail the VM.
        // SAFETY: advising our own mapping.
        if unsafe { libc::madvise(base as *mut libc::c_void, size, libc::MADV_HUGEPAGE) } != 0 {
            tracing::warn!(
                "madvise(MADV_HUGEPAGE) failed: {}",
                io::Error::last_os_error()
            );
        }
        Self::from_raw(base, size, mem_bytes)
    }

    /// Map a snapshot memory file privately: pages load lazily from the page cache (shared
    /// by every VM restored from the same file) and guest writes stay private to this VM.
    pub fn from_file(
        path: &std::path::Path,
        layout: &crate::persist::MemoryLayout,
    ) -> Result<Arc<Self>, MemoryError> {
        use std::os::fd::AsRawFd;
        let total = layout.total_bytes();
        let file = std::fs::File::open(path).map_err(|source| MemoryError::Mmap {
            size: total as usize,
            source,
        })?;
        let len = file
            .metadata()
            .map_err(|source| MemoryError::Mmap {
                size: total as usize,
                source,
            })?
            .len();
        if len != total {
            return Err(MemoryError::Layout(format!(
                "memory file {} has {len} bytes, the saved layout needs {total}",
                path.display()
            )));
        }
        if ram_ranges(total) != layout.ranges {
            return Err(MemoryError::Layout(format!(
                "saved layout {:?} is not zygote's layout for {} MiB",
                layout.ranges, layout.mem_mib
            )));
        }
        // SAFETY: a private file mapping with no fixed address; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_NORESERVE,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(MemoryError::Mmap {
                size: total as usize,
                source: io::Error::last_os_error(),
            });
        }
        // The mapping keeps its own reference to the file; `file` may close now.
        Self::from_raw(base as *mut u8, total as usize, total)
    }

    /// Touch every 4 KiB page of RAM at or above guest address `from` from the host side
    /// (one non-zero word per page), so every page is really backed. Benchmarks use this:
    /// first touches from inside the guest are slow under shadow paging.
    pub fn populate(&self, from: u64) -> u64 {
        let mut pages = 0;
        for r in &self.ranges {
            let start = from.max(r.guest_addr).min(r.guest_addr + r.size);
            let mut off = (start - r.guest_addr).next_multiple_of(4096);
            while off < r.size {
                // SAFETY: inside this range's host mapping; the word is 8-byte aligned.
                unsafe {
                    ((r.host_addr + off) as *mut u64)
                        .write_volatile(0x5a59_474f_5445_0000 | (off >> 12));
                }
                off += 4096;
                pages += 1;
            }
        }
        pages
    }

    /// Let KSM merge identical guest pages with other VMs' (opt-in: merging costs
    /// ksmd CPU time and makes later writes to merged pages copy-on-write faults).
    pub fn enable_ksm(&self) -> io::Result<()> {
        // SAFETY: advising our own mapping.
        let r = unsafe {
            libc::madvise(
                self.base as *mut libc::c_void,
                self.size() as usize,
                libc::MADV_MERGEABLE,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Unmap guest RAM in a branch spawner, which outlives its use of the memory. The
    /// struct must never be used again (the spawner only reaps, then _exits).
    pub fn unmap_for_spawner(&self) {
        // SAFETY: see above; the spawner process has no other user of the mapping.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.mapped_len) };
    }

    /// All RAM as one host slice (ranges are contiguous in the host mapping).
    ///
    /// # Safety
    /// The guest (and devices) may write concurrently unless the VM is paused or this is a
    /// frozen forked copy; callers must ensure that for a consistent view.
    pub unsafe fn host_slice(&self) -> &[u8] {
        // SAFETY: the mapping is at least `size()` bytes long and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.base, self.size() as usize) }
    }

    fn from_raw(
        base: *mut u8,
        mapped_len: usize,
        mem_bytes: u64,
    ) -> Result<Arc<Self>, MemoryError> {
        let mut ranges = Vec::new();
        let mut regions = Vec::new();
        let mut offset = 0usize;
        for (guest_addr, len) in ram_ranges(mem_bytes) {
            // SAFETY: [base+offset, +len) lies inside our mapping, which outlives `memory`
            // because both are owned by this struct and the mapping is unmapped in Drop.
            let host = unsafe { base.add(offset) };
            let region = unsafe {
                MmapRegion::<AtomicBitmap>::build_raw(
                    host,
                    len as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                )
            }
            .map_err(|e| MemoryError::Layout(e.to_string()))?;
            let region = GuestRegionMmap::new(region, GuestAddress(guest_addr))
                .ok_or_else(|| MemoryError::Layout("guest region overflows".into()))?;
            regions.push(region);
            ranges.push(RamRange {
                guest_addr,
                size: len,
                host_addr: host as u64,
            });
            offset += len as usize;
        }
        let memory = GuestMemoryMmap::from_regions(regions)
            .map_err(|e| MemoryError::Layout(e.to_string()))?;
        Ok(Arc::new(Self {
            base,
            mapped_len,
            ranges,
            memory,
        }))
    }

    /// vm-memory view used by loaders and devices.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.memory
    }

    /// RAM ranges in guest-physical order.
    pub fn ranges(&self) -> &[RamRange] {
        &self.ranges
    }

    /// Pages the VMM wrote through vm-memory since the last call (which clears them), as
    /// one bitmap over all RAM in `ranges()` order, 4 KiB pages (KVM's dirty-log layout).
    pub fn take_host_dirty(&self) -> Vec<u64> {
        use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
        let mut bitmap = Vec::new();
        let mut bit = 0usize;
        for region in self.memory.iter() {
            // The mapping's own bitmap (not the region trait's slice view) can be drained.
            let words = std::ops::Deref::deref(region).bitmap().get_and_reset();
            let pages = region.len() as usize / 4096;
            append_bits(&mut bitmap, bit, &words, pages);
            bit += pages;
        }
        bitmap
    }

    /// The layout recorded in a `VmState`.
    pub fn layout(&self) -> crate::persist::MemoryLayout {
        crate::persist::MemoryLayout {
            mem_mib: self.size() / MIB,
            ranges: self.ranges.iter().map(|r| (r.guest_addr, r.size)).collect(),
        }
    }

    /// Total RAM in bytes.
    pub fn size(&self) -> u64 {
        self.ranges.iter().map(|r| r.size).sum()
    }

    /// Highest guest-physical address of RAM plus one.
    pub fn end_addr(&self) -> u64 {
        self.ranges
            .last()
            .map(|r| r.guest_addr + r.size)
            .unwrap_or(0)
    }

    /// Host view of all RAM as one slice-able region (for host-side population and
    /// snapshot writes).
    pub fn host_base(&self) -> *mut u8 {
        self.base
    }
}

impl Drop for GuestRam {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the range we mapped; `memory` only holds non-owning
        // views of it and is dropped with us.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.mapped_len) };
    }
}

/// Total host memory in MiB, from /proc/meminfo.
pub fn host_total_mib() -> u64 {
    crate::host::meminfo_kib("MemTotal").map_or(u64::MAX, |kib| kib / 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appended_bits_land_where_a_page_loop_puts_them() {
        let words = [0x8000_0000_0000_0001u64, 0b1011, u64::MAX];
        for (at, pages) in [(0, 130), (64, 128), (192, 150), (3, 130), (70, 64)] {
            let mut fast = vec![1u64 << 2]; // an earlier range's bit survives
            append_bits(&mut fast, at, &words, pages);
            let mut slow = vec![1u64 << 2];
            slow.resize((at + pages).div_ceil(64), 0);
            for p in 0..pages {
                if words[p / 64] & (1 << (p % 64)) != 0 {
                    slow[(at + p) / 64] |= 1 << ((at + p) % 64);
                }
            }
            assert_eq!(fast, slow, "at {at}, {pages} pages");
        }
    }
    use vm_memory::{Bytes, GuestMemoryBackend};

    #[test]
    fn populate_touches_every_page_above_the_floor() {
        let ram = GuestRam::new(64, u64::MAX).unwrap();
        let pages = ram.populate(32 * MIB);
        assert_eq!(pages, 32 * MIB / 4096);
        let below: u64 = ram
            .memory()
            .read_obj(GuestAddress(32 * MIB - 4096))
            .unwrap();
        let at: u64 = ram.memory().read_obj(GuestAddress(32 * MIB)).unwrap();
        assert_eq!(below, 0);
        assert_ne!(at, 0);
    }

    #[test]
    fn ranges_split_around_the_hole() {
        assert_eq!(ram_ranges(256 * MIB), vec![(0, 256 * MIB)]);
        assert_eq!(ram_ranges(MMIO_GAP_START), vec![(0, MMIO_GAP_START)]);
        assert_eq!(
            ram_ranges(4096 * MIB),
            vec![(0, MMIO_GAP_START), (MMIO_GAP_END, 1024 * MIB)]
        );
    }

    #[test]
    fn rejects_bad_sizes() {
        assert!(matches!(
            GuestRam::new(0, 1024),
            Err(MemoryError::TooSmall(0))
        ));
        assert!(matches!(
            GuestRam::new(4096, 1024),
            Err(MemoryError::BeyondHost { .. })
        ));
    }

    #[test]
    fn mapping_is_aligned_and_usable_above_4g() {
        let ram = GuestRam::new(4096, u64::MAX).unwrap();
        assert_eq!(ram.host_base() as usize % HUGE_PAGE, 0);
        assert_eq!(ram.size(), 4096 * MIB);
        assert_eq!(ram.end_addr(), MMIO_GAP_END + 1024 * MIB);
        let high = GuestAddress(MMIO_GAP_END + 12345);
        ram.memory().write_obj(0xdead_beef_u32, high).unwrap();
        assert_eq!(ram.memory().read_obj::<u32>(high).unwrap(), 0xdead_beef);
        assert!(ram
            .memory()
            .read_obj::<u32>(GuestAddress(MMIO_GAP_START))
            .is_err());
        assert_eq!(ram.memory().num_regions(), 2);
    }
}
