//! Per-vCPU CPUID: start from KVM_GET_SUPPORTED_CPUID and make the topology leaves tell
//! each vCPU who it is (APIC id) and how many siblings it has.
use kvm_bindings::{kvm_cpuid_entry2, CpuId};

const LEAF_FEATURES: u32 = 0x1;
const LEAF_CACHE_PARAMS: u32 = 0x4;
const LEAF_PERFMON: u32 = 0xa;
const LEAF_EXT_TOPOLOGY: u32 = 0xb;
const LEAF_V2_EXT_TOPOLOGY: u32 = 0x1f;

const ECX_TSC_DEADLINE: u32 = 1 << 24;
const ECX_HYPERVISOR: u32 = 1 << 31;
const EDX_HTT: u32 = 1 << 28;

/// Inputs that differ per vCPU or per host.
#[derive(Debug, Clone, Copy)]
pub struct CpuidParams {
    pub vcpu_index: u8,
    pub num_vcpus: u8,
    /// KVM_CAP_TSC_DEADLINE_TIMER: the in-kernel LAPIC can emulate it.
    pub tsc_deadline: bool,
}

/// Adjust one vCPU's entries in place.
pub fn normalize(entries: &mut [kvm_cpuid_entry2], p: CpuidParams) {
    for e in entries.iter_mut() {
        match e.function {
            LEAF_FEATURES => {
                // EBX[31:24] initial APIC id, [23:16] logical processors per package.
                e.ebx = (e.ebx & 0x0000_ffff)
                    | (u32::from(p.vcpu_index) << 24)
                    | (u32::from(p.num_vcpus) << 16);
                e.ecx |= ECX_HYPERVISOR;
                if p.tsc_deadline {
                    e.ecx |= ECX_TSC_DEADLINE;
                } else {
                    e.ecx &= !ECX_TSC_DEADLINE;
                }
                if p.num_vcpus > 1 {
                    e.edx |= EDX_HTT;
                } else {
                    e.edx &= !EDX_HTT;
                }
            }
            LEAF_CACHE_PARAMS => {
                // EAX[31:26]: cores per package - 1 (one core per vCPU, one thread each).
                e.eax = (e.eax & 0x03ff_ffff) | (u32::from(p.num_vcpus.saturating_sub(1)) << 26);
                // EAX[25:14]: logical processors sharing this cache - 1: keep caches private.
                e.eax &= !(0xfff << 14);
            }
            LEAF_PERFMON => {
                // No virtual PMU: a guest must not program counters we do not save/restore.
                e.eax = 0;
                e.ebx = 0;
                e.ecx = 0;
                e.edx = 0;
            }
            LEAF_EXT_TOPOLOGY | LEAF_V2_EXT_TOPOLOGY => {
                // EDX: x2APIC id of this logical processor, on every subleaf.
                e.edx = u32::from(p.vcpu_index);
                match e.index {
                    0 => {
                        // SMT level: one thread per core.
                        e.eax = 0;
                        e.ebx = 1;
                        e.ecx = (1 << 8) | e.index;
                    }
                    1 => {
                        // Core level: all vCPUs in one package.
                        e.eax = 32 - u32::from(p.num_vcpus).saturating_sub(1).leading_zeros();
                        e.ebx = u32::from(p.num_vcpus);
                        e.ecx = (2 << 8) | e.index;
                    }
                    _ => {
                        e.eax = 0;
                        e.ebx = 0;
                        e.ecx = e.index;
                    }
                }
            }
            _ => {}
        }
    }
}

/// Clone `supported` and normalize it for one vCPU.
pub fn for_vcpu(supported: &CpuId, p: CpuidParams) -> CpuId {
    let mut cpuid = supported.clone();
    normalize(cpuid.as_mut_slice(), p);
    cpuid
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            ebx: 0x0000_0800,
            eax: 0xffff_ffff,
            ecx: 0,
            edx: 0,
            ..Default::default()
        }
    }

    #[test]
    fn leaf1_carries_apic_id_and_count() {
        let mut e = vec![entry(1, 0)];
        normalize(
            &mut e,
            CpuidParams {
                vcpu_index: 3,
                num_vcpus: 4,
                tsc_deadline: false,
            },
        );
        assert_eq!(e[0].ebx >> 24, 3);
        assert_eq!((e[0].ebx >> 16) & 0xff, 4);
        assert_eq!(e[0].ebx & 0xffff, 0x0800, "CLFLUSH size preserved");
        assert_ne!(e[0].ecx & ECX_HYPERVISOR, 0);
        assert_eq!(e[0].ecx & ECX_TSC_DEADLINE, 0);
        assert_ne!(e[0].edx & EDX_HTT, 0);
    }

    #[test]
    fn topology_leaf_and_pmu() {
        let mut e = vec![entry(0xb, 0), entry(0xb, 1), entry(0xa, 0)];
        normalize(
            &mut e,
            CpuidParams {
                vcpu_index: 1,
                num_vcpus: 2,
                tsc_deadline: true,
            },
        );
        assert_eq!((e[0].edx, e[0].ebx, e[0].ecx >> 8), (1, 1, 1));
        assert_eq!((e[1].edx, e[1].ebx, e[1].eax, e[1].ecx >> 8), (1, 2, 1, 2));
        assert_eq!((e[2].eax, e[2].ebx, e[2].ecx, e[2].edx), (0, 0, 0, 0));
    }

    #[test]
    fn single_vcpu_has_no_htt() {
        let mut e = vec![entry(1, 0), entry(4, 0)];
        normalize(
            &mut e,
            CpuidParams {
                vcpu_index: 0,
                num_vcpus: 1,
                tsc_deadline: true,
            },
        );
        assert_eq!(e[0].edx & EDX_HTT, 0);
        assert_ne!(e[0].ecx & ECX_TSC_DEADLINE, 0);
        assert_eq!(e[1].eax >> 26, 0);
    }
}
