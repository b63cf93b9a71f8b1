//! One sandbox's resolver: a UDP and a TCP socket on the guest's gateway, port 53,
//! made inside the sandbox's namespace; each question judged by the policy in force
//! ([`super::policy`]) and, when allowed, asked of the upstream resolver through a
//! socket made in the namespace too, one per query (a fresh source port and id each
//! time).
//!
//! Everything a guest can make the resolver hold is bounded: queries in flight
//! ([`MAX_IN_FLIGHT`]; more are dropped, as a busy resolver would), TCP connections
//! ([`MAX_TCP_CONNECTIONS`]), queries per connection, idle time, bytes read (see
//! `super::message`), and the wait for the upstream ([`UPSTREAM_TIMEOUT`]).
use std::net::{SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio::time::timeout;
use zygote_api::model::{DnsCounts, NetworkPolicy};

use super::message::{Answer, AnswerError, GuestQuery, MAX_ANSWER_BYTES, MAX_QUERY_BYTES};
use super::policy::{decide, Decision};
use super::DnsObserver;
use crate::egress::ca::EgressTls;
use crate::egress::judge::AnswerBook;
use crate::egress::proxy::LiveConnections;
use crate::egress::secrets::SecretBinding;
use crate::netns::{in_netns_async, random_u16};

/// Guest queries being answered at once (UDP and TCP together), per sandbox.
pub const MAX_IN_FLIGHT: usize = 64;
/// TCP connections from the guest at once, per sandbox.
pub const MAX_TCP_CONNECTIONS: usize = 8;
/// Queries answered on one TCP connection before it is closed.
pub const MAX_TCP_QUERIES: usize = 64;
/// A TCP connection idle (or a query half-sent) this long is closed.
pub const TCP_IDLE: Duration = Duration::from_secs(10);
/// How long the upstream may take to answer one query.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);
/// Packets on an upstream socket that are not the answer, before giving up.
const MAX_STRAY_PACKETS: usize = 8;

#[derive(Debug, Default)]
pub struct Counters {
    queries: AtomicU64,
    forwarded: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
}

impl Counters {
    pub fn snapshot(&self) -> DnsCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DnsCounts {
            queries: get(&self.queries),
            forwarded: get(&self.forwarded),
            refused: get(&self.refused),
            failed: get(&self.failed),
            dropped: get(&self.dropped),
        }
    }
}

/// What the resolver (and the egress proxy) of one sandbox share among their tasks.
pub struct Resolver {
    pub sandbox: String,
    pub netns: PathBuf,
    pub upstream: Option<SocketAddrV4>,
    /// Every policy in force (two while one changes): a question must pass them all.
    pub policies: RwLock<Vec<NetworkPolicy>>,
    pub counters: Counters,
    pub observer: Option<DnsObserver>,
    /// The addresses the guest got in answers, by name: what vouches for an address
    /// the egress proxy is asked to reach.
    pub book: Mutex<AnswerBook>,
    /// The egress proxy's open connections.
    pub live: LiveConnections,
    /// The sandbox's secrets bound to hosts (`crate::egress::secrets`).
    pub secrets: RwLock<Vec<SecretBinding>>,
    /// The daemon's egress CA and upstream trust (None: secrets are never swapped in).
    pub tls: Option<Arc<EgressTls>>,
    in_flight: Arc<Semaphore>,
    tcp_connections: Arc<Semaphore>,
}

/// A resolver's verdict on one question, for the counters and the event log.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub verdict: &'static str,
    pub detail: String,
}

