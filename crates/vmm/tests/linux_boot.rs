//! Boot a real Linux vmlinux on zygote's VMM. Needs hardware virtualization (VMX/SVM):
//! on other hosts (e.g. shadow-paging hypervisors) this skips with the reason printed.
mod linux_support;

use std::time::Duration;

use linux_support::Console;
use zygote_vmm::{ExitReason, VmConfig, Vmm};

#[test]
fn linux_boots_to_a_clean_reboot() {
    if !zygote_vmm::host::linux_guests_or_skip("linux_boots_to_a_clean_reboot") {
        return;
    }
    let console = Console::default();
    // No root filesystem: the kernel panics at mount time, and panic=1 + reboot=k turns
    // that into an i8042 reset, which is a clean VM exit.
    let mut vmm = Vmm::boot(VmConfig {
        kernel: linux_support::kernel(),
        initrd: None,
        cmdline: "console=ttyS0 reboot=k panic=1 pci=off nomodule".into(),
        mem_mib: 256,
        vcpus: 2,
        serial_out: console.sink(),
        start_paused: false,
        virtio_devices: Vec::new(),
    })
    .expect("VM builds");
    let exit = vmm.wait(Some(Duration::from_secs(120))).cloned();
    let text = console.text();
    assert!(text.contains("Linux version"), "console:\n{text}");
    // Both vCPUs came up: the MP table and INIT/SIPI work for a real kernel.
    assert!(
        text.contains("Brought up 1 node, 2 CPUs"),
        "console:\n{text}"
    );
    assert_eq!(exit, Some(ExitReason::Reset), "console:\n{text}");
}
