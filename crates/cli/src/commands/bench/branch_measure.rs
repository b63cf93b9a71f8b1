//! The measuring half of `zygote bench branch`: the same-run fork(2) baselines, booting
//! the populated probe VM, and one scenario's interleaved rounds of fork branch, warm
//! branch (through a spawner kept while the guest ran) and live, diff and full snapshots.
use std::path::Path;
use std::time::{Duration, Instant};

use zygote_vmm::devices::serial::{CallbackWriter, SerialOut};
use zygote_vmm::probe::progress::{self, Posted, ProgressBoard};
use zygote_vmm::probe::{self, ProbeOptions, ProbeVm};
use zygote_vmm::vmm::branch::{BranchRequest, ChildContext, ChildMain};
use zygote_vmm::vmm::snapshot::SnapshotMode;
use zygote_vmm::vmm::warm::{ChildSetup, Payload, SpawnerSetup, WarmBranchRequest};

use super::stats::ms;
use crate::commands::progress::Steps;

/// Guest RAM below this stays as the probe left it (its image, stack and mailbox).
pub const POPULATE_FLOOR: u64 = 32 << 20;

/// Modes in the order each round runs them.
pub const MODES: [&str; 5] = ["fork", "warm", "live", "diff", "full"];
/// The branch modes (a child whose guest must run) among `MODES`.
pub const BRANCH_MODES: usize = 2;

/// fork(2) cost of a process holding `mem_mib` of populated THP memory: the floor for a
/// fork-based branch on this host. With `kvm_slot`, the memory is also registered as
/// the memory slot of an otherwise empty KVM VM, isolating what KVM adds to fork.
pub fn bare_fork_baseline(
    mem_mib: u64,
    iterations: usize,
    kvm_slot: bool,
) -> anyhow::Result<Vec<Duration>> {
    let len = (mem_mib << 20) as usize;
    // SAFETY: private anonymous mapping, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    anyhow::ensure!(p != libc::MAP_FAILED, "mmap for the baseline failed");
    // SAFETY: advising and touching our own mapping.
    unsafe {
        libc::madvise(p, len, libc::MADV_HUGEPAGE);
        for off in (0..len).step_by(4096) {
            (p as *mut u8).add(off).write_volatile(1);
        }
    }
    let vm = if kvm_slot {
        let vm = kvm_ioctls::Kvm::new()?.create_vm()?;
        let region = kvm_bindings::kvm_userspace_memory_region {
            slot: 0,
            flags: 0,
            guest_phys_addr: 0,
            memory_size: len as u64,
            userspace_addr: p as u64,
        };
        // SAFETY: the mapping outlives the VM (dropped before the munmap below).
        unsafe { vm.set_user_memory_region(region)? };
        Some(vm)
    } else {
        None
    };
    let mut out = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        // SAFETY: the child only exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: leave at once.
            unsafe { libc::_exit(0) };
        }
        out.push(t.elapsed());
        anyhow::ensure!(pid > 0, "fork failed");
        // SAFETY: reaping our child.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    }
    drop(vm);
    // SAFETY: unmapping what we mapped; the VM using it is gone.
    unsafe { libc::munmap(p, len) };
    Ok(out)
}

pub fn sink(_: usize) -> SerialOut {
    Box::new(CallbackWriter(|_: &[u8]| {}))
}

/// Branch request for the probe VM: no devices, no console, children stay in this
/// process's cgroup and network namespace.
pub fn probe_branch<'a>(
    count: usize,
    child_main: ChildMain<'a>,
    ready_timeout: Duration,
) -> BranchRequest<'a> {
    BranchRequest {
        count,
        child_serial: &sink,
        child_devices: &|_| Default::default(),
        child_cgroup: &|_| None,
        child_netns: &|_| None,
        child_main,
        keep_fds: vec![],
        ready_timeout,
    }
}

