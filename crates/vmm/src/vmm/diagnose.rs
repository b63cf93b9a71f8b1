//! "Why is this guest stuck?": a readable dump of a live VM's state. Per vCPU the
//! registers, the interrupt state (RFLAGS.IF, pending/injected events, LAPIC
//! TPR/ISR/IRR and timer), per IOAPIC pin in use its routing, and per virtio device its
//! interrupt status and each queue's ring positions as the device and the guest see them
//! (a used index the guest never caught up with, with the interrupt acknowledged, is a
//! lost interrupt; an available index the device never caught up with is a lost kick).
//!
//! The VM is captured exactly as a snapshot or branch would capture it (vCPUs parked
//! outside KVM_RUN, devices quiescent), then resumed if it was running.
use std::fmt::Write;

use kvm_bindings::kvm_lapic_state;
use vm_memory::{Bytes, GuestAddress};

use super::{Vmm, VmmError};
use crate::arch::layout::{IOAPIC_PINS, VIRTIO_FIRST_IRQ};
use crate::memory::GuestMemoryMmap;
use crate::persist::{VcpuState, VmState};

// LAPIC register offsets (Intel SDM vol. 3, table 11-1).
const APIC_TPR: usize = 0x80;
const APIC_PPR: usize = 0xa0;
const APIC_SPIV: usize = 0xf0;
const APIC_ISR: usize = 0x100;
const APIC_IRR: usize = 0x200;
const APIC_LVTT: usize = 0x320;
const APIC_TMICT: usize = 0x380;

fn apic_reg(lapic: &kvm_lapic_state, offset: usize) -> u32 {
    let b = |i: usize| lapic.regs[offset + i] as u8;
    u32::from_le_bytes([b(0), b(1), b(2), b(3)])
}

/// Vectors set in a 256-bit LAPIC register bank (ISR, IRR): eight 32-bit words, 16 bytes apart.
fn apic_vectors(lapic: &kvm_lapic_state, base: usize) -> Vec<u8> {
    (0..8)
        .flat_map(|w| {
            let word = apic_reg(lapic, base + w * 0x10);
            (0..32)
                .filter(move |b| word & (1 << b) != 0)
                .map(move |b| (w * 32 + b) as u8)
        })
        .collect()
}

