//! Boot a real Linux vmlinux on zygote's VMM. Needs hardware virtualization (VMX/SVM):
//! on other hosts (e.g. shadow-paging hypervisors) this skips with the reason printed.
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use zygote_vmm::devices::serial::CallbackWriter;
use zygote_vmm::{ExitReason, VmConfig, Vmm};

/// `$ZYGOTE_KERNEL`, or the newest kernel in zygote's cache.
fn find_kernel() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ZYGOTE_KERNEL") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var_os("ZYGOTE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/zygote")))?;
    let mut found: Vec<PathBuf> = std::fs::read_dir(cache.join("kernel"))
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("vmlinux"))
        .filter(|p| p.is_file())
        .collect();
    found.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    found.pop()
}

#[test]
fn linux_boots_to_a_clean_reboot() {
    if !zygote_vmm::host::hardware_virtualization() {
        // Straight to stderr so the reason shows despite the test harness's capture.
        let _ = writeln!(
            std::io::stderr(),
            "skipping linux_boots_to_a_clean_reboot: this host has no hardware virtualization (no vmx/svm, no kvm_intel/kvm_amd); \
             Linux cannot boot under its KVM. Probe-guest tests cover the boot path here."
        );
        return;
    }
    let Some(kernel) = find_kernel() else {
        panic!("hardware virtualization present but no kernel: build it (make guest) or set ZYGOTE_KERNEL");
    };
    let console = Arc::new(Mutex::new(Vec::new()));
    let sink = console.clone();
    // No root filesystem: the kernel panics at mount time, and panic=1 + reboot=k turns
    // that into an i8042 reset, which is a clean VM exit.
    let mut vmm = Vmm::boot(VmConfig {
        kernel,
        initrd: None,
        cmdline: "console=ttyS0 reboot=k panic=1 pci=off nomodule".into(),
        mem_mib: 256,
        vcpus: 2,
        serial_out: Box::new(CallbackWriter(move |b: &[u8]| {
            sink.lock().unwrap().extend_from_slice(b)
        })),
        start_paused: false,
        virtio_devices: Vec::new(),
    })
    .expect("VM builds");
    let exit = vmm.wait(Some(Duration::from_secs(60))).cloned();
    let text = String::from_utf8_lossy(&console.lock().unwrap()).into_owned();
    assert!(text.contains("Linux version"), "console:\n{text}");
    assert_eq!(exit, Some(ExitReason::Reset), "console:\n{text}");
}
