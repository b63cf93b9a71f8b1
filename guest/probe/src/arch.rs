//! The few privileged x86 instructions the probe needs, each a single instruction
//! so the emulated ring-0 cost stays visible. Nothing here raises exceptions: the
//! probe installs no IDT, and an exception would end in a triple fault.

use core::arch::asm;

#[inline(always)]
pub fn outb(port: u16, value: u8) {
    // SAFETY: port I/O has no memory effects; the ports used are COM1 and the i8042.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags))
    }
}

/// CPUID with ECX = 0. Returns (eax, ebx, ecx, edx).
#[inline(always)]
pub fn cpuid(leaf: u32) -> (u32, u32, u32, u32) {
    // core::arch::x86_64::__cpuid is fine too, but spelling it out keeps the rbx
    // save/restore LLVM requires explicit.
    let (eax, ebx, ecx, edx): (u32, u32, u32, u32);
    // SAFETY: CPUID only writes the four registers named (rbx saved via a scratch reg).
    unsafe {
        asm!(
            "mov {tmp:r}, rbx",
            "cpuid",
            "xchg {tmp:r}, rbx",
            tmp = out(reg) ebx,
            inout("eax") leaf => eax,
            inout("ecx") 0u32 => ecx,
            out("edx") edx,
            options(nomem, nostack, preserves_flags),
        )
    }
    (eax, ebx, ecx, edx)
}

/// Initial APIC id of the executing CPU (CPUID.1:EBX[31:24]).
pub fn apic_id() -> u32 {
    cpuid(1).1 >> 24
}

#[inline(always)]
pub fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: reads the time-stamp counter (CR4.TSD is clear: the VMM sets only PAE).
    unsafe { asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags)) }
    (hi as u64) << 32 | lo as u64
}

/// TSC ticks in a second at the slowest TSC the probe assumes (1 GHz). Real
/// TSCs run at 1-5 GHz, so a wait of N such "seconds" lasts N/5..N seconds,
/// whether the guest runs natively (hardware virtualization) or emulated (this
/// machine: ~1 us per instruction, where an iteration count would mean a wait
/// a thousand times longer).
pub const TSC_SECOND: u64 = 1_000_000_000;

/// Busy-waits `ticks` TSC ticks.
pub fn delay_tsc(ticks: u64) {
    let start = rdtsc();
    while rdtsc().wrapping_sub(start) < ticks {}
}

/// Stops this CPU for good: interrupts off, halt, and halt again if woken.
pub fn halt_forever() -> ! {
    loop {
        // SAFETY: no memory effects.
        unsafe { asm!("cli", "hlt", options(nomem, nostack)) }
    }
}
