//! `zygote bench pause`: park a sandbox and bring it back, through a private daemon,
//! timed as a user sees it. Per guest size (a quarter of its memory filled, tmpfs):
//!
//! - `pause`: `POST .../pause` until it answers (memory and devices on disk, the VM
//!   process gone), and how much host memory that gave back (the VM process's resident
//!   set before; `MemAvailable` before and after);
//! - `resume`: `POST .../resume` until it answers, then the first exec (`true`) after it,
//!   and the resident set of the resumed VM once that exec answered (a runtime that maps
//!   the saved memory lazily holds less of it than it had);
//! - the baseline, measured on the same sandbox in the same run: a full snapshot (the
//!   pause writes the same state; the sandbox keeps running).
//!
//! Medians and p90 over the rounds; the last line printed is one JSON object.
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};
use zygote_api::client::{block_on, Client, Method};
use zygote_api::model::{ExecResponse, Sandbox, SandboxList, Snapshot};

use super::stats::{ms, Summary};
use crate::commands::private_daemon::{PrivateDaemon, StateDir};

#[derive(clap::Args)]
pub struct PauseBenchArgs {
    /// Guest memory sizes in MiB, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "256,1024,4096")]
    sizes: Vec<u32>,
    /// Percent of each guest's memory filled before pausing.
    #[arg(long, default_value_t = 25)]
    fill_percent: u32,
    /// Pause/resume rounds per size.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Runtime of the private daemon: kvm (zygote's VMM) or qemu.
    #[arg(long, default_value = "kvm")]
    runtime: String,
    /// Print only the JSON summary.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct SizeResult {
    mem_mib: u32,
    fill_mib: u32,
    pause_ms: Summary,
    resume_ms: Summary,
    /// From the resume request until the first exec after it answered.
    resume_to_exec_ms: Summary,
    first_exec_ms: Summary,
    full_snapshot_ms: Summary,
    /// Resident set of the running VM process before the pause (KiB, median).
    rss_before_kib: Option<u64>,
    /// `MemAvailable` gained by the pause (KiB, median).
    freed_kib: Option<i64>,
    /// Resident set of the resumed VM once its first exec answered (KiB, median).
    rss_after_resume_kib: Option<u64>,
}

#[derive(Serialize)]
struct PauseBench {
    runtime: String,
    rounds: usize,
    sizes: Vec<SizeResult>,
    failures: usize,
    errors: Vec<String>,
}

fn call<T: serde::de::DeserializeOwned>(
    c: &Client,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<T> {
    Ok(block_on(c.json(method, path, body.as_ref()))?)
}

fn exec(c: &Client, id: &str, script: &str) -> anyhow::Result<()> {
    let r: ExecResponse = call(
        c,
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"argv": ["sh", "-c", script], "timeout_ms": 600_000})),
    )?;
    anyhow::ensure!(
        r.exit_code == Some(0),
        "exec in {id} exited {:?}: {}",
        r.exit_code,
        r.stderr
    );
    Ok(())
}

/// Resident set (KiB) of a process, from /proc.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn sandbox(c: &Client, id: &str) -> anyhow::Result<Sandbox> {
    call(c, Method::GET, &format!("/v1/sandboxes/{id}"), None)
}

fn median_u64(mut v: Vec<u64>) -> Option<u64> {
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied()
}

fn median_i64(mut v: Vec<i64>) -> Option<i64> {
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied()
}

