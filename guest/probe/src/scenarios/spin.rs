//! `spin`: after the checks, count forever in mailbox.heartbeat with no output,
//! so the host can pause, resume, snapshot or branch the VM and watch the
//! counter move (or not) in guest memory.
//! Mailbox: scratch[SCRATCH_SPIN_MARKER] = SPIN_MARKER once the checks passed.

use crate::checks::{BootInfo, Fail};
use crate::{mailbox, say};
use zygote_probe_abi::{REPORT_READY, SCRATCH_SPIN_MARKER, SPIN_MARKER};

pub fn run(_info: &BootInfo) -> Result<(), Fail> {
    mailbox::set_scratch(SCRATCH_SPIN_MARKER, SPIN_MARKER);
    say!(REPORT_READY);
    let heartbeat = mailbox::heartbeat_ptr();
    // The count lives in a register and is stored each turn (inc, mov, jmp):
    // three emulated instructions per beat. Snapshots capture the register too,
    // so a restored or branched VM continues from where its memory says.
    let mut n: u64 = 0;
    loop {
        n = n.wrapping_add(1);
        // SAFETY: the heartbeat word is in the mailbox page (checked RAM).
        unsafe { core::ptr::write_volatile(heartbeat, n) };
    }
}
