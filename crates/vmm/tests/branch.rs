//! Fork-based branching of a live probe VM: children continue the guest independently
//! (memory isolation both ways), killing a child never disturbs the parent or siblings,
//! and a stopped VM refuses to branch. Skips with a reason when KVM is unavailable.
mod support;

use std::os::fd::RawFd;
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress};
use zygote_probe_abi as abi;
use zygote_vmm::probe::{self, ProbeOptions, ProbeVm};
use zygote_vmm::vmm::branch::{BranchError, BranchRequest, ChildContext};
use zygote_vmm::VmmError;

const CHILD_MARK: u64 = 0xc41d_c41d;
const PARENT_MARK: u64 = 0xba7e_ba7e;
const SCRATCH_CHILD: u64 = abi::MAILBOX_GPA + abi::MAILBOX_OFF_SCRATCH + 8 * 5;
const SCRATCH_PARENT: u64 = abi::MAILBOX_GPA + abi::MAILBOX_OFF_SCRATCH + 8 * 6;

fn heartbeat(vm: &ProbeVm) -> u64 {
    vm.mailbox().unwrap().heartbeat
}

/// A pipe children report on: records of (child index, heartbeat, parent mark seen).
struct Reports {
    r: RawFd,
    w: RawFd,
}

impl Reports {
    fn new() -> Self {
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        Self {
            r: fds[0],
            w: fds[1],
        }
    }

    fn send(fd: RawFd, rec: [u64; 3]) {
        let bytes: Vec<u8> = rec.iter().flat_map(|v| v.to_le_bytes()).collect();
        unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    }

    fn recv(&self, timeout: Duration) -> Option<[u64; 3]> {
        let mut pfd = libc::pollfd {
            fd: self.r,
            events: libc::POLLIN,
            revents: 0,
        };
        if unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) } <= 0 {
            return None;
        }
        let mut b = [0u8; 24];
        let n = unsafe { libc::read(self.r, b.as_mut_ptr().cast(), 24) };
        if n != 24 {
            return None;
        }
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        Some([w(0), w(1), w(2)])
    }
}

/// Child main: mark its own memory, then report heartbeat and whether it sees the
/// parent's post-fork mark, `rounds` times (forever when 0).
fn reporting_child(w: RawFd, rounds: usize) -> impl Fn(ChildContext) -> i32 {
    move |ctx: ChildContext| {
        let mem = ctx.vmm.guest_ram().memory();
        mem.write_obj(CHILD_MARK, GuestAddress(SCRATCH_CHILD))
            .unwrap();
        let mut round = 0;
        loop {
            std::thread::sleep(Duration::from_millis(150));
            let mb = probe::read_mailbox(ctx.vmm.guest_ram()).unwrap();
            let parent_mark: u64 = mem.read_obj(GuestAddress(SCRATCH_PARENT)).unwrap();
            Reports::send(w, [ctx.index as u64, mb.heartbeat, parent_mark]);
            round += 1;
            if rounds != 0 && round >= rounds {
                return 0;
            }
        }
    }
}

fn sink(_: usize) -> zygote_vmm::devices::serial::SerialOut {
    support::sink()
}

/// Branch `count` children running `child_main`, keeping `keep_fds` open in them.
fn branch(
    vm: &mut ProbeVm,
    count: usize,
    child_main: &dyn Fn(ChildContext) -> i32,
    keep_fds: Vec<RawFd>,
) -> Result<zygote_vmm::vmm::branch::BranchReport, BranchError> {
    branch_saving_point(vm, count, child_main, keep_fds, None)
}

/// [`branch`], also saving the branch point into `point`.
fn branch_saving_point(
    vm: &mut ProbeVm,
    count: usize,
    child_main: &dyn Fn(ChildContext) -> i32,
    keep_fds: Vec<RawFd>,
    point: Option<&std::path::Path>,
) -> Result<zygote_vmm::vmm::branch::BranchReport, BranchError> {
    let req = BranchRequest {
        count,
        child_serial: &sink,
        child_devices: &|_| Default::default(),
        child_cgroup: &|_| None,
        child_netns: &|_| None,
        child_main,
        keep_fds,
        ready_timeout: Duration::from_secs(30),
    };
    vm.vmm.branch_saving_point(&req, point)
}

