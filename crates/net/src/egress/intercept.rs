//! An HTTPS connection to a host a secret is bound to (`super::secrets`): the proxy
//! ends the guest's TLS with a leaf of the daemon's CA for the name the guest gave
//! (`super::ca`; the guest's trust store holds the CA), opens its own TLS to the
//! address the guest chose, verifying the real server's certificate for that same
//! name, and relays HTTP/1.1 between the two, one request at a time. In each request
//! the placeholders of the secrets bound to this host and port become their values, in
//! header values only; a request whose `Host` names another host than the TLS name is
//! refused (421), so a connection opened for a bound host cannot carry the value to
//! another one. Response headers echoing a value get the placeholder back.
//!
//! A server whose certificate does not verify gets nothing: the guest's requests are
//! answered 502 with the reason. HTTP/2 is not offered to either end; protocol upgrades
//! (WebSocket) are not relayed.
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, HOST};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::ca::EgressTls;
use super::secrets::{swap_in, swap_out, SecretBinding};

/// How long the guest may take to send a request's head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// The TLS handshakes, each.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head the relay reads.
const MAX_HEAD: usize = 64 * 1024;

type Body = BoxBody<Bytes, hyper::Error>;

/// The guest's end: the bytes the proxy read to learn the name, then the socket;
/// counting both ways.
pub struct GuestIo {
    first: Vec<u8>,
    at: usize,
    inner: TcpStream,
    pub sent: Arc<AtomicU64>,
    pub received: Arc<AtomicU64>,
}

impl GuestIo {
    pub fn new(inner: TcpStream, first: Vec<u8>) -> GuestIo {
        GuestIo {
            first,
            at: 0,
            inner,
            sent: Arc::default(),
            received: Arc::default(),
        }
    }
}

impl AsyncRead for GuestIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.at < this.first.len() {
            let n = (this.first.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.first[this.at..this.at + n]);
            this.at += n;
            this.sent.fetch_add(n as u64, Ordering::Relaxed);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.sent
            .fetch_add((buf.filled().len() - before) as u64, Ordering::Relaxed);
        r
    }
}

impl AsyncWrite for GuestIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = &r {
            self.received.fetch_add(*n as u64, Ordering::Relaxed);
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What an intercepted connection did, for the egress record.
#[derive(Debug, Default)]
pub struct Relayed {
    /// Names of the secrets whose values went out.
    pub secrets: Vec<String>,
    /// Why it ended early (the server's certificate, a handshake), if it did.
    pub failure: Option<String>,
}

/// Relays the guest's HTTPS connection to `host` (at `upstream`) with `secrets` swapped
/// in; returns when either end is done.
pub async fn relay(
    guest: GuestIo,
    upstream: TcpStream,
    host: &str,
    secrets: Vec<SecretBinding>,
    tls: &EgressTls,
) -> Relayed {
    let used = Arc::new(Mutex::new(Vec::new()));
    let server_end = async {
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| format!("{host:?} is not a TLS server name: {e}"))?;
        let connector = TlsConnector::from(tls.client());
        let tls_up = tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, upstream))
            .await
            .map_err(|_| "the server's TLS handshake timed out".to_string())?
            .map_err(|e| format!("the server did not prove it is {host}: {e}"))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls_up))
            .await
            .map_err(|e| format!("HTTP to the server: {e}"))?;
        Ok::<_, String>((sender, conn))
    };
    let (upstream, failure) = match server_end.await {
        Ok(up) => (Some(up), None),
        Err(why) => (None, Some(why)),
    };
    let acceptor = match tls.server_for(host) {
        Ok(cfg) => TlsAcceptor::from(cfg),
        Err(e) => {
            return Relayed {
                secrets: Vec::new(),
                failure: Some(e.to_string()),
            }
        }
    };
    let guest_tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(guest)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return Relayed {
                secrets: Vec::new(),
                failure: Some(failure.unwrap_or(format!("the guest's TLS handshake: {e}"))),
            }
        }
        Err(_) => {
            return Relayed {
                secrets: Vec::new(),
                failure: Some(failure.unwrap_or("the guest's TLS handshake timed out".into())),
            }
        }
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD);
    let Some((sender, conn)) = upstream else {
        // Every request gets the reason; nothing reaches the server.
        let why = failure.clone().unwrap_or_default();
        let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
            let why = why.clone();
            async move {
                Ok::<_, Infallible>(plain(
                    StatusCode::BAD_GATEWAY,
                    &format!("zygote egress: {why}\n"),
                ))
            }
        });
        let _ = builder
            .keep_alive(false)
            .serve_connection(TokioIo::new(guest_tls), svc)
            .await;
        return Relayed {
            secrets: Vec::new(),
            failure,
        };
    };
    let driver = tokio::spawn(conn);
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let (host_owned, secrets) = (host.to_string(), Arc::new(secrets));
    let used_svc = used.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (sender, host, secrets, used) = (
            sender.clone(),
            host_owned.clone(),
            secrets.clone(),
            used_svc.clone(),
        );
        async move { Ok::<_, Infallible>(forward(req, &sender, &host, &secrets, &used).await) }
    });
    let _ = builder.serve_connection(TokioIo::new(guest_tls), svc).await;
    driver.abort();
    let secrets = std::mem::take(&mut *used.lock().unwrap_or_else(|e| e.into_inner()));
    Relayed {
        secrets,
        failure: None,
    }
}

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(text.to_string()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("text/plain"));
    r
}

