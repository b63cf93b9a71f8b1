//! The remote host of `zygote bench net`: a network namespace (`zb-remote-<pid>`) joined
//! to the host by a veth pair on a free 10.78.<x>.0/24, a sink thread inside it that
//! counts the bytes of each connection from first byte to EOF, and optionally an iperf3
//! server. Dropping the [`Remote`] removes all of it.
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::Context;

/// Port of the byte sink in the remote namespace (and of iperf3's server).
pub(super) const SINK_PORT: u16 = 9000;
pub(super) const IPERF_PORT: u16 = 5201;

/// The remote host: a namespace with a veth pair to the host, and the sink thread (and
/// an iperf3 server, if used) in it. Dropping it removes all of it.
pub(super) struct Remote {
    pub(super) netns: String,
    host_link: String,
    /// 10.78.<x>.2: the address in the namespace.
    pub(super) addr: Ipv4Addr,
    pub(super) sink: Option<Sink>,
    iperf: Option<Child>,
}

/// A byte count from first byte to EOF, as the sink saw one connection.
pub(super) struct Received {
    pub(super) bytes: u64,
    pub(super) elapsed: Duration,
}

pub(super) struct Sink {
    /// A clone of the listening socket: shutting it down wakes the thread's accept.
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub(super) results: mpsc::Receiver<std::io::Result<Received>>,
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

    pub(super) fn start() -> anyhow::Result<Remote> {
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
    pub(super) fn start_iperf(&mut self) -> anyhow::Result<()> {
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
