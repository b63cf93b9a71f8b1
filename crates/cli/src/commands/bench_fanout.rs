//! `zygote bench fanout`: branch N children from one live VM in one request and measure
//! the wall time until all of them run, and the host memory each idle child adds.
use std::time::{Duration, Instant};

use serde::Serialize;
use zygote_vmm::vmm::branch::{BranchRequest, ChildContext};

use super::bench_branch::{boot_populated, sink};
use super::bench_stats::{ms, percentile};

#[derive(clap::Args)]
pub struct FanoutBenchArgs {
    /// Number of children.
    #[arg(long, default_value_t = 100)]
    children: usize,
    /// Guest memory in MiB (populated from the host before branching).
    #[arg(long, default_value_t = 256)]
    mem_mib: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Fanout {
    children: usize,
    mem_mib: u64,
    /// From the branch request until every child's VM was running.
    wall_ms: f64,
    /// How long the parent VM was paused (it forks all children while paused).
    parent_pause_ms: f64,
    fork_syscalls_ms: f64,
    /// Per child, time from the request until it ran: median and last.
    ready_p50_ms: f64,
    ready_max_ms: f64,
    /// Unique host memory per idle child, from /proc/<pid>/smaps_rollup Private_Clean +
    /// Private_Dirty, KiB.
    private_kib_p50: f64,
    private_kib_max: f64,
    /// Host-wide MemAvailable drop per child, KiB: includes KVM's kernel memory per VM,
    /// which smaps does not show.
    mem_available_drop_kib_per_child: f64,
    /// The parent's own Rss, KiB, for scale.
    parent_rss_kib: u64,
}

fn smaps_rollup(pid: i32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Some((
        field("Private_Clean:") + field("Private_Dirty:"),
        field("Rss:"),
    ))
}

fn mem_available_kib() -> u64 {
    zygote_vmm::host::meminfo_kib("MemAvailable").unwrap_or(0)
}

pub fn run(args: FanoutBenchArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.children > 0, "--children must be at least 1");
    eprintln!(
        "booting a {} MiB probe VM and populating its memory...",
        args.mem_mib
    );
    let (mut vm, _) = boot_populated(args.mem_mib)?;
    // Children pause their VM once it runs: an idle sandbox waiting for work.
    let idle = |mut ctx: ChildContext| -> i32 {
        let _ = ctx.vmm.pause();
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    };
    let avail_before = mem_available_kib();
    eprintln!("branching {} children...", args.children);
    let started = Instant::now();
    let report = vm.vmm.branch(&BranchRequest {
        count: args.children,
        child_serial: &sink,
        child_devices: &|_| Default::default(),
        child_cgroup: &|_| None,
        child_netns: &|_| None,
        child_main: &idle,
        keep_fds: vec![],
        ready_timeout: Duration::from_secs(600),
    })?;
    let wall = started.elapsed();
    // Let children finish pausing, then read their memory.
    std::thread::sleep(Duration::from_millis(500));
    let avail_after = mem_available_kib();
    let mut private: Vec<f64> = report
        .children
        .iter()
        .filter_map(|c| smaps_rollup(c.pid).map(|(p, _)| p as f64))
        .collect();
    private.sort_by(|a, b| a.total_cmp(b));
    let parent_rss_kib = smaps_rollup(std::process::id() as i32).map_or(0, |(_, rss)| rss);
    let mut ready: Vec<f64> = report
        .children
        .iter()
        .map(|c| c.ready_after.as_secs_f64() * 1e3)
        .collect();
    ready.sort_by(|a, b| a.total_cmp(b));
    for c in &report.children {
        // SAFETY: signalling our own children.
        unsafe { libc::kill(c.pid, libc::SIGKILL) };
    }
    vm.vmm.reap_children(true);
    vm.vmm.shutdown();

    let result = Fanout {
        children: args.children,
        mem_mib: args.mem_mib,
        wall_ms: wall.as_secs_f64() * 1e3,
        parent_pause_ms: report.pause.as_secs_f64() * 1e3,
        fork_syscalls_ms: report.fork.as_secs_f64() * 1e3,
        ready_p50_ms: percentile(&ready, 50.0),
        ready_max_ms: ready.last().copied().unwrap_or(f64::NAN),
        private_kib_p50: percentile(&private, 50.0),
        private_kib_max: private.last().copied().unwrap_or(f64::NAN),
        mem_available_drop_kib_per_child: avail_before.saturating_sub(avail_after) as f64
            / args.children as f64,
        parent_rss_kib,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        println!(
            "bench fanout: {} children of one live {} MiB VM",
            result.children, result.mem_mib
        );
        println!(
            "  wall until all running {} ms (parent paused {} ms, fork(2) total {} ms)",
            ms(result.wall_ms),
            ms(result.parent_pause_ms),
            ms(result.fork_syscalls_ms)
        );
        println!(
            "  child running after: p50 {} ms, last {} ms",
            ms(result.ready_p50_ms),
            ms(result.ready_max_ms)
        );
        println!(
            "  unique memory per idle child: p50 {:.0} KiB, max {:.0} KiB (parent Rss {} KiB)",
            result.private_kib_p50, result.private_kib_max, result.parent_rss_kib
        );
        println!(
            "  host MemAvailable drop per child: {:.0} KiB (includes KVM kernel memory)",
            result.mem_available_drop_kib_per_child
        );
    }
    Ok(0)
}
