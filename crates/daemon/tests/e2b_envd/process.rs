//! envd's process procedures beyond Start (issue 35, slice 2): List, Connect,
//! SendInput, SendSignal and CloseStdin by pid, and their answers to unknown or ended
//! pids and to malformed requests.
use std::time::Instant;

use serde_json::{json, Value};

use crate::common::{qemu_guest_ready, start_daemon, step, Scratch};
use crate::wire::{envelope, hostport, http, proxy_addr};

#[test]
fn e2b_envd_process_procedures_find_pids_and_refuse_bad_input() {
    if !qemu_guest_ready("e2b_envd_process_procedures_find_pids_and_refuse_bad_input") {
        return;
    }
    let t0 = Instant::now();
    let scratch = Scratch::new();
    let d = start_daemon(
        &scratch.state,
        &["--listen", "127.0.0.1:0", "--runtime", "qemu"],
    );
    let (api, proxy, token) = (hostport(&d.url), proxy_addr(&d), d.token());
    let body = br#"{"templateID": "minimal", "timeout": 600}"#;
    let a = http(
        &api,
        "POST",
        "/e2b/v2/sandboxes",
        &[("X-API-Key", &token)],
        body,
    );
    assert_eq!(a.status, 201, "{}", a.text());
    let v = a.json();
    let (id, tok) = (
        v["sandboxID"].as_str().unwrap(),
        v["envdAccessToken"].as_str().unwrap(),
    );
    let call = |method: &str, ct: &str, extra: &[(&str, &str)], body: &[u8]| {
        let mut h = vec![
            ("E2b-Sandbox-Id", id),
            ("E2b-Sandbox-Port", "49983"),
            ("X-Access-Token", tok),
            ("Content-Type", ct),
            ("Connect-Protocol-Version", "1"),
        ];
        h.extend_from_slice(extra);
        http(
            &proxy,
            "POST",
            &format!("/process.Process/{method}"),
            &h,
            body,
        )
    };
    let unary = |method: &str, body: Value| {
        call(
            method,
            "application/json",
            &[],
            &serde_json::to_vec(&body).unwrap(),
        )
    };
    let not_found = |pid: u64| json!({"code": "not_found", "message": format!("process with pid {pid} not found")});

    // A program that ended: its pid is gone for signals, input and stdin.
    let req = json!({"process": {"cmd": "/bin/sh", "args": ["-c", "true"]}});
    let a = call("Start", "application/connect+json", &[], &envelope(&req));
    let ended = a.envelopes()[0].1["event"]["start"]["pid"]
        .as_u64()
        .unwrap();
    // A running one (started through the native API): listed, fed, followed.
    let bearer = format!("Bearer {token}");
    let native = json!({"argv": ["/bin/sh", "-c", "read x; echo got:$x"], "background": true});
    let a = http(
        &api,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        &[
            ("Authorization", &bearer),
            ("Content-Type", "application/json"),
        ],
        &serde_json::to_vec(&native).unwrap(),
    );
    assert!(a.status < 300, "{}", a.text());
    let live = a.json()["pid"].as_u64().unwrap();
    let a = unary("List", json!({}));
    assert_eq!(
        (a.status, a.content_type().as_str()),
        (200, "application/json")
    );
    let listed = a.json()["processes"].as_array().unwrap().clone();
    let mine: Vec<&Value> = listed.iter().filter(|p| p["pid"] == live).collect();
    assert_eq!(mine.len(), 1, "{listed:?}");
    assert_eq!(mine[0]["config"]["cmd"], "/bin/sh");
    assert!(
        !listed.iter().any(|p| p["pid"] == ended),
        "ended ones are not listed"
    );
    step(t0, "List shows the running process only");

    for (method, body) in [
        (
            "SendSignal",
            json!({"process": {"pid": ended}, "signal": "SIGNAL_SIGKILL"}),
        ),
        (
            "SendSignal",
            json!({"process": {"pid": 999_999}, "signal": "SIGNAL_SIGTERM"}),
        ),
        (
            "SendInput",
            json!({"process": {"pid": 999_999}, "input": {"stdin": "eA=="}}),
        ),
        ("CloseStdin", json!({"process": {"pid": 999_999}})),
    ] {
        let pid = body["process"]["pid"].as_u64().unwrap();
        let a = unary(method, body);
        assert_eq!((a.status, a.json()), (404, not_found(pid)), "{method}");
    }
    let a = call(
        "Connect",
        "application/connect+json",
        &[],
        &envelope(&json!({"process": {"pid": 999_999}})),
    );
    assert_eq!(a.status, 200);
    assert_eq!(a.envelopes(), [(2, json!({"error": not_found(999_999)}))]);
    step(t0, "unknown and ended pids are not_found");

    // Malformed requests: invalid_argument (400, or in the end-stream), a signal envd
    // has no name for: unimplemented; the other form of a procedure: 415.
    for (method, body) in [
        ("SendSignal", &b"{\"process\":"[..]),
        (
            "SendInput",
            br#"{"process": {"pid": "x"}, "input": {"stdin": "eA=="}}"#,
        ),
        ("SendInput", br#"{"process": {"pid": 1}, "input": {}}"#),
        ("CloseStdin", br#"{"process": {}}"#),
        ("List", b"[]"),
    ] {
        let a = call(method, "application/json", &[], body);
        assert_eq!(
            (a.status, a.json()["code"].clone()),
            (400, json!("invalid_argument")),
            "{method} {}",
            a.text()
        );
    }
    let a = unary(
        "SendSignal",
        json!({"process": {"pid": live}, "signal": "SIGNAL_SIGINT"}),
    );
    assert_eq!(
        (a.status, a.json()["code"].clone()),
        (501, json!("unimplemented"))
    );
    let a = call(
        "List",
        "application/connect+json",
        &[],
        &envelope(&json!({})),
    );
    assert_eq!(a.status, 415, "a unary procedure in the stream form");
    let body = br#"{"process": {"pid": 1}}"#;
    let a = call("Connect", "application/json", &[], body);
    assert_eq!(a.status, 415, "a stream procedure in the unary form");
    let a = call(
        "Connect",
        "application/connect+json",
        &[],
        &envelope(&json!({"process": {"pid": -3}}))[..],
    );
    assert_eq!(a.envelopes()[0].1["error"]["code"], "invalid_argument");
    let a = call(
        "Connect",
        "application/connect+json",
        &[],
        &envelope(&json!({}))[..7],
    );
    assert_eq!(a.envelopes()[0].1["error"]["code"], "invalid_argument");
    step(t0, "malformed requests refused");

    // Connect to the live one with a 2 s timeout: start, then the deadline ends the
    // stream and the process runs on; input then reaches it and it ends normally.
    let connect = envelope(&json!({"process": {"pid": live}}));
    let a = call(
        "Connect",
        "application/connect+json",
        &[("Connect-Timeout-Ms", "2000")],
        &connect,
    );
    let envs = a.envelopes();
    assert_eq!(envs[0].1["event"]["start"]["pid"], live, "{envs:?}");
    assert_eq!(
        envs[envs.len() - 1].1["error"]["code"],
        "deadline_exceeded",
        "{envs:?}"
    );
    let a = unary(
        "SendInput",
        json!({"process": {"pid": live}, "input": {"stdin": "Z28K"}}),
    );
    assert_eq!((a.status, a.json()), (200, json!({})), "go\\n to its stdin");
    let a = call("Connect", "application/connect+json", &[], &connect);
    let envs = a.envelopes();
    let end = envs
        .iter()
        .find_map(|(_, m)| m["event"].get("end").cloned());
    assert_eq!(
        end.map(|e| e["exitCode"].clone()),
        Some(json!(0)),
        "{envs:?}"
    );
    let a = unary(
        "SendSignal",
        json!({"process": {"pid": live}, "signal": "SIGNAL_SIGKILL"}),
    );
    assert_eq!((a.status, a.json()), (404, not_found(live)), "it ended");
    step(
        t0,
        "Connect follows a live process; its deadline leaves it running",
    );
}
