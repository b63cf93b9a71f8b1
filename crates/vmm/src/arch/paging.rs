//! Identity page tables for the 64-bit entry: 2 MiB pages covering the first
//! max(4 GiB, top of RAM) guest-physical bytes (capped), so the kernel, boot
//! structures, RAM above the hole and the LAPIC/IOAPIC are all reachable.
use super::layout::{GIB, MAX_IDENTITY_MAPPED_GIB, PDE_START, PDPTE_START, PML4_START};

const PRESENT: u64 = 1 << 0;
const WRITABLE: u64 = 1 << 1;
/// User-accessible, so probe guests may drop to ring 3 over the same tables.
const USER: u64 = 1 << 2;
const HUGE: u64 = 1 << 7;
const TABLE_FLAGS: u64 = PRESENT | WRITABLE | USER;

/// One page-table page to write into guest memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TablePage {
    pub guest_addr: u64,
    pub entries: Vec<u64>,
}

/// How many GiB the boot tables map for a VM whose RAM ends at `ram_end`.
pub fn mapped_gib(ram_end: u64) -> u64 {
    let needed = ram_end.div_ceil(GIB).max(4);
    needed.min(MAX_IDENTITY_MAPPED_GIB)
}

/// Build PML4, PDPT and page directories identity-mapping `mapped_gib(ram_end)` GiB.
pub fn identity_tables(ram_end: u64) -> Vec<TablePage> {
    let gib = mapped_gib(ram_end);
    let mut pml4 = vec![0u64; 512];
    pml4[0] = PDPTE_START | TABLE_FLAGS;
    let mut pdpt = vec![0u64; 512];
    let mut pages = Vec::new();
    for g in 0..gib {
        let pd_addr = PDE_START + g * 0x1000;
        pdpt[g as usize] = pd_addr | TABLE_FLAGS;
        let entries = (0..512u64)
            .map(|i| (g * GIB + (i << 21)) | PRESENT | WRITABLE | USER | HUGE)
            .collect();
        pages.push(TablePage {
            guest_addr: pd_addr,
            entries,
        });
    }
    let mut out = vec![
        TablePage {
            guest_addr: PML4_START,
            entries: pml4,
        },
        TablePage {
            guest_addr: PDPTE_START,
            entries: pdpt,
        },
    ];
    out.extend(pages);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::layout::CMDLINE_START;

    /// Walk the tables like the MMU would for a 2 MiB page.
    fn translate(tables: &[TablePage], va: u64) -> Option<u64> {
        let find = |addr: u64| tables.iter().find(|t| t.guest_addr == addr);
        let pml4e = find(PML4_START)?.entries[((va >> 39) & 0x1ff) as usize];
        if pml4e & PRESENT == 0 {
            return None;
        }
        let pdpte = find(pml4e & !0xfff)?.entries[((va >> 30) & 0x1ff) as usize];
        if pdpte & PRESENT == 0 {
            return None;
        }
        let pde = find(pdpte & !0xfff)?.entries[((va >> 21) & 0x1ff) as usize];
        if pde & PRESENT == 0 || pde & HUGE == 0 {
            return None;
        }
        Some((pde & !0x1f_ffff & !(1 << 63)) | (va & 0x1f_ffff))
    }

    #[test]
    fn identity_maps_low_memory_and_lapic() {
        let t = identity_tables(256 << 20);
        assert_eq!(mapped_gib(256 << 20), 4);
        for va in [0u64, 0x7000, 0x100_0000, 0xfee0_0000, 0xffff_f000] {
            assert_eq!(translate(&t, va), Some(va));
        }
        assert_eq!(translate(&t, 4 * GIB), None);
    }

    #[test]
    fn maps_ram_above_4g_and_caps() {
        let t = identity_tables(5 * GIB);
        assert_eq!(translate(&t, 5 * GIB - 8), Some(5 * GIB - 8));
        assert_eq!(mapped_gib(64 * GIB), MAX_IDENTITY_MAPPED_GIB);
    }

    #[test]
    fn tables_stay_clear_of_the_cmdline() {
        let t = identity_tables(64 * GIB);
        let last = t.iter().map(|p| p.guest_addr).max().unwrap();
        assert!(last + 0x1000 <= CMDLINE_START);
    }
}
