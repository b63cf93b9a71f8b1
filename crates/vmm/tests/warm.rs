//! Warm spawners under real KVM: a child made from a spawner forked long before the
//! branch has, page for page, the parent's memory at the branch instant (the parent
//! sends a witness copy; the child counts differing pages before it runs), its guest
//! runs, and a missed source of dirty pages is caught. Skips with a reason when KVM is
//! unavailable.
mod support;

use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};
use zygote_probe_abi as abi;
use zygote_vmm::probe::progress::{self, Posted, ProgressBoard};
use zygote_vmm::probe::{self, ProbeOptions, ProbeVm};
use zygote_vmm::vmm::branch::ChildContext;
use zygote_vmm::vmm::dirty::DirtySources;
use zygote_vmm::vmm::warm::{Payload, SpawnerSetup, WarmBranchRequest, WarmError, WarmReport};

/// Above the dirty window's start (128 MiB), with room for a 4 MiB window.
const MEM_MIB: u64 = 160;

fn boot(mem_mib: u64) -> Option<ProbeVm> {
    let elf = support::probe_elf()?;
    let mut vm = probe::boot_probe(
        &elf,
        &ProbeOptions {
            mem_mib,
            scenario: "spin".into(),
            ..Default::default()
        },
    )
    .unwrap();
    vm.wait_for_line(Duration::from_secs(60), |_| {}, |l| l == abi::REPORT_READY)
        .unwrap();
    Some(vm)
}

/// Prepare a spawner, let the guest run (and dirty) for `wait`, branch with
/// verification; the child proves its guest runs and exits.
fn warm_branch(vm: &mut ProbeVm, board: &ProgressBoard, wait: Duration) -> WarmReport {
    let child_main = |ctx: ChildContext, _: Payload| -> i32 {
        let outcome = progress::wait_for_progress(ctx.vmm.guest_ram(), Duration::from_secs(20));
        board.post(0, &outcome);
        i32::from(outcome.is_err())
    };
    let setup = SpawnerSetup {
        cgroup: None,
        child: &support::no_child_resources,
        child_main: &child_main,
        keep_fds: vec![],
    };
    vm.vmm.prepare_spawner(&setup).unwrap();
    support::wait_for_ready_spawner(&mut vm.vmm);
    std::thread::sleep(wait);
    board.clear();
    let report = support::verified_warm_branch(&mut vm.vmm);
    let posted = board.collect(
        Instant::now() + Duration::from_secs(25),
        Duration::from_micros(200),
    );
    assert!(
        matches!(posted[0], Some(Posted::Proven(_))),
        "the warm child's guest did not run: {:?}",
        posted[0]
    );
    vm.vmm.reap_children(true);
    report
}

