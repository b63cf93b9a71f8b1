//! Shared scaffolding for the VMM's KVM integration tests: find the probe guest (or
//! skip with a printed reason when KVM is unavailable), boot a spinning probe, discard
//! consoles.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use zygote_probe_abi as abi;
use zygote_vmm::devices::serial::{CallbackWriter, SerialOut};
use zygote_vmm::probe::{self, ProbeOptions, ProbeVm};

/// The probe ELF, or None (with the reason on stderr) when KVM is unusable here.
pub fn probe_elf() -> Option<PathBuf> {
    if let Err(why) = zygote_vmm::host::kvm_usable() {
        // Straight to stderr so the reason shows despite the test harness's capture.
        let _ = writeln!(
            std::io::stderr(),
            "skipping: KVM unavailable on this host: {why}"
        );
        return None;
    }
    Some(probe::locate_probe(true).expect("probe guest builds"))
}

/// Boot the `spin` probe with `vcpus` vCPUs and wait until it spins.
pub fn boot_spin(vcpus: u8) -> Option<ProbeVm> {
    let elf = probe_elf()?;
    let mut vm = probe::boot_probe(
        &elf,
        &ProbeOptions {
            scenario: "spin".into(),
            vcpus,
            ..Default::default()
        },
    )
    .unwrap();
    vm.wait_for_line(Duration::from_secs(60), |_| {}, |l| l == abi::REPORT_READY)
        .unwrap();
    Some(vm)
}

/// A console that discards output.
pub fn sink() -> SerialOut {
    Box::new(CallbackWriter(|_: &[u8]| {}))
}
