//! E2B compatibility (issue 35, slices 1-2) over raw HTTP: the control plane under `/e2b`
//! on the API listener and envd on the port proxy, answering bad input (wrong or
//! missing key and token, another sandbox's id, unknown procedures, truncated
//! envelopes) in E2B's shapes while the daemon keeps serving. The unchanged Python SDK
//! is exercised by scripts/e2b-test.sh.
mod common;
#[path = "e2b_envd/files.rs"]
mod files;
#[path = "e2b_envd/filesystem.rs"]
mod filesystem;
#[path = "e2b_envd/process.rs"]
mod process;
#[path = "e2b_envd/pty.rs"]
mod pty;
#[path = "e2b_envd/wire.rs"]
mod wire;

use std::time::Instant;

use serde_json::{json, Value};

use common::{qemu_guest_ready, start_daemon, step, Scratch};
use wire::{daemon_without_vms, envelope, hostport, http, proxy_addr};

const INVALID_KEY: &str =
    "Invalid API key, please visit https://e2b.dev/docs/api-key for more information.";
const ENVD_UNAUTHORIZED: &str =
    "unauthorized access, please provide a valid access token or method signing if supported";

#[test]
fn e2b_credentials_and_routing_errors_need_no_vm() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon_without_vms(tmp.path());
    let (api, proxy, token) = (hostport(&d.url), proxy_addr(&d), d.token());
    let bearer = format!("Bearer {token}");

    // Control plane: no key, a wrong key, and the daemon's own Bearer form are refused
    // with E2B's body (the SDK needs both fields).
    for headers in [
        vec![],
        vec![("X-API-Key", "wrong")],
        vec![("Authorization", bearer.as_str())],
    ] {
        let a = http(&api, "GET", "/e2b/sandboxes/sb-0123", &headers, b"");
        assert_eq!(a.status, 401, "{headers:?}: {}", a.text());
        assert_eq!(a.json(), json!({"code": 401, "message": INVALID_KEY}));
    }
    let key = [("X-API-Key", token.as_str())];
    let a = http(&api, "GET", "/e2b/sandboxes/sb-0123", &key, b"");
    assert_eq!((a.status, a.json()["code"].clone()), (404, json!(404)));
    assert_eq!(
        a.json()["message"],
        "Sandbox \"sb-0123\" doesn't exist or you don't have access to it"
    );
    let a = http(&api, "DELETE", "/e2b/sandboxes/sb-0123", &key, b"");
    assert_eq!(a.status, 404, "{}", a.text());
    let a = http(&api, "GET", "/e2b/no/such/route", &key, b"");
    assert_eq!((a.status, a.json()["code"].clone()), (404, json!(404)));
    let a = http(
        &api,
        "POST",
        "/e2b/v2/sandboxes",
        &key,
        b"{\"templateID\": ",
    );
    assert_eq!((a.status, a.json()["code"].clone()), (400, json!(400)));
    let body = br#"{"templateID": "minimal", "timeout": 0}"#;
    let a = http(&api, "POST", "/e2b/v2/sandboxes", &key, body);
    assert_eq!(a.status, 400);
    assert_eq!(a.json()["message"], "Timeout must be greater than 0");
    let body = br#"{"templateID": "no-such-template"}"#;
    let a = http(&api, "POST", "/e2b/v2/sandboxes", &key, body);
    assert_eq!(a.status, 404, "{}", a.text());
    assert_eq!(a.json()["message"], "template 'no-such-template' not found");

    // envd on the proxy: one routing header missing, another port, an unknown sandbox.
    let a = http(
        &proxy,
        "GET",
        "/health",
        &[("E2b-Sandbox-Id", "sb-0123")],
        b"",
    );
    assert_eq!(a.status, 400);
    assert_eq!(a.json()["message"], "Missing header: E2b-Sandbox-Port");
    let other = [("E2b-Sandbox-Id", "sb-0123"), ("E2b-Sandbox-Port", "8080")];
    assert_eq!(http(&proxy, "GET", "/", &other, b"").status, 400);
    let route = [("E2b-Sandbox-Id", "sb-0123"), ("E2b-Sandbox-Port", "49983")];
    let a = http(&proxy, "GET", "/health", &route, b"");
    assert_eq!(a.status, 502, "{}", a.text());
    assert_eq!(
        a.json(),
        json!({"code": 502, "message": "The sandbox was not found", "sandboxId": "sb-0123"})
    );

    // Both listeners still serve their own clients.
    let a = http(
        &api,
        "GET",
        "/v1/sandboxes",
        &[("Authorization", &bearer)],
        b"",
    );
    assert_eq!(a.status, 200);
    let a = http(&proxy, "GET", "/sandboxes/sb-0123/ports/80/", &[], b"");
    assert_eq!(
        a.status, 401,
        "the proxy's own rules apply without E2B's headers"
    );
}

