//! How many new VMs the host's memory holds: a create of several sandboxes, or a branch
//! where each child copies its parent's memory, is refused up front (422
//! `insufficient_memory`, saying how many fit) rather than failing half-way.
use crate::error::{Error, Result};

/// Refuses `count` new VMs of `per_vm_mib` each (`what`: children, sandboxes) that the
/// host's available memory cannot hold.
pub(super) fn check_capacity(what: &'static str, count: u32, per_vm_mib: u32) -> Result<()> {
    let available_mib =
        zygote_vmm::host::meminfo_kib("MemAvailable").map_or(u64::MAX, |kib| kib / 1024);
    let fit = vms_that_fit(available_mib, per_vm_mib);
    if count > fit {
        return Err(Error::InsufficientMemory {
            what,
            requested: count,
            fit,
            per_vm_mib,
            available_mib,
        });
    }
    Ok(())
}

/// How many VMs of `per_vm_mib` each the host's `available_mib` holds, keeping a tenth
/// of it (at least 256 MiB) for the host and the VMs already running.
fn vms_that_fit(available_mib: u64, per_vm_mib: u32) -> u32 {
    let reserve = (available_mib / 10).max(256);
    let usable = available_mib.saturating_sub(reserve);
    u32::try_from(usable / u64::from(per_vm_mib.max(1))).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::vms_that_fit;

    #[test]
    fn vms_fit_in_what_the_host_has_less_a_reserve() {
        // 20 GiB available: 2 GiB kept, 18 GiB for 256 MiB VMs.
        assert_eq!(vms_that_fit(20 * 1024, 256), 72);
        // Little memory: the 256 MiB reserve is kept.
        assert_eq!(vms_that_fit(1024, 256), 3);
        assert_eq!(vms_that_fit(200, 64), 0);
        assert_eq!(vms_that_fit(u64::MAX, 256), u32::MAX);
    }
}
