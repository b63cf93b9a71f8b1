//! `smp`: wake every other vCPU with INIT-SIPI-SIPI and wait until each has set
//! its bit in mailbox.cpus_alive.
//!
//! The APs run a 16-bit trampoline copied to AP_TRAMPOLINE_GPA (SIPI vector =
//! page number). It stays in real mode: CPUID gives the APIC id, `lock or` sets
//! the bit through DS = MAILBOX_GPA >> 4, then the AP halts with interrupts off.
//! APs print nothing, so the serial report is only the BSP's.

use crate::checks::{fail, fail_with, BootInfo, Fail};
use crate::{arch, mailbox, say};
use core::ptr::{read_volatile, write_volatile};
use zygote_probe_abi::{AP_TRAMPOLINE_GPA, LAPIC_GPA, MAILBOX_GPA, MAILBOX_OFF_CPUS_ALIVE};

const C: &str = "smp";

// Local APIC registers (xAPIC MMIO offsets).
const LAPIC_SVR: u64 = 0xf0;
const LAPIC_ICR_LOW: u64 = 0x300;
const LAPIC_ICR_HIGH: u64 = 0x310;
const SVR_APIC_ENABLE: u32 = 1 << 8;
// ICR low: destination shorthand "all excluding self" (bits 19:18 = 11), level
// assert (bit 14), delivery mode INIT (101) or STARTUP (110) in bits 10:8.
const ICR_ALL_BUT_SELF: u32 = 0b11 << 18;
const ICR_ASSERT: u32 = 1 << 14;
const ICR_INIT: u32 = 0b101 << 8;
const ICR_STARTUP: u32 = 0b110 << 8;

/// Pause after INIT and after each SIPI: 10 ms at a 1 GHz TSC, 2 ms at 5 GHz,
/// the spec's INIT-to-SIPI delay. KVM delivers IPIs synchronously and does not
/// need it; a stricter implementation might.
const IPI_DELAY_TICKS: u64 = arch::TSC_SECOND / 100;
/// How long to wait for the APs: 2..10 s depending on the TSC rate.
const WAIT_TICKS: u64 = 10 * arch::TSC_SECOND;

// The trampoline is assembled here as 16-bit code and copied at run time; it is
// position-independent (only a relative jump), so where it is linked is moot.
// It handles APIC ids 0..63 (two dwords of cpus_alive) and ignores larger ones.
core::arch::global_asm!(
    ".pushsection .rodata.ap_trampoline, \"a\"",
    ".code16",
    ".global ap_trampoline_start",
    ".global ap_trampoline_end",
    "ap_trampoline_start:",
    "cli",
    "mov ax, {mailbox_seg}",
    "mov ds, ax",
    "mov eax, 1",
    "cpuid",
    "shr ebx, 24",
    "mov di, {alive_lo}",
    "cmp ebx, 32",
    "jb 2f",
    "mov di, {alive_hi}",
    "sub ebx, 32",
    "cmp ebx, 32",
    "jae 3f",
    "2:",
    "mov cl, bl",
    "mov eax, 1",
    "shl eax, cl",
    "lock or dword ptr [di], eax",
    "3:",
    "cli",
    "hlt",
    "jmp 3b",
    "ap_trampoline_end:",
    ".code64",
    ".popsection",
    mailbox_seg = const MAILBOX_GPA >> 4,
    alive_lo = const MAILBOX_OFF_CPUS_ALIVE,
    alive_hi = const MAILBOX_OFF_CPUS_ALIVE + 4,
);

extern "C" {
    static ap_trampoline_start: u8;
    static ap_trampoline_end: u8;
}

fn lapic_write(reg: u64, value: u32) {
    // SAFETY: the LAPIC page is identity-mapped (VMM convention); xAPIC registers
    // are 32-bit, 16-byte aligned.
    unsafe { write_volatile((LAPIC_GPA + reg) as *mut u32, value) }
}

fn lapic_read(reg: u64) -> u32 {
    // SAFETY: as in lapic_write.
    unsafe { read_volatile((LAPIC_GPA + reg) as *const u32) }
}

fn send_ipi(low: u32) {
    lapic_write(LAPIC_ICR_HIGH, 0); // destination field unused with a shorthand
    lapic_write(LAPIC_ICR_LOW, low);
    arch::delay_tsc(IPI_DELAY_TICKS);
}

fn copy_trampoline() -> usize {
    // SAFETY: the symbols bound the trampoline bytes in .rodata; the destination
    // page is low RAM reserved for it (checked by the e820 check via the mailbox
    // entry, which starts at or below it).
    unsafe {
        let src = core::ptr::addr_of!(ap_trampoline_start);
        let len = core::ptr::addr_of!(ap_trampoline_end) as usize - src as usize;
        for i in 0..len {
            write_volatile(
                (AP_TRAMPOLINE_GPA as *mut u8).add(i),
                read_volatile(src.add(i)),
            );
        }
        len
    }
}

pub fn run(info: &BootInfo) -> Result<(), Fail> {
    let Some(want) = info.vcpus else {
        return Err(fail(C, "probe.vcpus missing from the command line"));
    };
    if want == 0 || want > 64 {
        return Err(fail_with(C, "probe.vcpus out of range 1..64", want));
    }
    if arch::cpuid(1).3 & (1 << 9) == 0 {
        return Err(fail(C, "CPUID.1:EDX.APIC is clear"));
    }
    mailbox::mark_alive(info.apic_id);
    if want > 1 {
        let len = copy_trampoline();
        lapic_write(LAPIC_SVR, lapic_read(LAPIC_SVR) | SVR_APIC_ENABLE);
        let vector = (AP_TRAMPOLINE_GPA >> 12) as u32;
        send_ipi(ICR_ALL_BUT_SELF | ICR_ASSERT | ICR_INIT);
        send_ipi(ICR_ALL_BUT_SELF | ICR_ASSERT | ICR_STARTUP | vector);
        // The second SIPI is for CPUs that missed the first; KVM ignores it for
        // CPUs already running.
        send_ipi(ICR_ALL_BUT_SELF | ICR_ASSERT | ICR_STARTUP | vector);
        say!(
            "info smp sent INIT-SIPI-SIPI vector=",
            crate::serial::Hex(vector as u64),
            " trampoline_bytes=",
            len
        );
    }
    let expected = if want == 64 {
        u64::MAX
    } else {
        (1u64 << want) - 1
    };
    // Cheap loop (no popcount: in software that is ~25 emulated instructions):
    // wait until every expected bit is set or the deadline passes.
    let start = arch::rdtsc();
    let mut polls = 0u64;
    let mut alive = mailbox::cpus_alive();
    while alive & expected != expected && arch::rdtsc().wrapping_sub(start) < WAIT_TICKS {
        alive = mailbox::cpus_alive();
        polls += 1;
    }
    if alive != expected {
        // Report the mask: missing bits name the vCPUs that never checked in;
        // extra bits mean APIC ids are not 0..N-1.
        say!(
            "info smp cpus_alive=",
            crate::serial::Hex(alive),
            " expected=",
            crate::serial::Hex(expected),
            " polls=",
            polls
        );
        let what = if alive & expected != expected {
            "vCPUs missing from cpus_alive"
        } else {
            "unexpected APIC ids in cpus_alive"
        };
        return Err(fail_with(C, what, alive));
    }
    say!(
        "check smp ok cpus=",
        want,
        " mask=",
        crate::serial::Hex(alive),
        " polls=",
        polls
    );
    Ok(())
}
