//! The pty route's HTTP side without booting a VM: how the token may be given
//! (header, or the `zygote.bearer.<token>` WebSocket subprotocol browsers can
//! set), and the 4xx answers before any upgrade.
mod common;

use std::io::{Read, Write};

use serde_json::Value;

use common::{start_daemon, Daemon};

fn daemon(tmp: &tempfile::TempDir) -> Daemon {
    // A cgroup root without controllers: nothing here starts a VM.
    let cg = tmp.path().join("cg");
    std::fs::create_dir_all(&cg).unwrap();
    std::fs::write(cg.join("cgroup.controllers"), "").unwrap();
    let cg = cg.display().to_string();
    let args = ["--listen", "127.0.0.1:0", "--cgroup-root", &cg];
    start_daemon(&tmp.path().join("state"), &args)
}

/// A GET of `path` with `headers` (each ending in CRLF): status and error code.
fn get(d: &Daemon, path: &str, headers: &str) -> (u16, String) {
    let addr = d.url.strip_prefix("http://").unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    // Closed after the answer, so it can be read to the end (an upgrade request asks
    // for both: only an error answer is expected).
    let connection = match headers.contains("Upgrade: websocket") {
        true => "Connection: Upgrade, close\r\n",
        false => "Connection: close\r\n",
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{connection}{headers}\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp.split(' ').nth(1).and_then(|c| c.parse().ok());
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {resp:?}"));
    let code = v["error"]["code"].as_str().unwrap_or_default().to_string();
    (status.unwrap_or_else(|| panic!("{resp:?}")), code)
}

const UPGRADE: &str = "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
                       Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

#[test]
fn the_token_as_a_subprotocol_and_errors_before_the_upgrade() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon(&tmp);
    let token = d.token();
    let path = "/v1/sandboxes/nope/pty?cols=80&rows=24";
    let offer = |t: &str| format!("Sec-WebSocket-Protocol: zygote.pty.v1, zygote.bearer.{t}\r\n");

    // Authenticated by the subprotocol: the unknown sandbox is the answer.
    assert_eq!(
        get(&d, path, &format!("{UPGRADE}{}", offer(&token))),
        (404, "not_found".into())
    );
    assert_eq!(
        get(&d, path, &format!("{UPGRADE}{}", offer("wrong"))),
        (401, "unauthorized".into())
    );
    assert_eq!(get(&d, path, UPGRADE), (401, "unauthorized".into()));
    // Only on WebSocket upgrades: elsewhere the subprotocol header means nothing.
    assert_eq!(
        get(&d, "/v1/info", &offer(&token)),
        (401, "unauthorized".into())
    );
    // ...and only on the pty route, the one a browser opens as a WebSocket: a
    // WebSocket-shaped request anywhere else still needs Authorization.
    for other in [
        "/v1/info",
        "/v1/sandboxes",
        "/v1/sandboxes/nope",
        "/v1/sandboxes/nope/files?path=/etc/hostname",
        "/v1/sandboxes/nope/pty/extra",
        "/metrics",
    ] {
        assert_eq!(
            get(&d, other, &format!("{UPGRADE}{}", offer(&token))),
            (401, "unauthorized".into()),
            "{other}"
        );
    }

    let auth = format!("Authorization: Bearer {token}\r\n");
    assert_eq!(
        get(&d, path, &format!("{UPGRADE}{auth}")),
        (404, "not_found".into())
    );
    // Not an upgrade, bad or missing sizes, unknown parameters: 400.
    for (p, headers) in [
        (path, auth.clone()),
        (
            "/v1/sandboxes/nope/pty?cols=0&rows=24",
            format!("{UPGRADE}{auth}"),
        ),
        (
            "/v1/sandboxes/nope/pty?cols=80&rows=1001",
            format!("{UPGRADE}{auth}"),
        ),
        ("/v1/sandboxes/nope/pty?cols=80", format!("{UPGRADE}{auth}")),
        (
            "/v1/sandboxes/nope/pty?cols=80&rows=24&x=1",
            format!("{UPGRADE}{auth}"),
        ),
        (
            "/v1/sandboxes/nope/pty?cols=80&rows=24&cwd=rel",
            format!("{UPGRADE}{auth}"),
        ),
    ] {
        assert_eq!(
            get(&d, p, &headers),
            (400, "invalid_argument".into()),
            "{p}"
        );
    }
}