#[test]
fn children_continue_independently_with_isolated_memory() {
    let Some(mut vm) = support::boot_spin(2) else {
        return;
    };
    let reports = Reports::new();
    let child_main = reporting_child(reports.w, 3);
    let before = heartbeat(&vm);
    let report = branch(&mut vm, 2, &child_main, vec![reports.w]).unwrap();
    eprintln!(
        "branch: pause {:?} (capture {:?}, fork {:?}), ready {:?}",
        report.pause,
        report.capture,
        report.fork,
        report
            .children
            .iter()
            .map(|c| c.ready_after)
            .collect::<Vec<_>>()
    );
    assert_eq!(report.children.len(), 2);
    assert!(!vm.vmm.is_paused(), "parent resumes right after fork");
    for c in &report.children {
        assert!(
            c.ready_after >= c.restore,
            "ready time includes the child's rebuild"
        );
    }

    // The parent writes after the fork; children must not see it.
    let mem = vm.vmm.guest_ram().memory();
    mem.write_obj(PARENT_MARK, GuestAddress(SCRATCH_PARENT))
        .unwrap();

    let mut seen: std::collections::HashMap<u64, Vec<u64>> = Default::default();
    for _ in 0..6 {
        let [index, beat, parent_mark] = reports
            .recv(Duration::from_secs(20))
            .expect("child reports");
        assert_ne!(
            parent_mark, PARENT_MARK,
            "child {index} saw the parent's post-fork write"
        );
        assert!(
            beat >= before,
            "child {index} continues from the fork point"
        );
        seen.entry(index).or_default().push(beat);
    }
    for (index, beats) in &seen {
        assert_eq!(beats.len(), 3);
        assert!(
            beats.windows(2).all(|w| w[1] > w[0]),
            "child {index}'s guest keeps running: {beats:?}"
        );
    }
    // And the parent never sees the children's writes, while its guest keeps running.
    let child_mark: u64 = mem.read_obj(GuestAddress(SCRATCH_CHILD)).unwrap();
    assert_ne!(child_mark, CHILD_MARK);
    let a = heartbeat(&vm);
    std::thread::sleep(Duration::from_millis(200));
    assert!(heartbeat(&vm) > a);

    // Two children come from one spawner, which exits cleanly once both have.
    let spawner = report.spawner.expect("count > 1 uses a spawner");
    assert_eq!(vm.vmm.children(), &[spawner]);
    let reaped = vm.vmm.reap_children(true);
    assert_eq!(reaped.len(), 1);
    let (pid, status) = reaped[0];
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "spawner {pid}: {status:#x}"
    );
    vm.vmm.shutdown();
}

#[test]
fn killing_a_child_disturbs_neither_parent_nor_sibling() {
    let Some(mut vm) = support::boot_spin(2) else {
        return;
    };
    let reports = Reports::new();
    let child_main = reporting_child(reports.w, 0);
    let report = branch(&mut vm, 2, &child_main, vec![reports.w]).unwrap();
    let victim = report.children[0].pid;
    assert_ne!(victim, report.children[1].pid);
    unsafe { libc::kill(victim, libc::SIGKILL) };
    // The spawner reaps it; wait until the pid is gone.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while unsafe { libc::kill(victim, 0) } == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "victim {victim} never went away"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // Drain what was in flight, then require fresh reports from the sibling only.
    std::thread::sleep(Duration::from_millis(200));
    while reports.recv(Duration::from_millis(10)).is_some() {}
    let mut sibling_beats = Vec::new();
    while sibling_beats.len() < 3 {
        let [index, beat, _] = reports
            .recv(Duration::from_secs(20))
            .expect("sibling alive");
        assert_eq!(index, 1, "only the sibling reports now");
        sibling_beats.push(beat);
    }
    assert!(sibling_beats.windows(2).all(|w| w[1] > w[0]));
    let a = heartbeat(&vm);
    std::thread::sleep(Duration::from_millis(200));
    assert!(heartbeat(&vm) > a, "parent keeps running");

    unsafe { libc::kill(report.children[1].pid, libc::SIGKILL) };
    // With both children gone the spawner exits and is reaped.
    vm.vmm.reap_children(true);
    assert!(vm.vmm.children().is_empty());
    vm.vmm.shutdown();
}

