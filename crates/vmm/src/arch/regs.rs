//! Initial register state of the boot vCPU for the 64-bit Linux boot protocol, and the
//! local APIC wiring every vCPU needs.
use kvm_bindings::{kvm_fpu, kvm_lapic_state, kvm_regs, kvm_sregs};

use super::gdt::{self, CODE_INDEX, DATA_INDEX, TSS_INDEX};
use super::layout::{BOOT_STACK_POINTER, GDT_START, IDT_START, PML4_START, ZERO_PAGE_START};

const CR0_PE: u64 = 1 << 0;
const CR0_ET: u64 = 1 << 4;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// General-purpose registers: entry point, zero page in rsi, reserved rflags bit set.
pub fn boot_regs(entry: u64) -> kvm_regs {
    kvm_regs {
        rflags: 0x2,
        rip: entry,
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        rsi: ZERO_PAGE_START,
        ..Default::default()
    }
}

/// Segment and control registers for long mode over the boot GDT and identity tables.
/// Starts from the vCPU's current sregs so fields KVM owns (APIC base, interrupt bitmap)
/// keep their values.
pub fn boot_sregs(mut sregs: kvm_sregs) -> kvm_sregs {
    let table = gdt::boot_gdt();
    let code = gdt::segment_from_descriptor(table[CODE_INDEX as usize], CODE_INDEX);
    let data = gdt::segment_from_descriptor(table[DATA_INDEX as usize], DATA_INDEX);
    let tss = gdt::segment_from_descriptor(table[TSS_INDEX as usize], TSS_INDEX);
    sregs.gdt.base = GDT_START;
    sregs.gdt.limit = (std::mem::size_of_val(&table) - 1) as u16;
    sregs.idt.base = IDT_START;
    sregs.idt.limit = (std::mem::size_of::<u64>() - 1) as u16;
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = tss;
    sregs.cr0 = CR0_PE | CR0_ET | CR0_PG;
    sregs.cr3 = PML4_START;
    sregs.cr4 = CR4_PAE;
    sregs.efer = EFER_LME | EFER_LMA;
    sregs
}

/// x87/SSE control words as after FNINIT / reset.
pub fn boot_fpu() -> kvm_fpu {
    kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    }
}

const APIC_LVT_LINT0: usize = 0x350;
const APIC_LVT_LINT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

fn lapic_reg(state: &kvm_lapic_state, offset: usize) -> u32 {
    let b = &state.regs[offset..offset + 4];
    u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
}

fn set_lapic_reg(state: &mut kvm_lapic_state, offset: usize, value: u32) {
    for (i, byte) in value.to_le_bytes().iter().enumerate() {
        state.regs[offset + i] = *byte as _;
    }
}

fn with_delivery_mode(reg: u32, mode: u32) -> u32 {
    (reg & !0x700) | (mode << 8)
}

/// Route LINT0 to ExtINT (the legacy PIC) and LINT1 to NMI, as firmware would.
pub fn wire_lapic_lints(state: &mut kvm_lapic_state) {
    let lint0 = lapic_reg(state, APIC_LVT_LINT0);
    set_lapic_reg(
        state,
        APIC_LVT_LINT0,
        with_delivery_mode(lint0, APIC_MODE_EXTINT),
    );
    let lint1 = lapic_reg(state, APIC_LVT_LINT1);
    set_lapic_reg(
        state,
        APIC_LVT_LINT1,
        with_delivery_mode(lint1, APIC_MODE_NMI),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_mode_sregs() {
        let s = boot_sregs(kvm_sregs::default());
        assert_eq!(s.cr3, PML4_START);
        assert_ne!(s.cr0 & CR0_PG, 0);
        assert_ne!(s.cr4 & CR4_PAE, 0);
        assert_eq!(s.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!(s.cs.l, 1);
        assert_eq!(s.gdt.limit, 31);
    }

    #[test]
    fn regs_point_at_zero_page() {
        let r = boot_regs(0x100_0000);
        assert_eq!((r.rip, r.rsi, r.rflags), (0x100_0000, ZERO_PAGE_START, 2));
    }

    #[test]
    fn lints_get_extint_and_nmi() {
        let mut st = kvm_lapic_state::default();
        set_lapic_reg(&mut st, APIC_LVT_LINT0, 0x0001_0000); // masked bit stays
        wire_lapic_lints(&mut st);
        assert_eq!(lapic_reg(&st, APIC_LVT_LINT0), 0x0001_0700);
        assert_eq!(lapic_reg(&st, APIC_LVT_LINT1), 0x0000_0400);
    }
}
