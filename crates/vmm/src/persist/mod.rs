//! `VmState`: the one description of a paused VM that branch, snapshot and restore share.
//!
//! On disk it is a small header (magic, format version, host CPU identity, payload
//! length, SHA-256 of the payload) followed by the bincode-encoded state. Guest memory is
//! not part of it: branch children inherit memory through fork(2), snapshots store it in
//! a separate file.
use std::io::{Read, Write};

use kvm_bindings::{
    kvm_clock_data, kvm_cpuid_entry2, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state,
    kvm_msr_entry, kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub mod cpu_identity;
pub mod snapshot_files;
pub use cpu_identity::CpuIdentity;

/// Bumped whenever the encoding of [`VmState`] changes incompatibly.
pub const FORMAT_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"ZYGOTEVM";

/// One vCPU's architectural and KVM state.
#[derive(Clone, Serialize, Deserialize)]
pub struct VcpuState {
    pub index: u8,
    pub cpuid: Vec<kvm_cpuid_entry2>,
    pub mp_state: kvm_mp_state,
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    /// The XSAVE area as 32-bit words (4 KiB legacy area, more with KVM_CAP_XSAVE2).
    pub xsave: Vec<u32>,
    pub xcrs: Option<kvm_xcrs>,
    pub debugregs: kvm_debugregs,
    pub lapic: kvm_lapic_state,
    /// In restore order: IA32_TSC before IA32_TSC_DEADLINE (the deadline is relative to it).
    pub msrs: Vec<kvm_msr_entry>,
    pub events: kvm_vcpu_events,
}

/// VM-wide interrupt controllers and clocks.
#[derive(Clone, Serialize, Deserialize)]
pub struct VmPlatformState {
    pub pic_master: kvm_irqchip,
    pub pic_slave: kvm_irqchip,
    pub ioapic: kvm_irqchip,
    pub pit: kvm_pit_state2,
    pub clock: kvm_clock_data,
}

/// Guest RAM layout (the bytes live elsewhere).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryLayout {
    pub mem_mib: u64,
    /// (guest-physical address, size) per range, in order.
    pub ranges: Vec<(u64, u64)>,
}

impl MemoryLayout {
    pub fn total_bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.1).sum()
    }
}

/// Device state the VMM restores.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct DevicesState {
    /// virtio devices in window order (VmConfig.virtio_devices order at boot).
    pub virtio: Vec<crate::devices::virtio::persist::VirtioDeviceState>,
}

/// Everything needed to rebuild a paused VM over its memory.
#[derive(Clone, Serialize, Deserialize)]
pub struct VmState {
    pub memory: MemoryLayout,
    pub platform: VmPlatformState,
    pub vcpus: Vec<VcpuState>,
    pub devices: DevicesState,
    /// The command line the VM booted with (for diagnostics and for re-creating devices).
    pub cmdline: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("I/O error on VM state: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a zygote VM state file (bad magic)")]
    BadMagic,
    #[error("VM state format version {found} is not supported (this zygote reads version {FORMAT_VERSION})")]
    Version { found: u32 },
    #[error("VM state checksum mismatch: the file is corrupt or truncated")]
    Checksum,
    #[error("VM state was saved on an incompatible CPU: saved on {saved}, this host is {host}")]
    IncompatibleCpu { saved: String, host: String },
    #[error("VM state encoding failed: {0}")]
    Encode(String),
    #[error("VM state is too large ({0} bytes)")]
    TooLarge(u64),
}

/// Largest state payload we accept when reading (a few vCPUs need ~100 KiB).
const MAX_PAYLOAD: u64 = 64 << 20;

impl VmState {
    /// Serialize with header and checksum.
    pub fn write_to(&self, out: &mut impl Write, cpu: &CpuIdentity) -> Result<(), PersistError> {
        let payload = bincode::serialize(self).map_err(|e| PersistError::Encode(e.to_string()))?;
        let cpu_bytes = bincode::serialize(cpu).map_err(|e| PersistError::Encode(e.to_string()))?;
        out.write_all(MAGIC)?;
        out.write_all(&FORMAT_VERSION.to_le_bytes())?;
        out.write_all(&(cpu_bytes.len() as u32).to_le_bytes())?;
        out.write_all(&cpu_bytes)?;
        out.write_all(&(payload.len() as u64).to_le_bytes())?;
        out.write_all(&Sha256::digest(&payload))?;
        out.write_all(&payload)?;
        Ok(())
    }

    /// Parse, verify the checksum, and refuse state from an incompatible CPU.
    pub fn read_from(input: &mut impl Read, host: &CpuIdentity) -> Result<Self, PersistError> {
        let mut magic = [0u8; 8];
        input.read_exact(&mut magic)?;
        if &magic != MAGIC {
            return Err(PersistError::BadMagic);
        }
        let mut u32b = [0u8; 4];
        input.read_exact(&mut u32b)?;
        let version = u32::from_le_bytes(u32b);
        if version != FORMAT_VERSION {
            return Err(PersistError::Version { found: version });
        }
        input.read_exact(&mut u32b)?;
        let cpu_len = u32::from_le_bytes(u32b) as usize;
        if cpu_len > 4096 {
            return Err(PersistError::TooLarge(cpu_len as u64));
        }
        let mut cpu_bytes = vec![0u8; cpu_len];
        input.read_exact(&mut cpu_bytes)?;
        let saved: CpuIdentity =
            bincode::deserialize(&cpu_bytes).map_err(|_| PersistError::Checksum)?;
        let mut u64b = [0u8; 8];
        input.read_exact(&mut u64b)?;
        let len = u64::from_le_bytes(u64b);
        if len > MAX_PAYLOAD {
            return Err(PersistError::TooLarge(len));
        }
        let mut digest = [0u8; 32];
        input.read_exact(&mut digest)?;
        let mut payload = vec![0u8; len as usize];
        input
            .read_exact(&mut payload)
            .map_err(|_| PersistError::Checksum)?;
        if Sha256::digest(&payload).as_slice() != digest {
            return Err(PersistError::Checksum);
        }
        if !saved.compatible_with(host) {
            return Err(PersistError::IncompatibleCpu {
                saved: saved.to_string(),
                host: host.to_string(),
            });
        }
        bincode::deserialize(&payload).map_err(|_| PersistError::Checksum)
    }
}

#[cfg(test)]
mod tests;
