//! Facts about the host that decide what can run here.
use std::path::Path;

/// True when the CPU exposes hardware virtualization (VMX/SVM) to this kernel: then a
/// Linux guest boots under KVM. Shadow-paging hypervisors (e.g. PVM) can run probe guests
/// but not Linux.
pub fn hardware_virtualization() -> bool {
    if Path::new("/sys/module/kvm_intel").exists() || Path::new("/sys/module/kvm_amd").exists() {
        return true;
    }
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| cpuinfo_has_virt_flag(&s))
        .unwrap_or(false)
}

/// Set by the nested lane (scripts/nested-lane.py) inside its L1 host: tests that need
/// Linux guests must run there, so a missing prerequisite fails them instead of skipping.
pub const REQUIRE_HW_VIRT_ENV: &str = "ZYGOTE_REQUIRE_HW_VIRT";

/// For tests that boot Linux guests on zygote's VMM: true when this host can. Otherwise
/// prints why `test` skips and returns false, or panics when [`REQUIRE_HW_VIRT_ENV`] is
/// set, so that a lane whose host lost hardware virtualization cannot pass vacuously.
pub fn linux_guests_or_skip(test: &str) -> bool {
    let why = if !hardware_virtualization() {
        "this host has no hardware virtualization (no vmx/svm, kvm_intel/kvm_amd not \
         loaded), so Linux cannot boot under its KVM; probe-guest tests cover the VMM here"
            .to_string()
    } else if let Err(e) = kvm_usable() {
        format!("/dev/kvm is unusable: {e}")
    } else {
        return true;
    };
    if std::env::var_os(REQUIRE_HW_VIRT_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
        panic!("{test} cannot run but {REQUIRE_HW_VIRT_ENV} is set: {why}");
    }
    // Straight to stderr so the reason shows despite the test harness's capture.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "skipping {test}: {why}");
    false
}

/// Whether any `flags` line of /proc/cpuinfo lists vmx or svm.
pub fn cpuinfo_has_virt_flag(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
}

/// A `/proc/meminfo` field in KiB (e.g. "MemTotal", "MemAvailable"), if present.
pub fn meminfo_kib(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo_kib(&text, field)
}

fn parse_meminfo_kib(text: &str, field: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.split(':').next() == Some(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Whether /dev/kvm exists and opens.
pub fn kvm_usable() -> Result<(), String> {
    crate::vstate::vm::open_kvm()
        .map(drop)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields() {
        let text = "MemTotal:       24105000 kB\nMemFree:  100 kB\nMemAvailable:   22000000 kB\n";
        assert_eq!(parse_meminfo_kib(text, "MemTotal"), Some(24_105_000));
        assert_eq!(parse_meminfo_kib(text, "MemAvailable"), Some(22_000_000));
        assert_eq!(parse_meminfo_kib(text, "Mem"), None);
        assert!(meminfo_kib("MemTotal").is_some());
    }

    #[test]
    fn finds_virt_flags() {
        assert!(cpuinfo_has_virt_flag(
            "processor: 0\nflags\t\t: fpu vme vmx sse\n"
        ));
        assert!(cpuinfo_has_virt_flag("flags : fpu svm\n"));
        assert!(!cpuinfo_has_virt_flag(
            "flags : fpu vmxnet sse\nvmx: fake\n"
        ));
    }
}
