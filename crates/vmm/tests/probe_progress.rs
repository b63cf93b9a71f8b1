//! The probe features the branch benchmarks stand on, under real KVM: the `spin` guest's
//! dirty window (the guest itself rewrites the pages, clamped to its RAM) and the proof
//! that a branch child's guest runs (heartbeat past the first value the child reads,
//! posted through a ProgressBoard). Skips with a reason when KVM is unavailable.
mod support;

use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};
use zygote_probe_abi as abi;
use zygote_vmm::probe::progress::{self, Posted, ProgressBoard};
use zygote_vmm::probe::{self, ProbeVm};
use zygote_vmm::vmm::branch::{BranchRequest, ChildContext};

fn wait_passes(vm: &ProbeVm, at_least: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = probe::dirty_passes(vm.vmm.guest_ram()).unwrap();
        if n >= at_least {
            return n;
        }
        assert!(Instant::now() < deadline, "only {n} passes in 60 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn word(vm: &ProbeVm, gpa: u64) -> u64 {
    vm.vmm
        .guest_ram()
        .memory()
        .read_obj(GuestAddress(gpa))
        .unwrap()
}

#[test]
fn the_guest_rewrites_its_dirty_window_and_only_that() {
    let Some(mut vm) = support::boot_spin(1) else {
        return;
    };
    let ram = vm.vmm.guest_ram().clone();
    assert_eq!(probe::dirty_passes(&ram).unwrap(), 0, "off until asked");
    // The default probe VM has 256 MiB: 1 MiB from 128 MiB fits.
    let pages = probe::dirty_window_pages(256, 1).unwrap();
    probe::set_dirty_window(&ram, pages).unwrap();
    wait_passes(&vm, 2);
    let first = word(&vm, abi::DIRTY_WINDOW_GPA);
    let last = word(&vm, abi::DIRTY_WINDOW_GPA + (pages - 1) * 4096);
    // Each page holds the heartbeat value of its write: set, and later pages later.
    assert!(first != 0 && last != 0, "{first} {last}");
    assert!(
        word(&vm, abi::DIRTY_WINDOW_GPA + pages * 4096) == 0,
        "the page past the window is untouched"
    );
    let passes = wait_passes(&vm, probe::dirty_passes(&ram).unwrap() + 1);
    assert!(
        word(&vm, abi::DIRTY_WINDOW_GPA) != first,
        "rewritten by pass {passes}"
    );

    // Off: passes stop. On with more pages than the guest has: it clamps to its RAM
    // instead of faulting, and keeps going.
    probe::set_dirty_window(&ram, 0).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let stopped = probe::dirty_passes(&ram).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(probe::dirty_passes(&ram).unwrap(), stopped);
    let top = (256 << 20) - 4096;
    let top_before = word(&vm, top);
    probe::set_dirty_window(&ram, u64::MAX).unwrap();
    wait_passes(&vm, stopped + 1);
    assert!(vm.vmm.wait(Some(Duration::ZERO)).is_none(), "still running");
    assert_ne!(
        word(&vm, top),
        top_before,
        "the last page of RAM is in the clamped window"
    );
    vm.vmm.shutdown();
}

#[test]
fn branch_children_prove_their_guest_runs() {
    let Some(mut vm) = support::boot_spin(1) else {
        return;
    };
    let board = ProgressBoard::new(3).unwrap();
    let child_main = |ctx: ChildContext| -> i32 {
        let outcome = progress::wait_for_progress(ctx.vmm.guest_ram(), Duration::from_secs(20));
        board.post(ctx.index, &outcome);
        i32::from(outcome.is_err())
    };
    let start_ns = progress::mono_ns();
    let report = vm
        .vmm
        .branch(&BranchRequest {
            count: 3,
            child_serial: &|_| support::sink(),
            child_devices: &|_| Default::default(),
            child_cgroup: &|_| None,
            child_netns: &|_| None,
            child_main: &child_main,
            keep_fds: vec![],
            ready_timeout: Duration::from_secs(30),
        })
        .unwrap();
    let posted = board.collect(
        Instant::now() + Duration::from_secs(25),
        Duration::from_millis(1),
    );
    for (c, p) in report.children.iter().zip(&posted) {
        match p {
            Some(Posted::Proven(p)) => {
                assert!(p.after > p.before, "{p:?}");
                assert!(p.since(start_ns) > Duration::ZERO);
                eprintln!(
                    "child {}: vCPUs started {:?}, guest ran {:?}",
                    c.index,
                    c.ready_after,
                    p.since(start_ns)
                );
            }
            other => panic!("child {} did not prove its guest runs: {other:?}", c.index),
        }
    }
    vm.vmm.reap_children(true);
    vm.vmm.shutdown();
}