fn hex_list(v: &[u8]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    v.iter()
        .map(|x| format!("{x:#04x}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn describe_vcpu(out: &mut String, v: &VcpuState) {
    let r = &v.regs;
    let s = &v.sregs;
    let e = &v.events;
    let _ = writeln!(
        out,
        "vCPU {}: mp_state {} rip={:#x} rsp={:#x} rflags={:#x} (IF={}) cr0={:#x} cr3={:#x} \
         cr4={:#x} efer={:#x} cs={:#x} (dpl {})",
        v.index,
        v.mp_state.mp_state,
        r.rip,
        r.rsp,
        r.rflags,
        (r.rflags >> 9) & 1,
        s.cr0,
        s.cr3,
        s.cr4,
        s.efer,
        s.cs.selector,
        s.cs.dpl,
    );
    let _ = writeln!(
        out,
        "  events: exception injected={} pending={} nr={}; interrupt injected={} nr={:#x} \
         shadow={}; nmi injected={} pending={} masked={}",
        e.exception.injected,
        e.exception.pending,
        e.exception.nr,
        e.interrupt.injected,
        e.interrupt.nr,
        e.interrupt.shadow,
        e.nmi.injected,
        e.nmi.pending,
        e.nmi.masked,
    );
    let l = &v.lapic;
    let lvtt = apic_reg(l, APIC_LVTT);
    let _ = writeln!(
        out,
        "  lapic: tpr={:#x} ppr={:#x} spiv={:#x} isr=[{}] irr=[{}] timer lvt={:#x} (vector \
         {:#x}, mode {}, masked {}) tmict={}",
        apic_reg(l, APIC_TPR),
        apic_reg(l, APIC_PPR),
        apic_reg(l, APIC_SPIV),
        hex_list(&apic_vectors(l, APIC_ISR)),
        hex_list(&apic_vectors(l, APIC_IRR)),
        lvtt,
        lvtt & 0xff,
        ["one-shot", "periodic", "tsc-deadline", "reserved"][((lvtt >> 17) & 3) as usize],
        (lvtt >> 16) & 1,
        apic_reg(l, APIC_TMICT),
    );
}

fn ring_idx(mem: &GuestMemoryMmap, ring: u64) -> String {
    // Both rings start with le16 flags, then le16 idx.
    match mem.read_obj::<u16>(GuestAddress(ring + 2)) {
        Ok(i) => u16::from_le(i).to_string(),
        Err(_) => "?".into(),
    }
}

/// The dump of a captured `state`; `mem` is read for the guest's side of each ring.
pub fn describe(state: &VmState, mem: &GuestMemoryMmap) -> String {
    let mut out = String::new();
    for v in &state.vcpus {
        describe_vcpu(&mut out, v);
    }
    // SAFETY: the IOAPIC member is the one KVM_GET_IRQCHIP(KVM_IRQCHIP_IOAPIC) fills.
    let ioapic = unsafe { state.platform.ioapic.chip.ioapic };
    let _ = writeln!(out, "ioapic: irr={:#x}", ioapic.irr);
    for (i, dev) in state.devices.virtio.iter().enumerate() {
        let pin = VIRTIO_FIRST_IRQ as usize + i;
        let virtio = dev.device.virtio();
        let route = if pin < IOAPIC_PINS as usize {
            // SAFETY: redirection entries are plain u64 bit fields.
            let bits = unsafe { ioapic.redirtbl[pin].bits };
            format!(
                "vector {:#x} {} remote_irr={} masked={}",
                bits & 0xff,
                if bits & (1 << 15) != 0 {
                    "level"
                } else {
                    "edge"
                },
                (bits >> 14) & 1,
                (bits >> 16) & 1
            )
        } else {
            "-".into()
        };
        let _ = writeln!(
            out,
            "virtio {i} (type {}): status {:#x}, interrupt status {:#x}, irq {pin}: {route}",
            virtio.device_type, dev.transport.device_status, dev.transport.interrupt_status,
        );
        for (q, qs) in virtio.queues.iter().enumerate().filter(|(_, q)| q.ready) {
            let _ = writeln!(
                out,
                "  queue {q}: size {} avail idx {} (device next {}), used idx {} (device next {})",
                qs.size,
                ring_idx(mem, qs.avail_ring),
                qs.next_avail,
                ring_idx(mem, qs.used_ring),
                qs.next_used,
            );
        }
    }
    out
}

impl Vmm {
    /// Capture and describe the VM (see the module doc); a running VM runs on after.
    pub fn diagnose(&mut self) -> Result<String, VmmError> {
        let was_paused = self.paused;
        let state = self.pause_and_capture()?;
        let text = describe(&state, self.ram.memory());
        if !was_paused {
            self.resume()?;
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lapic_banks_decode_to_vectors() {
        let mut l = kvm_lapic_state::default();
        // Vector 0xec (word 7, bit 12) in ISR, vectors 0x21 and 0x30 in IRR.
        l.regs[APIC_ISR + 7 * 0x10 + 1] = 0x10;
        l.regs[APIC_IRR + 0x10] = 0x02;
        l.regs[APIC_IRR + 0x10 + 2] = 0x01;
        assert_eq!(apic_vectors(&l, APIC_ISR), vec![0xec]);
        assert_eq!(apic_vectors(&l, APIC_IRR), vec![0x21, 0x30]);
        assert_eq!(hex_list(&apic_vectors(&l, APIC_IRR)), "0x21,0x30");
        assert_eq!(hex_list(&[]), "-");
    }
}