/// The host part of a `Host` header or URI authority (without port or brackets).
fn host_part(authority: &str) -> &str {
    match authority.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    }
}

fn same_host(given: &str, host: &str) -> bool {
    let given = host_part(given.trim());
    given
        .strip_suffix('.')
        .unwrap_or(given)
        .eq_ignore_ascii_case(host)
}

async fn forward(
    mut req: Request<Incoming>,
    sender: &tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Incoming>>,
    host: &str,
    secrets: &[SecretBinding],
    used: &Mutex<Vec<String>>,
) -> Response<Body> {
    let named = req
        .headers()
        .get_all(HOST)
        .iter()
        .map(|v| v.to_str().unwrap_or(""))
        .collect::<Vec<_>>();
    let authority = req.uri().authority().map(|a| a.as_str().to_string());
    let misdirected = named.len() != 1
        || !same_host(named[0], host)
        || authority.is_some_and(|a| !same_host(&a, host));
    if misdirected {
        return plain(
            StatusCode::MISDIRECTED_REQUEST,
            &format!("zygote egress: this connection is for {host}; its requests must name it (one Host)\n"),
        );
    }
    let bound: Vec<&SecretBinding> = secrets.iter().collect();
    let mut names = Vec::new();
    for value in req.headers_mut().values_mut() {
        let Ok(text) = value.to_str() else { continue };
        if let Some(swapped) = swap_in(text, &bound, &mut names) {
            match HeaderValue::from_str(&swapped) {
                Ok(v) => *value = v,
                Err(_) => {
                    return plain(
                        StatusCode::BAD_REQUEST,
                        "zygote egress: a secret's value cannot stand in this header\n",
                    )
                }
            }
        }
    }
    let response = {
        let mut s = sender.lock().await;
        match s.ready().await {
            Ok(()) => s.send_request(req).await,
            Err(e) => Err(e),
        }
    };
    if !names.is_empty() {
        let mut used = used.lock().unwrap_or_else(|e| e.into_inner());
        for n in names {
            if !used.contains(&n) {
                used.push(n);
            }
        }
    }
    match response {
        Ok(mut r) => {
            for value in r.headers_mut().values_mut() {
                let Ok(text) = value.to_str() else { continue };
                if let Some(v) = swap_out(text, &bound).and_then(|s| HeaderValue::from_str(&s).ok())
                {
                    *value = v;
                }
            }
            r.map(|b| b.boxed())
        }
        Err(e) => plain(
            StatusCode::BAD_GATEWAY,
            &format!("zygote egress: the server {host}: {e}\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_must_name_the_tls_host() {
        assert!(same_host("api.example.test", "api.example.test"));
        assert!(same_host("API.example.test:443", "api.example.test"));
        assert!(same_host("api.example.test.", "api.example.test"));
        assert!(!same_host("other.test", "api.example.test"));
        assert!(!same_host("api.example.test.evil", "api.example.test"));
        assert!(!same_host("api.example.test:x", "api.example.test"));
    }
}
