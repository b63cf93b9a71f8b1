//! The contract between zygote's probe guest (`guest/probe`) and the host.
//!
//! The probe is booted through the same x86_64 Linux boot path as a kernel:
//! 64-bit entry, `rsi` = zero page, identity-mapped memory. It reports text on
//! COM1 (0x3f8) and keeps machine-readable state in a mailbox page at a fixed
//! guest-physical address so the host can read it straight out of guest RAM
//! (e.g. to prove a counter keeps running after pause/resume or branch).
#![no_std]

/// Guest-physical address of the 4 KiB mailbox page (below 640 KiB, usable RAM,
/// clear of the VMM's boot structures).
pub const MAILBOX_GPA: u64 = 0x5_0000;

/// Written to [`Mailbox::magic`] once the probe has started.
pub const MAILBOX_MAGIC: u64 = 0x5a59_474f_5445_5052; // "ZYGOTEPR"

/// Guest-physical address where the probe copies its real-mode AP trampoline
/// (SIPI vector = this >> 12).
pub const AP_TRAMPOLINE_GPA: u64 = 0x8000;

/// Status values in [`Mailbox::status`].
pub const STATUS_RUNNING: u64 = 1;
pub const STATUS_OK: u64 = 2;
pub const STATUS_FAIL: u64 = 3;

/// Layout of the mailbox page (all little-endian u64, `repr(C)`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Mailbox {
    pub magic: u64,
    pub status: u64,
    /// Incremented continuously by the BSP in the `spin` scenario.
    pub heartbeat: u64,
    /// Bit n set when the vCPU with APIC id n has checked in.
    pub cpus_alive: u64,
    /// Scratch words scenarios may use (documented per scenario).
    pub scratch: [u64; 12],
}

/// Byte offsets inside the mailbox page, for host code reading guest memory.
pub const MAILBOX_OFF_MAGIC: u64 = 0;
pub const MAILBOX_OFF_STATUS: u64 = 8;
pub const MAILBOX_OFF_HEARTBEAT: u64 = 16;
pub const MAILBOX_OFF_CPUS_ALIVE: u64 = 24;
pub const MAILBOX_OFF_SCRATCH: u64 = 32;

/// Kernel command-line keys the probe understands.
/// `probe.scenario=<name>`: which scenario to run after the boot checks (default `boot`).
pub const CMDLINE_SCENARIO: &str = "probe.scenario=";
/// `probe.mem_mib=<N>`: the memory size the host asked for; e820 must cover it.
pub const CMDLINE_MEM_MIB: &str = "probe.mem_mib=";
/// `probe.vcpus=<N>`: how many vCPUs the host created; the smp check wakes them all.
pub const CMDLINE_VCPUS: &str = "probe.vcpus=";
/// A token the host appends so the probe can verify the command line arrived intact.
pub const CMDLINE_TOKEN: &str = "probe.token=zygote-cmdline-0123456789abcdef";

/// Final lines of the serial report.
pub const REPORT_OK: &str = "PROBE OK";
pub const REPORT_FAIL_PREFIX: &str = "PROBE FAIL ";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mailbox_offsets_match_layout() {
        assert_eq!(core::mem::size_of::<Mailbox>(), 128);
        assert_eq!(core::mem::offset_of!(Mailbox, heartbeat) as u64, MAILBOX_OFF_HEARTBEAT);
        assert_eq!(core::mem::offset_of!(Mailbox, cpus_alive) as u64, MAILBOX_OFF_CPUS_ALIVE);
        assert_eq!(core::mem::offset_of!(Mailbox, scratch) as u64, MAILBOX_OFF_SCRATCH);
        assert_eq!(core::mem::offset_of!(Mailbox, status) as u64, MAILBOX_OFF_STATUS);
    }
}
