//! `zygote bench linux`: BRANCH of a real Linux sandbox through the daemon, timed as a
//! user sees it. A private daemon (`zygote serve` on a temporary state directory) runs a
//! parent sandbox with part of its memory filled; then, per round:
//!
//! - branch 1 child, until the child's agent has answered an exec (`answer1`);
//! - full, then diff snapshot of that child (their pauses), and the child goes;
//! - branch 4 children, until all four have answered an exec (`answer4`).
//!
//! Then one fan-out (`--fanout N`, the API's maximum by default): N children at once,
//! until all have answered, and the host memory each idle child holds of its own
//! (private pages of its VM process, from the daemon's `/metrics`), against the parent's.
//!
//! Each 1-child branch is also split into the daemon's phases (`phases` of its reply:
//! recording, the child's network, the branch point, the child's VM up, its VM build,
//! its agent's reidentify, the child recorded) plus the first exec after the reply, so
//! that a regression shows in its own column.
//!
//! Pauses are what the VMM (or QEMU) reports: how long the source's vCPUs stood still.
//! Failures (a child that did not come up or answer, a request that failed) are counted,
//! never retried. Medians and p90 over the rounds; the last line printed is one JSON
//! object, so scripts (`make bench-nested`) can take it as is.
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};
use zygote_api::client::{block_on, Client, Method};
use zygote_api::model::{
    BranchPhases, BranchResponse, ExecResponse, Sandbox, SandboxList, Snapshot,
};

use super::stats::{ms, percentile, Summary};
use crate::commands::private_daemon::{PrivateDaemon, StateDir};

#[derive(clap::Args)]
pub struct LinuxBenchArgs {
    /// Rounds (each: a 1-child branch, full + diff snapshots, a 4-child branch).
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Guest memory of the parent sandbox in MiB.
    #[arg(long, default_value_t = 512)]
    mem_mib: u32,
    /// MiB of the parent's memory filled (tmpfs) before the rounds.
    #[arg(long, default_value_t = 128)]
    fill_mib: u32,
    /// Runtime of the private daemon: kvm (zygote's VMM) or qemu.
    #[arg(long, default_value = "kvm")]
    runtime: String,
    /// Children of the final fan-out branch (0: skip it).
    #[arg(long, default_value_t = 16)]
    fanout: usize,
    /// Warm spawners each VMM of the private daemon keeps (`zygote serve
    /// --warm-spawners`; kvm runtime): 1-child branches then go through one.
    #[arg(long, default_value_t = 0)]
    warm_spawners: usize,
    /// Print only the JSON summary.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct LinuxBench {
    runtime: String,
    warm_spawners: usize,
    mem_mib: u32,
    fill_mib: u32,
    rounds: usize,
    /// Children that did not come up or answer, plus requests that failed.
    failures: usize,
    pause_ms_p50: f64,
    pause_ms_p90: f64,
    answer1_ms_p50: f64,
    answer1_ms_p90: f64,
    answer4_ms_p50: f64,
    answer4_ms_p90: f64,
    /// Branch request -> the daemon's reply (children running and reidentified).
    reply1_ms_p50: f64,
    reply4_ms_p50: f64,
    full_pause_ms_p50: f64,
    diff_pause_ms_p50: f64,
    diff_pause_ms_p90: f64,
    /// Full-snapshot pause p50 / branch pause p50.
    full_over_fork: f64,
    /// Children of the fan-out branch (0: not measured).
    fanout: usize,
    /// Branch request until all fan-out children answered.
    fanout_answer_ms: Option<f64>,
    /// Median private host memory of one idle fan-out child (KiB).
    fanout_child_private_kib_p50: Option<f64>,
    /// The parent's private host memory at the same moment (KiB).
    parent_private_kib: Option<f64>,
    /// p50 of each phase of the 1-child branches (ms; see the module doc).
    phases1_ms_p50: std::collections::BTreeMap<&'static str, f64>,
    /// Every failure, in words.
    errors: Vec<String>,
}

