//! zygote's probe guest: a freestanding x86_64 program the VMM boots exactly like
//! a vmlinux (64-bit Linux boot protocol). It checks what the boot path set up,
//! runs the scenario named on the command line, reports on COM1 and in the
//! mailbox page, and exits by asking the i8042 for a CPU reset.
//! See README.md for the contract with the VMM.
#![no_std]
#![no_main]

mod arch;
mod bootparams;
mod checks;
mod cmdline;
mod mailbox;
mod scenarios;
mod serial;
mod virtio;

use checks::Fail;
use serial::Hex;
use zygote_probe_abi::{
    REPORT_FAIL_PREFIX, REPORT_OK, RESET_PORT, RESET_VALUE, STATUS_FAIL, STATUS_OK,
};

// Entry: 64-bit mode, CPL0, interrupts off, rsi = zero page, no usable stack.
// Only the first vCPU to arrive may proceed: a VMM that wrongly started APs at
// the entry would otherwise run them on the same stack. Late arrivals record
// their APIC id in the mailbox (the boot checks report it) and halt.
// The winner sets its own stack, zeroes .bss (loaders may leave p_memsz >
// p_filesz to fresh, hopefully zero, RAM), clears DF as the SysV ABI requires,
// and calls Rust.
core::arch::global_asm!(
    ".section .text.entry, \"ax\"",
    ".global _start",
    "_start:",
    "cld",
    "mov eax, 1",
    "xchg qword ptr [rip + {taken}], rax", // xchg with memory is always locked
    "test rax, rax",
    "jnz 5f",
    "lea rsp, [rip + __stack_top]",
    "lea rdi, [rip + __bss_start]",
    "lea rcx, [rip + __bss_end]",
    "xor eax, eax",
    "2:",
    "cmp rdi, rcx",
    "jae 3f",
    "mov qword ptr [rdi], rax",
    "add rdi, 8",
    "jmp 2b",
    "3:",
    "mov rdi, rsi",
    "xor ebp, ebp",
    "call {main}",
    "jmp 6f",
    "5:",
    "mov eax, 1",
    "cpuid",
    "shr ebx, 24",
    "cmp ebx, 64",
    "jae 6f",
    "mov ecx, ebx",
    "mov eax, 1",
    "shl rax, cl",
    "lock or qword ptr [{extra}], rax",
    "6:",
    "cli",
    "hlt",
    "jmp 6b",
    taken = sym ENTRY_TAKEN,
    main = sym probe_main,
    extra = const zygote_probe_abi::MAILBOX_GPA + zygote_probe_abi::MAILBOX_OFF_SCRATCH
        + 8 * zygote_probe_abi::SCRATCH_EXTRA_ENTRY as u64,
);

/// Set by the first vCPU through the entry point. In .data, not .bss: it must
/// be zero before any code has run.
#[no_mangle]
#[used]
#[link_section = ".data.entry_taken"]
static mut ENTRY_TAKEN: u64 = 0;

#[no_mangle]
extern "C" fn probe_main(zero_page: *const u8) -> ! {
    // The mailbox goes first so the host sees the probe started even if the
    // very first check fails.
    mailbox::init();
    say!("PROBE START");
    let info = match checks::run(zero_page as u64) {
        Ok(info) => info,
        Err(f) => finish_fail(f),
    };
    let Some(scenario) = scenarios::find(info.scenario) else {
        say!("info unknown scenario ", info.scenario);
        finish_fail(checks::fail("scenario", "unknown probe.scenario"))
    };
    say!("scenario ", scenario.name);
    match (scenario.run)(&info) {
        Ok(()) => {
            mailbox::set_status(STATUS_OK);
            say!(REPORT_OK);
            reset()
        }
        Err(f) => finish_fail(f),
    }
}

fn finish_fail(f: Fail) -> ! {
    mailbox::set_status(STATUS_FAIL);
    match f.value {
        Some(v) => say!(REPORT_FAIL_PREFIX, f.check, ": ", f.what, " ", Hex(v)),
        None => say!(REPORT_FAIL_PREFIX, f.check, ": ", f.what),
    }
    reset()
}

/// The clean exit: the VMM treats an i8042 reset request as "guest finished".
fn reset() -> ! {
    arch::outb(RESET_PORT, RESET_VALUE);
    arch::halt_forever()
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    mailbox::set_status(STATUS_FAIL);
    match info.location() {
        Some(l) => say!(REPORT_FAIL_PREFIX, "panic: at ", l.file(), ":", l.line()),
        None => say!(REPORT_FAIL_PREFIX, "panic"),
    }
    reset()
}
