//! `spin`: after the checks, count forever in mailbox.heartbeat with no output,
//! so the host can pause, resume, snapshot or branch the VM and watch the
//! counter move (or not) in guest memory.
//! Mailbox: scratch[SCRATCH_SPIN_MARKER] = SPIN_MARKER once the checks passed.
//! It also obeys the dirty-page command (see `SCRATCH_DIRTY_CMD` in probe-abi): the
//! guest itself rewrites a small area so that KVM's dirty log records it; and the
//! chatter command (`SCRATCH_CHATTER`): one byte to COM1 per turn; and the dirty window
//! (`MAILBOX_OFF_DIRTY_WINDOW_PAGES`): a page-by-page rewrite of up to the rest of its RAM.

use crate::checks::{BootInfo, Fail};
use crate::{mailbox, say};
use zygote_probe_abi::{
    dirty_word, CHATTER_BYTE, COM1_PORT, DIRTY_AREA_GPA, DIRTY_AREA_PAGES, DIRTY_WINDOW_GPA,
    DIRTY_WORD_OFFSETS, MAILBOX_OFF_DIRTY_PASSES, MAILBOX_OFF_DIRTY_WINDOW_PAGES, MMIO_HOLE_START,
    REPORT_READY, SCRATCH_CHATTER, SCRATCH_DIRTY_ACK, SCRATCH_DIRTY_CMD, SCRATCH_SPIN_MARKER,
    SPIN_MARKER,
};

fn fill_dirty_area(cmd: u64) {
    for page in 0..DIRTY_AREA_PAGES {
        for (k, off) in DIRTY_WORD_OFFSETS.iter().enumerate() {
            let addr = (DIRTY_AREA_GPA + page * 4096 + off) as *mut u64;
            // SAFETY: the area is identity-mapped RAM (64 MiB; the host asks for more) that
            // nothing else in the probe uses.
            unsafe { core::ptr::write_volatile(addr, dirty_word(cmd, page, k as u64)) };
        }
    }
    mailbox::set_scratch(SCRATCH_DIRTY_ACK, cmd);
}

/// One pass over the dirty window: a word per page, the heartbeat after each, so that a
/// host watching the heartbeat sees the guest run even during a pass of many
/// milliseconds. Returns the heartbeat to continue from.
fn dirty_window_pass(pages: u64, mut n: u64, heartbeat: *mut u64) -> u64 {
    for page in 0..pages {
        n = n.wrapping_add(1);
        // SAFETY: the caller clamped `pages` to RAM below the MMIO hole, above everything
        // else the probe uses; the heartbeat is in the mailbox page.
        unsafe {
            core::ptr::write_volatile((DIRTY_WINDOW_GPA + page * 4096) as *mut u64, n);
            core::ptr::write_volatile(heartbeat, n);
        }
    }
    n
}

pub fn run(info: &BootInfo) -> Result<(), Fail> {
    mailbox::set_scratch(SCRATCH_SPIN_MARKER, SPIN_MARKER);
    say!(REPORT_READY);
    let heartbeat = mailbox::heartbeat_ptr();
    // The count lives in a register and is stored each turn: a handful of emulated
    // instructions per beat. Snapshots capture the register too, so a restored or
    // branched VM continues from where its memory says.
    let mut n: u64 = 0;
    let mut done: u64 = 0;
    // The window must stay inside RAM whatever the host asks for: a write past it would
    // fault, and the probe has no handler.
    let ram_end = info.ram_top.min(MMIO_HOLE_START);
    let max_window_pages = ram_end.saturating_sub(DIRTY_WINDOW_GPA) / 4096;
    let mut passes: u64 = 0;
    loop {
        n = n.wrapping_add(1);
        // SAFETY: the heartbeat word is in the mailbox page (checked RAM).
        unsafe { core::ptr::write_volatile(heartbeat, n) };
        let cmd = mailbox::scratch(SCRATCH_DIRTY_CMD);
        if cmd != done {
            fill_dirty_area(cmd);
            done = cmd;
        }
        if mailbox::scratch(SCRATCH_CHATTER) != 0 {
            crate::arch::outb(COM1_PORT, CHATTER_BYTE);
        }
        let window = mailbox::word(MAILBOX_OFF_DIRTY_WINDOW_PAGES).min(max_window_pages);
        if window != 0 {
            n = dirty_window_pass(window, n, heartbeat);
            passes += 1;
            mailbox::set_word(MAILBOX_OFF_DIRTY_PASSES, passes);
        }
    }
}