/// The phases of one 1-child branch, by column name (those the daemon reported).
fn phase_columns(run: &BranchRun) -> Vec<(&'static str, f64)> {
    let mut out = Vec::new();
    if let Some(p) = &run.phases {
        out.extend([
            ("record", p.record_ms),
            ("network", p.network_ms),
            ("point", p.point_ms),
        ]);
        if let Some(c) = p.children.first() {
            out.extend(c.vm_ms.map(|v| ("child vm up", v)));
            out.extend(c.vm_build_ms.map(|v| ("child vm build", v)));
            out.extend(c.warm_catch_up_ms.map(|v| ("child warm catch-up", v)));
            out.extend(c.warm_state_ms.map(|v| ("child warm state sent", v)));
            out.extend(c.agent_ms.map(|v| ("child reidentify", v)));
            out.extend(c.agent_connect_ms.map(|v| ("child agent connect", v)));
            out.extend(c.reidentify_ms.map(|v| ("child reidentify answered", v)));
            if let Some(g) = c.reidentify_parts {
                out.extend([
                    ("guest entropy", g.entropy_ms),
                    ("guest hostname", g.hostname_ms),
                    ("guest clock", g.clock_ms),
                    ("guest net", g.net_ms),
                    ("guest machine-id+hooks", g.identity_ms),
                ]);
            }
            out.push(("child recorded", c.recorded_ms));
        }
    }
    if let (Some(a), Some(r)) = (run.answered, run.replied) {
        out.push(("first exec", (a - r).as_secs_f64() * 1e3));
    }
    out
}

fn call<T: serde::de::DeserializeOwned>(
    c: &Client,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<T> {
    Ok(block_on(c.json(method, path, body.as_ref()))?)
}

fn delete(c: &Client, path: &str) {
    if let Err(e) = block_on(c.raw(Method::DELETE, path, None)) {
        eprintln!("bench: DELETE {path}: {e}");
    }
}

fn exec(c: &Client, id: &str, script: &str) -> anyhow::Result<String> {
    let r: ExecResponse = call(
        c,
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"argv": ["sh", "-c", script]})),
    )?;
    anyhow::ensure!(
        r.exit_code == Some(0),
        "exec in {id} exited {:?}: {}",
        r.exit_code,
        r.stderr
    );
    Ok(r.stdout)
}

/// One branch as the bench saw it.
struct BranchRun {
    /// From the request until every child answered `echo ok` (None: a child failed).
    answered: Option<Duration>,
    /// From the request until the daemon's reply: each child's VM runs and its agent
    /// has already answered once (the daemon reidentifies every child before replying).
    replied: Option<Duration>,
    /// The VMM's pause of the parent.
    pause_ms: Option<f64>,
    /// The daemon's account of its steps.
    phases: Option<BranchPhases>,
    children: Vec<String>,
}

/// Branch `count` children of `parent` and wait until each answered `echo ok`.
fn branch_and_answer(
    c: &Client,
    parent: &str,
    count: usize,
    errors: &mut Vec<String>,
) -> BranchRun {
    let t0 = Instant::now();
    let resp: BranchResponse = match call(
        c,
        Method::POST,
        &format!("/v1/sandboxes/{parent}/branch"),
        Some(json!({"count": count})),
    ) {
        Ok(r) => r,
        Err(e) => {
            errors.push(format!("branch -c {count}: {e}"));
            return BranchRun {
                answered: None,
                replied: None,
                pause_ms: None,
                phases: None,
                children: Vec::new(),
            };
        }
    };
    let replied = t0.elapsed();
    for f in &resp.failed {
        errors.push(format!(
            "branch -c {count}: child {} did not come up: {}",
            f.index, f.error
        ));
    }
    let answers: Vec<anyhow::Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = resp
            .children
            .iter()
            .map(|id| s.spawn(move || exec(c, id, "echo ok").map(drop)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("exec thread"))
            .collect()
    });
    let elapsed = t0.elapsed();
    let mut all_ok = resp.failed.is_empty();
    for (id, a) in resp.children.iter().zip(answers) {
        if let Err(e) = a {
            errors.push(format!("branch -c {count}: child {id} did not answer: {e}"));
            all_ok = false;
        }
    }
    BranchRun {
        answered: all_ok.then_some(elapsed),
        replied: all_ok.then_some(replied),
        pause_ms: resp.pause_ms,
        phases: resp.phases,
        children: resp.children,
    }
}

fn snapshot(c: &Client, id: &str, kind: &str, errors: &mut Vec<String>) -> Option<Snapshot> {
    call(
        c,
        Method::POST,
        "/v1/snapshots",
        Some(json!({"sandbox": id, "kind": kind})),
    )
    .map_err(|e| errors.push(format!("{kind} snapshot of {id}: {e}")))
    .ok()
}

