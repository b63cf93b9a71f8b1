//! Exposed ports through a real daemon's proxy to a guest's servers: busybox httpd for
//! the access rules, and a responder that tells what request head the guest got (none
//! of the API token's forms may be in it).
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::{Client, ClientError};

use crate::common::{proxy_url, sh};

/// One HTTP/1.0 GET to the proxy at `proxy` (`http://127.0.0.1:PORT`) with `host` as
/// the Host header and `headers` (each line ending in CRLF); the whole answer.
fn http_request(proxy: &str, host: &str, path: &str, headers: &str) -> String {
    let addr = proxy.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).expect("the proxy listens");
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n{headers}\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// [`http_request`] with the bearer token, if any.
pub fn http_get(proxy: &str, host: &str, path: &str, token: Option<&str>) -> String {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    http_request(proxy, host, path, &auth)
}

fn status_of(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// `POST /v1/sandboxes/{id}/ports` with `body`: the exposed port, or the API's error.
async fn expose(c: &Client, id: &str, body: Value) -> Result<Value, ClientError> {
    c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/ports"),
        Some(&body),
    )
    .await
}

/// A guest's HTTP server, exposed: reachable through the proxy by path and by host
/// name with the token, refused without it, public once made so; gone when unexposed.
pub async fn exposed_ports(c: &Client, token: &str, id: &str) {
    sh(
        c,
        id,
        "mkdir -p /www && echo guest-page > /www/index.html && httpd -p 8080 -h /www",
    )
    .await
    .unwrap();
    let proxy = proxy_url(c).await.expect("the daemon runs its proxy");
    let port = expose(c, id, json!({"port": 8080})).await.unwrap();
    assert_eq!(port["public"], false, "{port}");
    let path = format!("/sandboxes/{id}/ports/8080/");
    let with_token = http_get(&proxy, "127.0.0.1", &path, Some(token));
    assert_eq!(status_of(&with_token), 200, "{with_token}");
    assert!(with_token.contains("guest-page"), "{with_token}");
    let by_host = http_get(&proxy, &format!("8080-{id}.localhost"), "/", Some(token));
    assert!(by_host.contains("guest-page"), "{by_host}");
    let without = http_get(&proxy, "127.0.0.1", &path, None);
    assert_eq!(status_of(&without), 401, "{without}");
    match expose(c, id, json!({"port": 8080})).await {
        Err(ClientError::Api { status: 409, .. }) => {}
        other => panic!("exposing a port twice: {other:?}"),
    }
    c.raw(
        Method::DELETE,
        &format!("/v1/sandboxes/{id}/ports/8080"),
        None,
    )
    .await
    .unwrap();
    expose(c, id, json!({"port": 8080, "public": true}))
        .await
        .unwrap();
    let public = http_get(&proxy, "127.0.0.1", &path, None);
    assert!(public.contains("guest-page"), "{public}");
    our_token_stays_out_of_the_guest(c, token, id, &proxy).await;
}

/// Answers one HTTP request with nothing, having kept the request's head in
/// /tmp/seen-head (CRs dropped): what the guest was sent, as it got it.
const RECORD_HEAD: &str = r#"#!/bin/sh
cr=$(printf '\r')
head=''
while IFS= read -r line; do
  line=${line%"$cr"}
  [ -z "$line" ] && break
  head="$head$line
"
done
printf '%s' "$head" > /tmp/seen-head
printf 'HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n'
"#;

/// Issue 33, defect 4: a public port's guest gets the client's request with the guest's
/// own credentials, but none of the API token's forms: not a second Authorization
/// header, not the `zygote.bearer.` WebSocket subprotocol.
async fn our_token_stays_out_of_the_guest(c: &Client, token: &str, id: &str, proxy: &str) {
    let setup = format!(
        "cat > /record-head <<'EOF'\n{RECORD_HEAD}EOF\n\
         chmod +x /record-head && (nc -ll -p 8081 -e /record-head &) ; sleep 0.3"
    );
    sh(c, id, &setup).await.unwrap();
    expose(c, id, json!({"port": 8081, "public": true}))
        .await
        .unwrap();
    let headers = format!(
        "X-Probe: 1\r\nAuthorization: Bearer the-guests-own\r\n\
         Authorization: Bearer {token}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Protocol: chat, zygote.bearer.{token}\r\n"
    );
    let answer = http_request(proxy, &format!("8081-{id}.localhost"), "/", &headers);
    assert_eq!(status_of(&answer), 200, "{answer}");
    let seen = sh(c, id, "cat /tmp/seen-head").await.unwrap();
    let lower = seen.to_ascii_lowercase();
    assert!(
        !seen.contains(token) && !lower.contains("zygote.bearer"),
        "the guest got the API token: {seen}"
    );
    for kept in [
        "x-probe: 1\n",
        "authorization: bearer the-guests-own\n",
        "sec-websocket-protocol: chat\n",
    ] {
        assert!(
            lower.contains(kept),
            "{kept:?} did not reach the guest: {seen}"
        );
    }
}
