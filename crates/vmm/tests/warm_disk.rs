//! A warm spawner holds the parent's copy-on-write disk as it was at the spawner's fork.
//! At the branch the parent sends only the disk pages written since, and the child
//! adopts its updated copy without the overlay being serialized: here, under real KVM
//! with a guest driving its disk, the child's disk equals the parent's at the branch
//! instant (a verifying branch compares every overlay page), the child's guest goes on
//! using the device, and a parent that does not tell its spawners of disk writes is
//! caught. Skips with a reason when KVM is unavailable.
mod support;

use support::ChildReport;
use zygote_vmm::devices::virtio::block::{Block, BlockConfig};
use zygote_vmm::probe::ProbeVm;
use zygote_vmm::vmm::branch::ChildContext;
use zygote_vmm::vmm::dirty::DirtySources;
use zygote_vmm::vmm::warm::{Payload, SpawnerSetup, WarmReport};

/// Prepare a spawner, let the guest write its disk (`cmd`) after the spawner's fork,
/// branch with verification; the child's guest drives its disk once (`cmd + 100`) and
/// reports whether that worked.
fn branch_after_disk_write(vm: &mut ProbeVm, cmd: u64) -> (WarmReport, bool) {
    let report = ChildReport::new();
    let w = report.write_fd();
    let child_main = move |ctx: ChildContext, _: Payload| -> i32 {
        ChildReport::send(w, support::blk_command(ctx.vmm.guest_ram(), cmd + 100));
        0
    };
    let setup = SpawnerSetup {
        cgroup: None,
        child: &support::no_child_resources,
        child_main: &child_main,
        keep_fds: vec![w],
    };
    vm.vmm.prepare_spawner(&setup).unwrap();
    support::wait_for_ready_spawner(&mut vm.vmm);
    // Rewrites the spin sector: a page the spawner's copy already holds, older.
    assert!(
        support::blk_command(vm.vmm.guest_ram(), cmd),
        "parent drives its disk"
    );
    let branched = support::verified_warm_branch(&mut vm.vmm);
    let child_ok = report.wait();
    vm.vmm.reap_children(true);
    (branched, child_ok)
}

#[test]
fn a_warm_child_adopts_the_parents_disk_with_the_writes_since_its_spawner_forked() {
    let Some(elf) = support::probe_elf() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("root.img");
    let base = support::make_blk_image(&image);
    let mut vm = support::boot_blkspin(&elf, Block::open(BlockConfig::cow(&image)).unwrap());
    assert!(support::blk_command(vm.vmm.guest_ram(), 1));

    for round in 0..3 {
        let (report, child_ok) = branch_after_disk_write(&mut vm, 2 + round);
        assert_eq!(
            report.memory_mismatches,
            Some(0),
            "round {round}: the child's RAM or disk differs from the parent's: {report:?}"
        );
        assert!(
            child_ok,
            "round {round}: the child's guest drove its adopted disk"
        );
        // Only the written pages travel: the state is small whatever the overlay.
        assert!(report.state_bytes < 1 << 20, "{report:?}");
    }

    // A parent that keeps its disk writes from the spawners sends a stale disk.
    vm.vmm.set_spawner_dirty_sources(DirtySources {
        disk: false,
        ..Default::default()
    });
    let (report, _) = branch_after_disk_write(&mut vm, 10);
    assert!(
        report.memory_mismatches.unwrap() >= 1,
        "disk writes kept from the spawner, yet no mismatch: {report:?}"
    );
    vm.vmm.set_spawner_dirty_sources(DirtySources::default());
    assert!(
        support::blk_command(vm.vmm.guest_ram(), 20),
        "the parent's device is unaffected"
    );
    vm.vmm.pause().unwrap();
    vm.vmm.shutdown();
    assert_eq!(
        std::fs::read(&image).unwrap(),
        base,
        "base image never written"
    );
}