#[test]
fn e2b_envd_runs_commands_moves_files_and_refuses_bad_input() {
    if !qemu_guest_ready("e2b_envd_runs_commands_moves_files_and_refuses_bad_input") {
        return;
    }
    let t0 = Instant::now();
    let scratch = Scratch::new();
    let d = start_daemon(
        &scratch.state,
        &["--listen", "127.0.0.1:0", "--runtime", "qemu"],
    );
    let (api, proxy, token) = (hostport(&d.url), proxy_addr(&d), d.token());
    let key = [("X-API-Key", token.as_str())];
    let create = || {
        let body = br#"{"templateID": "minimal", "timeout": 600, "metadata": {"suite": "e2b"}}"#;
        let a = http(&api, "POST", "/e2b/v2/sandboxes", &key, body);
        assert_eq!(a.status, 201, "{}", a.text());
        let v = a.json();
        assert_eq!(v["templateID"], "minimal");
        assert_eq!(v["envdVersion"], "0.6.4");
        let tok = v["envdAccessToken"].as_str().unwrap().to_string();
        assert_ne!(tok, token, "never the daemon token");
        (v["sandboxID"].as_str().unwrap().to_string(), tok)
    };
    let (a_id, a_tok) = create();
    let (b_id, b_tok) = create();
    step(
        t0,
        &format!("two sandboxes through POST /e2b/v2/sandboxes: {a_id}, {b_id}"),
    );

    let rpc = |id: &str, tok: &str, path: &str, ct: &str, body: &[u8]| {
        let h = [
            ("E2b-Sandbox-Id", id),
            ("E2b-Sandbox-Port", "49983"),
            ("X-Access-Token", tok),
            ("Content-Type", ct),
            ("Connect-Protocol-Version", "1"),
        ];
        http(&proxy, "POST", path, &h, body)
    };
    let start = |id: &str, tok: &str, script: &str| {
        let req = json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}, "stdin": false});
        rpc(
            id,
            tok,
            "/process.Process/Start",
            "application/connect+json",
            &envelope(&req),
        )
    };

    // A command: start, output, end (non-zero exit: exitCode and error), end-stream {}.
    let a = start(&a_id, &a_tok, "echo hi; echo oops >&2; exit 3");
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.content_type(), "application/connect+json");
    let envs = a.envelopes();
    assert!(
        envs[0].1["event"]["start"]["pid"].as_u64().unwrap() > 0,
        "{envs:?}"
    );
    let data: Vec<&Value> = envs
        .iter()
        .filter_map(|(_, m)| m["event"].get("data"))
        .collect();
    let stdout: Vec<&str> = data.iter().filter_map(|d| d["stdout"].as_str()).collect();
    let stderr: Vec<&str> = data.iter().filter_map(|d| d["stderr"].as_str()).collect();
    assert_eq!(stdout, ["aGkK"], "base64 of hi\\n: {envs:?}");
    assert_eq!(stderr, ["b29wcwo="], "base64 of oops\\n: {envs:?}");
    let (flags, last) = &envs[envs.len() - 1];
    assert_eq!((*flags, last), (2, &json!({})), "end-stream");
    let end = &envs[envs.len() - 2].1["event"]["end"];
    assert_eq!(
        end,
        &json!({"exitCode": 3, "exited": true, "status": "exit status 3", "error": "exit status 3"})
    );
    step(t0, "Start streamed start, data and end");

    // Wrong token, no token, and A's token with B's id: 401 with envd's message.
    for (id, tok) in [(&a_id, "wrong"), (&a_id, ""), (&b_id, a_tok.as_str())] {
        let a = start(id, tok, "touch /tmp/should-not-exist");
        assert_eq!(a.status, 401, "{id} {tok}: {}", a.text());
        assert_eq!(a.json(), json!({"code": 401, "message": ENVD_UNAUTHORIZED}));
    }
    // Unknown procedure: envd's mux answer; others' codecs: 415.
    let a = rpc(
        &a_id,
        &a_tok,
        "/process.Process/Nope",
        "application/json",
        b"{}",
    );
    assert_eq!((a.status, a.text().as_str()), (404, "404 page not found\n"));
    let a = rpc(
        &a_id,
        &a_tok,
        "/process.Process/Start",
        "application/connect+proto",
        b"",
    );
    assert_eq!(a.status, 415);
    // Truncated and compressed envelopes: 200 and an end-stream invalid_argument.
    let good = envelope(&json!({"process": {"cmd": "/bin/true"}}));
    let mut compressed = good.clone();
    compressed[0] = 1;
    for (body, message) in [
        (
            &good[..3],
            "protocol error: incomplete envelope".to_string(),
        ),
        (
            &good[..9],
            format!(
                "protocol error: promised {} bytes in enveloped message, got 4 bytes",
                good.len() - 5
            ),
        ),
        (
            &compressed[..],
            "protocol error: sent compressed message without compression support".into(),
        ),
    ] {
        let a = rpc(
            &a_id,
            &a_tok,
            "/process.Process/Start",
            "application/connect+json",
            body,
        );
        assert_eq!(a.status, 200, "{}", a.text());
        let envs = a.envelopes();
        assert_eq!(envs.len(), 1, "{envs:?}");
        assert_eq!(envs[0].0, 2);
        assert_eq!(
            envs[0].1,
            json!({"error": {"code": "invalid_argument", "message": message}})
        );
    }
    step(t0, "bad tokens, procedures and envelopes refused");

    // Files: a multipart upload, then read back; a missing one is envd's 404.
    let files = |method: &str, query: &str, headers: &[(&str, &str)], body: &[u8]| {
        let mut h = vec![
            ("E2b-Sandbox-Id", a_id.as_str()),
            ("E2b-Sandbox-Port", "49983"),
            ("X-Access-Token", a_tok.as_str()),
        ];
        h.extend_from_slice(headers);
        http(&proxy, method, &format!("/files?{query}"), &h, body)
    };
    let upload = b"--b0undary\r\nContent-Disposition: form-data; name=\"file\"; \
filename=\"/tmp/a.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nx\r\n--b0undary--\r\n";
    let multipart = [("Content-Type", "multipart/form-data; boundary=b0undary")];
    let a = files("POST", "path=/tmp/a.txt", &multipart, upload);
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(
        a.json(),
        json!([{"path": "/tmp/a.txt", "name": "a.txt", "type": "file"}])
    );
    let a = files("GET", "path=/tmp/a.txt", &[], b"");
    assert_eq!((a.status, a.text().as_str()), (200, "x"));
    let a = files("GET", "path=/tmp/nope", &[], b"");
    assert_eq!(a.status, 404);
    assert_eq!(
        a.json(),
        json!({"code": 404, "message": "path '/tmp/nope' does not exist"})
    );
    let a = files("POST", "path=/tmp/a.txt", &multipart, &upload[..40]);
    assert_eq!(a.status, 400, "a torn multipart body: {}", a.text());
    step(t0, "files written and read");

    // B is untouched by A's token, and both still serve.
    let a = start(
        &b_id,
        &b_tok,
        "ls /tmp/should-not-exist 2>/dev/null; echo b-ok",
    );
    let envs = a.envelopes();
    assert!(
        envs.iter()
            .any(|(_, m)| m["event"]["data"]["stdout"] == "Yi1vawo="),
        "B answers and never ran the refused command: {envs:?}"
    );
    let a = start(&a_id, &a_tok, "cat /tmp/a.txt");
    assert!(a
        .envelopes()
        .iter()
        .any(|(_, m)| m["event"]["data"]["stdout"] == "eA=="));
    let h = [
        ("E2b-Sandbox-Id", a_id.as_str()),
        ("E2b-Sandbox-Port", "49983"),
    ];
    assert_eq!(
        http(&proxy, "GET", "/health", &h, b"").status,
        204,
        "health needs no token"
    );

    // get_info, then kill: 204, again 404, and envd then answers "not found".
    let a = http(&api, "GET", &format!("/e2b/sandboxes/{a_id}"), &key, b"");
    assert_eq!(a.status, 200, "{}", a.text());
    let v = a.json();
    assert_eq!(
        (v["state"].as_str(), v["metadata"]["suite"].as_str()),
        (Some("running"), Some("e2b"))
    );
    assert_eq!(v["envdAccessToken"], a_tok.as_str());
    for id in [&a_id, &b_id] {
        let a = http(&api, "DELETE", &format!("/e2b/sandboxes/{id}"), &key, b"");
        assert_eq!(a.status, 204, "{}", a.text());
    }
    let a = http(&api, "DELETE", &format!("/e2b/sandboxes/{a_id}"), &key, b"");
    assert_eq!(a.status, 404);
    assert_eq!(http(&proxy, "GET", "/health", &h, b"").status, 502);
    step(t0, "killed");
}
