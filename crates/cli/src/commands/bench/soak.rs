//! `zygote bench soak`: many sandbox life cycles through a private daemon, watching for
//! what they leave behind. Not a timed test: it reports, it does not assert.
//!
//! A private daemon (`zygote serve` on a fresh state directory) runs N cycles of: create
//! a sandbox, exec `echo` in it, branch it (1 child), exec in the child, delete child and
//! parent. At the start, every ~10% of the cycles, after the last one and again after an
//! idle `--settle-secs`, the bench samples the daemon's fds, threads and RSS (/proc), the
//! other processes whose command line names the state directory (VMs, supervisors), the
//! entries under its `vms/`, `layers/`, `snapshots/`, socket files anywhere in it, and its
//! network namespaces.
//! A healthy daemon stays flat and leaves nothing. The last line printed is one JSON
//! object. Exit status 1 only if the daemon died or more than `--max-failed-cycles`
//! cycles failed. At the end everything the bench made goes (sandboxes, snapshots, the
//! daemon, its stray processes, the temporary state directory).
use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};
use zygote_api::client::{block_on, Client, Method};

use super::stats::Summary;
use crate::commands::private_daemon::{status_field, PrivateDaemon, StateDir};

#[derive(clap::Args)]
pub struct SoakBenchArgs {
    /// Cycles (each: create, exec, branch 1 child, exec in it, delete both).
    #[arg(long, default_value_t = 1000)]
    cycles: usize,
    /// Runtime of the private daemon: kvm (zygote's VMM) or qemu; default: the daemon's
    /// own choice.
    #[arg(long)]
    runtime: Option<String>,
    /// Image of the sandboxes.
    #[arg(long, default_value = "minimal")]
    image: String,
    /// State directory of the private daemon (must be empty or absent; kept afterwards).
    /// Default: a temporary directory, removed at the end.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Idle seconds before the last sample, so that threads the daemon keeps for a while
    /// (tokio's blocking pool keeps an idle thread for 10 s) have gone.
    #[arg(long, default_value_t = 15)]
    settle_secs: u64,
    /// Exit 1 if more cycles than this failed.
    #[arg(long, default_value_t = 5)]
    max_failed_cycles: usize,
}

/// What one sample saw of the daemon and the state directory.
#[derive(Serialize, Clone, Default)]
struct Sample {
    cycle: usize,
    elapsed_s: f64,
    fds: usize,
    /// fds by kind: socket, pipe, anon_inode, file (anything with a path), other.
    fd_kinds: BTreeMap<&'static str, usize>,
    threads: usize,
    rss_kib: u64,
    /// Sandboxes and snapshots the daemon still lists (None: it did not answer).
    sandboxes: Option<usize>,
    snapshots: Option<usize>,
    /// Processes other than the daemon (and the bench) naming the state directory.
    procs: usize,
    /// Entries (files and directories) below vms/, layers/ and snapshots/, by directory.
    entries: BTreeMap<&'static str, usize>,
    /// Socket files anywhere under the state directory.
    sockets: usize,
    /// The daemon's network namespaces (`/run/netns/zygote-<its instance>-*`).
    netns: usize,
    // The names behind the counts, for the report on what leaked.
    #[serde(skip)]
    fd_targets: Vec<String>,
    #[serde(skip)]
    proc_list: Vec<String>,
    #[serde(skip)]
    entry_list: Vec<String>,
    #[serde(skip)]
    socket_list: Vec<String>,
    #[serde(skip)]
    netns_list: Vec<String>,
}

#[derive(Serialize, Default)]
struct Cleanup {
    sandboxes_deleted: usize,
    snapshots_deleted: usize,
    /// Processes naming the state directory still alive after the daemon stopped
    /// (killed by the bench).
    processes_killed: Vec<String>,
    errors: Vec<String>,
}

