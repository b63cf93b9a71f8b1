//! `blkspin`: the `blk` checks, then keep the device live and spin, obeying the host's
//! block command (see `SCRATCH_BLK_CMD` in probe-abi). A restored or branched VM keeps
//! driving the same queue from wherever its memory says the driver was.

use crate::checks::{BootInfo, Fail};
use crate::{mailbox, say};
use zygote_probe_abi::{
    blk_spin_word, BLK_SPIN_SECTOR, REPORT_READY, SCRATCH_BLK_ACK, SCRATCH_BLK_CMD,
    SCRATCH_BLK_RESULT,
};

pub fn run(info: &BootInfo) -> Result<(), Fail> {
    let mut q = super::blk::checks(info)?;
    say!(REPORT_READY);
    let heartbeat = mailbox::heartbeat_ptr();
    let mut n: u64 = 0;
    let mut done: u64 = 0;
    loop {
        n = n.wrapping_add(1);
        // SAFETY: the heartbeat word is in the mailbox page (checked RAM).
        unsafe { core::ptr::write_volatile(heartbeat, n) };
        let cmd = mailbox::scratch(SCRATCH_BLK_CMD);
        if cmd != done {
            let ok = super::blk::verify_written(&mut q).is_ok()
                && super::blk::write_and_check(&mut q, BLK_SPIN_SECTOR, |w| blk_spin_word(cmd, w))
                    .is_ok();
            mailbox::set_scratch(SCRATCH_BLK_RESULT, if ok { 1 } else { 2 });
            mailbox::set_scratch(SCRATCH_BLK_ACK, cmd);
            done = cmd;
        }
    }
}
