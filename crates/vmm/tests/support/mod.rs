//! Shared scaffolding for the VMM's KVM integration tests: find the probe guest (or
//! skip with a printed reason when KVM is unavailable), boot a spinning probe, discard
//! consoles, drive the `blkspin` scenario's disk.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};

use zygote_probe_abi as abi;
use zygote_vmm::devices::serial::{CallbackWriter, SerialOut};
use zygote_vmm::memory::GuestRam;
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

fn scratch(i: usize) -> GuestAddress {
    GuestAddress(abi::MAILBOX_GPA + abi::MAILBOX_OFF_SCRATCH + 8 * i as u64)
}

/// Asks the `blkspin` guest to re-verify its earlier writes and write its spin sector
/// with `cmd`'s pattern; true if that worked.
pub fn blk_command(ram: &GuestRam, cmd: u64) -> bool {
    let mem = ram.memory();
    mem.write_obj(cmd, scratch(abi::SCRATCH_BLK_CMD)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while mem.read_obj::<u64>(scratch(abi::SCRATCH_BLK_ACK)).unwrap() != cmd {
        assert!(
            Instant::now() < deadline,
            "guest never acknowledged block command {cmd}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    mem.read_obj::<u64>(scratch(abi::SCRATCH_BLK_RESULT))
        .unwrap()
        == 1
}

/// A 1 MiB disk image whose sector 0 holds the pattern the `blk` checks read; returns
/// its bytes.
pub fn make_blk_image(path: &std::path::Path) -> Vec<u8> {
    let mut data = vec![0x33u8; 1 << 20];
    for w in 0..64u64 {
        let at = 8 * w as usize;
        data[at..at + 8].copy_from_slice(&abi::blk_base_word(w).to_le_bytes());
    }
    std::fs::write(path, &data).unwrap();
    data
}