#[derive(Serialize)]
struct SoakReport {
    runtime: String,
    image: String,
    cycles: usize,
    cycles_done: usize,
    failed_cycles: usize,
    failures: usize,
    /// The first few failures, in words.
    errors: Vec<String>,
    daemon_died: Option<String>,
    elapsed_s: f64,
    cycles_per_s: f64,
    cycle_ms_p50: f64,
    cycle_ms_p90: f64,
    start: Sample,
    end: Sample,
    settled: Sample,
    /// settled - start: fds, threads, rss_kib, procs, entries, sockets.
    delta: BTreeMap<&'static str, i64>,
    /// fd targets (paths; sockets/pipes by kind) open when settled but not at the start.
    new_fd_targets: Vec<String>,
    leftover_processes: Vec<String>,
    leftover_files: Vec<String>,
    leftover_sockets: Vec<String>,
    /// Network namespaces of this daemon still there when settled.
    leftover_netns: Vec<String>,
    cleanup: Cleanup,
}

/// The soak's private daemon: on `--state-dir` (created if absent, must be empty) or on a
/// temporary directory; `runtime`: its `--runtime`, if any.
fn start_daemon(runtime: Option<&str>, state_dir: Option<&Path>) -> anyhow::Result<PrivateDaemon> {
    let state = match state_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            // A used state directory would give the daemon sandboxes to re-attach,
            // and the final clean-up deletes every sandbox it lists.
            anyhow::ensure!(
                std::fs::read_dir(dir)?.next().is_none(),
                "--state-dir {} is not empty: the soak needs a fresh daemon",
                dir.display()
            );
            StateDir::Given(dir)
        }
        None => StateDir::Temp {
            prefix: "zygote-soak-",
        },
    };
    let extra: Vec<String> = runtime
        .map(|r| vec!["--runtime".to_string(), r.to_string()])
        .unwrap_or_default();
    PrivateDaemon::start(state, &extra, "the daemon")
}

// Answers are read as JSON values, not as the daemon's model types: the soak needs a
// few fields and should not break when the others change.
fn get(c: &Client, path: &str) -> anyhow::Result<Value> {
    Ok(block_on(c.json(Method::GET, path, None::<&Value>))?)
}

fn post(c: &Client, path: &str, body: Value) -> anyhow::Result<Value> {
    Ok(block_on(c.json(Method::POST, path, Some(&body)))?)
}

/// The ids in the list `field` of a daemon answer (`{"sandboxes": [{"id": ...}]}`).
fn ids(v: &Value, field: &str) -> Vec<String> {
    let list = v[field].as_array().into_iter().flatten();
    list.filter_map(|s| Some(s["id"].as_str()?.to_string()))
        .collect()
}

fn delete(c: &Client, path: &str) -> anyhow::Result<()> {
    block_on(c.raw(Method::DELETE, path, None))?;
    Ok(())
}

fn echo(c: &Client, id: &str) -> anyhow::Result<()> {
    let body = json!({"argv": ["echo", "soak"]});
    let r = post(c, &format!("/v1/sandboxes/{id}/exec"), body)?;
    anyhow::ensure!(
        r["exit_code"] == 0 && r["stdout"] == "soak\n",
        "echo in {id} exited {} with stdout {}, stderr {}",
        r["exit_code"],
        r["stdout"],
        r["stderr"]
    );
    Ok(())
}

/// One cycle; its failures, in words (empty: it went through).
fn cycle(c: &Client, image: &str, n: usize) -> Vec<String> {
    let mut errors = Vec::new();
    let mut note = |step: &str, r: anyhow::Result<()>| {
        if let Err(e) = r {
            errors.push(format!("cycle {n}: {step}: {e:#}"));
        }
    };
    let created = post(c, "/v1/sandboxes", json!({ "image": image }));
    let parent = match created.map(|v| ids(&v, "sandboxes").into_iter().next()) {
        Ok(Some(id)) => id,
        other => {
            let e = other.and_then(|_| Err(anyhow::anyhow!("the daemon created no sandbox")));
            note("create", e);
            return errors;
        }
    };
    note("exec in the parent", echo(c, &parent));
    let branch = format!("/v1/sandboxes/{parent}/branch");
    match post(c, &branch, json!({"count": 1})) {
        Ok(b) => {
            let children = b["children"].as_array().into_iter().flatten();
            let children: Vec<&str> = children.filter_map(Value::as_str).collect();
            if children.is_empty() || b["failed"].as_array().is_some_and(|f| !f.is_empty()) {
                let e = anyhow::anyhow!("no child came up: {}", b["failed"]);
                note("branch", Err(e));
            }
            for child in children {
                note("exec in the child", echo(c, child));
                let r = delete(c, &format!("/v1/sandboxes/{child}"));
                note("delete the child", r);
            }
        }
        Err(e) => note("branch", Err(e)),
    }
    let r = delete(c, &format!("/v1/sandboxes/{parent}"));
    note("delete the parent", r);
    errors
}

