//! One sandbox's egress proxy: the guest's TCP connections to the ports name rules
//! cover are redirected by the namespace's rules to a socket of the daemon inside the
//! namespace ([`PROXY_PORT`] on the gateway); the proxy learns where the guest meant to
//! go (`SO_ORIGINAL_DST`), reads the name the connection gives (TLS SNI or HTTP Host,
//! bounded in bytes and time, `super::sniff`), judges it (`super::judge`) and, if
//! allowed, connects to the real destination from a socket made in the namespace too
//! (marked [`PROXY_MARK`], which the namespace's output chain lets out) and splices the
//! two, counting bytes. Every connection, refused or not, goes to the egress record.
//!
//! HTTPS connections to a host that one of the sandbox's secrets is bound to are not
//! spliced but relayed by `super::intercept`, which swaps the secrets in.
//!
//! Open connections stay listed with what they were judged on; a policy change judges
//! them again and cuts those the new policy refuses ([`LiveConnections::recheck`]).
use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::timeout;
use zygote_api::model::{EgressEntry, NetworkPolicy};

use super::intercept::{relay, GuestIo};
use super::judge::{judge, Attempt, Verdict};
use super::secrets::{bound_for, SecretBinding};
use super::sniff::{sniff, Sniffed, MAX_SNIFF_BYTES};
use crate::dns::server::Resolver;
use crate::netns::in_netns_async;

/// The proxy's port on the gateway, inside every sandbox's namespace.
pub const PROXY_PORT: u16 = 15080;
/// The mark of the proxy's outgoing sockets (the namespace's output chain accepts it).
pub const PROXY_MARK: u32 = 0x7a67_0001;
/// How long a connection may take to name its host.
pub const SNIFF_TIMEOUT: Duration = Duration::from_secs(5);
/// Connecting to the real destination.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Guest connections through the proxy at once, per sandbox (more wait in the
/// kernel's backlog).
pub const MAX_PROXIED: usize = 256;

/// Called with every egress record entry.
pub type EgressObserver = Arc<dyn Fn(&EgressEntry) + Send + Sync>;

struct Live {
    addr: Ipv4Addr,
    port: u16,
    name: Result<String, String>,
    cut: Arc<Notify>,
}

/// The proxy's open connections.
#[derive(Default)]
pub struct LiveConnections {
    /// Set once the sandbox's network goes ([`LiveConnections::cut_all`]).
    closing: std::sync::atomic::AtomicBool,
    next: AtomicU64,
    open: Mutex<HashMap<u64, Live>>,
}

impl LiveConnections {
    /// Cuts every open connection (the sandbox's network goes).
    pub fn cut_all(&self) {
        self.closing.store(true, Ordering::SeqCst);
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        for live in open.values() {
            live.cut.notify_one();
        }
    }

