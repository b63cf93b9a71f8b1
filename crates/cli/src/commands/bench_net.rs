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
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};
use zygote_daemon::client::{block_on, Client, Method};

use crate::commands::bench_stats::{ms, percentile, Summary};

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
/// Port of the byte sink in the remote namespace (and of iperf3's server).
const SINK_PORT: u16 = 9000;
const IPERF_PORT: u16 = 5201;

/// A `zygote serve` on a private temporary state directory. Dropping it deletes what it
/// still has, stops it, kills what outlived it and removes its namespaces.
struct Daemon {
    backend: &'static str,
    child: Child,
    client: Client,
    state: PathBuf,
    _temp: tempfile::TempDir,
}

impl Daemon {
    fn start(backend: &'static str, runtime: &str) -> anyhow::Result<Daemon> {
        let temp = tempfile::Builder::new()
            .prefix(&format!("zygote-net-{backend}-"))
            .tempdir()?;
        let state = temp.path().canonicalize()?;
        let mut child = Command::new(std::env::current_exe()?)
            .arg("serve")
            .arg("--state-dir")
            .arg(&state)
            .args(["--listen", "127.0.0.1:0", "--proxy-listen", "none"])
            .args(["--runtime", runtime, "--network", backend])
            .env(
                "ZYGOTE_LOG",
                std::env::var("ZYGOTE_LOG").unwrap_or("warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting zygote serve")?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let url = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("zygoted listening on ").map(str::to_string));
        let Some(url) = url else {
            let status = child.wait()?;
            anyhow::bail!(
                "the {backend} daemon (--network {backend} --runtime {runtime}) did not start \
                 ({status}); its stderr above says why"
            );
        };
        // Keep reading its stdout: a closed pipe would turn its later writes into EPIPE.
        std::thread::spawn(move || lines.for_each(drop));
        let token = std::fs::read_to_string(state.join("token"))?;
        let client = Client::new(&url, Some(token.trim().to_string()))?;
        Ok(Daemon {
            backend,
            child,
            client,
            state,
            _temp: temp,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
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
        if self.alive() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) };
        }
        let _ = self.child.wait();
        // VMs deliberately outlive a daemon; these belong to this private one.
        for (pid, cmd) in stray_procs(&self.state, self.pid()) {
            eprintln!("net: clean-up: killing {pid} {cmd}");
            // SAFETY: a plain kill(2) of a process our private daemon started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        if self.backend == "isolated" {
            // The daemon's own naming (`zygote-<hash of the state dir>-<sandbox>`): with
            // the user backend `start` only computes the name, and `sweep` removes what
            // is left of this daemon's namespaces (nothing, if the deletes went through).
            let choice = zygote_daemon::network::BackendChoice::User;
            match zygote_daemon::network::Network::start(choice, &self.state, None) {
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

/// The remote host: a namespace with a veth pair to the host, and the sink thread (and
/// an iperf3 server, if used) in it. Dropping it removes all of it.
struct Remote {
    netns: String,
    host_link: String,
    /// 10.78.<x>.2: the address in the namespace.
    addr: Ipv4Addr,
    sink: Option<Sink>,
    iperf: Option<Child>,
}

/// A byte count from first byte to EOF, as the sink saw one connection.
struct Received {
    bytes: u64,
    elapsed: Duration,
}

struct Sink {
    /// A clone of the listening socket: shutting it down wakes the thread's accept.
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    results: mpsc::Receiver<std::io::Result<Received>>,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running ip (iproute2)")?;
    anyhow::ensure!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

fn command_output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

impl Remote {
    /// A /24 in 10.78.0.0/16 that no route or address of the host touches.
    fn free_subnet() -> anyhow::Result<u8> {
        let used = command_output("ip", &["-4", "route", "show", "table", "all"])
            + &command_output("ip", &["-4", "addr"]);
        let start = std::process::id() % 254;
        (0..254)
            .map(|i| ((start + i) % 254 + 1) as u8)
            .find(|x| !used.contains(&format!("10.78.{x}.")) && !used.contains("10.78.0.0/16"))
            .context("no free /24 in 10.78.0.0/16 for the remote namespace")
    }

    fn start() -> anyhow::Result<Remote> {
        let pid = std::process::id();
        let x = Remote::free_subnet()?;
        let mut r = Remote {
            netns: format!("zb-remote-{pid}"),
            host_link: format!("zbh{pid}"),
            addr: Ipv4Addr::new(10, 78, x, 2),
            sink: None,
            iperf: None,
        };
        let ns_link = format!("zbr{pid}");
        let (host_cidr, ns_cidr) = (format!("10.78.{x}.1/24"), format!("10.78.{x}.2/24"));
        let gateway = format!("10.78.{x}.1");
        let (ns, hl) = (r.netns.clone(), r.host_link.clone());
        ip(&["netns", "add", &ns])?;
        ip(&[
            "link", "add", &hl, "type", "veth", "peer", "name", &ns_link, "netns", &ns,
        ])?;
        ip(&["addr", "add", &host_cidr, "dev", &hl])?;
        ip(&["link", "set", &hl, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        ip(&["-n", &ns, "addr", "add", &ns_cidr, "dev", &ns_link])?;
        ip(&["-n", &ns, "link", "set", &ns_link, "up"])?;
        ip(&["-n", &ns, "route", "add", "default", "via", &gateway])?;
        r.sink = Some(Sink::start(&r.netns, r.addr)?);
        Ok(r)
    }

    /// An iperf3 server in the namespace (for the whole run).
    fn start_iperf(&mut self) -> anyhow::Result<()> {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.netns, "iperf3", "-s"])
            .args(["-B", &self.addr.to_string(), "-p", &IPERF_PORT.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting iperf3 -s in the remote namespace")?;
        self.iperf = Some(child);
        // Until it listens.
        std::thread::sleep(Duration::from_millis(500));
        Ok(())
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        if let Some(mut c) = self.iperf.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // The sink's socket and thread hold the namespace: they go first.
        drop(self.sink.take());
        if Path::new("/sys/class/net").join(&self.host_link).exists() {
            if let Err(e) = ip(&["link", "del", &self.host_link]) {
                eprintln!("net: clean-up: {e:#}");
            }
        }
        if Path::new("/run/netns").join(&self.netns).exists() {
            if let Err(e) = ip(&["netns", "del", &self.netns]) {
                eprintln!("net: clean-up: {e:#}");
            }
        }
    }
}

impl Sink {
    /// A thread that joins `netns`, listens on `addr:SINK_PORT` and reports each
    /// connection it accepts.
    fn start(netns: &str, addr: Ipv4Addr) -> anyhow::Result<Sink> {
        let path = Path::new("/run/netns").join(netns);
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel::<anyhow::Result<TcpListener>>();
        let (tx, results) = mpsc::channel();
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("bench-net-sink".into())
            .spawn(move || {
                let bound = (|| {
                    let ns = std::fs::File::open(&path)
                        .with_context(|| format!("opening {}", path.display()))?;
                    // SAFETY: setns(2) on a namespace fd we own; it moves this thread
                    // only (network namespaces can be joined by one thread of many).
                    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        let e = std::io::Error::last_os_error();
                        anyhow::bail!("setns into {}: {e}", path.display());
                    }
                    let l = TcpListener::bind(SocketAddrV4::new(addr, SINK_PORT))
                        .with_context(|| format!("binding {addr}:{SINK_PORT}"))?;
                    Ok(l)
                })();
                let listener = match bound.and_then(|l| Ok((l.try_clone()?, l))) {
                    Ok((clone, l)) => {
                        let _ = ready_tx.send(Ok(clone));
                        l
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                for conn in listener.incoming() {
                    if stopping.load(Ordering::SeqCst) {
                        break;
                    }
                    let r = conn.and_then(|mut s| {
                        s.set_read_timeout(Some(Duration::from_secs(60)))?;
                        let mut buf = vec![0u8; 256 << 10];
                        let (mut bytes, mut first) = (0u64, None);
                        loop {
                            let n = s.read(&mut buf)?;
                            if n == 0 {
                                break;
                            }
                            first.get_or_insert_with(Instant::now);
                            bytes += n as u64;
                        }
                        let elapsed = first.map_or(Duration::ZERO, |t| t.elapsed());
                        Ok(Received { bytes, elapsed })
                    });
                    if tx.send(r).is_err() {
                        break;
                    }
                }
            })?;
        let listener = ready_rx
            .recv()
            .context("the sink thread ended before listening")??;
        Ok(Sink {
            listener,
            stop,
            thread: Some(thread),
            results,
        })
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // SAFETY: shutdown(2) of a socket we own; a thread blocked in accept on it
        // returns (EINVAL) and sees the stop flag.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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

/// A field of /proc/PID/status, as a number.
fn status_field(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Processes whose command line names `state`, other than the daemon, the bench and its
/// ancestors: (pid, command line).
fn stray_procs(state: &Path, daemon: u32) -> Vec<(u32, String)> {
    let me = std::process::id();
    let mut skip: BTreeSet<u32> = [daemon, me].into();
    let mut p = me;
    while let Some(parent) = status_field(p, "PPid").filter(|&q| q > 1) {
        p = parent as u32;
        if !skip.insert(p) {
            break;
        }
    }
    let needle = state.display().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
        if !skip.contains(&pid) && cmd.contains(&needle) {
            out.push((pid, cmd.trim_end().chars().take(200).collect()));
        }
    }
    out
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

/// One backend's samples.
#[derive(Default)]
struct Samples {
    create: Vec<Duration>,
    branch: Vec<Duration>,
    mib_s: Vec<f64>,
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

#[derive(Serialize)]
struct BackendReport {
    create_ms_p50: f64,
    create_ms_p90: f64,
    branch_ms_p50: f64,
    branch_ms_p90: f64,
    mib_s_p50: f64,
    /// The slowest tenth of the transfers (nearest-rank 10th percentile).
    mib_s_p10: f64,
    samples: usize,
}

impl BackendReport {
    fn of(s: &Samples) -> BackendReport {
        let (create, branch) = (Summary::of(&s.create), Summary::of(&s.branch));
        let mut mib = s.mib_s.clone();
        mib.sort_by(f64::total_cmp);
        BackendReport {
            create_ms_p50: create.p50,
            create_ms_p90: create.p90,
            branch_ms_p50: branch.p50,
            branch_ms_p90: branch.p90,
            mib_s_p50: percentile(&mib, 50.0),
            mib_s_p10: percentile(&mib, 10.0),
            samples: create.n,
        }
    }
}

#[derive(Serialize)]
struct NetReport {
    rounds: usize,
    runtime: String,
    mib: u64,
    isolated: BackendReport,
    user: BackendReport,
    create_overhead_ms_p50: f64,
    branch_overhead_ms_p50: f64,
    throughput_ratio: f64,
    method: &'static str,
    failures: usize,
    errors: Vec<String>,
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

fn print_table(r: &NetReport) {
    let f = |v: f64| if v.is_nan() { "-".to_string() } else { ms(v) };
    let rate = |v: f64| {
        if v.is_nan() {
            "-".to_string()
        } else {
            format!("{v:.1}")
        }
    };
    let (i, u) = (&r.isolated, &r.user);
    println!(
        "bench net: {} rounds, {} runtime, {} MiB per transfer ({})",
        r.rounds, r.runtime, r.mib, r.method
    );
    println!(
        "{:<24} {:>12} {:>12} {:>16}",
        "", "isolated", "user", "isolated vs user"
    );
    let rows = [
        ("create ms p50", f(i.create_ms_p50), f(u.create_ms_p50)),
        ("create ms p90", f(i.create_ms_p90), f(u.create_ms_p90)),
        ("branch ms p50", f(i.branch_ms_p50), f(u.branch_ms_p50)),
        ("branch ms p90", f(i.branch_ms_p90), f(u.branch_ms_p90)),
        (
            "guest->remote MiB/s p50",
            rate(i.mib_s_p50),
            rate(u.mib_s_p50),
        ),
        (
            "guest->remote MiB/s p10",
            rate(i.mib_s_p10),
            rate(u.mib_s_p10),
        ),
    ];
    let diff = [
        f(r.create_overhead_ms_p50),
        String::new(),
        f(r.branch_overhead_ms_p50),
        String::new(),
        format!("x{:.2}", r.throughput_ratio),
        String::new(),
    ];
    for ((name, a, b), d) in rows.into_iter().zip(diff) {
        println!("{name:<24} {a:>12} {b:>12} {d:>16}");
    }
}
