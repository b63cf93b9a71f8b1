//! `zygote bench branch`: pause time and time-to-running of fork-based and warm
//! (spawner-based) branching against live, diff and full snapshots of the same live VM,
//! interleaved in one run, with an idle guest and with a guest that keeps rewriting a
//! window of its memory.
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use zygote_vmm::probe;
use zygote_vmm::vmm::snapshot::SnapshotMode;

use super::branch_measure::{
    bare_fork_baseline, boot_populated, run_scenario, tracking_cost, Samples, Scenario,
    BRANCH_MODES, MODES,
};
use super::plot::{self, Panel, Series};
use super::stats::{ms, percentile, Summary};

#[derive(clap::Args)]
pub struct BranchBenchArgs {
    /// Guest memory in MiB; all of it above 32 MiB is touched from the host first.
    #[arg(long, default_value_t = 1024)]
    mem_mib: u64,
    /// Measurements per mode, per scenario.
    #[arg(long, default_value_t = 20)]
    iterations: usize,
    /// After the idle scenario, run every mode again while the guest keeps rewriting this
    /// many MiB of its memory (a word in every 4 KiB page, from 128 MiB up); 0 skips it.
    #[arg(long, default_value_t = 64)]
    dirty_mib: u64,
    /// How long a branch child may take to show that its guest runs (its heartbeat
    /// advanced in the child's memory) before the bench fails.
    #[arg(long, default_value_t = 10_000)]
    progress_timeout_ms: u64,
    /// Also run, per round, an untimed warm branch whose child compares its RAM with a
    /// witness copy of the parent's, and report the differing pages
    /// (`memory_mismatches`, which must be 0).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    verify: bool,
    /// Where snapshots are written (deleted after each measurement).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also draw the pause distribution of every mode as CDFs into this PNG.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
}

#[derive(Serialize)]
struct ModeResult {
    mode: &'static str,
    pause_ms: Summary,
    /// Every pause, in run order (for plots and re-analysis).
    pause_samples_ms: Vec<f64>,
    /// Branches only: from the request until the child's VM was built and its vCPU
    /// threads started, as the child reports it. Not proof that its guest executes.
    vcpus_started_ms: Option<Summary>,
    /// Branches only: from the request until the child's guest had demonstrably run:
    /// its heartbeat rose in the child's own memory past the value the child first read.
    guest_running_ms: Option<Summary>,
    /// Until the operation was complete: snapshot on disk; for a branch, the later of
    /// the child's guest running and the branch call returning.
    total_ms: Summary,
    /// Snapshots: guest pages written, median.
    pages_written_p50: Option<f64>,
}

#[derive(Serialize)]
struct ScenarioResult {
    /// "idle" (the guest only counts its heartbeat) or "dirtying".
    scenario: &'static str,
    /// The window the guest keeps rewriting (0 when idle).
    dirty_mib: u64,
    /// Whole passes over the window per second, median of the waits between rounds.
    dirty_passes_per_s: Option<f64>,
    modes: Vec<ModeResult>,
    /// fork only: parts of the pause, and the child's own rebuild time.
    fork_capture_ms: Summary,
    fork_syscall_ms: Summary,
    fork_resume_ms: Summary,
    child_restore_ms: Summary,
    /// fork only, per round: from the child's vCPU threads starting until its guest had
    /// run (what the old definition of "child running" left out).
    guest_after_vcpus_started_ms: Summary,
    /// warm only: parts of the pause (stop + capture, last read of the dirty logs,
    /// writing the pages into the spawner, sending the state), pages written, and the
    /// child's restore into its ready VM.
    warm_capture_ms: Summary,
    warm_dirty_read_ms: Summary,
    warm_copy_ms: Summary,
    warm_send_ms: Summary,
    warm_pages_copied_p50: Option<f64>,
    /// warm only, before the pause (while the guest ran): catching the spawner up.
    warm_catch_up_ms: Summary,
    warm_caught_up_pages_p50: Option<f64>,
    warm_child_restore_ms: Summary,
    /// Verified warm branches (untimed) and the pages their children found different
    /// from the parent's at the branch instant, in all: must be 0.
    verified_branches: usize,
    memory_mismatches: u64,
    /// warm pause p50 / fork pause p50, and the same for the guest running.
    warm_over_fork_pause: f64,
    warm_over_fork_guest_running: f64,
    /// full pause p50 / fork pause p50.
    full_over_fork: f64,
    /// fork-mode pause p50 / bare fork p50 (same run).
    fork_pause_over_bare_fork: f64,
    /// fork-mode pause p50 / KVM-slot fork p50 (same run).
    fork_pause_over_kvm_slot_fork: f64,
}

