//! Snapshots of a running Linux guest: full, diff (layered on the full) and live, each
//! restored into a new VM with its own vsock socket. A restored guest continues exactly
//! where its snapshot was taken: files written before it are there (later ones are
//! not), and a process counting in memory keeps counting.
//! Needs hardware virtualization; elsewhere it skips with the reason printed.
mod linux_support;

use std::path::Path;

use linux_support::{agent, boot_minimal, sh_ok, ticks, Console, TICKER};
use zygote_vmm::devices::virtio::persist::DeviceHostConfig;
use zygote_vmm::vmm::snapshot::SnapshotMode;
use zygote_vmm::vmm::RestoreConfig;
use zygote_vmm::Vmm;

/// Restore `snap` with its vsock on `uds` and check the guest is at `generation`.
fn restore_and_check(snap: &Path, uds: &Path, generation: &str) {
    let console = Console::default();
    let vmm = Vmm::restore_snapshot(
        snap,
        RestoreConfig {
            serial_out: console.sink(),
            start_paused: false,
            device_host: DeviceHostConfig {
                vsock_uds: Some(uds.to_path_buf()),
                net_tap: None,
                ..Default::default()
            },
            device_data: Vec::new(),
            inherited_disks: Vec::new(),
        },
        true,
    )
    .unwrap_or_else(|e| panic!("restoring {}: {e}", snap.display()));
    let a = agent(uds);
    assert_eq!(
        sh_ok(&a, "cat /root/generation"),
        generation,
        "{}: the disk as of the snapshot",
        snap.display()
    );
    let (x, y) = ticks(&a);
    assert!(
        y > x,
        "{}: the in-memory counter keeps running ({x} -> {y}); console:\n{}",
        snap.display(),
        console.tail(30)
    );
    // The restored guest is a working system, not just a memory image.
    assert_eq!(sh_ok(&a, "echo $((6 * 7)) >/tmp/x; cat /tmp/x"), "42");
    a.close();
    vmm.shutdown();
}

#[test]
fn full_diff_and_live_snapshots_of_a_linux_guest_restore() {
    if !zygote_vmm::host::linux_guests_or_skip(
        "full_diff_and_live_snapshots_of_a_linux_guest_restore",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut vm = boot_minimal(dir.path(), 1, 512);
    let a = agent(&vm.vsock);
    sh_ok(&a, TICKER);

    let snap = |name: &str| dir.path().join(name);
    sh_ok(&a, "echo one >/root/generation");
    let full = vm.vmm.snapshot(SnapshotMode::Full, &snap("full")).unwrap();
    sh_ok(
        &a,
        "echo two >/root/generation; dd if=/dev/zero of=/root/pad bs=1M count=8 2>/dev/null",
    );
    let diff = vm.vmm.snapshot(SnapshotMode::Diff, &snap("diff")).unwrap();
    assert!(
        diff.pages_written < full.pages_written,
        "a diff stores only what changed ({} vs {} pages)",
        diff.pages_written,
        full.pages_written
    );
    sh_ok(&a, "echo three >/root/generation");
    let live = vm.vmm.snapshot(SnapshotMode::Live, &snap("live")).unwrap();
    eprintln!(
        "paused: full {:?}, diff {:?}, live {:?}",
        full.pause, diff.pause, live.pause
    );
    for (name, r) in [("full", &full), ("diff", &diff), ("live", &live)] {
        eprintln!(
            "{name}: pause {:?} = capture {:?} + dirty log {:?} + write {:?} ({} pages) + rest",
            r.pause, r.phases.capture, r.phases.dirty_log, r.phases.write, r.pages_written
        );
    }
    // The source keeps running after all three.
    sh_ok(&a, "echo four >/root/generation");
    let (x, y) = ticks(&a);
    assert!(y > x, "the source guest still runs");
    a.close();
    vm.vmm.shutdown();

    restore_and_check(&snap("full"), &dir.path().join("r-full.vsock"), "one");
    restore_and_check(&snap("diff"), &dir.path().join("r-diff.vsock"), "two");
    restore_and_check(&snap("live"), &dir.path().join("r-live.vsock"), "three");
    linux_support::assert_image_intact(&linux_support::minimal_image());
}