#[test]
fn warm_children_match_the_parent_while_the_guest_rewrites_memory() {
    let Some(mut vm) = boot(MEM_MIB) else {
        return;
    };
    let board = ProgressBoard::new(1).unwrap();
    let rounds: usize = std::env::var("ZYGOTE_WARM_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    // Idle (only the heartbeat), then a 4 MiB window the guest rewrites continuously.
    let window = probe::dirty_window_pages(MEM_MIB, 4).unwrap();
    let mut copied = Vec::new();
    for round in 0..rounds {
        let dirtying = round >= rounds / 4;
        if round == rounds / 4 {
            probe::set_dirty_window(vm.vmm.guest_ram(), window).unwrap();
        }
        let r = warm_branch(
            &mut vm,
            &board,
            Duration::from_millis(if dirtying { 5 } else { 1 }),
        );
        assert_eq!(
            r.memory_mismatches,
            Some(0),
            "round {round}: {} pages copied, {r:?}",
            r.pages_copied
        );
        copied.push(r.pages_copied);
    }
    copied.sort_unstable();
    eprintln!(
        "{rounds} warm branches, 0 mismatches; pages copied median {}",
        copied[rounds / 2]
    );
    // Dirtying rounds copy the window they rewrote: the copy is not vacuous.
    assert!(copied[rounds - 1] >= 64, "{copied:?}");
    vm.vmm.shutdown();
}

#[test]
fn a_missed_source_of_dirty_pages_is_caught() {
    let Some(mut vm) = boot(MEM_MIB) else {
        return;
    };
    let board = ProgressBoard::new(1).unwrap();
    let window = probe::dirty_window_pages(MEM_MIB, 1).unwrap();
    probe::set_dirty_window(vm.vmm.guest_ram(), window).unwrap();

    // Without KVM's log, the pages the guest rewrites are missed.
    vm.vmm.set_spawner_dirty_sources(DirtySources {
        kvm: false,
        ..Default::default()
    });
    let r = warm_branch(&mut vm, &board, Duration::from_millis(50));
    assert!(
        r.memory_mismatches.unwrap() > 0,
        "KVM's log off, yet no mismatch: {r:?}"
    );

    // Without the VMM's own record, a page only the VMM writes is missed. (A page the
    // guest never touches: above the window.)
    vm.vmm.set_spawner_dirty_sources(DirtySources {
        host: false,
        ..Default::default()
    });
    let untouched = GuestAddress(abi::DIRTY_WINDOW_GPA + (window + 16) * 4096);
    let child_main = |ctx: ChildContext, _: Payload| -> i32 {
        let outcome = progress::wait_for_progress(ctx.vmm.guest_ram(), Duration::from_secs(20));
        board.post(0, &outcome);
        i32::from(outcome.is_err())
    };
    let setup = SpawnerSetup {
        cgroup: None,
        child: &support::no_child_resources,
        child_main: &child_main,
        keep_fds: vec![],
    };
    // A spawner, then a page written by the VMM alone, then a verified branch.
    let vmm_write_then_branch = |vm: &mut ProbeVm, value: u64| {
        vm.vmm.prepare_spawner(&setup).unwrap();
        support::wait_for_ready_spawner(&mut vm.vmm);
        vm.vmm
            .guest_ram()
            .memory()
            .write_obj(value, untouched)
            .unwrap();
        let r = support::verified_warm_branch(&mut vm.vmm);
        vm.vmm.reap_children(true);
        r
    };
    let r = vmm_write_then_branch(&mut vm, 0x5eed);
    assert_eq!(r.memory_mismatches, Some(1), "{r:?}");

    // Both on again: the same write is carried.
    vm.vmm.set_spawner_dirty_sources(DirtySources::default());
    let r = vmm_write_then_branch(&mut vm, 0x5eed_5eed);
    assert_eq!(r.memory_mismatches, Some(0), "{r:?}");
    vm.vmm.shutdown();
}

#[test]
fn without_a_ready_spawner_the_caller_is_told_and_a_dead_one_is_dropped() {
    let Some(mut vm) = boot(64) else {
        return;
    };
    let no = vm.vmm.branch_warm(&WarmBranchRequest {
        payload: b"",
        fds: &[],
        ready_timeout: Duration::from_secs(5),
        max_pages: u64::MAX,
        by_cost: false,
        verify: false,
    });
    assert!(matches!(no, Err(WarmError::NoSpawner)), "{no:?}");
    let child_main = |_: ChildContext, _: Payload| -> i32 { 0 };
    let pid = vm
        .vmm
        .prepare_spawner(&SpawnerSetup {
            cgroup: None,
            child: &support::no_child_resources,
            child_main: &child_main,
            keep_fds: vec![],
        })
        .unwrap();
    support::wait_for_ready_spawner(&mut vm.vmm);
    let listed = vm.vmm.spawners().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].pid, pid);
    // A spawner further behind than the caller allows is refused before any pause
    // (the guest's heartbeat page alone is written continuously), and kept.
    std::thread::sleep(Duration::from_millis(20));
    let stale = vm.vmm.branch_warm(&WarmBranchRequest {
        payload: b"",
        fds: &[],
        ready_timeout: Duration::from_secs(5),
        max_pages: 0,
        by_cost: false,
        verify: false,
    });
    assert!(
        matches!(stale, Err(WarmError::TooStale { pages, max: 0 }) if pages >= 1),
        "{stale:?}"
    );
    assert_eq!(vm.vmm.spawners().unwrap().len(), 1);
    // SAFETY: killing the spawner we made.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !vm.vmm.spawners().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "a dead spawner is still listed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let no = vm.vmm.branch_warm(&WarmBranchRequest {
        payload: b"",
        fds: &[],
        ready_timeout: Duration::from_secs(5),
        max_pages: u64::MAX,
        by_cost: false,
        verify: false,
    });
    assert!(matches!(no, Err(WarmError::NoSpawner)), "{no:?}");
    assert!(
        vm.vmm.wait(Some(Duration::ZERO)).is_none(),
        "the parent runs on"
    );
    vm.vmm.shutdown();
}
