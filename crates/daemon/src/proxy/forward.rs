//! One proxied request: a connection to the guest, the request with its headers made
//! fit for the guest, and the answer streamed back (or, for a 101, the upgraded
//! connections joined by [`super::upgrade`]).
//!
//! One upstream connection per request: the guest is a veth hop away, so a pool would
//! save little, and a fresh connection carries an upgrade without further ado.
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{StatusCode, Version};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::{route::Route, upgrade, ProxyError};
use crate::token::remove_token;

/// How long a guest may take to accept the connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Headers about one connection, not the message (RFC 9110 section 7.6.1), plus the
/// proxy ones that end here.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

pub(super) struct Upstream<'a> {
    pub target: SocketAddr,
    pub route: Route,
    /// The client, for `X-Forwarded-For`.
    pub peer: Option<SocketAddr>,
    /// The API token: never passed on to a guest.
    pub token: &'a str,
    pub req: Request,
}

/// The protocol an upgrade request asks for (`Connection: upgrade` and `Upgrade: x`).
fn upgrade_protocol(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| headers.get(header::UPGRADE).cloned())
        .flatten()
}

/// Removes the hop-by-hop headers, including those the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The request's headers as the guest gets them: the client's, less the hop-by-hop
/// ones, plus the `X-Forwarded-*` ones; and, whatever the client sent, without our
/// token in any form (a public port's own `Authorization` headers go through).
fn upstream_headers(up: &Upstream<'_>, protocol: Option<&HeaderValue>) -> HeaderMap {
    let mut headers = up.req.headers().clone();
    strip_hop_by_hop(&mut headers);
    if let Some(peer) = up.peer {
        let ip = peer.ip().to_string();
        let chain = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
            Some(earlier) => format!("{earlier}, {ip}"),
            None => ip,
        };
        if let Ok(v) = HeaderValue::from_str(&chain) {
            headers.insert("x-forwarded-for", v);
        }
    }
    match up.req.headers().get(header::HOST).cloned() {
        Some(host) => {
            headers.insert("x-forwarded-host", host);
        }
        // HTTP/1.0 without Host: the guest's HTTP/1.1 server needs one.
        None => {
            if let Ok(v) = HeaderValue::from_str(&up.target.to_string()) {
                headers.insert(header::HOST, v);
            }
        }
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    if let Some(prefix) = up.route.prefix.as_deref() {
        if let Ok(v) = HeaderValue::from_str(prefix) {
            headers.insert("x-forwarded-prefix", v);
        }
    }
    if let Some(p) = protocol {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, p.clone());
    }
    // Last, so nothing added above can bring it back.
    remove_token(&mut headers, up.token);
    headers
}

async fn connect(target: SocketAddr) -> Result<TcpStream, String> {
    match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Ok(s)
        }
        Ok(Err(e)) => Err(format!("connecting to {target}: {e}")),
        Err(_) => Err(format!(
            "{target} accepted no connection within {} s",
            CONNECT_TIMEOUT.as_secs()
        )),
    }
}

pub(super) async fn forward(mut up: Upstream<'_>) -> Result<Response, ProxyError> {
    let (sandbox, port) = (up.route.sandbox.clone(), up.route.port);
    let unreachable = |why: String| ProxyError::Unreachable {
        sandbox: sandbox.clone(),
        port,
        why,
    };
    let bad = |why: String| ProxyError::BadResponse {
        sandbox: sandbox.clone(),
        port,
        why,
    };
    let protocol = upgrade_protocol(up.req.headers());
    let headers = upstream_headers(&up, protocol.as_ref());
    // Taken before the request is sent on: the client's side of an upgrade.
    let client_upgrade = protocol.is_some().then(|| hyper::upgrade::on(&mut up.req));
    let (parts, body) = up.req.into_parts();
    let mut req = axum::http::Request::builder()
        .method(parts.method)
        .uri(up.route.upstream.as_str())
        .version(Version::HTTP_11)
        .body(body)
        .map_err(|e| bad(format!("building the request: {e}")))?;
    *req.headers_mut() = headers;

    let stream = connect(up.target).await.map_err(&unreachable)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(format!("HTTP handshake: {e}")))?;
    let what = format!("{sandbox}:{port}");
    tokio::spawn({
        let what = what.clone();
        async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!("proxy: connection to {what}: {e}");
            }
        }
    });
    let mut resp = sender
        .send_request(req)
        .await
        .map_err(|e| bad(e.to_string()))?;

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(bad(
                "101 Switching Protocols to a request that asked for no upgrade".into(),
            ));
        };
        let guest_upgrade = hyper::upgrade::on(&mut resp);
        tokio::spawn(upgrade::splice(client_upgrade, guest_upgrade, what));
        // Connection and Upgrade stay: they are the 101's point.
        let (parts, _) = resp.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, Body::new(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_with_the_ones_connection_names() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "keep-alive, X-Private".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key(header::CONTENT_TYPE));
    }

    #[test]
    fn an_upgrade_needs_both_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        assert_eq!(upgrade_protocol(&h), None);
        h.insert(header::CONNECTION, "keep-alive, Upgrade".parse().unwrap());
        assert_eq!(upgrade_protocol(&h), Some("websocket".parse().unwrap()));
        h.remove(header::UPGRADE);
        assert_eq!(upgrade_protocol(&h), None);
    }
}
