//! The kvm runtime (zygote's own VMM, fork-based branch): what stands
//! between it and serving sandboxes.
//!
//! The per-VM VMM process exists (`zygote vm serve`, crates/vmm/CONTROL.md:
//! status, pause/resume, fork-based branch with per-child control sockets,
//! full/diff/live snapshots, stop, exit file). A sandbox needs more than a
//! VM, though: its root filesystem on a copy-on-write disk and a channel to
//! the in-guest agent. `vm serve` boots guests with no virtio devices, so
//! the daemon cannot run sandboxes on it yet; [`unavailable_reason`] says
//! why, and the daemon falls back to qemu with that reason in `GET /v1/info`.

/// Why the kvm runtime cannot serve sandboxes on this host.
pub fn unavailable_reason() -> String {
    if !zygote_vmm::host::hardware_virtualization() {
        return "this host has no hardware virtualization (no vmx/svm, kvm_intel/kvm_amd not \
                loaded): zygote's VMM cannot boot Linux guests here"
            .to_string();
    }
    "zygote's per-VM VMM process (`zygote vm serve`) boots guests without a root disk or a \
     vsock device, so a sandbox's filesystem and its agent are unreachable; the kvm runtime \
     needs `vm serve` to attach the CoW root image and hybrid vsock (crates/vmm \
     devices::virtio::setup already builds both)"
        .to_string()
}