/// One guest size: create, fill, then `rounds` of snapshot (baseline), pause, resume.
fn measure_size(
    c: &Client,
    mem_mib: u32,
    args: &PauseBenchArgs,
    errors: &mut Vec<String>,
    say: &dyn Fn(String),
) -> anyhow::Result<SizeResult> {
    let fill_mib = mem_mib * args.fill_percent / 100;
    let made: SandboxList = call(
        c,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"image": "minimal", "mem_mib": mem_mib, "name": format!("bench-pause-{mem_mib}")})),
    )
    .with_context(|| format!("creating a {mem_mib} MiB sandbox"))?;
    let id = made.sandboxes.first().context("no sandbox")?.id.clone();
    let fill = format!(
        "yes zygote | head -c {} >/dev/shm/fill",
        u64::from(fill_mib) << 20
    );
    exec(c, &id, &fill)?;
    let (mut pause, mut resume, mut to_exec, mut first_exec, mut full) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut rss_before, mut freed, mut rss_after) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        let t = Instant::now();
        match call::<Snapshot>(
            c,
            Method::POST,
            "/v1/snapshots",
            Some(json!({"sandbox": id, "kind": "full"})),
        ) {
            Ok(s) => {
                full.push(t.elapsed());
                let _ = block_on(c.raw(Method::DELETE, &format!("/v1/snapshots/{}", s.id), None));
            }
            Err(e) => errors.push(format!("{mem_mib} MiB: full snapshot: {e}")),
        }
        let pid = sandbox(c, &id)?.pid;
        rss_before.extend(pid.and_then(rss_kib));
        let available = zygote_vmm::host::meminfo_kib("MemAvailable");
        let t = Instant::now();
        let paused: anyhow::Result<Value> =
            call(c, Method::POST, &format!("/v1/sandboxes/{id}/pause"), None);
        if let Err(e) = paused {
            errors.push(format!("{mem_mib} MiB: pause: {e}"));
            continue;
        }
        pause.push(t.elapsed());
        // Let the host account the exited process's memory.
        std::thread::sleep(Duration::from_millis(500));
        if let (Some(before), Some(after)) =
            (available, zygote_vmm::host::meminfo_kib("MemAvailable"))
        {
            freed.push(after as i64 - before as i64);
        }
        if pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists()) {
            errors.push(format!("{mem_mib} MiB: the VM process outlived the pause"));
        }
        let t = Instant::now();
        let resumed: anyhow::Result<Value> =
            call(c, Method::POST, &format!("/v1/sandboxes/{id}/resume"), None);
        if let Err(e) = resumed {
            errors.push(format!("{mem_mib} MiB: resume: {e}"));
            break;
        }
        resume.push(t.elapsed());
        let e0 = Instant::now();
        match exec(c, &id, "test -s /dev/shm/fill") {
            Ok(()) => {
                first_exec.push(e0.elapsed());
                to_exec.push(t.elapsed());
            }
            Err(e) => errors.push(format!("{mem_mib} MiB: first exec after resume: {e}")),
        }
        rss_after.extend(sandbox(c, &id)?.pid.and_then(rss_kib));
        say(format!(
            "{mem_mib} MiB, round {round}: pause {} ms, resume {} ms, first exec {} ms",
            pause
                .last()
                .map_or("-".into(), |d| ms(d.as_secs_f64() * 1e3)),
            resume
                .last()
                .map_or("-".into(), |d| ms(d.as_secs_f64() * 1e3)),
            first_exec
                .last()
                .map_or("-".into(), |d| ms(d.as_secs_f64() * 1e3)),
        ));
    }
    let _ = block_on(c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None));
    Ok(SizeResult {
        mem_mib,
        fill_mib,
        pause_ms: Summary::of(&pause),
        resume_ms: Summary::of(&resume),
        resume_to_exec_ms: Summary::of(&to_exec),
        first_exec_ms: Summary::of(&first_exec),
        full_snapshot_ms: Summary::of(&full),
        rss_before_kib: median_u64(rss_before),
        freed_kib: median_i64(freed),
        rss_after_resume_kib: median_u64(rss_after),
    })
}

pub fn run(args: PauseBenchArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    anyhow::ensure!(
        (1..=90).contains(&args.fill_percent),
        "--fill-percent must be in 1..=90"
    );
    anyhow::ensure!(!args.sizes.is_empty(), "--sizes must name a size");
    let json_only = args.json;
    let say = move |m: String| {
        if !json_only {
            eprintln!("{m}");
        }
    };
    let runtime = ["--runtime".to_string(), args.runtime.clone()];
    let state = StateDir::Temp {
        prefix: "zygote-bench-",
    };
    let d = PrivateDaemon::start(state, &runtime, "the daemon")?;
    let mut errors = Vec::new();
    let mut sizes = Vec::new();
    for &mem_mib in &args.sizes {
        say(format!(
            "{mem_mib} MiB guest, {}% filled, {} rounds on the {} runtime",
            args.fill_percent, args.rounds, args.runtime
        ));
        match measure_size(&d.client, mem_mib, &args, &mut errors, &say) {
            Ok(r) => sizes.push(r),
            Err(e) => errors.push(format!("{mem_mib} MiB: {e:#}")),
        }
    }
    let result = PauseBench {
        runtime: args.runtime.clone(),
        rounds: args.rounds,
        failures: errors.len(),
        sizes,
        errors,
    };
    if !args.json {
        let kib = |v: Option<u64>| v.map_or("-".into(), |k| format!("{}", k / 1024));
        let rows: Vec<Vec<String>> = result
            .sizes
            .iter()
            .map(|s| {
                vec![
                    s.mem_mib.to_string(),
                    ms(s.full_snapshot_ms.p50),
                    ms(s.pause_ms.p50),
                    ms(s.resume_ms.p50),
                    ms(s.first_exec_ms.p50),
                    kib(s.rss_before_kib),
                    s.freed_kib.map_or("-".into(), |k| format!("{}", k / 1024)),
                    kib(s.rss_after_resume_kib),
                ]
            })
            .collect();
        crate::commands::daemon_client::print_table(
            &[
                "MiB",
                "full snap ms",
                "pause ms",
                "resume ms",
                "1st exec ms",
                "RSS before MiB",
                "freed MiB",
                "RSS after MiB",
            ],
            &rows,
        );
        for e in &result.errors {
            eprintln!("failure: {e}");
        }
    }
    println!("{}", serde_json::to_string(&result)?);
    Ok(if result.failures == 0 { 0 } else { 1 })
}
