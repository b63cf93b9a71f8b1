//! A warm spawner holds the parent's copy-on-write disk as it was at the spawner's fork.
//! At the branch the parent sends only the disk pages written since, and the child
//! adopts its updated copy without the overlay being serialized: here, under real KVM
//! with a guest driving its disk, the child's disk equals the parent's at the branch
//! instant (a verifying branch compares every overlay page), the child's guest goes on
//! using the device, and a parent that does not tell its spawners of disk writes is
//! caught. Skips with a reason when KVM is unavailable.
mod support;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zygote_probe_abi as abi;
use zygote_vmm::devices::virtio::block::{Block, BlockConfig};
use zygote_vmm::probe::{self, ProbeOptions, ProbeVm};
use zygote_vmm::vmm::branch::ChildContext;
use zygote_vmm::vmm::dirty::DirtySources;
use zygote_vmm::vmm::warm::{ChildSetup, Payload, SpawnerSetup, WarmBranchRequest, WarmReport};

fn child(_: &mut Payload) -> ChildSetup {
    ChildSetup {
        serial: support::sink(),
        devices: Default::default(),
        cgroup: None,
        netns: None,
    }
}

/// Prepare a spawner, let the guest write its disk (`cmd`) after the spawner's fork,
/// branch with verification; the child's guest drives its disk once (`cmd + 100`) and
/// the result comes back through a pipe.
fn branch_after_disk_write(vm: &mut ProbeVm, cmd: u64) -> (WarmReport, bool) {
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fresh descriptors from pipe(2), owned here.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let w_raw = w.as_raw_fd();
    let child_main = move |ctx: ChildContext, _: Payload| -> i32 {
        let ok = support::blk_command(ctx.vmm.guest_ram(), cmd + 100);
        let byte = [ok as u8];
        unsafe { libc::write(w_raw, byte.as_ptr().cast(), 1) };
        0
    };
    let setup = SpawnerSetup {
        cgroup: None,
        child: &child,
        child_main: &child_main,
        keep_fds: vec![w_raw],
    };
    vm.vmm.prepare_spawner(&setup).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !vm.vmm.spawners().unwrap().iter().any(|s| s.ready) {
        assert!(Instant::now() < deadline, "no spawner built its VM in 30 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Rewrites the spin sector: a page the spawner's copy already holds, older.
    assert!(
        support::blk_command(vm.vmm.guest_ram(), cmd),
        "parent drives its disk"
    );
    let report = vm
        .vmm
        .branch_warm(&WarmBranchRequest {
            payload: b"",
            fds: &[],
            ready_timeout: Duration::from_secs(30),
            max_pages: u64::MAX,
            by_cost: false,
            verify: true,
        })
        .unwrap();
    drop(w);
    let mut pfd = libc::pollfd {
        fd: r.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    assert!(
        unsafe { libc::poll(&mut pfd, 1, 60_000) } > 0,
        "child reports"
    );
    let mut byte = [0u8; 1];
    assert_eq!(
        unsafe { libc::read(r.as_raw_fd(), byte.as_mut_ptr().cast(), 1) },
        1
    );
    vm.vmm.reap_children(true);
    (report, byte[0] == 1)
}

#[test]
fn a_warm_child_adopts_the_parents_disk_with_the_writes_since_its_spawner_forked() {
    let Some(elf) = support::probe_elf() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("root.img");
    let base = support::make_blk_image(&image);
    let disk = Arc::new(Mutex::new(Block::open(BlockConfig::cow(&image)).unwrap()));
    let mut vm = probe::boot_probe_with_devices(
        &elf,
        &ProbeOptions {
            scenario: "blkspin".into(),
            ..Default::default()
        },
        vec![disk],
    )
    .unwrap();
    vm.wait_for_line(Duration::from_secs(60), |_| {}, |l| l == abi::REPORT_READY)
        .unwrap();
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