#[derive(Serialize)]
struct BranchBench {
    mem_mib: u64,
    iterations: usize,
    populated_pages: u64,
    /// Baseline measured in the same run: fork(2) of this process holding the same
    /// amount of populated MADV_HUGEPAGE memory and no VM (the kernel's floor).
    bare_fork_ms: Summary,
    /// The same bare fork with that memory registered as a KVM memory slot (a VM
    /// with no vCPUs): fork then also runs KVM's MMU-notifier invalidation over the
    /// slot, which this host's KVM charges per guest page. The floor for forking a
    /// process that owns a VM.
    kvm_slot_fork_ms: Summary,
    /// Dirtying guests only: its passes over the window per second with no dirty
    /// tracking and with a warm spawner kept (median; same run), and their ratio (the
    /// cost of keeping spawners is 1 - ratio).
    progress_without_tracking: Option<f64>,
    progress_with_spawner: Option<f64>,
    progress_with_spawner_ratio: Option<f64>,
    scenarios: Vec<ScenarioResult>,
}

fn samples_ms(v: &[Duration]) -> Vec<f64> {
    v.iter().map(|d| d.as_secs_f64() * 1e3).collect()
}

fn median(v: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = v.into_iter().collect();
    v.sort_by(|a, b| a.total_cmp(b));
    (!v.is_empty()).then(|| percentile(&v, 50.0))
}

fn summarize(
    name: &'static str,
    dirty_mib: u64,
    s: &Samples,
    bare: &Summary,
    kvm_slot: &Summary,
) -> ScenarioResult {
    let modes: Vec<ModeResult> = MODES
        .iter()
        .enumerate()
        .map(|(k, &mode)| ModeResult {
            mode,
            pause_ms: Summary::of(&s.pause[k]),
            pause_samples_ms: samples_ms(&s.pause[k]),
            vcpus_started_ms: (k < BRANCH_MODES).then(|| Summary::of(&s.vcpus_started[k])),
            guest_running_ms: (k < BRANCH_MODES).then(|| Summary::of(&s.guest_ran[k])),
            total_ms: Summary::of(&s.total[k]),
            pages_written_p50: median(s.pages_written[k].iter().map(|&p| p as f64)),
        })
        .collect();
    let fork_p50 = modes[0].pause_ms.p50;
    let running_p50 = |k: usize| {
        modes[k]
            .guest_running_ms
            .as_ref()
            .map_or(f64::NAN, |s| s.p50)
    };
    ScenarioResult {
        scenario: name,
        dirty_mib,
        dirty_passes_per_s: median(s.passes_per_s.iter().copied()),
        warm_capture_ms: Summary::of(&s.warm_capture),
        warm_dirty_read_ms: Summary::of(&s.warm_dirty_read),
        warm_copy_ms: Summary::of(&s.warm_copy),
        warm_send_ms: Summary::of(&s.warm_send),
        warm_pages_copied_p50: median(s.warm_pages.iter().map(|&p| p as f64)),
        warm_catch_up_ms: Summary::of(&s.warm_catch_up),
        warm_caught_up_pages_p50: median(s.warm_caught_up_pages.iter().map(|&p| p as f64)),
        warm_child_restore_ms: Summary::of(&s.warm_restore),
        verified_branches: s.verified,
        memory_mismatches: s.memory_mismatches,
        warm_over_fork_pause: modes[1].pause_ms.p50 / fork_p50,
        warm_over_fork_guest_running: running_p50(1) / running_p50(0),
        full_over_fork: modes[4].pause_ms.p50 / fork_p50,
        fork_pause_over_bare_fork: fork_p50 / bare.p50,
        fork_pause_over_kvm_slot_fork: fork_p50 / kvm_slot.p50,
        modes,
        fork_capture_ms: Summary::of(&s.capture),
        fork_syscall_ms: Summary::of(&s.fork),
        fork_resume_ms: Summary::of(&s.resume),
        child_restore_ms: Summary::of(&s.child_restore),
        guest_after_vcpus_started_ms: Summary::of(
            &s.guest_ran[0]
                .iter()
                .zip(&s.vcpus_started[0])
                .map(|(ran, started)| ran.saturating_sub(*started))
                .collect::<Vec<_>>(),
        ),
    }
}