#[test]
fn a_stopped_vm_refuses_to_branch() {
    let Some(elf) = support::probe_elf() else {
        return;
    };
    // The boot scenario resets the VM when done.
    let mut vm = probe::boot_probe(&elf, &ProbeOptions::default()).unwrap();
    vm.wait_for_line(Duration::from_secs(60), |_| {}, |l| l == abi::REPORT_OK)
        .unwrap();
    assert!(vm.vmm.wait(Some(Duration::from_secs(30))).is_some());
    let never = |_: ChildContext| -> i32 { unreachable!("no child may start") };
    let err = branch(&mut vm, 1, &never, vec![]).unwrap_err();
    assert!(
        matches!(err, BranchError::Vmm(VmmError::Stopped(_))),
        "{err}"
    );
    assert!(err.to_string().contains("stopped"), "{err}");
}

#[test]
fn a_single_child_is_a_direct_child() {
    let Some(mut vm) = support::boot_spin(2) else {
        return;
    };
    let reports = Reports::new();
    let child_main = reporting_child(reports.w, 1);
    let report = branch(&mut vm, 1, &child_main, vec![reports.w]).unwrap();
    assert!(report.spawner.is_none());
    assert_eq!(vm.vmm.children(), &[report.children[0].pid]);
    let [index, _, _] = reports
        .recv(Duration::from_secs(20))
        .expect("child reports");
    assert_eq!(index, 0);
    let reaped = vm.vmm.reap_children(true);
    assert_eq!(reaped.len(), 1);
    assert!(libc::WIFEXITED(reaped[0].1) && libc::WEXITSTATUS(reaped[0].1) == 0);
    vm.vmm.shutdown();
}

/// A branch child is a sandbox of its own: it outlives its parent VM and the spawner
/// that forked it (a tree search keeps one child and deletes the parent; the daemon
/// kills a deleted sandbox's whole cgroup, where the spawner lives).
#[test]
fn children_outlive_the_parent_and_the_spawner() {
    let Some(mut vm) = support::boot_spin(1) else {
        return;
    };
    let reports = Reports::new();
    let child_main = reporting_child(reports.w, 0);
    let report = branch(&mut vm, 2, &child_main, vec![reports.w]).unwrap();
    let spawner = report.spawner.expect("count > 1 uses a spawner");
    unsafe { libc::kill(spawner, libc::SIGKILL) };
    assert_eq!(vm.vmm.reap_children(true), vec![(spawner, libc::SIGKILL)]);
    vm.vmm.shutdown();

    // Drain what was in flight, then both children must still be reporting progress.
    std::thread::sleep(Duration::from_millis(300));
    while reports.recv(Duration::from_millis(10)).is_some() {}
    let mut beats: std::collections::HashMap<u64, Vec<u64>> = Default::default();
    while beats.values().map(Vec::len).sum::<usize>() < 6 {
        let [index, beat, _] = reports
            .recv(Duration::from_secs(20))
            .expect("children keep running without their spawner and parent");
        beats.entry(index).or_default().push(beat);
    }
    assert_eq!(beats.len(), 2, "both children report: {beats:?}");
    for c in &report.children {
        unsafe { libc::kill(c.pid, libc::SIGKILL) };
    }
}

/// The cgroup v2 mount point, if this host has one we can write to.
fn cgroup2_root() -> Option<std::path::PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    let dir = mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[2] == "cgroup2")
        .map(|f| std::path::PathBuf::from(f[1]))?;
    let probe = dir.join(format!("zygote-probe-{}", std::process::id()));
    std::fs::create_dir(&probe).ok()?;
    std::fs::remove_dir(&probe).ok()?;
    Some(dir)
}

/// The pid of KVM's `kvm-nx-lpage-recovery-<vmm>` kernel thread for the VM `vmm` made.
fn kvm_worker_of(vmm: libc::pid_t) -> Option<String> {
    let name = format!("(kvm-nx-lpage-recovery-{vmm})");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        stat.contains(&name)
            .then(|| e.file_name().to_string_lossy().into_owned())
    })
}

/// Removes the test's cgroups (once their processes are gone).
struct Cgroups(Vec<std::path::PathBuf>);

