//! The KVM VM object: open /dev/kvm with clear errors, register guest RAM, create the
//! in-kernel interrupt controllers and PIT.
use kvm_bindings::{
    kvm_pit_config, kvm_userspace_memory_region, CpuId, KVM_MAX_CPUID_ENTRIES,
    KVM_MEM_LOG_DIRTY_PAGES, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Cap, Kvm, VmFd};

use crate::arch::layout::{KVM_IDENTITY_MAP_ADDR, KVM_TSS_ADDR};
use crate::memory::GuestRam;

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("/dev/kvm does not exist: this host has no KVM (load kvm_intel/kvm_amd, or use the qemu runtime)")]
    NoKvm,
    #[error("permission denied opening /dev/kvm: run as root or add your user to the 'kvm' group")]
    KvmPermission,
    #[error("opening /dev/kvm failed: {0}")]
    OpenKvm(kvm_ioctls::Error),
    #[error("KVM API version {0} is not the stable version 12")]
    ApiVersion(i32),
    #[error("KVM lacks a capability zygote needs: {0}")]
    MissingCap(&'static str),
    #[error("KVM ioctl {op} failed: {source}")]
    Ioctl {
        op: &'static str,
        source: kvm_ioctls::Error,
    },
}

fn ioctl(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Ioctl { op, source }
}

/// Open /dev/kvm, mapping the common failures to actionable errors.
pub fn open_kvm() -> Result<Kvm, VmError> {
    match Kvm::new() {
        Ok(kvm) => {
            let v = kvm.get_api_version();
            if v != 12 {
                return Err(VmError::ApiVersion(v));
            }
            Ok(kvm)
        }
        Err(e) if e.errno() == libc::ENOENT => Err(VmError::NoKvm),
        Err(e) if e.errno() == libc::EACCES || e.errno() == libc::EPERM => {
            Err(VmError::KvmPermission)
        }
        Err(e) => Err(VmError::OpenKvm(e)),
    }
}

/// What the host KVM offers, read once per VM.
pub struct HostKvm {
    pub kvm: Kvm,
    pub supported_cpuid: CpuId,
    pub msr_index_list: Vec<u32>,
    pub max_vcpus: usize,
    pub tsc_deadline: bool,
    /// KVM_CAP_XSAVE2 size in bytes (0 when absent).
    pub xsave2_size: usize,
    pub has_xcrs: bool,
    pub cpu: crate::persist::CpuIdentity,
    /// Size of each vCPU's kvm_run mapping.
    pub vcpu_mmap_size: usize,
}

impl HostKvm {
    pub fn open() -> Result<Self, VmError> {
        let kvm = open_kvm()?;
        for (cap, name) in [
            (Cap::Irqchip, "KVM_CAP_IRQCHIP"),
            (Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
            (Cap::SetTssAddr, "KVM_CAP_SET_TSS_ADDR"),
            (Cap::Pit2, "KVM_CAP_PIT2"),
            (Cap::Ioeventfd, "KVM_CAP_IOEVENTFD"),
            (Cap::Irqfd, "KVM_CAP_IRQFD"),
            (Cap::ImmediateExit, "KVM_CAP_IMMEDIATE_EXIT"),
        ] {
            if !kvm.check_extension(cap) {
                return Err(VmError::MissingCap(name));
            }
        }
        let supported_cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(ioctl("KVM_GET_SUPPORTED_CPUID"))?;
        let msr_index_list = kvm
            .get_msr_index_list()
            .map_err(ioctl("KVM_GET_MSR_INDEX_LIST"))?
            .as_slice()
            .to_vec();
        let max_vcpus = kvm.get_max_vcpus();
        let tsc_deadline = kvm.check_extension(Cap::TscDeadlineTimer);
        let xsave2_size = kvm.check_extension_int(Cap::Xsave2).max(0) as usize;
        let has_xcrs = kvm.check_extension(Cap::Xcrs);
        let vcpu_mmap_size = kvm
            .get_vcpu_mmap_size()
            .map_err(ioctl("KVM_GET_VCPU_MMAP_SIZE"))?;
        Ok(Self {
            kvm,
            supported_cpuid,
            msr_index_list,
            max_vcpus,
            tsc_deadline,
            xsave2_size,
            has_xcrs,
            cpu: crate::persist::CpuIdentity::host(),
            vcpu_mmap_size,
        })
    }
}

/// A KVM VM with guest RAM registered and interrupt controllers created.
pub struct Vm {
    pub fd: VmFd,
}

impl Vm {
    pub fn new(host: &HostKvm) -> Result<Self, VmError> {
        let fd = host.kvm.create_vm().map_err(ioctl("KVM_CREATE_VM"))?;
        Ok(Self { fd })
    }

    /// One memory slot per RAM range, at the mapping's (inherited-on-fork) host address.
    pub fn register_memory(&self, ram: &GuestRam) -> Result<(), VmError> {
        self.set_memory_slots(ram, 0)
    }

    /// Turn KVM dirty-page logging on or off for all RAM. Turning it on starts a fresh log.
    pub fn set_dirty_logging(&self, ram: &GuestRam, on: bool) -> Result<(), VmError> {
        self.set_memory_slots(ram, if on { KVM_MEM_LOG_DIRTY_PAGES } else { 0 })
    }

    /// Pages written by the guest since logging started or since the last call (which
    /// clears the log), as one bitmap over all RAM in `ram.ranges()` order, 4 KiB pages.
    pub fn take_dirty_log(&self, ram: &GuestRam) -> Result<Vec<u64>, VmError> {
        let mut bitmap = Vec::new();
        let mut bit = 0usize;
        for (slot, r) in ram.ranges().iter().enumerate() {
            let log = self
                .fd
                .get_dirty_log(slot as u32, r.size as usize)
                .map_err(ioctl("KVM_GET_DIRTY_LOG"))?;
            let pages = (r.size / 4096) as usize;
            crate::memory::append_bits(&mut bitmap, bit, &log, pages);
            bit += pages;
        }
        Ok(bitmap)
    }

    fn set_memory_slots(&self, ram: &GuestRam, flags: u32) -> Result<(), VmError> {
        for (slot, r) in ram.ranges().iter().enumerate() {
            let region = kvm_userspace_memory_region {
                slot: slot as u32,
                guest_phys_addr: r.guest_addr,
                memory_size: r.size,
                userspace_addr: r.host_addr,
                flags,
            };
            // SAFETY: the region lies in `ram`'s mapping, which outlives the VM (both are
            // owned by the Vmm and the VM fd is closed first).
            unsafe { self.fd.set_user_memory_region(region) }
                .map_err(ioctl("KVM_SET_USER_MEMORY_REGION"))?;
        }
        Ok(())
    }

    /// TSS and identity-map pages (needed by Intel VMX), in-kernel PIC/IOAPIC/LAPIC, PIT.
    pub fn create_platform(&self) -> Result<(), VmError> {
        self.fd
            .set_identity_map_address(KVM_IDENTITY_MAP_ADDR)
            .map_err(ioctl("KVM_SET_IDENTITY_MAP_ADDR"))?;
        self.fd
            .set_tss_address(KVM_TSS_ADDR as usize)
            .map_err(ioctl("KVM_SET_TSS_ADDR"))?;
        self.fd
            .create_irq_chip()
            .map_err(ioctl("KVM_CREATE_IRQCHIP"))?;
        // The dummy speaker port keeps guests that beep from exiting to us.
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        self.fd.create_pit2(pit).map_err(ioctl("KVM_CREATE_PIT2"))?;
        Ok(())
    }
}
