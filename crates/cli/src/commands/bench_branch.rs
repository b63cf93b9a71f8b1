//! `zygote bench branch`: pause time and time-to-running of fork-based branching against
//! live, diff and full snapshots of the same live VM, interleaved in one run.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;
use zygote_vmm::devices::serial::{CallbackWriter, SerialOut};
use zygote_vmm::probe::{self, ProbeOptions, ProbeVm};
use zygote_vmm::vmm::branch::{BranchRequest, ChildContext};
use zygote_vmm::vmm::snapshot::SnapshotMode;

use super::bench_stats::{ms, Summary};

/// Guest RAM below this stays as the probe left it (its image, stack and mailbox).
pub const POPULATE_FLOOR: u64 = 32 << 20;

#[derive(clap::Args)]
pub struct BranchBenchArgs {
    /// Guest memory in MiB; all of it above 32 MiB is touched from the host first.
    #[arg(long, default_value_t = 1024)]
    mem_mib: u64,
    /// Measurements per mode.
    #[arg(long, default_value_t = 20)]
    iterations: usize,
    /// Where snapshots are written (deleted after each measurement).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct ModeResult {
    mode: &'static str,
    pause_ms: Summary,
    /// fork only: from the request until the child's VM runs.
    ready_ms: Option<Summary>,
    /// From the request until the operation completed (snapshot on disk / child running).
    total_ms: Summary,
}

#[derive(Serialize)]
struct BranchBench {
    mem_mib: u64,
    iterations: usize,
    populated_pages: u64,
    modes: Vec<ModeResult>,
    /// fork only: parts of the pause, and the child's own rebuild time.
    fork_capture_ms: Summary,
    fork_syscall_ms: Summary,
    fork_resume_ms: Summary,
    child_restore_ms: Summary,
    /// full pause p50 / fork pause p50.
    full_over_fork: f64,
    /// Baseline measured in the same run: fork(2) of this process holding the same
    /// amount of populated MADV_HUGEPAGE memory and no VM (the kernel's floor).
    bare_fork_ms: Summary,
    /// fork-mode pause p50 / bare fork p50.
    fork_pause_over_bare_fork: f64,
    /// The same bare fork with that memory registered as a KVM memory slot (a VM
    /// with no vCPUs): fork then also runs KVM's MMU-notifier invalidation over the
    /// slot, which this host's KVM charges per guest page. The floor for forking a
    /// process that owns a VM.
    kvm_slot_fork_ms: Summary,
    /// fork-mode pause p50 / KVM-slot fork p50.
    fork_pause_over_kvm_slot_fork: f64,
}

