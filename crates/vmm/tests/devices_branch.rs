//! A guest actively using virtio-blk is branched and snapshotted: the child and the
//! restored VM keep driving the same queue from the saved ring positions and see the
//! disk writes made before the fork/snapshot; the base image is never written.
mod support;

use std::time::Duration;

use zygote_vmm::devices::virtio::block::{Block, BlockConfig};
use zygote_vmm::vmm::branch::{BranchRequest, ChildContext};
use zygote_vmm::vmm::snapshot::SnapshotMode;
use zygote_vmm::vmm::RestoreConfig;
use zygote_vmm::Vmm;

#[test]
fn branch_and_restore_carry_a_live_block_device() {
    let Some(elf) = support::probe_elf() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("root.img");
    let base = support::make_blk_image(&image);
    let mut vm = support::boot_blkspin(&elf, Block::open(BlockConfig::cow(&image)).unwrap());
    assert!(
        support::blk_command(vm.vmm.guest_ram(), 1),
        "parent drives its disk"
    );

    // Branch: the child gets its own block device over the parent's written pages.
    let report = support::ChildReport::new();
    let w = report.write_fd();
    let child_main = move |ctx: ChildContext| -> i32 {
        let ok = support::blk_command(ctx.vmm.guest_ram(), 2)
            && support::blk_command(ctx.vmm.guest_ram(), 3);
        support::ChildReport::send(w, ok);
        0
    };
    let sink = |_: usize| support::sink();
    vm.vmm
        .branch(&BranchRequest {
            count: 1,
            child_serial: &sink,
            child_devices: &|_| Default::default(),
            child_cgroup: &|_| None,
            child_netns: &|_| None,
            child_main: &child_main,
            keep_fds: vec![w],
            ready_timeout: Duration::from_secs(30),
        })
        .unwrap();
    assert!(
        report.wait(),
        "the child's guest drove the restored device successfully"
    );
    assert!(
        support::blk_command(vm.vmm.guest_ram(), 4),
        "the parent's device is unaffected"
    );
    assert_eq!(vm.vmm.reap_children(true).len(), 1);

    // Snapshot and restore: the device comes back with its queue and private pages.
    let snap = dir.path().join("snap");
    vm.vmm.snapshot(SnapshotMode::Full, &snap).unwrap();
    vm.vmm.shutdown();
    assert!(
        snap.join("device-0.data").exists(),
        "CoW disk pages stored with the snapshot"
    );
    let mut restored =
        Vmm::restore_snapshot(&snap, RestoreConfig::new(support::sink(), false), true).unwrap();
    assert!(
        support::blk_command(restored.guest_ram(), 5),
        "restored guest drives its disk"
    );
    assert!(support::blk_command(restored.guest_ram(), 6));
    restored.pause().unwrap();
    restored.shutdown();
    assert_eq!(
        std::fs::read(&image).unwrap(),
        base,
        "base image never written"
    );
}