/// Private host memory (KiB) per sandbox, from the daemon's Prometheus metrics.
fn private_kib(c: &Client) -> anyhow::Result<std::collections::HashMap<String, f64>> {
    let text = block_on(c.raw(Method::GET, "/metrics", None))?;
    let text = String::from_utf8_lossy(&text);
    let mut out = std::collections::HashMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("zygote_vm_memory_bytes{sandbox=\"") else {
            continue;
        };
        let Some((id, rest)) = rest.split_once('"') else {
            continue;
        };
        if let Some(value) = rest.strip_prefix(",kind=\"private\"} ") {
            if let Ok(bytes) = value.trim().parse::<f64>() {
                out.insert(id.to_string(), bytes / 1024.0);
            }
        }
    }
    Ok(out)
}

/// The fan-out: `count` children at once; (time until all answered, median private
/// KiB of a child, the parent's private KiB).
fn fanout(
    c: &Client,
    parent: &str,
    count: usize,
    errors: &mut Vec<String>,
) -> (Option<f64>, Option<f64>, Option<f64>) {
    let run = branch_and_answer(c, parent, count, errors);
    let (t, kids) = (run.answered, run.children);
    // Let the children settle (their agents answered; the guests go idle).
    std::thread::sleep(Duration::from_secs(2));
    let (mut child_kib, mut parent_kib) = (Vec::new(), None);
    match private_kib(c) {
        Ok(m) => {
            child_kib = kids.iter().filter_map(|k| m.get(k).copied()).collect();
            parent_kib = m.get(parent).copied();
        }
        Err(e) => errors.push(format!("reading /metrics: {e}")),
    }
    for id in &kids {
        delete(c, &format!("/v1/sandboxes/{id}"));
    }
    child_kib.sort_by(f64::total_cmp);
    let median = (!child_kib.is_empty()).then(|| percentile(&child_kib, 50.0));
    (t.map(|t| t.as_secs_f64() * 1e3), median, parent_kib)
}

fn ms_of(v: Option<f64>) -> Option<Duration> {
    v.map(|m| Duration::from_secs_f64(m / 1e3))
}

