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

/// Printed by scenarios that keep running instead of resetting (`spin`), once the
/// boot checks have passed and the scenario's steady state has begun.
pub const REPORT_READY: &str = "PROBE READY";

/// Index into [`Mailbox::scratch`] of a bitmask (by APIC id) of vCPUs that entered
/// the probe's 64-bit entry point after the first one did. Only the BSP may be
/// started at the entry; APs must wait for INIT-SIPI. Those extra vCPUs park
/// themselves, set their bit here, and the boot checks fail. Not cleared by the
/// probe (fresh guest RAM is zero), all scenarios.
pub const SCRATCH_EXTRA_ENTRY: usize = 0;

/// Index into [`Mailbox::scratch`] where `spin` writes [`SPIN_MARKER`] once its
/// boot checks have passed (just before printing [`REPORT_READY`]).
pub const SCRATCH_SPIN_MARKER: usize = 1;
/// "SPIN" in ASCII: the value of `scratch[SCRATCH_SPIN_MARKER]` in the `spin` scenario.
pub const SPIN_MARKER: u64 = 0x5350_494e;
/// `spin` also obeys a host command: when scratch[SCRATCH_DIRTY_CMD] changes to a
/// non-zero value `c`, the guest writes `dirty_word(c, page, k)` at offsets
/// `DIRTY_WORD_OFFSETS[k]` of each of the `DIRTY_AREA_PAGES` pages at `DIRTY_AREA_GPA`,
/// then sets scratch[SCRATCH_DIRTY_ACK] = c. Because the guest (not the host) writes
/// the pages, KVM's dirty log sees them: snapshot tests use this to build diff chains.
pub const SCRATCH_DIRTY_CMD: usize = 2;
pub const SCRATCH_DIRTY_ACK: usize = 3;
/// `spin` also writes [`CHATTER_BYTE`] to COM1 on every turn while
/// scratch[SCRATCH_CHATTER] is non-zero: a guest in a loop of port I/O exits, for
/// tests that pause a vCPU while it is in the middle of one.
pub const SCRATCH_CHATTER: usize = 4;
pub const CHATTER_BYTE: u8 = b'.';
// Off any 2 MiB boundary: the boot memory check writes the ends of every 2 MiB page.
pub const DIRTY_AREA_GPA: u64 = 0x401_0000;
pub const DIRTY_AREA_PAGES: u64 = 16;
pub const DIRTY_WORD_OFFSETS: [u64; 4] = [0, 1024, 2048, 4088];
pub const fn dirty_word(cmd: u64, page: u64, k: u64) -> u64 {
    (cmd << 16 | page << 4 | k).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// `spin` also keeps a *dirty window* busy, for benchmarks of a guest that writes memory
/// while it is paused, snapshotted or branched: while the mailbox word at
/// [`MAILBOX_OFF_DIRTY_WINDOW_PAGES`] is a non-zero `n`, the guest writes one word into
/// each of the `n` 4 KiB pages from [`DIRTY_WINDOW_GPA`] (clamped to its RAM below the
/// MMIO hole), in order, over and over, bumping the heartbeat after every page (so
/// progress stays visible mid-pass) and counting finished passes in the word at
/// [`MAILBOX_OFF_DIRTY_PASSES`]. One word per page is all it takes to dirty a page, and
/// keeps the pass short under an emulated ring 0. Both words lie in the mailbox page past
/// [`Mailbox`] (which ends at 128 bytes), not in `scratch`: host tests use the free
/// scratch words as markers, and a marker must not start the window.
pub const MAILBOX_OFF_DIRTY_WINDOW_PAGES: u64 = 0x100;
pub const MAILBOX_OFF_DIRTY_PASSES: u64 = 0x108;
/// Start of the dirty window: 128 MiB, above the probe image, the virtio area and the
/// small dirty area; the host must give the guest at least this plus the window.
pub const DIRTY_WINDOW_GPA: u64 = 128 << 20;

// ---------------------------------------------------------------------------
// Boot-path conventions the probe relies on. The VMM owns these addresses; they
// are listed here so host tests and the VMM can assert they agree with the probe.
// ---------------------------------------------------------------------------

/// Guest-physical (= virtual, identity-mapped) address the probe ELF is linked and
/// loaded at (p_paddr of its single PT_LOAD segment, also e_entry).
pub const PROBE_LOAD_GPA: u64 = 0x100_0000;
/// Where the VMM puts `struct boot_params` (the zero page); passed in `rsi`.
pub const ZERO_PAGE_GPA: u64 = 0x7000;
/// Where the VMM puts the kernel command line (`hdr.cmd_line_ptr`).
pub const CMDLINE_GPA: u64 = 0x2_0000;
/// Start of the 32-bit MMIO hole: no RAM in e820 from here ...
pub const MMIO_HOLE_START: u64 = 0xc000_0000;
/// ... up to here; RAM beyond `MMIO_HOLE_START` continues at this address.
pub const MMIO_HOLE_END: u64 = 0x1_0000_0000;
/// The VMM identity-maps max(4 GiB, top of RAM) with 2 MiB pages, but never more
/// than this; the probe only touches RAM below the mapped limit.
pub const IDENTITY_MAP_MAX: u64 = 16 << 30;
/// Local APIC MMIO base (xAPIC mode) the `smp` scenario programs.
pub const LAPIC_GPA: u64 = 0xfee0_0000;

/// COM1 data port: the probe's text report.
pub const COM1_PORT: u16 = 0x3f8;
/// i8042 command port; writing [`RESET_VALUE`] asks for a CPU reset, which the VMM
/// treats as the probe's clean exit.
pub const RESET_PORT: u16 = 0x64;
pub const RESET_VALUE: u8 = 0xfe;

// ---------------------------------------------------------------------------
// virtio scenarios (`blk`, `rng`, `vsock`): polling drivers over virtio-mmio.
// The probe finds each device from the `virtio_mmio.device=4K@<base>:<irq>` entries
// the VMM appends to the command line and checks its device ID.
// ---------------------------------------------------------------------------

/// Guest-physical scratch area for virtqueues and buffers (above the probe image at
/// 16 MiB; the boot memory check only touches the ends of 2 MiB pages before the
/// scenario starts). Needs `probe.mem_mib` >= 64.
pub const VIRTIO_AREA_GPA: u64 = 0x300_0000;
pub const VIRTIO_AREA_SIZE: u64 = 1 << 20;

/// `blk`: sector 0 of the root image holds 64 words `blk_base_word(0..64)`
/// (little-endian), which the host test writes and the probe compares.
pub const fn blk_base_word(i: u64) -> u64 {
    (i + 1).wrapping_mul(0x0123_4567_89ab_cdef) ^ 0x5a59_474f_424c_4b30 // "ZYGOBLK0"
}
/// `blk` writes sectors `BLK_WRITE_FIRST..BLK_WRITE_FIRST + BLK_WRITE_SECTORS`, word
/// `w` of sector `s` being `blk_write_word(s, w)`, then reads them back.
pub const BLK_WRITE_FIRST: u64 = 1;
pub const BLK_WRITE_SECTORS: u64 = 8;
pub const fn blk_write_word(sector: u64, word: u64) -> u64 {
    (sector << 32 | word).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5752_4954_4542_4c4b
}

/// `rng`: bytes requested per read (two reads, which must differ).
pub const RNG_READ_BYTES: u32 = 64;

/// `vsock`: the probe connects from `VSOCK_GUEST_PORT` to host port `VSOCK_HOST_PORT`
/// (the host test listens on `<uds_path>_<VSOCK_HOST_PORT>`), sends `VSOCK_PING`,
/// expects exactly `VSOCK_PONG` back, then shuts the connection down.
pub const VSOCK_HOST_PORT: u32 = 5000;
pub const VSOCK_GUEST_PORT: u32 = 40000;
pub const VSOCK_PING: &[u8] = b"ping from the probe";
pub const VSOCK_PONG: &[u8] = b"pong from the host";

/// `blkspin`: the `blk` checks, then `spin` with the device still live. When the host
/// sets scratch[SCRATCH_BLK_CMD] to a new non-zero `c`, the guest re-reads the sectors
/// the checks wrote, then writes sector `BLK_SPIN_SECTOR` with `blk_spin_word(c, w)` and
/// reads it back, all through the same queue; it then stores 1 (ok) or 2 (failed) in
/// scratch[SCRATCH_BLK_RESULT] and `c` in scratch[SCRATCH_BLK_ACK]. Branch and restore
/// tests use it to prove restored queues and disk contents carry on.
pub const SCRATCH_BLK_CMD: usize = 8;
pub const SCRATCH_BLK_ACK: usize = 9;
pub const SCRATCH_BLK_RESULT: usize = 10;
pub const BLK_SPIN_SECTOR: u64 = 100;
pub const fn blk_spin_word(cmd: u64, word: u64) -> u64 {
    (cmd << 20 | word).wrapping_mul(0xd6e8_feb8_6659_fd93) ^ 0x424c_4b53_5049_4e00
    // "BLKSPIN"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mailbox_offsets_match_layout() {
        assert_eq!(core::mem::size_of::<Mailbox>(), 128);
        assert_eq!(
            core::mem::offset_of!(Mailbox, heartbeat) as u64,
            MAILBOX_OFF_HEARTBEAT
        );
        assert_eq!(
            core::mem::offset_of!(Mailbox, cpus_alive) as u64,
            MAILBOX_OFF_CPUS_ALIVE
        );
        assert_eq!(
            core::mem::offset_of!(Mailbox, scratch) as u64,
            MAILBOX_OFF_SCRATCH
        );
        assert_eq!(
            core::mem::offset_of!(Mailbox, status) as u64,
            MAILBOX_OFF_STATUS
        );
    }

    // Ordering facts the layout relies on, checked at compile time.
    const _: () = {
        assert!(ZERO_PAGE_GPA < AP_TRAMPOLINE_GPA);
        assert!(AP_TRAMPOLINE_GPA < CMDLINE_GPA && CMDLINE_GPA < MAILBOX_GPA);
        // The SIPI vector is 8 bits of page number.
        assert!(AP_TRAMPOLINE_GPA >> 12 < 0x100);
        assert!(PROBE_LOAD_GPA >= 1 << 20);
        // The dirty window starts above everything else the probe writes.
        assert!(DIRTY_WINDOW_GPA >= DIRTY_AREA_GPA + DIRTY_AREA_PAGES * 4096);
        assert!(DIRTY_WINDOW_GPA >= VIRTIO_AREA_GPA + VIRTIO_AREA_SIZE);
        assert!(DIRTY_WINDOW_GPA.is_multiple_of(4096));
        assert!(MAILBOX_OFF_DIRTY_WINDOW_PAGES >= core::mem::size_of::<Mailbox>() as u64);
        assert!(MAILBOX_OFF_DIRTY_PASSES >= MAILBOX_OFF_DIRTY_WINDOW_PAGES + 8);
        assert!(MAILBOX_OFF_DIRTY_PASSES + 8 <= 4096);
    };

    #[test]
    fn boot_structures_do_not_overlap() {
        // Zero page, trampoline page and mailbox page are distinct 4 KiB pages
        // below 640 KiB; the command line sits between them and the mailbox.
        for a in [ZERO_PAGE_GPA, AP_TRAMPOLINE_GPA, CMDLINE_GPA, MAILBOX_GPA] {
            assert_eq!(a % 0x1000, 0);
            assert!(a < 0xa_0000);
        }
    }
}
