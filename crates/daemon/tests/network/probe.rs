//! What the networking suites share: whether this machine can run them, and whether a
//! guest reaches given addresses (servers of the test's own only).
use std::net::Ipv4Addr;
use std::process::Command;

use zygote_daemon::client::Client;

use crate::common::sh;

/// Why this machine cannot run the suite, if it cannot.
pub fn unavailable() -> Option<String> {
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, nftables)".into());
    }
    for tool in ["ip", "nft"] {
        if Command::new(tool).arg("-V").output().is_err() {
            return Some(format!("`{tool}` is not installed (scripts/setup.sh)"));
        }
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun is missing".into());
    }
    None
}

/// For each `addr:port`, whether the guest got the server's answer: one exec, the
/// probes at once, each bounded by nc's 2 s connect timeout.
pub async fn reach(c: &Client, id: &str, targets: &[(Ipv4Addr, u16)]) -> Vec<bool> {
    let mut script: String = targets
        .iter()
        .enumerate()
        .map(|(i, (a, p))| {
            format!(
                "(if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {a} {p} 2>/dev/null \
                 | grep -q 'remote-\\|host-\\|HTTP/1'; then echo open; else echo closed; fi) \
                 > /tmp/reach.{i} &\n"
            )
        })
        .collect();
    script.push_str("wait\n");
    for i in 0..targets.len() {
        script.push_str(&format!("cat /tmp/reach.{i}\n"));
    }
    let out = sh(c, id, &script).await.unwrap();
    let got: Vec<bool> = out.lines().map(|l| l == "open").collect();
    assert_eq!(got.len(), targets.len(), "{out}");
    got
}