/// Boot the spin probe with `mem_mib` and populate its RAM from the host.
pub fn boot_populated(mem_mib: u64) -> anyhow::Result<(ProbeVm, u64)> {
    let elf = probe::locate_probe(true)?;
    let mut vm = probe::boot_probe(
        &elf,
        &ProbeOptions {
            mem_mib,
            scenario: "spin".into(),
            ..Default::default()
        },
    )?;
    vm.wait_for_line(Duration::from_secs(120), |_| {}, |l| l == "PROBE READY")?;
    let pages = vm.vmm.guest_ram().populate(POPULATE_FLOOR);
    Ok((vm, pages))
}

/// What one scenario measured, raw. Index k of the per-mode arrays is `MODES[k]`.
#[derive(Default)]
pub struct Samples {
    pub pause: [Vec<Duration>; 5],
    /// Until the operation was complete: snapshot on disk; for a branch, the child's
    /// guest ran (the later of that and the branch call returning).
    pub total: [Vec<Duration>; 5],
    /// Snapshots only (a branch writes nothing).
    pub pages_written: [Vec<u64>; 5],
    /// Branches: from the request until the child's VM was built and its vCPU threads
    /// started (the child's own readiness report).
    pub vcpus_started: [Vec<Duration>; 5],
    /// Branches: from the request until the child's guest had demonstrably run.
    pub guest_ran: [Vec<Duration>; 5],
    pub capture: Vec<Duration>,
    pub fork: Vec<Duration>,
    pub resume: Vec<Duration>,
    pub child_restore: Vec<Duration>,
    /// Warm branches: parts of the pause, pages written into the spawner, the child's
    /// restore into its ready VM.
    pub warm_capture: Vec<Duration>,
    pub warm_dirty_read: Vec<Duration>,
    pub warm_copy: Vec<Duration>,
    pub warm_send: Vec<Duration>,
    pub warm_pages: Vec<u64>,
    pub warm_catch_up: Vec<Duration>,
    pub warm_caught_up_pages: Vec<u64>,
    pub warm_restore: Vec<Duration>,
    /// Extra warm branches (untimed) whose child compared its RAM with a witness of
    /// the parent's: how many, and the differing pages they found in all.
    pub verified: usize,
    pub memory_mismatches: u64,
    /// Dirtying only: finished passes over the window per second, measured while the
    /// bench waits between measurements.
    pub passes_per_s: Vec<f64>,
}

/// How a scenario runs.
pub struct Scenario<'a> {
    pub name: &'static str,
    /// Pages of the probe's dirty window (0: an idle guest that only counts).
    pub window_pages: u64,
    pub iterations: usize,
    pub work: &'a Path,
    /// How long a child may take to show its guest ran.
    pub progress_timeout: Duration,
    /// Also run an untimed, verified warm branch per round.
    pub verify: bool,
}