/// The daemon's open fds: targets (sockets and pipes only by kind: their inode numbers
/// change all the time) and counts by kind.
fn fds(pid: u32) -> (Vec<String>, BTreeMap<&'static str, usize>) {
    let (mut targets, mut kinds) = (Vec::new(), BTreeMap::new());
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
    {
        let Some(t) = e.ok().and_then(|e| std::fs::read_link(e.path()).ok()) else {
            continue;
        };
        let t = t.display().to_string();
        let kind = ["socket:", "pipe:", "anon_inode:"]
            .into_iter()
            .find(|k| t.starts_with(k))
            .map(|k| k.trim_end_matches(':'))
            .unwrap_or(if t.starts_with('/') { "file" } else { "other" });
        *kinds.entry(kind).or_insert(0) += 1;
        let by_kind = matches!(kind, "socket" | "pipe");
        targets.push(if by_kind { kind.to_string() } else { t });
    }
    targets.sort();
    (targets, kinds)
}

/// The daemon's stray processes, as "PID command line" (cut at 240 characters).
fn stray_procs(d: &PrivateDaemon) -> Vec<String> {
    let procs = d.stray_procs().into_iter();
    procs
        .map(|(pid, cmd)| format!("{pid} {}", cmd.chars().take(240).collect::<String>()))
        .collect()
}

/// Every entry below `dir` (relative to `root`), and the socket files among them.
fn walk(root: &Path, dir: &Path, entries: &mut Vec<String>, sockets: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        let rel = path.strip_prefix(root).unwrap_or(&path);
        let rel = rel.display().to_string();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_socket() {
            sockets.push(rel.clone());
        }
        entries.push(rel);
        if ft.is_dir() {
            walk(root, &path, entries, sockets);
        }
    }
}

