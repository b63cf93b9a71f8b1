//! `zygote bench fanout`: branch N children from one live VM in one request and measure
//! the wall time until every child's guest has demonstrably run, and the host memory
//! each idle child adds.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;
use zygote_vmm::probe::progress::{self, Posted, ProgressBoard};
use zygote_vmm::vmm::branch::ChildContext;

use super::branch_measure::{boot_populated, probe_branch};
use super::plot::{self, Series};
use super::stats::{ms, percentile};

#[derive(clap::Args)]
pub struct FanoutBenchArgs {
    /// Number of children.
    #[arg(long, default_value_t = 100)]
    children: usize,
    /// Guest memory in MiB (populated from the host before branching).
    #[arg(long, default_value_t = 256)]
    mem_mib: u64,
    /// How long each child may take to show that its guest runs (its heartbeat advanced
    /// in the child's own memory); a child that does not fails the bench.
    #[arg(long, default_value_t = 60_000)]
    progress_timeout_ms: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also draw the timeline of children becoming ready into this PNG.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
}

#[derive(Serialize)]
struct Fanout {
    children: usize,
    mem_mib: u64,
    /// From the branch request until every child's guest had demonstrably run (its
    /// heartbeat advanced in the child's memory after the branch).
    wall_ms: f64,
    /// From the request until every child's VM was rebuilt and its vCPU threads started
    /// (the children's own readiness reports; not proof that their guests execute).
    wall_vcpus_started_ms: f64,
    /// Children whose guest proved it ran within the timeout (all of them, or the bench
    /// fails).
    children_running: usize,
    /// How long the parent VM was paused (it forks all children while paused).
    parent_pause_ms: f64,
    fork_syscalls_ms: f64,
    /// Per child, time from the request until its guest ran: median, p90 and last.
    running_p50_ms: f64,
    running_p90_ms: f64,
    running_max_ms: f64,
    /// Per child, time from the request until its vCPU threads started: median and last.
    vcpus_started_p50_ms: f64,
    vcpus_started_max_ms: f64,
    /// Per child, from its vCPU threads starting until its guest had run: what the old
    /// definition of "running" left out. Median and p90.
    guest_after_vcpus_p50_ms: f64,
    guest_after_vcpus_p90_ms: f64,
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

/// Times in ms from `start_ns` of every child that proved its guest ran, and the
/// indexes of those that did not (stalled, unreadable or never posted).
fn running_times(posted: &[Option<Posted>], start_ns: u64) -> (Vec<f64>, Vec<usize>) {
    let mut times = Vec::new();
    let mut failed = Vec::new();
    for (i, p) in posted.iter().enumerate() {
        match p {
            Some(Posted::Proven(p)) => times.push(p.since(start_ns).as_secs_f64() * 1e3),
            _ => failed.push(i),
        }
    }
    times.sort_by(|a, b| a.total_cmp(b));
    (times, failed)
}

pub fn run(args: FanoutBenchArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.children > 0, "--children must be at least 1");
    eprintln!(
        "booting a {} MiB probe VM and populating its memory...",
        args.mem_mib
    );
    let (mut vm, _) = boot_populated(args.mem_mib)?;
    let board = ProgressBoard::new(args.children)?;
    let timeout = Duration::from_millis(args.progress_timeout_ms);
    // Each child proves its guest runs, posts the proof, then pauses its VM: an idle
    // sandbox waiting for work.
    let idle = |mut ctx: ChildContext| -> i32 {
        let outcome = progress::wait_for_progress(ctx.vmm.guest_ram(), timeout);
        board.post(ctx.index, &outcome);
        let _ = ctx.vmm.pause();
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    };
    let avail_before = mem_available_kib();
    eprintln!("branching {} children...", args.children);
    let start_ns = progress::mono_ns();
    let started = Instant::now();
    let report = vm.vmm.branch(&probe_branch(
        args.children,
        &idle,
        Duration::from_secs(600),
    ))?;
    let wall_vcpus_started = started.elapsed();
    eprintln!(
        "all {} children report their vCPUs started after {} ms; waiting for their guests to run...",
        args.children,
        ms(wall_vcpus_started.as_secs_f64() * 1e3)
    );
    let posted = board.collect(
        Instant::now() + timeout + Duration::from_secs(1),
        Duration::from_millis(1),
    );
    let (running, not_running) = running_times(&posted, start_ns);
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
    let mut started_ms: Vec<f64> = report
        .children
        .iter()
        .map(|c| c.ready_after.as_secs_f64() * 1e3)
        .collect();
    started_ms.sort_by(|a, b| a.total_cmp(b));
    let mut gaps: Vec<f64> = report
        .children
        .iter()
        .filter_map(|c| match posted.get(c.index) {
            Some(Some(Posted::Proven(p))) => Some(
                p.since(start_ns)
                    .saturating_sub(c.ready_after)
                    .as_secs_f64()
                    * 1e3,
            ),
            _ => None,
        })
        .collect();
    gaps.sort_by(|a, b| a.total_cmp(b));
    for c in &report.children {
        // SAFETY: signalling our own children.
        unsafe { libc::kill(c.pid, libc::SIGKILL) };
    }
    vm.vmm.reap_children(true);
    vm.vmm.shutdown();
    if !not_running.is_empty() {
        let shown: Vec<String> = not_running.iter().take(10).map(|i| i.to_string()).collect();
        anyhow::bail!(
            "only {} of {} children proved that their guest runs within {timeout:?}; not: {}{}",
            running.len(),
            args.children,
            shown.join(", "),
            if not_running.len() > 10 { ", ..." } else { "" }
        );
    }