pub fn run(args: BranchBenchArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.iterations > 0, "--iterations must be at least 1");
    let window_pages = match args.dirty_mib {
        0 => 0,
        mib => probe::dirty_window_pages(args.mem_mib, mib).ok_or_else(|| {
            anyhow::anyhow!(
                "--dirty-mib {mib} does not fit a {} MiB guest: the window starts at {} MiB \
                 and must end below min(guest size, 3072 MiB)",
                args.mem_mib,
                zygote_probe_abi::DIRTY_WINDOW_GPA >> 20
            )
        })?,
    };
    let work = tempfile::Builder::new()
        .prefix("zygote-bench-branch-")
        .tempdir_in(args.work_dir.clone().unwrap_or_else(std::env::temp_dir))?;
    eprintln!(
        "baseline: bare fork(2) with {} MiB of populated THP memory...",
        args.mem_mib
    );
    let bare = Summary::of(&bare_fork_baseline(args.mem_mib, args.iterations, false)?);
    eprintln!("baseline: the same with the memory in a KVM memory slot...");
    let kvm_slot = Summary::of(&bare_fork_baseline(args.mem_mib, args.iterations, true)?);
    eprintln!(
        "booting a {} MiB probe VM and populating its memory...",
        args.mem_mib
    );
    let (mut vm, populated_pages) = boot_populated(args.mem_mib)?;
    let progress = if window_pages > 0 {
        eprintln!("the guest's progress without dirty tracking, then with a warm spawner kept...");
        Some(tracking_cost(
            &mut vm,
            window_pages,
            args.iterations.max(5),
        )?)
    } else {
        None
    };
    // Diffs need a base snapshot of this VM.
    vm.vmm
        .snapshot(SnapshotMode::Full, &work.path().join("base"))?;

    let mut scenarios = Vec::new();
    let plan = [("idle", 0, 0), ("dirtying", args.dirty_mib, window_pages)];
    for (name, dirty_mib, pages) in plan {
        if name == "dirtying" && pages == 0 {
            continue;
        }
        eprintln!(
            "scenario {name}: {} rounds of fork, warm, live, diff, full{}",
            args.iterations,
            if pages > 0 {
                format!(" while the guest rewrites {dirty_mib} MiB")
            } else {
                String::new()
            }
        );
        let samples = run_scenario(
            &mut vm,
            &Scenario {
                name,
                window_pages: pages,
                iterations: args.iterations,
                work: work.path(),
                progress_timeout: Duration::from_millis(args.progress_timeout_ms),
                verify: args.verify,
            },
        )?;
        scenarios.push(summarize(name, dirty_mib, &samples, &bare, &kvm_slot));
    }
    vm.vmm.shutdown();

    let result = BranchBench {
        mem_mib: args.mem_mib,
        iterations: args.iterations,
        populated_pages,
        bare_fork_ms: bare,
        kvm_slot_fork_ms: kvm_slot,
        progress_without_tracking: progress.map(|p| p.0),
        progress_with_spawner: progress.map(|p| p.1),
        progress_with_spawner_ratio: progress.map(|(without, with)| with / without),
        scenarios,
    };
    if let Some(path) = &args.plot {
        plot(path, &result)?;
        eprintln!("plot written to {}", path.display());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print_table(&result);
    }
    Ok(0)
}

fn plot(path: &std::path::Path, r: &BranchBench) -> anyhow::Result<()> {
    let panels: Vec<Panel> = r
        .scenarios
        .iter()
        .map(|sc| Panel {
            title: scenario_title(sc),
            series: sc
                .modes
                .iter()
                .map(|m| Series {
                    label: format!("{} (p50 {} ms)", mode_label(m.mode), ms(m.pause_ms.p50)),
                    samples: m.pause_samples_ms.clone(),
                })
                .collect(),
        })
        .collect();
    let title = format!(
        "bench branch: VM pause per mode, {} MiB guest, {} rounds",
        r.mem_mib, r.iterations
    );
    plot::cdf_panels(path, &title, "pause (ms, log scale)", &panels)?;
    Ok(())
}

