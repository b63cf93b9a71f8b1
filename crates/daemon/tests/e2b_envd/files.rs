//! envd's `/files` beyond slice 1 (issue 35): signed URLs (the sandbox found from the
//! signature alone, never another's; expired, forged or misused ones 401), streamed
//! octet-stream uploads with gzip (a broken body leaves nothing behind) and gzip
//! downloads.
use std::io::Read;
use std::time::Instant;

use base64::Engine as _;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::common::{qemu_guest_ready, start_daemon, step, Scratch};
use crate::wire::{envelope, hostport, http, proxy_addr, Answer};

/// The SDK's `get_signature` (e2b/sandbox/signature.py).
fn sign(path: &str, op: &str, user: &str, token: &str, expiration: Option<u64>) -> String {
    let raw = match expiration {
        None => format!("{path}:{op}:{user}:{token}"),
        Some(e) => format!("{path}:{op}:{user}:{token}:{e}"),
    };
    let b64 = base64::engine::general_purpose::STANDARD_NO_PAD;
    let sig = format!("v1_{}", b64.encode(Sha256::digest(raw.as_bytes())));
    sig.replace('+', "%2B").replace('/', "%2F")
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[test]
fn e2b_envd_signed_urls_open_one_sandbox_and_uploads_stream() {
    if !qemu_guest_ready("e2b_envd_signed_urls_open_one_sandbox_and_uploads_stream") {
        return;
    }
    let t0 = Instant::now();
    let scratch = Scratch::new();
    let d = start_daemon(
        &scratch.state,
        &["--listen", "127.0.0.1:0", "--runtime", "qemu"],
    );
    let (api, proxy, token) = (hostport(&d.url), proxy_addr(&d), d.token());
    let create = || {
        let body = br#"{"templateID": "minimal", "timeout": 600, "envVars": {"E2B_FS": "1"}}"#;
        let a = http(
            &api,
            "POST",
            "/e2b/v2/sandboxes",
            &[("X-API-Key", &token)],
            body,
        );
        assert_eq!(a.status, 201, "{}", a.text());
        let v = a.json();
        (
            v["sandboxID"].as_str().unwrap().to_string(),
            v["envdAccessToken"].as_str().unwrap().to_string(),
        )
    };
    let ((a_id, a_tok), (b_id, b_tok)) = (create(), create());
    let routed = |id: &str,
                  tok: Option<&str>,
                  method: &str,
                  query: &str,
                  extra: &[(&str, &str)],
                  body: &[u8]| {
        let mut h = vec![("E2b-Sandbox-Id", id), ("E2b-Sandbox-Port", "49983")];
        if let Some(t) = tok {
            h.push(("X-Access-Token", t));
        }
        h.extend_from_slice(extra);
        http(&proxy, method, &format!("/files?{query}"), &h, body)
    };
    let octets = [("Content-Type", "application/octet-stream")];
    for (id, tok, text) in [(&a_id, &a_tok, "in A"), (&b_id, &b_tok, "in B")] {
        let a = routed(
            id,
            Some(tok),
            "POST",
            "path=/tmp/s.txt",
            &octets,
            text.as_bytes(),
        );
        assert_eq!(a.status, 200, "{}", a.text());
        assert_eq!(
            a.json(),
            json!([{"path": "/tmp/s.txt", "name": "s.txt", "type": "file"}])
        );
    }
    let env = |id: &str, tok: &str| {
        let h = [
            ("E2b-Sandbox-Id", id),
            ("E2b-Sandbox-Port", "49983"),
            ("X-Access-Token", tok),
        ];
        http(&proxy, "GET", "/envs", &h, b"")
    };
    let a = env(&a_id, &a_tok);
    assert_eq!(
        (a.status, a.json()["E2B_FS"].clone()),
        (200, json!("1")),
        "{}",
        a.text()
    );
    assert_eq!(
        env(&b_id, &a_tok).status,
        401,
        "A's token reads nothing of B's"
    );
    step(t0, "two sandboxes with /tmp/s.txt; /envs");

    // Without routing headers: the signature alone names the sandbox, each its own.
    let unrouted = |method: &str, query: &str, body: &[u8]| {
        http(&proxy, method, &format!("/files?{query}"), &[], body)
    };
    let text = |a: &Answer| (a.status, a.text());
    for (tok, want) in [(&a_tok, "in A"), (&b_tok, "in B")] {
        let q = format!(
            "path=/tmp/s.txt&signature={}",
            sign("/tmp/s.txt", "read", "", tok, None)
        );
        assert_eq!(text(&unrouted("GET", &q, b"")), (200, want.into()));
    }
    let a_read = format!(
        "path=/tmp/s.txt&signature={}",
        sign("/tmp/s.txt", "read", "", &a_tok, None)
    );
    // A's signature with B's routing headers and no token: refused, B not read.
    let a = routed(&b_id, None, "GET", &a_read, &[], b"");
    assert_eq!(
        (a.status, a.json()["message"].clone()),
        (401, json!("invalid signature"))
    );
    // A read signature does not write; a forged, altered or expired one opens nothing.
    let a = unrouted("POST", &a_read, b"overwritten");
    assert_eq!(a.status, 401, "{}", a.text());
    let forged = format!("path=/tmp/s.txt&signature=v1_{}", "A".repeat(43));
    let other_path = a_read.replace("path=/tmp/s.txt", "path=/etc/passwd");
    let other_user = format!("{a_read}&username=root");
    let past = now() - 10;
    let expired = format!(
        "path=/tmp/s.txt&signature={}&signature_expiration={past}",
        sign("/tmp/s.txt", "read", "", &a_tok, Some(past))
    );
    let moved = expired.replace(&format!("={past}"), &format!("={}", now() + 600));
    for (q, message) in [
        (&forged, "invalid signature"),
        (&other_path, "invalid signature"),
        (&other_user, "invalid signature"),
        (&moved, "invalid signature"),
        (&expired, "signature is already expired"),
    ] {
        let a = unrouted("GET", q, b"");
        assert_eq!(
            (a.status, a.json()),
            (401, json!({"code": 401, "message": message})),
            "{q}"
        );
    }
    // Routed, no token, no signature: envd's 401; unrouted without one is not envd's.
    let a = routed(&a_id, None, "GET", "path=/tmp/s.txt", &[], b"");
    assert_eq!(a.status, 401);
    let a = unrouted("GET", "path=/tmp/s.txt", b"");
    assert_ne!(a.status, 200, "{}", a.text());
    // A timed write signature: a signed upload as a user, owned by them.
    let later = now() + 600;
    let up = format!(
        "path=up.txt&username=root&signature={}&signature_expiration={later}",
        sign("up.txt", "write", "root", &a_tok, Some(later))
    );
    let a = unrouted("POST", &up, b"signed upload");
    assert_eq!(a.status, 400, "a body without its type: {}", a.text());
    let a = http(
        &proxy,
        "POST",
        &format!("/files?{up}"),
        &octets,
        b"signed upload",
    );
    assert_eq!(a.json()[0]["path"], "/root/up.txt", "{}", a.text());
    step(t0, "signed URLs");

    // gzip both ways; a broken gzip body is 400 and leaves no staging file.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut gz, &vec![b'z'; 5 << 20]).unwrap();
    let gz = gz.finish().unwrap();
    let enc = [
        ("Content-Type", "application/octet-stream"),
        ("Content-Encoding", "gzip"),
    ];
    let a = routed(&a_id, Some(&a_tok), "POST", "path=/tmp/gz/z", &enc, &gz);
    assert_eq!(a.status, 200, "{}", a.text());
    let a = routed(
        &a_id,
        Some(&a_tok),
        "GET",
        "path=/tmp/gz/z",
        &[("Accept-Encoding", "gzip")],
        b"",
    );
    assert_eq!(a.status, 200);
    assert!(
        a.head
            .to_ascii_lowercase()
            .contains("content-encoding: gzip"),
        "{}",
        a.head
    );
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&a.body[..])
        .read_to_end(&mut plain)
        .unwrap();
    assert!(plain.len() == 5 << 20 && plain.iter().all(|&b| b == b'z'));
    let mut torn = gz.clone();
    torn.truncate(gz.len() / 2);
    let bad = routed(
        &a_id,
        Some(&a_tok),
        "POST",
        "path=/tmp/gz/torn",
        &enc,
        &torn,
    );
    assert_eq!(bad.status, 400, "{}", bad.text());
    let br = [
        ("Content-Type", "application/octet-stream"),
        ("Content-Encoding", "br"),
    ];
    assert_eq!(
        routed(&a_id, Some(&a_tok), "POST", "path=/tmp/gz/br", &br, b"x").status,
        400
    );
    let h = [
        ("E2b-Sandbox-Id", a_id.as_str()),
        ("E2b-Sandbox-Port", "49983"),
        ("X-Access-Token", a_tok.as_str()),
        ("Content-Type", "application/connect+json"),
    ];
    // A full guest disk is envd's 507 (the SDK's NotEnoughSpaceException).
    let req = json!({"process": {"cmd": "/bin/sh", "args": ["-c",
        "mkdir -p /tmp/gz/small && mount -t tmpfs -o size=64k tmpfs /tmp/gz/small"]}});
    assert_eq!(
        http(
            &proxy,
            "POST",
            "/process.Process/Start",
            &h,
            &envelope(&req)
        )
        .status,
        200
    );
    let full = routed(
        &a_id,
        Some(&a_tok),
        "POST",
        "path=/tmp/gz/small/f",
        &octets,
        &[1; 1 << 20],
    );
    assert_eq!(
        (full.status, full.json()),
        (
            507,
            json!({"code": 507, "message": "not enough disk space available"})
        )
    );
    let req = json!({"process": {"cmd": "/bin/sh", "args": ["-c",
        "ls -A /tmp/gz/small; umount /tmp/gz/small && rmdir /tmp/gz/small && ls -A /tmp/gz"]}});
    let ls = http(
        &proxy,
        "POST",
        "/process.Process/Start",
        &h,
        &envelope(&req),
    );
    let out: Vec<String> = ls
        .envelopes()
        .iter()
        .filter_map(|(_, m)| m["event"]["data"]["stdout"].as_str().map(String::from))
        .collect();
    let b64 = base64::engine::general_purpose::STANDARD;
    assert_eq!(
        out,
        [b64.encode("z\n")],
        "only the whole file, no staging left (also not in the full one)"
    );
    step(t0, "gzip uploads and downloads");
}