    /// Judges every open connection again under `policies` (the addresses were
    /// vouched for when they opened) and cuts those refused now; how many.
    pub fn recheck(&self, policies: &[NetworkPolicy]) -> usize {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let mut cut = 0;
        for live in open.values() {
            let attempt = Attempt {
                addr: live.addr,
                port: live.port,
                name: live.name.as_deref().map_err(Clone::clone),
            };
            if let Verdict::Refused(_) = judge(policies, &attempt, |_, _| true) {
                live.cut.notify_one();
                cut += 1;
            }
        }
        cut
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Where a redirected connection was going (`SO_ORIGINAL_DST`).
fn original_destination(s: &TcpStream) -> io::Result<SocketAddrV4> {
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `addr`, which we own.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_IP,
            libc::SO_ORIGINAL_DST,
            (&mut addr as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
        u16::from_be(addr.sin_port),
    ))
}

/// Accepts the guest's redirected connections on `listener`, forever.
pub async fn serve(listener: TcpListener, r: Arc<Resolver>, observer: Option<EgressObserver>) {
    let slots = Arc::new(Semaphore::new(MAX_PROXIED));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let conn = match listener.accept().await {
            Ok((conn, _)) => conn,
            Err(e) => {
                tracing::debug!(sandbox = %r.sandbox, "egress proxy: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let (r, observer) = (r.clone(), observer.clone());
        tokio::spawn(async move {
            let _permit = permit;
            handle(conn, &r, observer.as_ref()).await;
        });
    }
}

async fn handle(mut guest: TcpStream, r: &Resolver, observer: Option<&EgressObserver>) {
    let Ok(dst) = original_destination(&guest) else {
        return;
    };
    let mut entry = EgressEntry {
        sandbox: r.sandbox.clone(),
        event: "refused".into(),
        address: dst.ip().to_string(),
        port: dst.port(),
        started_ms: now_ms(),
        ..Default::default()
    };
    let note = |e: &EgressEntry| {
        tracing::debug!(sandbox = %e.sandbox, host = ?e.host, port = e.port, event = %e.event, reason = %e.reason, "egress");
        if let Some(o) = observer {
            o(e);
        }
    };
    // The first bytes, until they name a host (or cannot).
    let mut first = Vec::with_capacity(2048);
    let sniffed = timeout(SNIFF_TIMEOUT, async {
        let mut buf = [0u8; 4096];
        loop {
            let s = sniff(&first);
            if s != Sniffed::NeedMore {
                return s;
            }
            let room = (MAX_SNIFF_BYTES - first.len()).min(buf.len());
            match guest.read(&mut buf[..room]).await {
                Ok(0) | Err(_) => return Sniffed::NeedMore,
                Ok(n) => first.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .unwrap_or(Sniffed::NeedMore);
    // What the first byte says, for the record and for a refusal a client can read.
    entry.protocol = match first.first() {
        Some(0x16) => "tls",
        Some(b) if b.is_ascii_uppercase() => "http",
        _ => "",
    }
    .into();
    let name: Result<String, String> = match &sniffed {
        Sniffed::Tls { host } => Ok(host.clone()),
        Sniffed::Http { host, method, path } => {
            entry.method = Some(method.clone());
            entry.path = Some(path.clone());
            Ok(host.clone())
        }
        Sniffed::Unnamed(why) => Err(why.to_string()),
        Sniffed::NeedMore => Err("named no host in time".into()),
    };
    entry.host = name.as_ref().ok().cloned();
    let verdict = {
        let policies = r.policies.read().unwrap_or_else(|e| e.into_inner()).clone();
        let book = r.book.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let attempt = Attempt {
            addr: *dst.ip(),
            port: dst.port(),
            name: name.as_deref().map_err(Clone::clone),
        };
        judge(&policies, &attempt, |a, n| book.vouches(a, n, now))
    };
    let reason = match verdict {
        Verdict::Refused(why) => {
            entry.reason = why;
            entry.ended_ms = Some(now_ms());
            if entry.protocol == "http" {
                let body = format!("refused by the sandbox's egress policy: {}\n", entry.reason);
                let _ = guest
                    .write_all(
                        format!(
                            "HTTP/1.1 403 Forbidden\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            }
            note(&entry);
            return;
        }
        Verdict::Allowed(why) => why,
    };
    entry.reason = reason;
    let upstream = match connect_out(r, dst).await {
        Ok(s) => s,
        Err(e) => {
            entry.event = "failed".into();
            entry.reason = format!("connecting to {dst}: {e}");
            entry.ended_ms = Some(now_ms());
            note(&entry);
            return;
        }
    };
    let id = r.live.next.fetch_add(1, Ordering::Relaxed);
    let cut = Arc::new(Notify::new());
    r.live
        .open
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(
            id,
            Live {
                addr: *dst.ip(),
                port: dst.port(),
                name: name.clone(),
                cut: cut.clone(),
            },
        );
    // Registered after the network went (cut_all ran between accept and here).
    if r.live.closing.load(Ordering::SeqCst) {
        cut.notify_one();
    }
    entry.event = "open".into();
    // HTTPS to a host a secret is bound to: relayed with the placeholders swapped.
    let bound = match (&name, entry.protocol.as_str(), &r.tls) {
        (Ok(host), "tls", Some(tls)) => {
            let secrets = r.secrets.read().unwrap_or_else(|e| e.into_inner()).clone();
            let bound: Vec<SecretBinding> = bound_for(&secrets, host, dst.port())
                .into_iter()
                .cloned()
                .collect();
            (!bound.is_empty()).then(|| (host.clone(), bound, tls.clone()))
        }
        _ => None,
    };
    if bound.is_some() {
        entry.reason = format!(
            "{}; secrets bound to this host are swapped in",
            entry.reason
        );
    }
    note(&entry);
    let mut failed = false;
    let (cut_by_policy, sent, received) = match bound {
        Some((host, secrets, tls)) => {
            let io = GuestIo::new(guest, first);
            let (sent, received) = (io.sent.clone(), io.received.clone());
            let relayed = tokio::select! {
                done = relay(io, upstream, &host, secrets, &tls) => Some(done),
                _ = cut.notified() => None,
            };
            if let Some(done) = &relayed {
                entry.secrets = done.secrets.clone();
                if let Some(why) = &done.failure {
                    entry.reason = why.clone();
                    failed = true;
                }
            }
            (
                relayed.is_none(),
                sent.load(Ordering::Relaxed),
                received.load(Ordering::Relaxed),
            )
        }
        None => {
            let (sent, received) = (AtomicU64::new(0), AtomicU64::new(0));
            let cut = splice(guest, upstream, &first, &sent, &received, &cut).await;
            (
                cut,
                sent.load(Ordering::Relaxed),
                received.load(Ordering::Relaxed),
            )
        }
    };
    r.live
        .open
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id);
    entry.event = match (cut_by_policy, failed) {
        (true, _) => "cut",
        (false, true) => "failed",
        (false, false) => "closed",
    }
    .into();
    if cut_by_policy {
        entry.reason = if r.live.closing.load(Ordering::SeqCst) {
            "cut: the sandbox's network went away".into()
        } else {
            "cut: the sandbox's policy changed and no longer allows it".into()
        };
    }
    entry.bytes_out = sent;
    entry.bytes_in = received;
    entry.ended_ms = Some(now_ms());
    note(&entry);
}

/// A connection to `dst` from a socket made in the sandbox's namespace, marked so the
/// namespace lets it out.
async fn connect_out(r: &Resolver, dst: SocketAddrV4) -> io::Result<TcpStream> {
    let std = in_netns_async(r.netns.clone(), move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        let mark = PROXY_MARK;
        // SAFETY: setsockopt reads `size_of::<u32>()` bytes of `mark`.
        let set = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_MARK,
                (&mark as *const u32).cast(),
                std::mem::size_of::<u32>() as libc::socklen_t,
            )
        };
        if set != 0 {
            return Err(io::Error::last_os_error());
        }
        s.connect_timeout(&dst.into(), CONNECT_TIMEOUT)?;
        s.set_nonblocking(true)?;
        Ok(std::net::TcpStream::from(s))
    })
    .await?;
    TcpStream::from_std(std)
}

/// Copies both ways until both ends are done, or `cut` is notified (true then).
async fn splice(
    guest: TcpStream,
    upstream: TcpStream,
    first: &[u8],
    sent: &AtomicU64,
    received: &AtomicU64,
    cut: &Notify,
) -> bool {
    let (mut gr, mut gw) = guest.into_split();
    let (mut ur, mut uw) = upstream.into_split();
    let out = async {
        if uw.write_all(first).await.is_ok() {
            sent.fetch_add(first.len() as u64, Ordering::Relaxed);
            pump(&mut gr, &mut uw, sent).await;
        }
        let _ = uw.shutdown().await;
    };
    let back = async {
        pump(&mut ur, &mut gw, received).await;
        let _ = gw.shutdown().await;
    };
    tokio::select! {
        _ = async { tokio::join!(out, back) } => false,
        _ = cut.notified() => true,
    }
}

async fn pump(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    count: &AtomicU64,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
                count.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }
}