fn mode_label(mode: &str) -> &'static str {
    match mode {
        "fork" => "fork branch",
        "warm" => "warm branch",
        "live" => "live snapshot",
        "diff" => "diff snapshot",
        "full" => "full snapshot",
        _ => "?",
    }
}

fn scenario_title(sc: &ScenarioResult) -> String {
    match sc.dirty_passes_per_s {
        Some(rate) if sc.dirty_mib > 0 => format!(
            "dirtying: guest rewrites {} MiB ({rate:.1} passes/s)",
            sc.dirty_mib
        ),
        _ => "idle: guest only counts its heartbeat".into(),
    }
}

fn print_table(r: &BranchBench) {
    println!(
        "bench branch: {} MiB guest ({} pages populated), {} rounds per scenario, medians and p90 in ms",
        r.mem_mib, r.populated_pages, r.iterations
    );
    for sc in &r.scenarios {
        println!();
        println!("scenario {}", scenario_title(sc));
        println!(
            "{:<6} {:>10} {:>10} {:>14} {:>14} {:>14} {:>10} {:>8}",
            "mode",
            "pause p50",
            "pause p90",
            "vCPUs started",
            "guest ran p50",
            "guest ran p90",
            "total p50",
            "pages"
        );
        for m in &sc.modes {
            let opt = |v: Option<f64>| v.map_or("-".into(), ms);
            println!(
                "{:<6} {:>10} {:>10} {:>14} {:>14} {:>14} {:>10} {:>8}",
                m.mode,
                ms(m.pause_ms.p50),
                ms(m.pause_ms.p90),
                opt(m.vcpus_started_ms.as_ref().map(|s| s.p50)),
                opt(m.guest_running_ms.as_ref().map(|s| s.p50)),
                opt(m.guest_running_ms.as_ref().map(|s| s.p90)),
                ms(m.total_ms.p50),
                m.pages_written_p50
                    .map_or("-".into(), |p| format!("{p:.0}")),
            );
        }
        println!(
            "fork pause p50 parts: pause+capture {} + fork(2) {} + resume {}; child rebuild {}; \
             vCPUs started -> guest ran {} (p90 {})",
            ms(sc.fork_capture_ms.p50),
            ms(sc.fork_syscall_ms.p50),
            ms(sc.fork_resume_ms.p50),
            ms(sc.child_restore_ms.p50),
            ms(sc.guest_after_vcpus_started_ms.p50),
            ms(sc.guest_after_vcpus_started_ms.p90),
        );
        println!(
            "warm: catch-up before the pause {} ({:.0} pages); pause p50 parts: pause+capture {} + \
             dirty logs {} + copy {} ({:.0} pages); state sent after {}; child restore {}; \
             warm/fork: pause {:.2}x, guest ran {:.2}x; {} verified warm branches, {} memory \
             mismatches",
            ms(sc.warm_catch_up_ms.p50),
            sc.warm_caught_up_pages_p50.unwrap_or(0.0),
            ms(sc.warm_capture_ms.p50),
            ms(sc.warm_dirty_read_ms.p50),
            ms(sc.warm_copy_ms.p50),
            sc.warm_pages_copied_p50.unwrap_or(0.0),
            ms(sc.warm_send_ms.p50),
            ms(sc.warm_child_restore_ms.p50),
            sc.warm_over_fork_pause,
            sc.warm_over_fork_guest_running,
            sc.verified_branches,
            sc.memory_mismatches,
        );
        println!(
            "full/fork pause {:.0}x; fork pause / bare fork {:.2}x; / KVM-slot fork {:.2}x",
            sc.full_over_fork, sc.fork_pause_over_bare_fork, sc.fork_pause_over_kvm_slot_fork
        );
    }
    println!();
    println!(
        "baselines (same run): bare fork(2) of {} MiB THP p50 {} ms; with it in a KVM memory slot p50 {} ms",
        r.mem_mib,
        ms(r.bare_fork_ms.p50),
        ms(r.kvm_slot_fork_ms.p50)
    );
    if let (Some(without), Some(with)) = (r.progress_without_tracking, r.progress_with_spawner) {
        println!(
            "guest progress: {without:.1} passes/s without dirty tracking, {with:.1} with a warm \
             spawner kept ({:.1}%)",
            (with / without - 1.0) * 100.0
        );
    }
    println!(
        "vCPUs started: the child's VM rebuilt and its threads running; guest ran: its \
         heartbeat advanced in the child's memory (the child's guest executed)"
    );
}