    let result = Fanout {
        children: args.children,
        mem_mib: args.mem_mib,
        wall_ms: running.last().copied().unwrap_or(f64::NAN),
        wall_vcpus_started_ms: wall_vcpus_started.as_secs_f64() * 1e3,
        children_running: running.len(),
        parent_pause_ms: report.pause.as_secs_f64() * 1e3,
        fork_syscalls_ms: report.fork.as_secs_f64() * 1e3,
        running_p50_ms: percentile(&running, 50.0),
        running_p90_ms: percentile(&running, 90.0),
        running_max_ms: running.last().copied().unwrap_or(f64::NAN),
        vcpus_started_p50_ms: percentile(&started_ms, 50.0),
        vcpus_started_max_ms: started_ms.last().copied().unwrap_or(f64::NAN),
        guest_after_vcpus_p50_ms: percentile(&gaps, 50.0),
        guest_after_vcpus_p90_ms: percentile(&gaps, 90.0),
        private_kib_p50: percentile(&private, 50.0),
        private_kib_max: private.last().copied().unwrap_or(f64::NAN),
        mem_available_drop_kib_per_child: avail_before.saturating_sub(avail_after) as f64
            / args.children as f64,
        parent_rss_kib,
    };
    if let Some(path) = &args.plot {
        let series = [
            Series {
                label: "VM rebuilt, vCPU threads started".into(),
                samples: started_ms,
            },
            Series {
                label: "guest ran (heartbeat advanced in the child)".into(),
                samples: running,
            },
        ];
        let title = format!(
            "bench fanout: {} children of one {} MiB VM",
            args.children, args.mem_mib
        );
        plot::timeline(
            path,
            &title,
            "ms since the branch request",
            "children",
            &series,
        )?;
        eprintln!("plot written to {}", path.display());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        println!(
            "bench fanout: {} children of one live {} MiB VM; {} of them proved their guest runs",
            result.children, result.mem_mib, result.children_running
        );
        println!(
            "  wall until every guest ran {} ms (all vCPU threads started after {} ms; parent paused {} ms, fork(2) total {} ms)",
            ms(result.wall_ms),
            ms(result.wall_vcpus_started_ms),
            ms(result.parent_pause_ms),
            ms(result.fork_syscalls_ms)
        );
        println!(
            "  child's guest ran after: p50 {} ms, p90 {} ms, last {} ms (vCPUs started: p50 {} ms, last {} ms)",
            ms(result.running_p50_ms),
            ms(result.running_p90_ms),
            ms(result.running_max_ms),
            ms(result.vcpus_started_p50_ms),
            ms(result.vcpus_started_max_ms)
        );
        println!(
            "  per child, vCPUs started -> guest ran: p50 {} ms, p90 {} ms",
            ms(result.guest_after_vcpus_p50_ms),
            ms(result.guest_after_vcpus_p90_ms)
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

#[cfg(test)]
mod tests {
    use super::*;
    use zygote_vmm::probe::progress::Progress;

    #[test]
    fn only_proven_children_count_as_running() {
        let proven = |at_ms: u64| {
            Some(Posted::Proven(Progress {
                before: 1,
                after: 2,
                seen_mono_ns: 1_000_000_000 + at_ms * 1_000_000,
            }))
        };
        let posted = [
            proven(30),
            None,
            Some(Posted::Stalled { heartbeat: 4 }),
            proven(10),
            Some(Posted::Unreadable),
        ];
        let (times, failed) = running_times(&posted, 1_000_000_000);
        assert_eq!(times, vec![10.0, 30.0]);
        assert_eq!(failed, vec![1, 2, 4]);
    }
}
