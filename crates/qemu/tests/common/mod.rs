//! Shared set-up for the QEMU integration tests: kernel and images come from
//! zygote-images (built on first use, cached afterwards).
#![allow(dead_code)]

use std::time::Instant;

use zygote_images::{ImageInfo, KernelInfo};
use zygote_qemu::{QemuConfig, QemuVm};

pub fn progress(line: &str) {
    eprintln!("    {line}");
}

pub fn kernel() -> KernelInfo {
    let t = Instant::now();
    let k = zygote_images::build_kernel(&mut progress).expect("building the guest kernel");
    eprintln!(
        "kernel {} ready in {:.1}s",
        k.release,
        t.elapsed().as_secs_f64()
    );
    k
}

pub fn image(name: &str) -> ImageInfo {
    let t = Instant::now();
    let i = zygote_images::build_image(name, &mut progress).expect("building the image");
    eprintln!("image {name} ready in {:.1}s", t.elapsed().as_secs_f64());
    i
}

pub fn config(kernel: &KernelInfo, image: &ImageInfo) -> QemuConfig {
    let mut cfg = QemuConfig::new(&kernel.vmlinux, &image.path);
    // Generous: two test binaries' VMs may share 2 busy cores under TCG.
    cfg.boot_timeout = std::time::Duration::from_secs(120);
    cfg
}

pub fn boot(cfg: &QemuConfig) -> QemuVm {
    let vm = QemuVm::boot(cfg).unwrap_or_else(|e| panic!("boot failed: {e}"));
    eprintln!(
        "booted in {:.2}s ({})",
        vm.boot_duration().as_secs_f64(),
        vm.accel().as_str()
    );
    vm
}

/// Runs named checks in order against one VM and reports every failure
/// together, so one boot serves many assertions without hiding later ones.
pub struct Checks {
    failures: Vec<String>,
}

impl Checks {
    pub fn new() -> Self {
        Checks {
            failures: Vec::new(),
        }
    }

    pub fn run(&mut self, name: &str, check: impl FnOnce()) {
        let t = Instant::now();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(check));
        let secs = t.elapsed().as_secs_f64();
        match result {
            Ok(()) => eprintln!("  ok   {name} ({secs:.2}s)"),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                eprintln!("  FAIL {name} ({secs:.2}s): {msg}");
                self.failures.push(format!("{name}: {msg}"));
            }
        }
    }

    pub fn finish(self) {
        assert!(
            self.failures.is_empty(),
            "{} check(s) failed:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}