fn sample(d: &PrivateDaemon, cycle: usize, t0: Instant) -> Sample {
    let pid = d.pid();
    let (fd_targets, fd_kinds) = fds(pid);
    let proc_list = stray_procs(d);
    let listed = |what: &str| {
        let v = get(&d.client, &format!("/v1/{what}")).ok()?;
        Some(ids(&v, what).len())
    };
    let (mut entry_list, mut socket_list, mut entries) = (vec![], vec![], BTreeMap::new());
    for sub in ["vms", "layers", "snapshots"] {
        let before = entry_list.len();
        walk(
            &d.state,
            &d.state.join(sub),
            &mut entry_list,
            &mut socket_list,
        );
        entries.insert(sub, entry_list.len() - before);
    }
    // Sockets elsewhere in the state directory count too (not its three subtrees twice).
    for e in std::fs::read_dir(&d.state).into_iter().flatten().flatten() {
        if matches!(e.file_type(), Ok(ft) if ft.is_socket()) {
            socket_list.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    let prefix = zygote_net::netns_prefix_for(&d.state);
    let netns_list: Vec<String> = zygote_net::host::netns_names()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    Sample {
        cycle,
        elapsed_s: t0.elapsed().as_secs_f64(),
        fds: fd_targets.len(),
        fd_kinds,
        threads: status_field(pid, "Threads").unwrap_or(0) as usize,
        rss_kib: status_field(pid, "VmRSS").unwrap_or(0),
        sandboxes: listed("sandboxes"),
        snapshots: listed("snapshots"),
        procs: proc_list.len(),
        entries,
        sockets: socket_list.len(),
        netns: netns_list.len(),
        fd_targets,
        proc_list,
        entry_list,
        socket_list,
        netns_list,
    }
}

/// `s` minus `start` (entries: the three directories together).
fn delta(s: &Sample, start: &Sample) -> BTreeMap<&'static str, i64> {
    let entries = |x: &Sample| x.entries.values().sum::<usize>() as i64;
    BTreeMap::from([
        ("fds", s.fds as i64 - start.fds as i64),
        ("threads", s.threads as i64 - start.threads as i64),
        ("rss_kib", s.rss_kib as i64 - start.rss_kib as i64),
        ("procs", s.procs as i64 - start.procs as i64),
        ("entries", entries(s) - entries(start)),
        ("sockets", s.sockets as i64 - start.sockets as i64),
        ("netns", s.netns as i64 - start.netns as i64),
    ])
}

fn line(s: &Sample, start: &Sample, total: usize, failed: usize) -> String {
    let d = delta(s, start);
    let n = |v: Option<usize>| v.map_or("?".into(), |n| n.to_string());
    let listed = format!("{}/{}", n(s.sandboxes), n(s.snapshots));
    let e = |k| s.entries.get(k).copied().unwrap_or(0);
    let entries = format!("{}/{}/{}", e("vms"), e("layers"), e("snapshots"));
    let (mib, mib_d) = (s.rss_kib as f64 / 1024.0, d["rss_kib"] as f64 / 1024.0);
    format!(
        "cycle {:>5}/{total} {:>7.1}s  fds {} ({:+})  threads {} ({:+})  rss {mib:.1} MiB \
         ({mib_d:+.1})  sandboxes/snapshots {listed}  stray procs {}  vms/layers/snapshots \
         {entries}  sockets {}  netns {}  failed cycles {failed}",
        s.cycle, s.elapsed_s, s.fds, d["fds"], s.threads, d["threads"], s.procs, s.sockets, s.netns,
    )
}

/// Deletes what the daemon still has, stops it, kills what outlived it.
fn clean_up(d: &mut PrivateDaemon) -> Cleanup {
    let mut out = Cleanup::default();
    let c = d.client.clone();
    // Two passes: a snapshot a sandbox depends on goes once the sandbox has gone.
    for pass in (1..=2).filter(|_| d.died().is_none()) {
        for (what, n) in [
            ("sandboxes", &mut out.sandboxes_deleted),
            ("snapshots", &mut out.snapshots_deleted),
        ] {
            let path = format!("/v1/{what}");
            let listed = get(&c, &path).unwrap_or_default();
            for id in ids(&listed, what) {
                match delete(&c, &format!("{path}/{id}")) {
                    Ok(()) => *n += 1,
                    // The first pass may meet a snapshot still in use; say only the last.
                    Err(e) if pass == 2 => out.errors.push(format!("DELETE {path}/{id}: {e:#}")),
                    Err(_) => {}
                }
            }
        }
    }
    d.stop();
    // VMs deliberately outlive a daemon; these belong to this private one, so they go.
    for p in stray_procs(d) {
        if let Some(pid) = p.split(' ').next().and_then(|s| s.parse::<i32>().ok()) {
            // SAFETY: a plain kill(2) of a process our private daemon started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        out.processes_killed.push(p);
    }
    out
}

/// `after` minus `before`, as multisets (a few dozen fds: quadratic is fine).
fn added(before: &[String], after: &[String]) -> Vec<String> {
    let mut left = before.to_vec();
    let mut fresh = |t: &&String| match left.iter().position(|b| b == *t) {
        Some(i) => {
            left.swap_remove(i);
            false
        }
        None => true,
    };
    after.iter().filter(&mut fresh).cloned().collect()
}

pub fn run(args: SoakBenchArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.cycles > 0, "--cycles must be at least 1");
    let mut d = start_daemon(args.runtime.as_deref(), args.state_dir.as_deref())?;
    let info = get(&d.client, "/v1/info").unwrap_or_default();
    let runtime = info["runtime"]["name"].as_str().unwrap_or("?").to_string();
    eprintln!(
        "soak: {} cycles of create/exec/branch/exec/delete, image {}, {runtime} runtime, \
         daemon pid {}, state {}",
        args.cycles,
        args.image,
        d.pid(),
        d.state.display()
    );
    // A moment's idle first, so that the start sample does not catch the connection of
    // the request above still closing.
    std::thread::sleep(Duration::from_secs(2));
    let t0 = Instant::now();
    let start = sample(&d, 0, t0);
    let pb = indicatif::ProgressBar::new(args.cycles as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} cycles [{elapsed}, eta {eta}] {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    // suspend, not println: println prints nothing when stderr is not a terminal.
    pb.suspend(|| eprintln!("{}", line(&start, &start, args.cycles, 0)));
    let every = (args.cycles / 10).max(1);
    let (mut errors, mut failed_cycles, mut done) = (Vec::<String>::new(), 0, 0);
    let (mut durations, mut died, mut end) = (Vec::new(), None, start.clone());
    for n in 1..=args.cycles {
        let t = Instant::now();
        let errs = cycle(&d.client, &args.image, n);
        durations.push(t.elapsed());
        done = n;
        if !errs.is_empty() {
            failed_cycles += 1;
            pb.set_message(format!("{failed_cycles} failed"));
            errors.extend(errs);
            died = d.died();
        }
        pb.inc(1);
        if died.is_some() || n % every == 0 || n == args.cycles {
            end = sample(&d, n, t0);
            pb.suspend(|| eprintln!("{}", line(&end, &start, args.cycles, failed_cycles)));
        }
        if died.is_some() {
            break;
        }
    }
    pb.finish_and_clear();
    let loop_s = t0.elapsed().as_secs_f64();
    let settled = if died.is_none() {
        eprintln!("soak: idle {} s before the last sample", args.settle_secs);
        std::thread::sleep(Duration::from_secs(args.settle_secs));
        died = d.died();
        let s = sample(&d, done, t0);
        eprintln!("{} (settled)", line(&s, &start, args.cycles, failed_cycles));
        s
    } else {
        end.clone()
    };
    let cleanup = clean_up(&mut d);
    let sum = Summary::of(&durations);
    let report = SoakReport {
        runtime,
        image: args.image.clone(),
        cycles: args.cycles,
        cycles_done: done,
        failed_cycles,
        failures: errors.len(),
        errors: errors.iter().take(5).cloned().collect(),
        daemon_died: died.clone(),
        elapsed_s: loop_s,
        cycles_per_s: done as f64 / loop_s,
        cycle_ms_p50: sum.p50,
        cycle_ms_p90: sum.p90,
        delta: delta(&settled, &start),
        new_fd_targets: added(&start.fd_targets, &settled.fd_targets),
        leftover_processes: settled.proc_list.clone(),
        leftover_files: settled.entry_list.iter().take(20).cloned().collect(),
        leftover_sockets: settled.socket_list.iter().take(20).cloned().collect(),
        leftover_netns: settled.netns_list.iter().take(20).cloned().collect(),
        start,
        end,
        settled,
        cleanup,
    };
    for (what, list) in [
        ("failure", &report.errors),
        ("new fd", &report.new_fd_targets),
        ("leftover process", &report.leftover_processes),
        ("leftover file", &report.leftover_files),
        ("leftover socket", &report.leftover_sockets),
        ("leftover network namespace", &report.leftover_netns),
        ("killed at clean-up", &report.cleanup.processes_killed),
        ("clean-up error", &report.cleanup.errors),
    ] {
        for item in list {
            eprintln!("{what}: {item}");
        }
    }
    eprintln!(
        "soak: {done} cycles in {loop_s:.1} s ({:.3} cycles/s), {failed_cycles} failed{}",
        report.cycles_per_s,
        died.as_ref()
            .map_or(String::new(), |why| format!("; {why}"))
    );
    println!("{}", serde_json::to_string(&report)?);
    let bad = died.is_some() || failed_cycles > args.max_failed_cycles;
    Ok(i32::from(bad))
}
