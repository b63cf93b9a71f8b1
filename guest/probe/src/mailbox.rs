//! The machine-readable report: a page at MAILBOX_GPA the host reads straight out
//! of guest RAM. All accesses are volatile so the host (or another vCPU) sees each
//! store when it happens.

use core::ptr::{addr_of_mut, read_volatile, write_volatile};
use zygote_probe_abi::{
    Mailbox, MAILBOX_GPA, MAILBOX_MAGIC, MAILBOX_OFF_DIRTY_PASSES, MAILBOX_OFF_DIRTY_WINDOW_PAGES,
    SCRATCH_EXTRA_ENTRY, STATUS_RUNNING,
};

fn mb() -> *mut Mailbox {
    MAILBOX_GPA as *mut Mailbox
}

/// Clears the page's report fields and marks the probe as running. Runs first
/// thing, before the e820 check has shown the mailbox page is RAM: the host
/// should learn the probe started even if that check fails.
/// scratch[SCRATCH_EXTRA_ENTRY] is left alone: stray vCPUs may already have
/// written it (fresh RAM starts zero).
pub fn init() {
    // SAFETY: MAILBOX_GPA is identity-mapped RAM reserved for the mailbox.
    unsafe {
        let m = mb();
        write_volatile(addr_of_mut!((*m).heartbeat), 0);
        write_volatile(addr_of_mut!((*m).cpus_alive), 0);
        for i in 0..(*m).scratch.len() {
            if i != SCRATCH_EXTRA_ENTRY {
                write_volatile(addr_of_mut!((*m).scratch[i]), 0);
            }
        }
        for off in [MAILBOX_OFF_DIRTY_WINDOW_PAGES, MAILBOX_OFF_DIRTY_PASSES] {
            write_volatile((MAILBOX_GPA + off) as *mut u64, 0);
        }
        write_volatile(addr_of_mut!((*m).status), STATUS_RUNNING);
        write_volatile(addr_of_mut!((*m).magic), MAILBOX_MAGIC);
    }
}

pub fn set_status(status: u64) {
    // SAFETY: as in init.
    unsafe { write_volatile(addr_of_mut!((*mb()).status), status) }
}

pub fn set_scratch(index: usize, value: u64) {
    // SAFETY: as in init; the index is bounds-checked by the array access.
    unsafe { write_volatile(addr_of_mut!((*mb()).scratch[index]), value) }
}

pub fn scratch(index: usize) -> u64 {
    // SAFETY: as in init.
    unsafe { read_volatile(addr_of_mut!((*mb()).scratch[index])) }
}

/// A u64 of the mailbox page past [`Mailbox`], at byte offset `off` (a probe-abi
/// `MAILBOX_OFF_*` constant).
pub fn word(off: u64) -> u64 {
    // SAFETY: as in init; callers pass 8-byte aligned offsets inside the page.
    unsafe { read_volatile((MAILBOX_GPA + off) as *const u64) }
}

pub fn set_word(off: u64, value: u64) {
    // SAFETY: as in word.
    unsafe { write_volatile((MAILBOX_GPA + off) as *mut u64, value) }
}

pub fn cpus_alive() -> u64 {
    // SAFETY: as in init.
    unsafe { read_volatile(addr_of_mut!((*mb()).cpus_alive)) }
}

/// Atomically sets bit `apic_id` in cpus_alive: APs set theirs concurrently with
/// the same `lock or`.
pub fn mark_alive(apic_id: u32) {
    if apic_id >= 64 {
        return;
    }
    // SAFETY: as in init; the field is 8-byte aligned.
    unsafe {
        let p = addr_of_mut!((*mb()).cpus_alive);
        core::arch::asm!("lock or qword ptr [{p}], {v}", p = in(reg) p, v = in(reg) 1u64 << apic_id, options(nostack));
    }
}

pub fn heartbeat_ptr() -> *mut u64 {
    // SAFETY: only forms the address.
    unsafe { addr_of_mut!((*mb()).heartbeat) }
}