impl Drop for Cgroups {
    fn drop(&mut self) {
        for d in self.0.iter().rev() {
            for _ in 0..250 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Each child joins its own cgroup before it builds its VM, so whatever the new VM
/// creates is accounted there: KVM attaches its per-VM kernel threads (e.g.
/// kvm-nx-lpage-recovery-<pid> on EPT/NPT hosts) to the creator's cgroups, and left in
/// the parent's cgroup they would keep it from being removed while the child runs.
#[test]
fn children_join_their_cgroups_before_building_their_vm() {
    let Some(root) = cgroup2_root() else {
        eprintln!("skipping: no writable cgroup v2 hierarchy on this host");
        return;
    };
    let Some(mut vm) = support::boot_spin(1) else {
        return;
    };
    let base = root.join(format!("zygote-branch-test-{}", std::process::id()));
    let dirs: Vec<_> = (0..2).map(|i| base.join(format!("c{i}"))).collect();
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
    }
    let mut cleanup = Cgroups(vec![base.clone()]);
    cleanup.0.extend(dirs.clone());
    let reports = Reports::new();
    let child_main = reporting_child(reports.w, 0);
    let report = vm
        .vmm
        .branch(&BranchRequest {
            count: 2,
            child_serial: &sink,
            child_devices: &|_| Default::default(),
            child_cgroup: &|i| Some(dirs[i].clone()),
            child_netns: &|_| None,
            child_main: &child_main,
            keep_fds: vec![reports.w],
            ready_timeout: Duration::from_secs(30),
        })
        .unwrap();
    for c in &report.children {
        let procs = std::fs::read_to_string(dirs[c.index].join("cgroup.procs")).unwrap();
        let pids: Vec<&str> = procs.split_whitespace().collect();
        assert!(
            pids.contains(&c.pid.to_string().as_str()),
            "child {} (pid {}) is in {}: {pids:?}",
            c.index,
            c.pid,
            dirs[c.index].display()
        );
        // Where KVM runs a kernel thread per VM (named after the VM's creator), the
        // child's is in the child's cgroup.
        match kvm_worker_of(c.pid) {
            Some(worker) => assert!(
                pids.contains(&worker.as_str()),
                "KVM worker {worker} of child {} is not in its cgroup: {pids:?}",
                c.index
            ),
            None => eprintln!("this host's KVM runs no per-VM worker thread to check"),
        }
    }
    let [_, beat, _] = reports.recv(Duration::from_secs(20)).expect("children run");
    assert!(beat > 0);
    for c in &report.children {
        unsafe { libc::kill(c.pid, libc::SIGKILL) };
    }
    vm.vmm.reap_children(true);
    vm.vmm.shutdown();
}

/// A branch that keeps its point: the spawner (used even for one child) writes a full
/// snapshot of the branch point after forking the children, while parent and child
/// run; it restores to exactly the state the child started from.
#[test]
fn a_saved_branch_point_restores_the_state_children_started_from() {
    let Some(mut vm) = support::boot_spin(1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let point = dir.path().join("point");
    let mem = vm.vmm.guest_ram().memory();
    mem.write_obj(PARENT_MARK, GuestAddress(SCRATCH_PARENT))
        .unwrap();
    let before = heartbeat(&vm);
    let reports = Reports::new();
    let child_main = reporting_child(reports.w, 1);
    let report =
        branch_saving_point(&mut vm, 1, &child_main, vec![reports.w], Some(&point)).unwrap();
    assert!(report.spawner.is_some(), "saving the point uses a spawner");
    // Changed after the branch point: neither the child nor the point sees it.
    vm.vmm
        .guest_ram()
        .memory()
        .write_obj(0u64, GuestAddress(SCRATCH_PARENT))
        .unwrap();
    let [_, child_beat, parent_mark] = reports
        .recv(Duration::from_secs(20))
        .expect("child reports");
    assert_eq!(parent_mark, PARENT_MARK);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !point.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the point's snapshot never appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let restored = zygote_vmm::Vmm::restore_snapshot(
        &point,
        zygote_vmm::vmm::RestoreConfig::new(support::sink(), true),
        true,
    )
    .expect("the saved point restores");
    let mem = restored.guest_ram().memory();
    let mark: u64 = mem.read_obj(GuestAddress(SCRATCH_PARENT)).unwrap();
    assert_eq!(
        mark, PARENT_MARK,
        "the point holds the state before the branch"
    );
    let point_beat = probe::read_mailbox(restored.guest_ram()).unwrap().heartbeat;
    assert!(
        (before..=child_beat).contains(&point_beat),
        "point heartbeat {point_beat}: after {before} (read before the branch), \
         at most the child's {child_beat}"
    );
    restored.shutdown();
    for pid in vm.vmm.children().to_vec() {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    for c in &report.children {
        unsafe { libc::kill(c.pid, libc::SIGKILL) };
    }
    vm.vmm.shutdown();
}
