//! Which CPU a VM state was captured on. Restoring on a different vendor or family/model
//! would hand the guest CPUID and MSR values that host cannot honour.
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuIdentity {
    pub vendor: String,
    pub family: u32,
    pub model: u32,
}

impl CpuIdentity {
    /// The host CPU, from the CPUID instruction.
    pub fn host() -> Self {
        let leaf0 = core::arch::x86_64::__cpuid(0);
        let mut vendor = Vec::with_capacity(12);
        for r in [leaf0.ebx, leaf0.edx, leaf0.ecx] {
            vendor.extend_from_slice(&r.to_le_bytes());
        }
        let leaf1 = core::arch::x86_64::__cpuid(1);
        Self::from_signature(String::from_utf8_lossy(&vendor).into_owned(), leaf1.eax)
    }

    /// Decode family/model from CPUID.1:EAX the way the SDM defines the extended fields.
    pub fn from_signature(vendor: String, eax: u32) -> Self {
        let base_family = (eax >> 8) & 0xf;
        let base_model = (eax >> 4) & 0xf;
        let family = if base_family == 0xf {
            base_family + ((eax >> 20) & 0xff)
        } else {
            base_family
        };
        let model = if base_family == 0x6 || base_family == 0xf {
            base_model | (((eax >> 16) & 0xf) << 4)
        } else {
            base_model
        };
        Self {
            vendor,
            family,
            model,
        }
    }

    pub fn compatible_with(&self, host: &CpuIdentity) -> bool {
        self == host
    }
}

impl std::fmt::Display for CpuIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} family {:#x} model {:#x}",
            self.vendor, self.family, self.model
        )
    }
}