/// fork(2) cost of a process holding `mem_mib` of populated THP memory: the floor for a
/// fork-based branch on this host. With `kvm_slot`, the memory is also registered as
/// the memory slot of an otherwise empty KVM VM, isolating what KVM adds to fork.
fn bare_fork_baseline(
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

pub fn run(args: BranchBenchArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.iterations > 0, "--iterations must be at least 1");
    let work = tempfile::Builder::new()
        .prefix("zygote-bench-branch-")
        .tempdir_in(args.work_dir.clone().unwrap_or_else(std::env::temp_dir))?;
    eprintln!(
        "baseline: bare fork(2) with {} MiB of populated THP memory...",
        args.mem_mib
    );
    let bare = bare_fork_baseline(args.mem_mib, args.iterations, false)?;
    eprintln!("baseline: the same with the memory in a KVM memory slot...");
    let kvm_slot = bare_fork_baseline(args.mem_mib, args.iterations, true)?;
    eprintln!(
        "booting a {} MiB probe VM and populating its memory...",
        args.mem_mib
    );
    let (mut vm, populated_pages) = boot_populated(args.mem_mib)?;
    // Diffs need a base snapshot of this VM.
    vm.vmm
        .snapshot(SnapshotMode::Full, &work.path().join("base"))?;

    let mut pause: [Vec<Duration>; 4] = Default::default();
    let mut total: [Vec<Duration>; 4] = Default::default();
    let (mut ready, mut capture, mut fork) = (Vec::new(), Vec::new(), Vec::new());
    let (mut resume, mut restore) = (Vec::new(), Vec::new());
    let exit_at_once = |_: ChildContext| -> i32 { 0 };
    for i in 0..args.iterations {
        eprint!("\riteration {}/{}", i + 1, args.iterations);
        let started = Instant::now();
        let r = vm.vmm.branch(&BranchRequest {
            count: 1,
            child_serial: &sink,
            child_devices: &|_| Default::default(),
            child_cgroup: &|_| None,
            child_netns: &|_| None,
            child_main: &exit_at_once,
            keep_fds: vec![],
            ready_timeout: Duration::from_secs(30),
        })?;
        total[0].push(started.elapsed());
        pause[0].push(r.pause);
        ready.push(r.children[0].ready_after);
        capture.push(r.capture);
        fork.push(r.fork);
        resume.push(r.resume);
        restore.push(r.children[0].restore);
        vm.vmm.reap_children(true);

        for (slot, mode) in [
            (1, SnapshotMode::Live),
            (2, SnapshotMode::Diff),
            (3, SnapshotMode::Full),
        ] {
            // Let the guest run (and dirty its heartbeat page) between measurements.
            std::thread::sleep(Duration::from_millis(20));
            let dir = work.path().join(format!("{mode:?}-{i}"));
            let r = vm.vmm.snapshot(mode, &dir)?;
            pause[slot].push(r.pause);
            total[slot].push(r.total);
            std::fs::remove_dir_all(&dir)?;
        }
    }
    eprintln!();
    vm.vmm.shutdown();

    let names = ["fork", "live", "diff", "full"];
    let modes: Vec<ModeResult> = (0..4)
        .map(|k| ModeResult {
            mode: names[k],
            pause_ms: Summary::of(&pause[k]),
            ready_ms: (k == 0).then(|| Summary::of(&ready)),
            total_ms: Summary::of(&total[k]),
        })
        .collect();
    let bare_fork_ms = Summary::of(&bare);
    let kvm_slot_fork_ms = Summary::of(&kvm_slot);
    let result = BranchBench {
        fork_pause_over_kvm_slot_fork: modes[0].pause_ms.p50 / kvm_slot_fork_ms.p50,
        kvm_slot_fork_ms,
        fork_pause_over_bare_fork: modes[0].pause_ms.p50 / bare_fork_ms.p50,
        bare_fork_ms,
        mem_mib: args.mem_mib,
        iterations: args.iterations,
        populated_pages,
        full_over_fork: modes[3].pause_ms.p50 / modes[0].pause_ms.p50,
        fork_capture_ms: Summary::of(&capture),
        fork_syscall_ms: Summary::of(&fork),
        fork_resume_ms: Summary::of(&resume),
        child_restore_ms: Summary::of(&restore),
        modes,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        println!(
            "bench branch: {} MiB guest ({} pages populated), {} iterations, medians and p90 in ms",
            result.mem_mib, result.populated_pages, result.iterations
        );
        println!(
            "{:<6} {:>10} {:>10} {:>12} {:>12}",
            "mode", "pause p50", "pause p90", "ready p50", "total p50"
        );
        for m in &result.modes {
            let ready = m.ready_ms.as_ref().map_or("-".into(), |r| ms(r.p50));
            println!(
                "{:<6} {:>10} {:>10} {:>12} {:>12}",
                m.mode,
                ms(m.pause_ms.p50),
                ms(m.pause_ms.p90),
                ready,
                ms(m.total_ms.p50)
            );
        }
        println!(
            "fork pause p50 parts: pause+capture {} + fork(2) {} + resume {}; child rebuild {}",
            ms(result.fork_capture_ms.p50),
            ms(result.fork_syscall_ms.p50),
            ms(result.fork_resume_ms.p50),
            ms(result.child_restore_ms.p50),
        );
        println!(
            "baseline bare fork(2) of {} MiB THP: p50 {} ms; fork pause / bare fork = {:.2}x",
            result.mem_mib,
            ms(result.bare_fork_ms.p50),
            result.fork_pause_over_bare_fork
        );
        println!(
            "baseline the same in a KVM memory slot: p50 {} ms; fork pause / that = {:.2}x",
            ms(result.kvm_slot_fork_ms.p50),
            result.fork_pause_over_kvm_slot_fork
        );
        println!("full/fork pause ratio {:.0}x", result.full_over_fork);
    }
    Ok(0)
}