impl Resolver {
    pub fn new(
        sandbox: String,
        netns: PathBuf,
        upstream: Option<SocketAddrV4>,
        policies: Vec<NetworkPolicy>,
        observer: Option<DnsObserver>,
    ) -> Resolver {
        Resolver {
            sandbox,
            netns,
            upstream,
            policies: RwLock::new(policies),
            counters: Counters::default(),
            observer,
            book: Mutex::default(),
            live: LiveConnections::default(),
            secrets: RwLock::new(Vec::new()),
            tls: None,
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            tcp_connections: Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS)),
        }
    }

    fn decide(&self, q: &GuestQuery) -> Decision {
        let policies = self.policies.read().unwrap_or_else(|e| e.into_inner());
        decide(&policies, &q.question)
    }

    /// The reply to a guest's message (None: nothing to send back).
    async fn answer(&self, bytes: &[u8], udp: bool) -> Option<Vec<u8>> {
        self.counters.queries.fetch_add(1, Ordering::Relaxed);
        let q = match GuestQuery::parse(bytes) {
            Ok(q) => q,
            Err((e, reply)) => {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                self.note("", "", "refused", e.to_string());
                return reply;
            }
        };
        let name = q.question.name.clone();
        let qtype = q.question.qtype.to_string();
        let (reply, verdict, detail) = match self.decide(&q) {
            Decision::Refuse(why) => (q.refused(), "refused", why.to_string()),
            Decision::NoRecords => (q.no_records(), "empty", "no IPv6 in sandboxes".into()),
            Decision::Forward => match self.forward(&q, udp).await {
                // A policy changed while the upstream answered: the answer is judged
                // by the policy in force now.
                Ok(_) if matches!(self.decide(&q), Decision::Refuse(_)) => {
                    (q.refused(), "refused", "the policy changed".into())
                }
                Ok(a) => {
                    self.book.lock().unwrap_or_else(|e| e.into_inner()).record(
                        &q.question.name,
                        &a.addresses,
                        Instant::now(),
                    );
                    let shown: Vec<String> =
                        a.addresses.iter().map(|(ip, _)| ip.to_string()).collect();
                    (
                        a.bytes,
                        "forwarded",
                        format!("{} {}", a.code, shown.join(" ")),
                    )
                }
                Err(e) => (q.failed(), "failed", e),
            },
        };
        let counter = match verdict {
            "forwarded" | "empty" => &self.counters.forwarded,
            "refused" => &self.counters.refused,
            _ => &self.counters.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.note(&name, &qtype, verdict, detail);
        Some(reply)
    }

    fn note(&self, name: &str, qtype: &str, verdict: &'static str, detail: String) {
        tracing::debug!(sandbox = %self.sandbox, name, qtype, verdict, detail, "dns");
        if let Some(observe) = &self.observer {
            observe(&super::DnsLogEntry {
                sandbox: &self.sandbox,
                name,
                qtype,
                verdict,
                detail: &detail,
            });
        }
    }

    /// Asks the upstream, over the transport the guest used.
    async fn forward(&self, q: &GuestQuery, udp: bool) -> Result<Answer, String> {
        let upstream = self
            .upstream
            .ok_or_else(|| "no upstream resolver configured".to_string())?;
        let id = random_u16();
        let asked = async {
            if udp {
                self.forward_udp(q, upstream, id).await
            } else {
                self.forward_tcp(q, upstream, id).await
            }
        };
        match timeout(UPSTREAM_TIMEOUT, asked).await {
            Ok(r) => r,
            Err(_) => Err(format!("the upstream {upstream} did not answer in time")),
        }
    }

    async fn forward_udp(
        &self,
        q: &GuestQuery,
        upstream: SocketAddrV4,
        id: u16,
    ) -> Result<Answer, String> {
        let sock = in_netns_async(self.netns.clone(), move || {
            let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
            s.connect(upstream)?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
        .await
        .and_then(UdpSocket::from_std)
        .map_err(|e| format!("upstream socket: {e}"))?;
        sock.send(&q.upstream_query(id))
            .await
            .map_err(|e| format!("sending upstream: {e}"))?;
        let mut buf = vec![0u8; MAX_ANSWER_BYTES + 1];
        for _ in 0..MAX_STRAY_PACKETS {
            let n = sock
                .recv(&mut buf)
                .await
                .map_err(|e| format!("upstream: {e}"))?;
            if let Some(a) = q.check_answer(id, &buf[..n], true).map_err(bad)? {
                return Ok(a);
            }
        }
        Err("the upstream sent no matching answer".into())
    }

    async fn forward_tcp(
        &self,
        q: &GuestQuery,
        upstream: SocketAddrV4,
        id: u16,
    ) -> Result<Answer, String> {
        let conn = in_netns_async(self.netns.clone(), move || {
            let s = std::net::TcpStream::connect_timeout(&upstream.into(), UPSTREAM_TIMEOUT)?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
        .await
        .and_then(TcpStream::from_std)
        .map_err(|e| format!("connecting upstream: {e}"))?;
        let mut conn = conn;
        let query = q.upstream_query(id);
        let mut framed = (query.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&query);
        conn.write_all(&framed)
            .await
            .map_err(|e| format!("sending upstream: {e}"))?;
        let len = usize::from(
            conn.read_u16()
                .await
                .map_err(|e| format!("upstream: {e}"))?,
        );
        if len > MAX_ANSWER_BYTES {
            return Err(bad(AnswerError::TooLong(len)));
        }
        let mut buf = vec![0u8; len];
        conn.read_exact(&mut buf)
            .await
            .map_err(|e| format!("upstream: {e}"))?;
        q.check_answer(id, &buf, false)
            .map_err(bad)?
            .ok_or_else(|| "the upstream's answer is not to this query".into())
    }
}

fn bad(e: AnswerError) -> String {
    e.to_string()
}

/// Answers the guest's UDP queries on `sock`, forever.
pub async fn serve_udp(sock: UdpSocket, r: Arc<Resolver>) {
    let sock = Arc::new(sock);
    // One byte more than a query may have: a longer datagram arrives cut, is seen too
    // long and dropped.
    let mut buf = vec![0u8; MAX_QUERY_BYTES + 1];
    loop {
        let (n, from): (usize, SocketAddr) = match sock.recv_from(&mut buf).await {
            Ok(got) => got,
            Err(e) => {
                tracing::debug!(sandbox = %r.sandbox, "dns: udp: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = r.in_flight.clone().try_acquire_owned() else {
            r.counters.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let (sock, r, bytes) = (sock.clone(), r.clone(), buf[..n].to_vec());
        tokio::spawn(async move {
            let _permit = permit;
            if let Some(reply) = r.answer(&bytes, true).await {
                let _ = sock.send_to(&reply, from).await;
            }
        });
    }
}

/// Answers the guest's TCP queries on `listener`, forever.
pub async fn serve_tcp(listener: TcpListener, r: Arc<Resolver>) {
    loop {
        let conn = match listener.accept().await {
            Ok((conn, _)) => conn,
            Err(e) => {
                tracing::debug!(sandbox = %r.sandbox, "dns: tcp: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = r.tcp_connections.clone().try_acquire_owned() else {
            r.counters.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let r = r.clone();
        tokio::spawn(async move {
            let _permit = permit;
            tcp_connection(conn, &r).await;
        });
    }
}

async fn tcp_connection(mut conn: TcpStream, r: &Resolver) {
    for _ in 0..MAX_TCP_QUERIES {
        let Ok(Ok(len)) = timeout(TCP_IDLE, conn.read_u16()).await else {
            return;
        };
        let len = usize::from(len);
        if len > MAX_QUERY_BYTES {
            return;
        }
        let mut query = vec![0u8; len];
        let Ok(Ok(_)) = timeout(TCP_IDLE, conn.read_exact(&mut query)).await else {
            return;
        };
        let Ok(permit) = r.in_flight.clone().try_acquire_owned() else {
            r.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let reply = r.answer(&query, false).await;
        drop(permit);
        let Some(reply) = reply else { return };
        // A reply longer than TCP's 2-byte length cannot be framed: close instead.
        let Ok(len) = u16::try_from(reply.len()) else {
            return;
        };
        let mut framed = len.to_be_bytes().to_vec();
        framed.extend_from_slice(&reply);
        if timeout(TCP_IDLE, conn.write_all(&framed)).await.is_err() {
            return;
        }
    }
}
