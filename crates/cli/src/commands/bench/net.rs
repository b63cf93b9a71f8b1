//! `zygote bench net`: the isolated network backend against QEMU user networking, in
//! the same run. Not a test: it reports, it does not assert.
//!
//! Two private daemons (`zygote serve` on two temporary state directories), one with
//! `--network isolated`, one with `--network user`. Each round, for each backend in turn
//! (the order alternates round by round: the machine is shared and noisy), the bench
//! times a create (`POST /v1/sandboxes`, answered once the guest's agent answers), sends
//! `--mib` MiB from the guest to a "remote host" and times a branch of one child.
//!
//! The remote host is a network namespace the bench makes itself (`zb-remote-<pid>`),
//! joined to the host by a veth pair on 10.78.<x>.0/24: guest traffic never leaves this
//! machine. A sink thread inside that namespace accepts, counts bytes until EOF and
//! times first byte to EOF; the guest runs `dd if=/dev/zero | nc` (busybox). iperf3 is
//! used instead when both the host and the guests have it.
//!
//! The last line printed is one JSON object. Everything the bench made goes at the end,
//! on error too (sandboxes, daemons, processes still naming their state directories,
//! the daemons' namespaces, the remote namespace and its veth pair).
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};
use zygote_api::client::{block_on, Client, Method};

use super::net_remote::{Remote, IPERF_PORT, SINK_PORT};
use super::net_report::{print_table, BackendReport, NetReport, Samples};
use super::stats::ms;
use crate::commands::private_daemon::{PrivateDaemon, StateDir};

#[derive(clap::Args)]
pub struct NetBenchArgs {
    /// Rounds; each creates, measures and branches one sandbox on each backend.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Runtime of both daemons: qemu or kvm (zygote's VMM; it gives guests of the user
    /// backend no NIC, so there is no user throughput then).
    #[arg(long, default_value = "qemu")]
    runtime: String,
    /// MiB sent from the guest to the remote host per round.
    #[arg(long, default_value_t = 32)]
    mib: u64,
}

/// The two backends, as `zygote serve --network` names them.
const BACKENDS: [&str; 2] = ["isolated", "user"];

/// One backend's private daemon, on a temporary state directory. Dropping it deletes what
/// it still has, stops it, kills what outlived it and removes its namespaces.
struct Daemon {
    backend: &'static str,
    daemon: PrivateDaemon,
}

impl std::ops::Deref for Daemon {
    type Target = PrivateDaemon;
    fn deref(&self) -> &PrivateDaemon {
        &self.daemon
    }
}

impl std::ops::DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut PrivateDaemon {
        &mut self.daemon
    }
}

impl Daemon {
    fn start(backend: &'static str, runtime: &str) -> anyhow::Result<Daemon> {
        let prefix = format!("zygote-net-{backend}-");
        let extra = ["--proxy-listen", "none", "--runtime", runtime];
        let extra = extra.into_iter().chain(["--network", backend]);
        let extra: Vec<String> = extra.map(str::to_string).collect();
        let what = format!("the {backend} daemon (--network {backend} --runtime {runtime})");
        let daemon = PrivateDaemon::start(StateDir::Temp { prefix: &prefix }, &extra, &what)?;
        Ok(Daemon { backend, daemon })
    }

