//! The networking suite's stand-in for the internet: a network namespace of the test's
//! own, on a veth to the host, with two small HTTP servers, a metadata-style link-local
//! address, and a DNS server (the daemon's `--dns` in the suite). Nothing here sends a
//! packet off this machine.
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub const REMOTE_PORT: u16 = 8080;
/// On `a`: a sink that counts the bytes every connection sends it.
pub const SINK_PORT: u16 = 8081;
/// The address the remote DNS server gives every name but those under `a.zygote.test`
/// and `b.zygote.test` (a documentation address: only ever read from an answer, never
/// contacted).
pub const DNS_ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 77);

pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Serves `marker` to every TCP connection on `listener`, forever (a daemon thread).
pub fn serve(listener: TcpListener, marker: String) {
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let marker = marker.clone();
            std::thread::spawn(move || {
                let mut conn = conn;
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let mut buf = [0u8; 512];
                let _ = conn.read(&mut buf);
                let _ = write!(
                    conn,
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{marker}",
                    marker.len()
                );
            });
        }
    });
}

/// The test's stand-in for the internet: namespace `ns` with addresses `a` and `b` on a
/// veth whose host end has `host`, plus a link-local address `ll` routed there (a
/// metadata service a guest must never reach). HTTP on `REMOTE_PORT` of `a`, `b` and
/// `ll`; DNS (UDP and TCP) on `b`, counting the queries that arrive.
pub struct Remote {
    ns: String,
    link: String,
    pub a: Ipv4Addr,
    pub b: Ipv4Addr,
    pub ll: Ipv4Addr,
    pub host: Ipv4Addr,
    pub dns_queries: Arc<AtomicUsize>,
    /// Bytes received on `a`:[`SINK_PORT`].
    pub sunk: Arc<AtomicUsize>,
}

impl Remote {
    pub fn start() -> Remote {
        let n = std::process::id() % 200 + 20;
        let r = Remote {
            ns: format!("zt-remote-{}", std::process::id()),
            link: format!("ztr{}", std::process::id() % 100_000),
            a: Ipv4Addr::new(10, 77, n as u8, 2),
            b: Ipv4Addr::new(10, 77, n as u8, 3),
            ll: Ipv4Addr::new(169, 254, 77, n as u8),
            host: Ipv4Addr::new(10, 77, n as u8, 1),
            dns_queries: Arc::default(),
            sunk: Arc::default(),
        };
        r.remove();
        ip(&["netns", "add", &r.ns]);
        ip(&[
            "link", "add", &r.link, "type", "veth", "peer", "name", "eth0", "netns", &r.ns,
        ]);
        ip(&["addr", "add", &format!("{}/24", r.host), "dev", &r.link]);
        ip(&["link", "set", &r.link, "up"]);
        for a in [r.a, r.b] {
            ip(&[
                "-n",
                &r.ns,
                "addr",
                "add",
                &format!("{a}/24"),
                "dev",
                "eth0",
            ]);
        }
        ip(&[
            "-n",
            &r.ns,
            "addr",
            "add",
            &format!("{}/32", r.ll),
            "dev",
            "lo",
        ]);
        ip(&["-n", &r.ns, "link", "set", "eth0", "up"]);
        ip(&["-n", &r.ns, "link", "set", "lo", "up"]);
        ip(&[
            "-n",
            &r.ns,
            "route",
            "add",
            "default",
            "via",
            &r.host.to_string(),
        ]);
        ip(&[
            "route",
            "add",
            &format!("{}/32", r.ll),
            "via",
            &r.a.to_string(),
        ]);
        let _ = NAMED.set([r.a, r.b]);
        // A thread in the namespace binds the servers; their sockets stay there.
        let ns_file = std::fs::File::open(format!("/run/netns/{}", r.ns)).unwrap();
        let addrs = [r.a, r.b, r.ll];
        let (dns, queries, sunk) = (r.b, r.dns_queries.clone(), r.sunk.clone());
        std::thread::spawn(move || {
            // SAFETY: switches only this thread's network namespace.
            assert_eq!(
                unsafe { libc::setns(ns_file.as_raw_fd(), libc::CLONE_NEWNET) },
                0
            );
            for a in addrs {
                let l = TcpListener::bind((a, REMOTE_PORT)).expect("remote server");
                serve(l, format!("remote-{a}"));
            }
            // The ports rules by name cover by default (plain TCP on 443 too: the
            // egress proxy judges the ClientHello, it never needs a TLS server).
            for a in [addrs[0], addrs[1]] {
                for port in [80, 443] {
                    let l = TcpListener::bind((a, port)).expect("remote server");
                    serve(l, format!("remote-{a}"));
                }
            }
            serve_dns_tcp(
                TcpListener::bind((dns, 53)).expect("remote DNS (TCP)"),
                queries.clone(),
            );
            serve_dns(UdpSocket::bind((dns, 53)).expect("remote DNS"), queries);
            sink(
                TcpListener::bind((addrs[0], SINK_PORT)).expect("sink"),
                sunk,
            );
        })
        .join()
        .unwrap();
        r
    }

