//! Boot failures must be reported quickly and with the guest's last words,
//! and must leave nothing behind.
mod common;

use std::time::{Duration, Instant};

use zygote_qemu::{QemuError, QemuVm};

fn our_workdirs() -> Vec<std::path::PathBuf> {
    let prefix = format!("zygote-qemu-{}-", std::process::id());
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

#[test]
fn boot_failures_are_reported_with_the_serial_log() {
    let kernel = common::kernel();
    let image = common::image("minimal");

    // A missing init panics the kernel; panic=-1 + -no-reboot makes QEMU exit,
    // which must be noticed at once rather than after the boot timeout.
    let mut cfg = common::config(&kernel, &image);
    cfg.extra_cmdline.push("init=/no/such/init".into());
    let t = Instant::now();
    let err = QemuVm::boot(&cfg).err().expect("boot must fail");
    let took = t.elapsed();
    match &err {
        QemuError::Exited { serial_tail, .. } => {
            assert!(serial_tail.contains("/no/such/init"), "{err}");
            assert!(serial_tail.contains("Kernel panic"), "{err}");
        }
        other => panic!("expected Exited, got {other}"),
    }
    assert!(took < Duration::from_secs(30), "noticed after {took:?}");
    eprintln!("missing init reported in {took:?}");

    // An agent that serves another channel: the timeout error shows the console.
    let mut cfg = common::config(&kernel, &image);
    cfg.extra_cmdline
        .push("zygote.agent.port=org.example.elsewhere".into());
    cfg.boot_timeout = Duration::from_secs(15);
    let err = QemuVm::boot(&cfg).err().expect("boot must time out");
    match &err {
        QemuError::BootTimeout { serial_tail, .. } => {
            // The agent did start, and said where it listens.
            assert!(serial_tail.contains("org.example.elsewhere"), "{err}");
        }
        other => panic!("expected BootTimeout, got {other}"),
    }
    let text = err.to_string();
    assert!(text.contains("did not answer within 15s"), "{text}");

    // Neither failure left a scratch directory behind.
    assert_eq!(our_workdirs(), Vec::<std::path::PathBuf>::new());
}

#[test]
fn forced_kvm_fails_clearly_without_hardware_virtualization() {
    let Some(reason) = zygote_qemu::kvm_unavailable_reason() else {
        eprintln!("skipped: this host has hardware virtualization");
        return;
    };
    if std::env::var_os("ZYGOTE_QEMU_ACCEL").is_some() {
        eprintln!("skipped: ZYGOTE_QEMU_ACCEL overrides the probe");
        return;
    }
    let mut cfg = zygote_qemu::QemuConfig::new("/nonexistent/vmlinux", "/nonexistent.ext4");
    cfg.accel = Some(zygote_qemu::Accel::Kvm);
    match QemuVm::boot(&cfg) {
        Err(QemuError::KvmUnavailable(why)) => assert_eq!(why, reason),
        Err(other) => panic!("expected KvmUnavailable, got {other}"),
        Ok(_) => panic!("expected KvmUnavailable, got a VM"),
    }
    assert_eq!(zygote_qemu::detect_accel(), zygote_qemu::Accel::Tcg);
}