/// Let the guest run between measurements. Idle: a moment (its heartbeat page gets
/// dirtied). Dirtying: until it has finished two more passes over the window, so at
/// least one whole pass happened after the previous measurement and the next diff or
/// live snapshot finds the whole window dirty. Returns passes per second seen.
fn settle(vm: &ProbeVm, window_pages: u64) -> anyhow::Result<Option<f64>> {
    if window_pages == 0 {
        std::thread::sleep(Duration::from_millis(20));
        return Ok(None);
    }
    let ram = vm.vmm.guest_ram();
    let t = Instant::now();
    let start = probe::dirty_passes(ram)?;
    let heartbeat = progress::heartbeat(ram)?;
    loop {
        let now = probe::dirty_passes(ram)?;
        if now >= start + 2 {
            return Ok(Some((now - start) as f64 / t.elapsed().as_secs_f64()));
        }
        if t.elapsed() > Duration::from_secs(60) {
            let beats = progress::heartbeat(ram)? - heartbeat;
            anyhow::bail!(
                "the guest finished {} passes over its dirty window in 60 s ({beats} heartbeats): {}",
                now - start,
                if beats > 0 {
                    "the probe runs but ignores the window; is it older than this bench? \
                     (make build installs the current one next to zygote)"
                } else {
                    "the guest is not running"
                }
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Run `sc.iterations` rounds of fork, live, diff and full on `vm`, whose dirty window is
/// set to `sc.window_pages` for the scenario and stopped after it.
pub fn run_scenario(vm: &mut ProbeVm, sc: &Scenario) -> anyhow::Result<Samples> {
    probe::set_dirty_window(vm.vmm.guest_ram(), sc.window_pages)?;
    let board = ProgressBoard::new(1)?;
    let timeout = sc.progress_timeout;
    // The child proves its guest runs, posts the proof, and exits: its VM goes with it.
    let child_main = |ctx: ChildContext| -> i32 {
        let outcome = progress::wait_for_progress(ctx.vmm.guest_ram(), timeout);
        board.post(ctx.index, &outcome);
        i32::from(outcome.is_err())
    };
    let mut s = Samples::default();
    let mut steps = Steps::new(sc.name, sc.iterations);
    for i in 0..sc.iterations {
        s.passes_per_s.extend(settle(vm, sc.window_pages)?);
        board.clear();
        let start_ns = progress::mono_ns();
        let started = Instant::now();
        let r = vm
            .vmm
            .branch(&probe_branch(1, &child_main, Duration::from_secs(30)))?;
        let returned = started.elapsed();
        let posted = board.collect(
            Instant::now() + timeout + Duration::from_secs(1),
            Duration::from_micros(200),
        );
        vm.vmm.reap_children(true);
        let ran = match posted[0] {
            Some(Posted::Proven(p)) => p.since(start_ns),
            other => anyhow::bail!(
                "{} round {}: the branch child's guest did not run ({other:?} within {timeout:?})",
                sc.name,
                i + 1
            ),
        };
        s.pause[0].push(r.pause);
        s.total[0].push(returned.max(ran));
        s.vcpus_started[0].push(r.children[0].ready_after);
        s.guest_ran[0].push(ran);
        s.capture.push(r.capture);
        s.fork.push(r.fork);
        s.resume.push(r.resume);
        s.child_restore.push(r.children[0].restore);

        // Warm: the spawner is forked before the guest runs on, so it is as stale as a
        // kept one would be.
        let (r, returned, ran) = warm_round(vm, sc, &board, false)?;
        s.pause[1].push(r.pause);
        s.total[1].push(returned.max(ran));
        s.vcpus_started[1].push(r.child.ready_after);
        s.guest_ran[1].push(ran);
        s.warm_capture.push(r.capture);
        s.warm_dirty_read.push(r.dirty_read);
        s.warm_copy.push(r.copy);
        s.warm_send.push(r.send);
        s.warm_pages.push(r.pages_copied);
        s.warm_catch_up.push(r.catch_up);
        s.warm_caught_up_pages.push(r.pages_caught_up);
        s.warm_restore.push(r.child.restore);
        if sc.verify {
            let (r, ..) = warm_round(vm, sc, &board, true)?;
            s.verified += 1;
            s.memory_mismatches += r.memory_mismatches.unwrap_or(0);
        }

        for (slot, mode) in [
            (2, SnapshotMode::Live),
            (3, SnapshotMode::Diff),
            (4, SnapshotMode::Full),
        ] {
            s.passes_per_s.extend(settle(vm, sc.window_pages)?);
            let dir = sc.work.join(format!("{}-{mode:?}-{i}", sc.name));
            let r = vm.vmm.snapshot(mode, &dir)?;
            s.pause[slot].push(r.pause);
            s.total[slot].push(r.total);
            s.pages_written[slot].push(r.pages_written);
            std::fs::remove_dir_all(&dir)?;
        }
        steps.step(format!(
            "fork pause {} ms, guest ran {} ms; warm pause {} ms, guest ran {} ms; diff pause {} ms ({} pages)",
            ms(s.pause[0][i].as_secs_f64() * 1e3),
            ms(s.guest_ran[0][i].as_secs_f64() * 1e3),
            ms(s.pause[1][i].as_secs_f64() * 1e3),
            ms(s.guest_ran[1][i].as_secs_f64() * 1e3),
            ms(s.pause[3][i].as_secs_f64() * 1e3),
            s.pages_written[3][i]
        ));
    }
    steps.finish();
    probe::set_dirty_window(vm.vmm.guest_ram(), 0)?;
    Ok(s)
}

fn warm_child(_: &mut Payload) -> ChildSetup {
    ChildSetup {
        serial: sink(0),
        devices: Default::default(),
        cgroup: None,
        netns: None,
    }
}

/// One warm branch: fork a spawner, wait until its VM is built, let the guest run on
/// as between any two measurements, branch through it. Returns the report, the time
/// until the call returned and until the child's guest demonstrably ran.
fn warm_round(
    vm: &mut ProbeVm,
    sc: &Scenario,
    board: &ProgressBoard,
    verify: bool,
) -> anyhow::Result<(zygote_vmm::vmm::warm::WarmReport, Duration, Duration)> {
    let timeout = sc.progress_timeout;
    let child_main = |ctx: ChildContext, _: Payload| -> i32 {
        let outcome = progress::wait_for_progress(ctx.vmm.guest_ram(), timeout);
        board.post(ctx.index, &outcome);
        i32::from(outcome.is_err())
    };
    vm.vmm.prepare_spawner(&SpawnerSetup {
        cgroup: None,
        child: &warm_child,
        child_main: &child_main,
        keep_fds: vec![],
    })?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !vm.vmm.spawners()?.iter().any(|s| s.ready) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{}: no warm spawner was built in 30 s",
            sc.name
        );
        std::thread::sleep(Duration::from_micros(500));
    }
    settle(vm, sc.window_pages)?;
    board.clear();
    let start_ns = progress::mono_ns();
    let started = Instant::now();
    let r = vm.vmm.branch_warm(&WarmBranchRequest {
        payload: b"",
        fds: &[],
        ready_timeout: Duration::from_secs(30),
        max_pages: u64::MAX,
        by_cost: false,
        verify,
    })?;
    let returned = started.elapsed();
    let posted = board.collect(
        Instant::now() + timeout + Duration::from_secs(1),
        Duration::from_micros(200),
    );
    vm.vmm.reap_children(true);
    match posted[0] {
        Some(Posted::Proven(p)) => Ok((r, returned, p.since(start_ns))),
        other => anyhow::bail!(
            "{}: the warm child's guest did not run ({other:?} within {timeout:?})",
            sc.name
        ),
    }
}

/// The guest's own progress (passes over its dirty window per second) with no dirty
/// tracking, then with a warm spawner kept (KVM's dirty log on, the VMM reading it):
/// medians of `rounds` settles each. Call before anything turns the log on.
pub fn tracking_cost(
    vm: &mut ProbeVm,
    window_pages: u64,
    rounds: usize,
) -> anyhow::Result<(f64, f64)> {
    probe::set_dirty_window(vm.vmm.guest_ram(), window_pages)?;
    let rate = |vm: &mut ProbeVm, kept: bool| -> anyhow::Result<f64> {
        let mut v = Vec::new();
        for _ in 0..rounds {
            if kept {
                // What keeping a spawner adds between branches: reading the logs.
                vm.vmm.spawners()?;
            }
            v.extend(settle(vm, window_pages)?);
        }
        v.sort_by(|a, b| a.total_cmp(b));
        Ok(v[v.len() / 2])
    };
    let without = rate(vm, false)?;
    let child_main = |_: ChildContext, _: Payload| -> i32 { 0 };
    let pid = vm.vmm.prepare_spawner(&SpawnerSetup {
        cgroup: None,
        child: &warm_child,
        child_main: &child_main,
        keep_fds: vec![],
    })?;
    let with = rate(vm, true)?;
    vm.vmm.drop_spawner(pid);
    probe::set_dirty_window(vm.vmm.guest_ram(), 0)?;
    Ok((without, with))
}
