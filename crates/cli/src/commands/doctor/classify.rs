//! Verdicts: turn gathered `Facts` into findings and a runtime summary.
//! Pure functions of the facts, so every host kind can be tested by
//! constructing its facts.
use super::facts::{CpuFacts, Facts, KvmCaps, KvmFacts};
use super::host_checks;
use serde::Serialize;

/// Which backend serves /dev/kvm, which decides what guests can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Flavor {
    /// Intel VT-x (kvm_intel): full guests, Linux included.
    Vmx,
    /// AMD-V (kvm_amd): full guests, Linux included.
    Svm,
    /// Shadow-paging PVM-style KVM (kvm_pvm) without VMX/SVM: guest ring 0 is
    /// emulated, which is enough for probe guests but not for a Linux kernel.
    Pvm,
    /// /dev/kvm exists but its backend is not recognised.
    Unknown,
    /// No /dev/kvm.
    None,
}

impl Flavor {
    pub fn hardware(self) -> bool {
        matches!(self, Flavor::Vmx | Flavor::Svm)
    }
}

/// The vendor module owning /dev/kvm decides the flavor (KVM admits one vendor
/// module at a time, so a PVM host that also has VMX still serves kvm_pvm).
/// CPU flags are the fallback for kernels with KVM built in.
pub fn flavor(kvm: &KvmFacts, cpu: &CpuFacts) -> Flavor {
    if !kvm.present {
        return Flavor::None;
    }
    let module = |name: &str| kvm.modules.iter().any(|m| m == name);
    if module("kvm_intel") {
        Flavor::Vmx
    } else if module("kvm_amd") {
        Flavor::Svm
    } else if module("kvm_pvm") {
        Flavor::Pvm
    } else if cpu.vmx {
        Flavor::Vmx
    } else if cpu.svm {
        Flavor::Svm
    } else {
        Flavor::Unknown
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// `group.name`, e.g. `kvm.access`; the group is what the table is sorted by.
    pub check: String,
    pub status: Status,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Runtimes {
    /// zygote's own KVM VMM with Linux guests (needs hardware virtualization).
    pub kvm: bool,
    /// Probe guests (`zygote probe`): any working KVM.
    pub probe: bool,
    /// The QEMU runtime.
    pub qemu: bool,
    /// Accelerator the QEMU runtime would use: "kvm" or "tcg".
    pub qemu_accel: Option<&'static str>,
    /// Recommended runtime for Linux sandboxes; None when none can boot Linux.
    pub default_runtime: Option<&'static str>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub flavor: Flavor,
    pub runtimes: Runtimes,
    /// The network backend `zygote serve` (`--network auto`) run by this user would
    /// take here: "isolated" or "user".
    pub network_backend: &'static str,
    pub findings: Vec<Finding>,
}

impl Report {
    /// 1 only when nothing at all can run (no usable KVM and no QEMU).
    pub fn exit_code(&self) -> i32 {
        if self.runtimes.probe || self.runtimes.qemu {
            0
        } else {
            1
        }
    }
}

/// Accumulates findings in display order.
pub(super) struct Out(Vec<Finding>);

impl Out {
    pub(super) fn add(&mut self, check: &str, status: Status, detail: impl Into<String>) {
        self.0.push(Finding {
            check: check.to_owned(),
            status,
            detail: detail.into(),
        });
    }
    pub(super) fn ok_or_warn(&mut self, check: &str, ok: bool, good: String, bad: String) {
        let (status, detail) = if ok {
            (Status::Ok, good)
        } else {
            (Status::Warn, bad)
        };
        self.add(check, status, detail);
    }
}

pub fn classify(facts: &Facts) -> Report {
    let flavor = flavor(&facts.kvm, &facts.host.cpu);
    let mut out = Out(Vec::new());
    kvm_findings(facts, flavor, &mut out);
    host_checks::host_findings(facts, &mut out);
    host_checks::feature_findings(facts, &mut out);
    super::treeclone::findings(facts, &mut out);
    host_checks::network_findings(facts, &mut out);
    let runtimes = runtimes(facts, flavor);
    runtime_findings(facts, flavor, &runtimes, &mut out);
    Report {
        flavor,
        runtimes,
        network_backend: if host_checks::isolation_blockers(facts).is_empty() {
            "isolated"
        } else {
            "user"
        },
        findings: out.0,
    }
}

/// Capabilities without which zygote's VMM cannot run a Linux guest.
fn missing_required(caps: &KvmCaps) -> Vec<&'static str> {
    [
        (caps.irqchip, "irqchip"),
        (caps.pit2, "PIT2"),
        (caps.user_memory, "user memory"),
        (caps.ioeventfd, "ioeventfd"),
        (caps.irqfd, "irqfd"),
        (caps.immediate_exit, "immediate exit"),
    ]
    .into_iter()
    .filter_map(|(have, name)| (!have).then_some(name))
    .collect()
}

fn runtimes(facts: &Facts, flavor: Flavor) -> Runtimes {
    let kvm = &facts.kvm;
    // Probe guests need only memory slots and the in-kernel irqchip (HLT parks
    // the vCPU there), which every KVM flavor provides.
    let probe = kvm.accessible
        && kvm.api_version == Some(12)
        && kvm
            .caps
            .as_ref()
            .is_some_and(|c| c.user_memory && c.irqchip);
    let linux_kvm = probe
        && flavor.hardware()
        && kvm
            .caps
            .as_ref()
            .is_some_and(|c| missing_required(c).is_empty());
    let qemu = facts.features.qemu.version.is_some();
    // QEMU's KVM accelerator boots Linux only where our own VMM could too.
    let qemu_accel = qemu.then_some(if linux_kvm { "kvm" } else { "tcg" });
    let default_runtime = if linux_kvm {
        Some("kvm")
    } else if qemu {
        Some("qemu")
    } else {
        None
    };
    Runtimes {
        kvm: linux_kvm,
        probe,
        qemu,
        qemu_accel,
        default_runtime,
    }
}

fn kvm_findings(facts: &Facts, flavor: Flavor, out: &mut Out) {
    let kvm = &facts.kvm;
    let cpu = &facts.host.cpu;
    if !kvm.present {
        let hint = if cpu.vmx {
            "the CPU has VMX: load it with `modprobe kvm_intel`"
        } else if cpu.svm {
            "the CPU has SVM: load it with `modprobe kvm_amd`"
        } else if cpu.hypervisor {
            "this is a VM without nested virtualization: enable nested VMX/SVM on its host"
        } else {
            "enable VT-x/AMD-V in the firmware, then load kvm_intel or kvm_amd"
        };
        out.add(
            "kvm.device",
            Status::Fail,
            format!("/dev/kvm missing: {hint}"),
        );
        return;
    }
    out.add("kvm.device", Status::Ok, "/dev/kvm present");
    if kvm.accessible {
        out.add("kvm.access", Status::Ok, "/dev/kvm opens read-write");
    } else {
        out.add("kvm.access", Status::Fail, access_hint(kvm));
    }
    out.add(
        "kvm.flavor",
        flavor_status(flavor),
        flavor_detail(flavor, cpu),
    );
    if flavor.hardware() && cpu.hypervisor {
        nested_finding(cpu, out);
    }
    if let Some(v) = kvm.api_version {
        let ok = v == 12;
        out.ok_or_warn(
            "kvm.api",
            ok,
            format!("API version {v}"),
            format!("API version {v}, expected 12: zygote's VMM will not use it"),
        );
    }
    if let Some(caps) = &kvm.caps {
        caps_findings(caps, out);
    }
}

/// Whether this host's VMX/SVM is itself emulated in software: QEMU's TCG CPU models
/// name themselves so ("QEMU TCG CPU version ...").
pub fn emulated_virtualization(cpu: &CpuFacts) -> bool {
    cpu.hypervisor && (cpu.vmx || cpu.svm) && cpu.model.contains("TCG")
}

/// This host is a VM running guests of its own: what that means for speed.
fn nested_finding(cpu: &CpuFacts, out: &mut Out) {
    if emulated_virtualization(cpu) {
        out.add(
            "kvm.nested",
            Status::Warn,
            format!(
                "nested, and the virtualization extensions are emulated in software (CPU                  \"{}\", QEMU TCG): guests run correctly, but everything is roughly 15x                  slower than on hardware virtualization, so report ratios rather than times                  (this is how zygote's nested test lane runs; not for production)",
                cpu.model
            ),
        );
    } else {
        out.add(
            "kvm.nested",
            Status::Ok,
            "nested: this host is a VM with hardware virtualization passed through; guests              run at close to native speed, with VM exits (I/O, interrupts) costing more",
        );
    }
}

fn access_hint(kvm: &KvmFacts) -> String {
    let err = kvm.open_error.as_deref().unwrap_or("unknown error");
    let denied = matches!(kvm.open_errno, Some(libc::EACCES) | Some(libc::EPERM));
    if !denied {
        return format!("cannot open /dev/kvm: {err}");
    }
    let (mode, group) = kvm.device.as_ref().map_or(("?", "?"), |d| {
        (d.mode.as_str(), d.group.as_deref().unwrap_or("?"))
    });
    let owner = format!("/dev/kvm is mode {mode}, group {group}");
    if group == "root" || group == "?" {
        format!(
            "permission denied ({owner}): run as root, or give /dev/kvm to group kvm \
             (udev rule KERNEL==\"kvm\", GROUP=\"kvm\", MODE=\"0660\") and join that group"
        )
    } else {
        format!(
            "permission denied ({owner}): add yourself to group {group} \
             (`sudo usermod -aG {group} $USER`, then log in again) or run as root"
        )
    }
}

fn flavor_status(flavor: Flavor) -> Status {
    if flavor.hardware() {
        Status::Ok
    } else {
        Status::Warn
    }
}

fn flavor_detail(flavor: Flavor, cpu: &CpuFacts) -> String {
    let nested = if cpu.hypervisor { ", nested" } else { "" };
    match flavor {
        Flavor::Vmx => {
            format!("hardware VMX (kvm_intel{nested}): Linux guests run under zygote's KVM runtime")
        }
        Flavor::Svm => {
            format!("hardware SVM (kvm_amd{nested}): Linux guests run under zygote's KVM runtime")
        }
        Flavor::Pvm => "shadow-paging PVM-style KVM (kvm_pvm, no VMX/SVM): Linux guests need \
                        hardware virtualization; this host can run probe guests (zygote probe) \
                        and the QEMU runtime (TCG)"
            .to_owned(),
        Flavor::Unknown => "unrecognised KVM backend (no kvm_intel/kvm_amd/kvm_pvm module, no \
                            vmx/svm CPU flag): probe guests may run (try `zygote probe`); Linux \
                            guests are not assumed to"
            .to_owned(),
        Flavor::None => "no KVM".to_owned(),
    }
}

fn caps_findings(caps: &KvmCaps, out: &mut Out) {
    let missing = missing_required(caps);
    if missing.is_empty() {
        out.add(
            "kvm.caps",
            Status::Ok,
            "irqchip, PIT2, user memory, ioeventfd, irqfd, immediate exit: all present",
        );
    } else {
        out.add(
            "kvm.caps",
            Status::Fail,
            format!(
                "missing {}: zygote's VMM cannot boot Linux guests",
                missing.join(", ")
            ),
        );
    }
    out.ok_or_warn(
        "kvm.xsave",
        caps.xsave && caps.xsave2_size > 0,
        format!("XSAVE supported, XSAVE2 area {} bytes", caps.xsave2_size),
        format!(
            "XSAVE {}, XSAVE2 area {} bytes: guest FPU/AVX state may not be saved in full",
            if caps.xsave {
                "supported"
            } else {
                "unsupported"
            },
            caps.xsave2_size
        ),
    );
    let ring = if caps.dirty_log_ring > 0 {
        format!(", dirty ring up to {} KiB", caps.dirty_log_ring / 1024)
    } else {
        ", no dirty ring".to_owned()
    };
    out.ok_or_warn(
        "kvm.dirty_log",
        caps.manual_dirty_log_protect2 > 0,
        format!(
            "manual dirty-log protect (flags {:#x}){ring}: reading the dirty log does not \
             re-protect all guest memory, so diff snapshots stay cheap",
            caps.manual_dirty_log_protect2
        ),
        format!(
            "no KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2{ring}: every dirty-log read re-protects all \
             guest memory (slower diff snapshots)"
        ),
    );
    out.ok_or_warn(
        "kvm.tsc_control",
        caps.tsc_control,
        "TSC scaling: snapshots restore on hosts with another TSC frequency".to_owned(),
        "no TSC scaling (KVM_CAP_TSC_CONTROL=0): restore snapshots on hosts with the same TSC \
         frequency"
            .to_owned(),
    );
    out.ok_or_warn(
        "kvm.vcpus",
        caps.nr_vcpus > 0 && caps.max_vcpus > 0,
        format!(
            "{} vCPUs recommended, {} max per VM",
            caps.nr_vcpus, caps.max_vcpus
        ),
        "KVM reports no vCPU limits".to_owned(),
    );
    out.ok_or_warn(
        "kvm.msrs",
        caps.msr_index_count.is_some_and(|n| n > 0),
        format!(
            "{} MSRs in the save/restore index list",
            caps.msr_index_count.unwrap_or(0)
        ),
        "KVM_GET_MSR_INDEX_LIST failed or is empty: vCPU state cannot be snapshotted in full"
            .to_owned(),
    );
    out.ok_or_warn(
        "kvm.cpuid",
        caps.supported_cpuid_entries.is_some_and(|n| n > 0),
        format!(
            "{} supported CPUID entries",
            caps.supported_cpuid_entries.unwrap_or(0)
        ),
        "KVM_GET_SUPPORTED_CPUID failed or is empty".to_owned(),
    );
}

fn runtime_findings(facts: &Facts, flavor: Flavor, rt: &Runtimes, out: &mut Out) {
    let unusable = "/dev/kvm is not usable by this user (see kvm.access)";
    let kvm_why = if rt.kvm {
        format!("Linux guests under zygote's VMM ({})", flavor_name(flavor))
    } else if flavor == Flavor::None {
        "needs /dev/kvm with hardware virtualization (VMX/SVM)".to_owned()
    } else if !flavor.hardware() {
        format!(
            "Linux guests need hardware virtualization (VMX/SVM); this host's KVM is {}",
            flavor_name(flavor)
        )
    } else if !rt.probe {
        unusable.to_owned()
    } else {
        "KVM lacks capabilities zygote's VMM needs (see kvm.caps)".to_owned()
    };
    out.add("runtime.kvm", status(rt.kvm), kvm_why);
    out.add(
        "runtime.probe",
        status(rt.probe),
        if rt.probe {
            "probe guests (zygote probe) run on this KVM"
        } else if facts.kvm.present {
            unusable
        } else {
            "probe guests need /dev/kvm"
        },
    );
    let qemu_why = match (rt.qemu, rt.qemu_accel) {
        (true, Some("kvm")) => "QEMU with KVM acceleration".to_owned(),
        (true, _) => {
            "QEMU with TCG (software emulation: slower, but boots Linux guests anywhere)".to_owned()
        }
        (false, _) if facts.features.qemu.system.is_some() => {
            "qemu-system-x86_64 does not run".to_owned()
        }
        (false, _) => "QEMU not installed".to_owned(),
    };
    out.add("runtime.qemu", status(rt.qemu), qemu_why);
    match rt.default_runtime {
        Some(name) => out.add(
            "runtime.default",
            Status::Ok,
            format!("default runtime: {name}"),
        ),
        None if rt.probe => out.add(
            "runtime.default",
            Status::Warn,
            "no runtime can boot Linux guests here, only probe guests: install QEMU \
             (qemu-system-x86) for the qemu runtime",
        ),
        None => out.add(
            "runtime.default",
            Status::Fail,
            "nothing can run here: install QEMU (qemu-system-x86) or use a host with KVM",
        ),
    }
}

fn flavor_name(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Vmx => "hardware VMX",
        Flavor::Svm => "hardware SVM",
        Flavor::Pvm => "shadow-paging PVM",
        Flavor::Unknown => "an unrecognised backend",
        Flavor::None => "absent",
    }
}

fn status(ok: bool) -> Status {
    if ok {
        Status::Ok
    } else {
        Status::Fail
    }
}

#[cfg(test)]
#[path = "classify_tests.rs"]
mod tests;