    /// Deletes its sandboxes and snapshots, stops it, kills processes still naming its
    /// state directory and removes the namespaces named after it.
    fn clean_up(&mut self) {
        let c = self.client.clone();
        // Two passes: a snapshot a sandbox depends on goes once the sandbox has gone.
        for pass in 1..=2 {
            if !self.alive() {
                break;
            }
            for what in ["sandboxes", "snapshots"] {
                let path = format!("/v1/{what}");
                let listed = get(&c, &path).unwrap_or_default();
                for id in ids(&listed, what) {
                    if let Err(e) = delete(&c, &format!("{path}/{id}")) {
                        if pass == 2 {
                            eprintln!("net: clean-up: DELETE {path}/{id}: {e:#}");
                        }
                    }
                }
            }
        }
        self.stop();
        // VMs deliberately outlive a daemon; these belong to this private one.
        for (pid, cmd) in self.stray_procs() {
            let cmd: String = cmd.chars().take(200).collect();
            eprintln!("net: clean-up: killing {pid} {cmd}");
            // SAFETY: a plain kill(2) of a process our private daemon started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        if self.backend == "isolated" {
            // The daemon's own naming (`zygote-<hash of the state dir>-<sandbox>`): with
            // the user backend `start` only computes the name, and `sweep` removes what
            // is left of this daemon's namespaces (nothing, if the deletes went through).
            let choice = zygote_net::BackendChoice::User;
            match zygote_net::Network::start(choice, &self.state, None, None) {
                Ok(n) => n.sweep(&Default::default()),
                Err(e) => eprintln!("net: clean-up: namespaces: {e}"),
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.clean_up();
    }
}
// Answers are read as JSON values: the bench needs a few fields.
fn get(c: &Client, path: &str) -> anyhow::Result<Value> {
    Ok(block_on(c.json(Method::GET, path, None::<&Value>))?)
}

fn post(c: &Client, path: &str, body: Value) -> anyhow::Result<Value> {
    Ok(block_on(c.json(Method::POST, path, Some(&body)))?)
}

fn delete(c: &Client, path: &str) -> anyhow::Result<()> {
    block_on(c.raw(Method::DELETE, path, None))?;
    Ok(())
}

fn ids(v: &Value, field: &str) -> Vec<String> {
    let list = v[field].as_array().into_iter().flatten();
    list.filter_map(|s| Some(s["id"].as_str()?.to_string()))
        .collect()
}

fn exec(c: &Client, id: &str, script: &str, timeout_ms: u64) -> anyhow::Result<Value> {
    let body = json!({"argv": ["sh", "-c", script], "timeout_ms": timeout_ms});
    post(c, &format!("/v1/sandboxes/{id}/exec"), body)
}

/// How bytes get from the guest to the remote host.
#[derive(Clone, Copy, PartialEq)]
enum Transfer {
    Nc,
    Iperf3,
}

impl Transfer {
    fn name(self) -> &'static str {
        match self {
            Transfer::Nc => "nc",
            Transfer::Iperf3 => "iperf3",
        }
    }
}

/// Sends `mib` MiB from sandbox `id` to the remote host: MiB/s.
fn throughput(
    c: &Client,
    id: &str,
    remote: &Remote,
    mib: u64,
    method: Transfer,
) -> anyhow::Result<f64> {
    let timeout_ms = 300_000;
    if method == Transfer::Iperf3 {
        let script = format!("iperf3 -c {} -p {IPERF_PORT} -n {mib}M -J", remote.addr);
        let r = exec(c, id, &script, timeout_ms)?;
        let out: Value = serde_json::from_str(r["stdout"].as_str().unwrap_or_default())
            .with_context(|| format!("iperf3 said: {} {}", r["stdout"], r["stderr"]))?;
        let bps = out["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .with_context(|| format!("no end.sum_received in iperf3's answer: {out}"))?;
        return Ok(bps / 8.0 / 1048576.0);
    }
    let sink = remote.sink.as_ref().context("no sink")?;
    // A late report of an earlier, failed round is not this one's.
    while sink.results.try_recv().is_ok() {}
    let script = format!(
        "dd if=/dev/zero bs=64k count={} 2>/dev/null | nc -w 10 {} {SINK_PORT}",
        mib * 16,
        remote.addr
    );
    let r = exec(c, id, &script, timeout_ms)?;
    let got = sink.results.recv_timeout(Duration::from_secs(15));
    let got = match got {
        Ok(r) => r.context("the sink")?,
        Err(_) => anyhow::bail!(
            "the sink saw no connection (exit {}, stderr {})",
            r["exit_code"],
            r["stderr"]
        ),
    };
    let want = mib << 20;
    anyhow::ensure!(
        got.bytes == want,
        "the sink got {} of {want} bytes (nc exit {}, stderr {})",
        got.bytes,
        r["exit_code"],
        r["stderr"]
    );
    Ok(got.bytes as f64 / got.elapsed.as_secs_f64().max(1e-9) / 1048576.0)
}

/// One round on one backend: create, throughput, branch, delete. Failures go to
/// `errors`; what was measured goes to `s`. Returns the progress line.
fn round(
    d: &Daemon,
    remote: &Remote,
    args: &NetBenchArgs,
    method: Option<Transfer>,
    s: &mut Samples,
    errors: &mut Vec<String>,
) -> String {
    let c = &d.client;
    let b = d.backend;
    let mut line = format!("{b:<8}");
    let t = Instant::now();
    let created = post(c, "/v1/sandboxes", json!({"image": "minimal"}));
    let took = t.elapsed();
    let sandbox = match created {
        Ok(v) => v["sandboxes"][0].clone(),
        Err(e) => {
            errors.push(format!("{b}: create: {e:#}"));
            return format!("{line} create failed: {e:#}");
        }
    };
    let Some(id) = sandbox["id"].as_str().map(str::to_string) else {
        errors.push(format!("{b}: create: no sandbox in the answer"));
        return format!("{line} create: no sandbox in the answer");
    };
    s.create.push(took);
    line += &format!(" create {:>7} ms", ms(took.as_secs_f64() * 1e3));
    let isolated = sandbox["network"]["isolated"].as_bool();
    if isolated != Some(b == "isolated") {
        errors.push(format!(
            "{b}: sandbox {id} has network {} (expected isolated={})",
            sandbox["network"],
            b == "isolated"
        ));
    }
    match method {
        Some(m) => match throughput(c, &id, remote, args.mib, m) {
            Ok(v) => {
                s.mib_s.push(v);
                line += &format!("  {v:>7.1} MiB/s");
            }
            Err(e) => {
                errors.push(format!("{b}: throughput: {e:#}"));
                line += "  throughput failed";
            }
        },
        None => line += "  (no NIC)",
    }
    let t = Instant::now();
    let branched = post(
        c,
        &format!("/v1/sandboxes/{id}/branch"),
        json!({"count": 1}),
    );
    let took = t.elapsed();
    match branched {
        Ok(v) => {
            let children: Vec<String> = v["children"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c.as_str().map(str::to_string))
                .collect();
            if children.is_empty() {
                errors.push(format!("{b}: branch: no child came up: {}", v["failed"]));
                line += "  branch: no child";
            } else {
                s.branch.push(took);
                line += &format!("  branch {:>7} ms", ms(took.as_secs_f64() * 1e3));
            }
            for child in children {
                if let Err(e) = delete(c, &format!("/v1/sandboxes/{child}")) {
                    errors.push(format!("{b}: delete child {child}: {e:#}"));
                }
            }
        }
        Err(e) => {
            errors.push(format!("{b}: branch: {e:#}"));
            line += "  branch failed";
        }
    }
    if let Err(e) = delete(c, &format!("/v1/sandboxes/{id}")) {
        errors.push(format!("{b}: delete {id}: {e:#}"));
    }
    line
}

/// Why isolated networking cannot work here, if it cannot (the daemon checks again).
fn isolated_unavailable() -> Option<String> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (namespaces, veth pairs and nftables need it)".into());
    }
    for tool in ["ip", "nft"] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!("`{tool}` is not installed (iproute2, nftables)"));
        }
    }
    if !Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun is missing".into());
    }
    None
}