    /// A TCP listener on `addr:port` inside the remote namespace (bound by a thread
    /// that entered it; the socket stays there).
    #[allow(dead_code)] // not every suite serves more than the standard servers
    pub fn listen(&self, addr: Ipv4Addr, port: u16) -> TcpListener {
        let ns_file = std::fs::File::open(format!("/run/netns/{}", self.ns)).unwrap();
        std::thread::spawn(move || {
            // SAFETY: switches only this thread's network namespace.
            assert_eq!(
                unsafe { libc::setns(ns_file.as_raw_fd(), libc::CLONE_NEWNET) },
                0
            );
            TcpListener::bind((addr, port)).expect("a remote listener")
        })
        .join()
        .unwrap()
    }

    /// `zygote serve` arguments for a daemon listening on `listen` with `runtime`, whose
    /// sandboxes' resolvers ask this namespace's DNS server.
    pub fn daemon_args(&self, listen: &str, runtime: &str) -> Vec<String> {
        let upstream = self.b.to_string();
        [
            "--listen",
            listen,
            "--runtime",
            runtime,
            "--dns-upstream",
            &upstream,
        ]
        .map(String::from)
        .to_vec()
    }

    fn remove(&self) {
        let _ = Command::new("ip")
            .args(["route", "del", &format!("{}/32", self.ll)])
            .output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Counts into `sunk` every byte any connection on `listener` sends, forever.
fn sink(listener: TcpListener, sunk: Arc<AtomicUsize>) {
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let sunk = sunk.clone();
            std::thread::spawn(move || {
                let mut conn = conn;
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = conn.read(&mut buf) {
                    sunk.fetch_add(n, Ordering::SeqCst);
                }
            });
        }
    });
}

/// Answers every DNS query on `socket` (an A query with [`DNS_ANSWER`], any other with
/// no records), counting them, forever (a daemon thread).
fn serve_dns(socket: UdpSocket, queries: Arc<AtomicUsize>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            queries.fetch_add(1, Ordering::SeqCst);
            if let Some(answer) = dns_answer(&buf[..n]) {
                let _ = socket.send_to(&answer, from);
            }
        }
    });
}

/// [`serve_dns`] over TCP (RFC 1035 4.2.2: each message after its 2-byte length).
fn serve_dns_tcp(listener: TcpListener, queries: Arc<AtomicUsize>) {
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let queries = queries.clone();
            std::thread::spawn(move || {
                let mut conn = conn;
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let mut len = [0u8; 2];
                while conn.read_exact(&mut len).is_ok() {
                    let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
                    if conn.read_exact(&mut query).is_err() {
                        return;
                    }
                    queries.fetch_add(1, Ordering::SeqCst);
                    let Some(answer) = dns_answer(&query) else {
                        return;
                    };
                    let mut framed = (answer.len() as u16).to_be_bytes().to_vec();
                    framed.extend_from_slice(&answer);
                    if conn.write_all(&framed).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// The remote's `a` and `b`: names under `a.zygote.test` resolve to `a`, under
/// `b.zygote.test` to `b`, every other name to [`DNS_ANSWER`].
static NAMED: std::sync::OnceLock<[Ipv4Addr; 2]> = std::sync::OnceLock::new();

/// The address the remote DNS gives `name` (labels joined by dots, lower-case).
fn address_for(name: &str) -> Ipv4Addr {
    let [a, b] = NAMED.get().copied().unwrap_or([DNS_ANSWER; 2]);
    if name.ends_with(".a.zygote.test") {
        a
    } else if name.ends_with(".b.zygote.test") {
        b
    } else {
        DNS_ANSWER
    }
}

/// The answer to a one-question DNS query (RFC 1035 section 4.1), None if it is not one.
fn dns_answer(query: &[u8]) -> Option<Vec<u8>> {
    let count = |at: usize| Some(u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]));
    if count(4)? != 1 {
        return None;
    }
    // The question: labels up to the empty one, then type and class.
    let mut end = 12;
    let mut labels = Vec::new();
    while *query.get(end)? != 0 {
        let len = usize::from(query[end]);
        labels.push(String::from_utf8_lossy(query.get(end + 1..end + 1 + len)?).to_lowercase());
        end += 1 + len;
    }
    let address = address_for(&labels.join("."));
    let is_a = count(end + 1)? == 1;
    let question = query.get(12..end + 5)?;
    let mut answer = query[..2].to_vec(); // the query's id
                                          // A response, recursion desired and available, no error; one question, 0/1 answers.
    answer.extend_from_slice(&[0x81, 0x80, 0, 1, 0, u8::from(is_a), 0, 0, 0, 0]);
    answer.extend_from_slice(question);
    if is_a {
        // The name by a pointer to the question's, type A, class IN, TTL 60, 4 bytes.
        answer.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
        answer.extend_from_slice(&address.octets());
    }
    Some(answer)
}
