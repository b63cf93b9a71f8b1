//! Reading and writing the KVM state that `VmState` describes. Restore follows the order
//! KVM requires: CPUID → MP state → regs → sregs → xsave → xcrs → debugregs → LAPIC →
//! MSRs → vcpu events; platform: irqchips → PIT → clock.
use kvm_bindings::{
    kvm_clock_data, kvm_irqchip, kvm_msr_entry, kvm_xsave, CpuId, Msrs, Xsave, KVM_IRQCHIP_IOAPIC,
    KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_MAX_CPUID_ENTRIES,
};
use kvm_ioctls::{VcpuFd, VmFd};

use crate::arch::msr::{MSR_IA32_TSC, MSR_IA32_TSC_DEADLINE};
use crate::persist::{VcpuState, VmPlatformState};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{op} failed: {source}")]
    Ioctl {
        op: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("KVM_SET_MSRS restored {set} of {wanted} MSRs; MSR {failed:#x} was refused")]
    MsrRefused {
        set: usize,
        wanted: usize,
        failed: u32,
    },
    #[error("saved state has {saved} vCPUs, the VM has {vm}")]
    VcpuCount { saved: usize, vm: usize },
    #[error("bad saved state: {0}")]
    Invalid(String),
}

fn ioctl(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> StateError {
    move |source| StateError::Ioctl { op, source }
}

/// How a host's KVM exchanges XSAVE state.
#[derive(Debug, Clone, Copy)]
pub struct XsaveFormat {
    /// KVM_CAP_XSAVE2 size in bytes; 0 or ≤ 4096 means the legacy KVM_GET_XSAVE.
    pub xsave2_size: usize,
}

impl XsaveFormat {
    fn fam_len(&self) -> Option<usize> {
        let base = std::mem::size_of::<kvm_xsave>();
        (self.xsave2_size > base).then(|| (self.xsave2_size - base).div_ceil(4))
    }
}

/// Order MSRs so that IA32_TSC is restored before IA32_TSC_DEADLINE, whose value is
/// interpreted against the TSC.
pub fn order_msrs_for_restore(indices: &mut [u32]) {
    indices.sort_by_key(|&i| match i {
        MSR_IA32_TSC => 0,
        MSR_IA32_TSC_DEADLINE => 2,
        _ => 1,
    });
}

/// A KVM_GET_MSRS request for `indices`.
fn msr_query(indices: &[u32]) -> Result<Msrs, StateError> {
    let entries: Vec<kvm_msr_entry> = indices
        .iter()
        .map(|&index| kvm_msr_entry {
            index,
            ..Default::default()
        })
        .collect();
    Msrs::from_entries(&entries).map_err(|e| StateError::Invalid(e.to_string()))
}

/// The MSRs of `candidates` this vCPU can actually read, in restore order. Called once per
/// VM: hosts list MSRs in KVM_GET_MSR_INDEX_LIST that they then refuse.
pub fn saveable_msrs(fd: &VcpuFd, candidates: &[u32]) -> Vec<u32> {
    let mut list: Vec<u32> = candidates.to_vec();
    order_msrs_for_restore(&mut list);
    loop {
        let Ok(mut msrs) = msr_query(&list) else {
            return Vec::new();
        };
        match fd.get_msrs(&mut msrs) {
            Ok(n) if n == list.len() => return list,
            // KVM stops at the first MSR it cannot read: drop it and try again.
            Ok(n) => {
                list.remove(n);
            }
            Err(_) => return Vec::new(),
        }
    }
}

/// Capture one vCPU. It must be outside KVM_RUN (paused).
pub fn capture_vcpu(
    fd: &VcpuFd,
    index: u8,
    msr_indices: &[u32],
    xsave: XsaveFormat,
    has_xcrs: bool,
) -> Result<VcpuState, StateError> {
    let mp_state = fd.get_mp_state().map_err(ioctl("KVM_GET_MP_STATE"))?;
    let regs = fd.get_regs().map_err(ioctl("KVM_GET_REGS"))?;
    let sregs = fd.get_sregs().map_err(ioctl("KVM_GET_SREGS"))?;
    let xsave_words = match xsave.fam_len() {
        Some(fam) => {
            let mut x = Xsave::new(fam).map_err(|e| StateError::Invalid(e.to_string()))?;
            // SAFETY: `x` was sized from KVM_CAP_XSAVE2.
            unsafe { fd.get_xsave2(&mut x) }.map_err(ioctl("KVM_GET_XSAVE2"))?;
            let mut words = x.as_fam_struct_ref().xsave.region.to_vec();
            words.extend_from_slice(x.as_slice());
            words
        }
        None => fd
            .get_xsave()
            .map_err(ioctl("KVM_GET_XSAVE"))?
            .region
            .to_vec(),
    };
    let xcrs = if has_xcrs {
        Some(fd.get_xcrs().map_err(ioctl("KVM_GET_XCRS"))?)
    } else {
        None
    };
    let debugregs = fd.get_debug_regs().map_err(ioctl("KVM_GET_DEBUGREGS"))?;
    let lapic = fd.get_lapic().map_err(ioctl("KVM_GET_LAPIC"))?;
    let mut msrs = msr_query(msr_indices)?;
    let read = fd.get_msrs(&mut msrs).map_err(ioctl("KVM_GET_MSRS"))?;
    if read != msr_indices.len() {
        return Err(StateError::Invalid(format!(
            "KVM_GET_MSRS read {read} of {} MSRs",
            msr_indices.len()
        )));
    }
    let events = fd.get_vcpu_events().map_err(ioctl("KVM_GET_VCPU_EVENTS"))?;
    let cpuid = fd
        .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
        .map_err(ioctl("KVM_GET_CPUID2"))?
        .as_slice()
        .to_vec();
    Ok(VcpuState {
        index,
        cpuid,
        mp_state,
        regs,
        sregs,
        xsave: xsave_words,
        xcrs,
        debugregs,
        lapic,
        msrs: msrs.as_slice().to_vec(),
        events,
    })
}

/// Restore one freshly created vCPU.
pub fn restore_vcpu(fd: &VcpuFd, st: &VcpuState, xsave: XsaveFormat) -> Result<(), StateError> {
    let cpuid =
        CpuId::from_entries(&st.cpuid).map_err(|e| StateError::Invalid(format!("{e:?}")))?;
    fd.set_cpuid2(&cpuid).map_err(ioctl("KVM_SET_CPUID2"))?;
    fd.set_mp_state(st.mp_state)
        .map_err(ioctl("KVM_SET_MP_STATE"))?;
    fd.set_regs(&st.regs).map_err(ioctl("KVM_SET_REGS"))?;
    fd.set_sregs(&st.sregs).map_err(ioctl("KVM_SET_SREGS"))?;
    match xsave.fam_len() {
        Some(fam) => {
            let mut x = Xsave::new(fam).map_err(|e| StateError::Invalid(e.to_string()))?;
            let (head, tail) = st.xsave.split_at(st.xsave.len().min(1024));
            // SAFETY: the FAM struct's header is plain data we own.
            unsafe { x.as_mut_fam_struct() }.xsave.region[..head.len()].copy_from_slice(head);
            let n = tail.len().min(x.as_slice().len());
            x.as_mut_slice()[..n].copy_from_slice(&tail[..n]);
            // SAFETY: `x` was sized from KVM_CAP_XSAVE2.
            unsafe { fd.set_xsave2(&x) }.map_err(ioctl("KVM_SET_XSAVE2"))?;
        }
        None => {
            let mut x = kvm_xsave::default();
            let n = st.xsave.len().min(x.region.len());
            x.region[..n].copy_from_slice(&st.xsave[..n]);
            // SAFETY: a legacy 4 KiB kvm_xsave, which KVM_SET_XSAVE expects.
            unsafe { fd.set_xsave(&x) }.map_err(ioctl("KVM_SET_XSAVE"))?;
        }
    }
    if let Some(xcrs) = &st.xcrs {
        fd.set_xcrs(xcrs).map_err(ioctl("KVM_SET_XCRS"))?;
    }
    fd.set_debug_regs(&st.debugregs)
        .map_err(ioctl("KVM_SET_DEBUGREGS"))?;
    fd.set_lapic(&st.lapic).map_err(ioctl("KVM_SET_LAPIC"))?;
    let msrs = Msrs::from_entries(&st.msrs).map_err(|e| StateError::Invalid(e.to_string()))?;
    let set = fd.set_msrs(&msrs).map_err(ioctl("KVM_SET_MSRS"))?;
    if set != st.msrs.len() {
        return Err(StateError::MsrRefused {
            set,
            wanted: st.msrs.len(),
            failed: st.msrs[set].index,
        });
    }
    fd.set_vcpu_events(&st.events)
        .map_err(ioctl("KVM_SET_VCPU_EVENTS"))?;
    Ok(())
}

fn get_chip(vm: &VmFd, chip_id: u32) -> Result<kvm_irqchip, StateError> {
    let mut chip = kvm_irqchip {
        chip_id,
        ..Default::default()
    };
    vm.get_irqchip(&mut chip)
        .map_err(ioctl("KVM_GET_IRQCHIP"))?;
    Ok(chip)
}

/// Capture interrupt controllers, PIT and kvmclock.
pub fn capture_platform(vm: &VmFd) -> Result<VmPlatformState, StateError> {
    Ok(VmPlatformState {
        pic_master: get_chip(vm, KVM_IRQCHIP_PIC_MASTER)?,
        pic_slave: get_chip(vm, KVM_IRQCHIP_PIC_SLAVE)?,
        ioapic: get_chip(vm, KVM_IRQCHIP_IOAPIC)?,
        pit: vm.get_pit2().map_err(ioctl("KVM_GET_PIT2"))?,
        clock: vm.get_clock().map_err(ioctl("KVM_GET_CLOCK"))?,
    })
}

/// Restore platform state into a VM whose irqchip and PIT exist.
pub fn restore_platform(vm: &VmFd, st: &VmPlatformState) -> Result<(), StateError> {
    for chip in [&st.pic_master, &st.pic_slave, &st.ioapic] {
        vm.set_irqchip(chip).map_err(ioctl("KVM_SET_IRQCHIP"))?;
    }
    vm.set_pit2(&st.pit).map_err(ioctl("KVM_SET_PIT2"))?;
    // Only the clock value is restorable; the flags KVM reports (e.g. TSC_STABLE) are
    // read-only and rejected by KVM_SET_CLOCK.
    let clock = kvm_clock_data {
        clock: st.clock.clock,
        ..Default::default()
    };
    vm.set_clock(&clock).map_err(ioctl("KVM_SET_CLOCK"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsc_before_deadline() {
        let mut l = vec![MSR_IA32_TSC_DEADLINE, 0x174, MSR_IA32_TSC, 0xc000_0080];
        order_msrs_for_restore(&mut l);
        assert_eq!(l.first(), Some(&MSR_IA32_TSC));
        assert_eq!(l.last(), Some(&MSR_IA32_TSC_DEADLINE));
    }

    #[test]
    fn xsave_format_sizes() {
        assert_eq!(XsaveFormat { xsave2_size: 0 }.fam_len(), None);
        assert_eq!(XsaveFormat { xsave2_size: 4096 }.fam_len(), None);
        assert_eq!(
            XsaveFormat {
                xsave2_size: 4096 + 8
            }
            .fam_len(),
            Some(2)
        );
    }
}