/// Whether `program` is on the host's PATH.
fn on_host(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether a guest of `d` has iperf3 (one throwaway sandbox).
fn guest_has_iperf3(d: &Daemon) -> anyhow::Result<bool> {
    let v = post(&d.client, "/v1/sandboxes", json!({"image": "minimal"}))?;
    let id = ids(&v, "sandboxes")
        .into_iter()
        .next()
        .context("no sandbox in the answer")?;
    let r = exec(&d.client, &id, "command -v iperf3", 30_000);
    let _ = delete(&d.client, &format!("/v1/sandboxes/{id}"));
    Ok(r?["exit_code"] == 0)
}

pub fn run(args: NetBenchArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    anyhow::ensure!(args.mib > 0, "--mib must be at least 1");
    if let Some(why) = isolated_unavailable() {
        anyhow::bail!("bench net needs isolated networking, which is unavailable here: {why}");
    }
    // Declared first, dropped last: the daemons (and their VMs) go before the remote.
    let mut remote = Remote::start().context("making the remote namespace")?;
    let mut daemons = Vec::new();
    for b in BACKENDS {
        daemons.push(Daemon::start(b, &args.runtime)?);
    }
    for d in &daemons {
        let info = get(&d.client, "/v1/info")?;
        let backend = info["network"]["backend"].as_str().unwrap_or("?");
        anyhow::ensure!(
            backend == d.backend,
            "the daemon started with --network {} runs the {backend} backend ({})",
            d.backend,
            info["network"]["reason"]
        );
        let rt = info["runtime"]["name"].as_str().unwrap_or("?");
        anyhow::ensure!(
            rt == args.runtime,
            "the daemon runs the {rt} runtime, not {}",
            args.runtime
        );
    }
    // The kvm runtime gives user-backend guests no NIC.
    let user_has_nic = args.runtime != "kvm";
    let mut method = Transfer::Nc;
    if on_host("iperf3") {
        let mut all = true;
        for d in daemons
            .iter()
            .filter(|d| d.backend == "isolated" || user_has_nic)
        {
            all &= guest_has_iperf3(d).unwrap_or(false);
        }
        if all {
            remote.start_iperf()?;
            method = Transfer::Iperf3;
        } else {
            eprintln!("net: iperf3 is on the host but not in the guests: using nc");
        }
    }
    eprintln!(
        "net: {} rounds, {} runtime, {} MiB per transfer with {} to {} (namespace {}), \
         daemons: isolated pid {} ({}), user pid {} ({})",
        args.rounds,
        args.runtime,
        args.mib,
        method.name(),
        remote.addr,
        remote.netns,
        daemons[0].pid(),
        daemons[0].state.display(),
        daemons[1].pid(),
        daemons[1].state.display(),
    );
    let pb = indicatif::ProgressBar::new(args.rounds as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} rounds [{elapsed}] {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut samples = [Samples::default(), Samples::default()];
    let mut errors = Vec::new();
    for n in 1..=args.rounds {
        // Alternate which backend goes first.
        let order = if n % 2 == 1 { [0, 1] } else { [1, 0] };
        for i in order {
            let d = &mut daemons[i];
            anyhow::ensure!(d.alive(), "the {} daemon exited", d.backend);
            let m = (i == 0 || user_has_nic).then_some(method);
            let line = round(d, &remote, &args, m, &mut samples[i], &mut errors);
            pb.suspend(|| eprintln!("round {n}/{}  {line}", args.rounds));
        }
        if !errors.is_empty() {
            pb.set_message(format!("{} failures", errors.len()));
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    let (iso, user) = (
        BackendReport::of(&samples[0]),
        BackendReport::of(&samples[1]),
    );
    let report = NetReport {
        rounds: args.rounds,
        runtime: args.runtime.clone(),
        mib: args.mib,
        create_overhead_ms_p50: iso.create_ms_p50 - user.create_ms_p50,
        branch_overhead_ms_p50: iso.branch_ms_p50 - user.branch_ms_p50,
        throughput_ratio: iso.mib_s_p50 / user.mib_s_p50,
        isolated: iso,
        user,
        method: method.name(),
        failures: errors.len(),
        errors: errors.iter().take(5).cloned().collect(),
    };
    for e in &errors {
        eprintln!("failure: {e}");
    }
    // Clean up before the summary, so that its messages come before it.
    drop(daemons);
    drop(remote);
    print_table(&report);
    // NaN (no samples) becomes null.
    println!("{}", serde_json::to_string(&report)?);
    Ok(i32::from(!errors.is_empty()))
}
