//! Boot-time MSR values. Never assume an MSR exists: each is written only when it is in
//! KVM_GET_MSR_INDEX_LIST, and the count KVM_SET_MSRS returns is checked.
use kvm_bindings::kvm_msr_entry;

pub const MSR_IA32_TSC: u32 = 0x10;
pub const MSR_IA32_SYSENTER_CS: u32 = 0x174;
pub const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
pub const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
pub const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
pub const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
pub const MSR_STAR: u32 = 0xc000_0081;
pub const MSR_LSTAR: u32 = 0xc000_0082;
pub const MSR_CSTAR: u32 = 0xc000_0083;
pub const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
pub const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
pub const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;

const MISC_ENABLE_FAST_STRING: u64 = 1;
const MTRR_ENABLE: u64 = 1 << 11;
const MTRR_MEM_TYPE_WB: u64 = 6;

/// The MSRs a freshly booted x86_64 CPU should present, as (index, value).
pub fn boot_msr_values() -> [(u32, u64); 11] {
    [
        (MSR_IA32_SYSENTER_CS, 0),
        (MSR_IA32_SYSENTER_ESP, 0),
        (MSR_IA32_SYSENTER_EIP, 0),
        (MSR_STAR, 0),
        (MSR_CSTAR, 0),
        (MSR_KERNEL_GS_BASE, 0),
        (MSR_SYSCALL_MASK, 0),
        (MSR_LSTAR, 0),
        (MSR_IA32_TSC, 0),
        (MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        (MSR_MTRR_DEF_TYPE, MTRR_ENABLE | MTRR_MEM_TYPE_WB),
    ]
}

/// Keep only the MSRs the host's KVM supports; the rest are reported so callers can log them.
pub fn filter_supported(
    wanted: &[(u32, u64)],
    supported: &[u32],
) -> (Vec<kvm_msr_entry>, Vec<u32>) {
    let mut entries = Vec::new();
    let mut skipped = Vec::new();
    for &(index, data) in wanted {
        if supported.contains(&index) {
            entries.push(kvm_msr_entry {
                index,
                data,
                ..Default::default()
            });
        } else {
            skipped.push(index);
        }
    }
    (entries, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_msrs_are_dropped_not_assumed() {
        let wanted = boot_msr_values();
        let supported = [MSR_STAR, MSR_IA32_TSC, 0x1234];
        let (entries, skipped) = filter_supported(&wanted, &supported);
        let idx: Vec<u32> = entries.iter().map(|e| e.index).collect();
        assert_eq!(idx, vec![MSR_STAR, MSR_IA32_TSC]);
        assert_eq!(skipped.len(), wanted.len() - 2);
        assert!(skipped.contains(&MSR_IA32_MISC_ENABLE));
    }
}