pub fn run(args: LinuxBenchArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    anyhow::ensure!(
        args.fill_mib < args.mem_mib,
        "--fill-mib must be below --mem-mib"
    );
    let say = |m: String| {
        if !args.json {
            eprintln!("{m}");
        }
    };
    let runtime = [
        "--runtime".to_string(),
        args.runtime.clone(),
        "--warm-spawners".to_string(),
        args.warm_spawners.to_string(),
    ];
    let state = StateDir::Temp {
        prefix: "zygote-bench-",
    };
    let d = PrivateDaemon::start(state, &runtime, "the daemon")?;
    let c = &d.client;
    let made: SandboxList = call(
        c,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"image": "minimal", "mem_mib": args.mem_mib, "name": "bench-parent"})),
    )
    .context("creating the parent sandbox")?;
    let parent: Sandbox = made.sandboxes.into_iter().next().context("no sandbox")?;
    // Non-zero pages in guest RAM (tmpfs): what a branch shares and a snapshot writes.
    exec(
        c,
        &parent.id,
        &format!(
            "yes zygote | head -c {} >/dev/shm/fill",
            u64::from(args.fill_mib) << 20
        ),
    )?;
    say(format!(
        "parent {} ({} MiB, {} MiB filled) on the {} runtime; {} rounds",
        parent.id, args.mem_mib, args.fill_mib, args.runtime, args.rounds
    ));

    let mut errors = Vec::new();
    let (mut pause, mut answer1, mut answer4) = (Vec::new(), Vec::new(), Vec::new());
    let (mut reply1, mut reply4) = (Vec::new(), Vec::new());
    let (mut full_pause, mut diff_pause) = (Vec::new(), Vec::new());
    let mut phases1: std::collections::BTreeMap<&'static str, Vec<Duration>> = Default::default();
    for round in 1..=args.rounds {
        let one = branch_and_answer(c, &parent.id, 1, &mut errors);
        for (name, v) in phase_columns(&one) {
            phases1.entry(name).or_default().extend(ms_of(Some(v)));
        }
        let (t1, kids) = (one.answered, one.children);
        answer1.extend(t1);
        reply1.extend(one.replied);
        pause.extend(ms_of(one.pause_ms));
        if let Some(kid) = kids.first() {
            let full = snapshot(c, kid, "full", &mut errors);
            full_pause.extend(ms_of(full.as_ref().and_then(|s| s.pause_ms)));
            let diff = if args.runtime == "kvm" {
                let _ = exec(c, kid, "yes diff | head -c 8388608 >/dev/shm/diff");
                snapshot(c, kid, "diff", &mut errors)
            } else {
                None
            };
            diff_pause.extend(ms_of(diff.as_ref().and_then(|s| s.pause_ms)));
            for id in &kids {
                delete(c, &format!("/v1/sandboxes/{id}"));
            }
            for s in [diff, full].into_iter().flatten() {
                delete(c, &format!("/v1/snapshots/{}", s.id));
            }
        }
        let four = branch_and_answer(c, &parent.id, 4, &mut errors);
        let (t4, kids) = (four.answered, four.children);
        answer4.extend(t4);
        reply4.extend(four.replied);
        pause.extend(ms_of(four.pause_ms));
        for id in &kids {
            delete(c, &format!("/v1/sandboxes/{id}"));
        }
        say(format!(
            "round {round}: answer1 {} ms, answer4 {} ms, failures so far {}",
            t1.map_or("-".into(), |t| ms(t.as_secs_f64() * 1e3)),
            t4.map_or("-".into(), |t| ms(t.as_secs_f64() * 1e3)),
            errors.len()
        ));
    }
    let (fanout_answer_ms, fanout_child_kib, parent_kib) = if args.fanout > 0 {
        let r = fanout(c, &parent.id, args.fanout, &mut errors);
        say(format!(
            "fan-out of {}: all answered in {} ms; private memory per child {} KiB, parent {} KiB",
            args.fanout,
            r.0.map_or("-".into(), ms),
            r.1.map_or("-".into(), |k| format!("{k:.0}")),
            r.2.map_or("-".into(), |k| format!("{k:.0}")),
        ));
        r
    } else {
        (None, None, None)
    };
    delete(c, &format!("/v1/sandboxes/{}", parent.id));

    let (p, a1, a4) = (
        Summary::of(&pause),
        Summary::of(&answer1),
        Summary::of(&answer4),
    );
    let (fp, dp) = (Summary::of(&full_pause), Summary::of(&diff_pause));
    let (r1, r4) = (Summary::of(&reply1), Summary::of(&reply4));
    let phase_summaries: Vec<(&'static str, Summary)> = phases1
        .iter()
        .map(|(name, v)| (*name, Summary::of(v)))
        .collect();
    let result = LinuxBench {
        runtime: args.runtime.clone(),
        warm_spawners: args.warm_spawners,
        mem_mib: args.mem_mib,
        fill_mib: args.fill_mib,
        rounds: args.rounds,
        failures: errors.len(),
        pause_ms_p50: p.p50,
        pause_ms_p90: p.p90,
        answer1_ms_p50: a1.p50,
        answer1_ms_p90: a1.p90,
        answer4_ms_p50: a4.p50,
        answer4_ms_p90: a4.p90,
        reply1_ms_p50: r1.p50,
        reply4_ms_p50: r4.p50,
        full_pause_ms_p50: fp.p50,
        diff_pause_ms_p50: dp.p50,
        diff_pause_ms_p90: dp.p90,
        full_over_fork: fp.p50 / p.p50,
        fanout: args.fanout,
        fanout_answer_ms,
        fanout_child_private_kib_p50: fanout_child_kib,
        parent_private_kib: parent_kib,
        phases1_ms_p50: phase_summaries.iter().map(|(n, s)| (*n, s.p50)).collect(),
        errors,
    };
    if !args.json {
        crate::commands::daemon_client::print_table(
            &["figure", "p50 ms", "p90 ms", "n"],
            &[
                ("parent pause (branch)", &p),
                ("branch -> 1 child answers", &a1),
                ("branch -> 4 children answer", &a4),
                ("branch -> reply (1 child)", &r1),
                ("branch -> reply (4 children)", &r4),
                ("full snapshot pause", &fp),
                ("diff snapshot pause", &dp),
            ]
            .iter()
            .map(|(name, s)| (name.to_string(), *s))
            .chain(
                phase_summaries
                    .iter()
                    .map(|(n, s)| (format!("  1-child phase: {n}"), s)),
            )
            .map(|(name, s)| vec![name, ms(s.p50), ms(s.p90), s.n.to_string()])
            .collect::<Vec<_>>(),
        );
        for e in &result.errors {
            eprintln!("failure: {e}");
        }
    }
    println!("{}", serde_json::to_string(&result)?);
    Ok(if result.failures == 0 { 0 } else { 1 })
}
