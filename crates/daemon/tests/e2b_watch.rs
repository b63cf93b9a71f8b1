//! E2B's directory watching over raw HTTP (issue 35): envd's WatchDir stream and its
//! CreateWatcher / GetWatcherEvents / RemoveWatcher, with envd's exact answers to a
//! missing path, a file, a malformed request, an unknown or another sandbox's watcher
//! id, and zygote's per-sandbox watcher cap (resource_exhausted). The unchanged SDK is
//! exercised by sdk/e2b-compat/test_e2b_watch.py.
mod common;
// Shared with e2b_envd.rs, which uses all of it.
#[allow(dead_code)]
#[path = "e2b_envd/wire.rs"]
mod wire;

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::{qemu_guest_ready, start_daemon, step, Scratch};
use wire::{envelope, hostport, http, proxy_addr, Answer};

/// zygote's cap on CreateWatcher watchers per sandbox (e2b/envd/watch.rs).
const MAX_WATCHERS_PER_SANDBOX: usize = 16;

struct Envd {
    proxy: String,
    id: String,
    token: String,
}

impl Envd {
    fn call(&self, path: &str, ct: &str, body: &[u8], extra: &[(&str, &str)]) -> Answer {
        let mut h = vec![
            ("E2b-Sandbox-Id", self.id.as_str()),
            ("E2b-Sandbox-Port", "49983"),
            ("X-Access-Token", self.token.as_str()),
            ("Content-Type", ct),
            ("Connect-Protocol-Version", "1"),
        ];
        h.extend_from_slice(extra);
        http(&self.proxy, "POST", path, &h, body)
    }

    fn unary(&self, procedure: &str, body: &Value) -> Answer {
        let path = format!("/filesystem.Filesystem/{procedure}");
        self.call(&path, "application/json", body.to_string().as_bytes(), &[])
    }

    fn sh(&self, script: &str) {
        let req = json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}, "stdin": false});
        let a = self.call(
            "/process.Process/Start",
            "application/connect+json",
            &envelope(&req),
            &[],
        );
        let envs = a.envelopes();
        let end = &envs[envs.len() - 2].1["event"]["end"];
        assert_eq!(end["exitCode"], 0, "{script}: {envs:?}");
    }
}

fn error(a: &Answer) -> (u16, String, String) {
    let v = a.json();
    let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    (a.status, s("code"), s("message"))
}

#[test]
fn e2b_watchers_stream_poll_and_refuse_bad_input_as_envd() {
    if !qemu_guest_ready("e2b_watchers_stream_poll_and_refuse_bad_input_as_envd") {
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
        Envd {
            proxy: proxy.clone(),
            id: v["sandboxID"].as_str().unwrap().into(),
            token: v["envdAccessToken"].as_str().unwrap().into(),
        }
    };
    let (a, b) = (create(), create());
    a.sh("mkdir -p /w && echo x > /w/file");
    step(t0, &format!("sandboxes {} and {}", a.id, b.id));

    // A watcher polled: relative names, taken once.
    let w = a.unary("CreateWatcher", &json!({"path": "/w", "recursive": true}));
    assert_eq!(w.status, 200, "{}", w.text());
    let wid = w.json()["watcherId"].as_str().unwrap().to_string();
    assert!(wid.starts_with('w'), "{wid}");
    a.sh("mkdir /w/d && echo 1 > /w/d/f");
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !seen.contains(&json!({"name": "d/f", "type": "EVENT_TYPE_WRITE"})) {
        assert!(Instant::now() < deadline, "no d/f write in {seen:?}");
        let got = a.unary("GetWatcherEvents", &json!({"watcherId": wid}));
        assert_eq!(got.status, 200, "{}", got.text());
        seen.extend(got.json()["events"].as_array().unwrap().iter().cloned());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(seen[0], json!({"name": "d", "type": "EVENT_TYPE_CREATE"}));
    let f_created = json!({"name": "d/f", "type": "EVENT_TYPE_CREATE"});
    assert_eq!(
        seen.iter().filter(|e| **e == f_created).count(),
        1,
        "{seen:?}"
    );
    let again = a.unary("GetWatcherEvents", &json!({"watcherId": wid}));
    assert_eq!(again.json(), json!({"events": []}));
    // Another sandbox cannot reach it, even with the right id.
    let other = b.unary("GetWatcherEvents", &json!({"watcherId": wid}));
    let gone = format!("watcher with id {wid} not found");
    assert_eq!(error(&other), (404, "not_found".into(), gone.clone()));
    assert_eq!(
        b.unary("RemoveWatcher", &json!({"watcherId": wid})).status,
        404
    );
    let removed = a.unary("RemoveWatcher", &json!({"watcherId": wid}));
    assert_eq!((removed.status, removed.json()), (200, json!({})));
    let after = a.unary("GetWatcherEvents", &json!({"watcherId": wid}));
    assert_eq!(error(&after), (404, "not_found".into(), gone));
    step(
        t0,
        "CreateWatcher, GetWatcherEvents, RemoveWatcher; B cannot see A's",
    );

    // Bad input, in envd's words.
    let missing = a.unary("CreateWatcher", &json!({"path": "/no/such"}));
    let msg = "path /no/such not found: stat /no/such: no such file or directory";
    assert_eq!(error(&missing), (404, "not_found".into(), msg.into()));
    let file = a.unary("CreateWatcher", &json!({"path": "/w/file"}));
    let msg = "path /w/file not a directory: %!w(<nil>)";
    assert_eq!(error(&file), (400, "invalid_argument".into(), msg.into()));
    let relative = a.unary("CreateWatcher", &json!({"path": "w"}));
    assert_eq!(error(&relative).1, "invalid_argument");
    let torn = a.call(
        "/filesystem.Filesystem/CreateWatcher",
        "application/json",
        b"{",
        &[],
    );
    assert_eq!(error(&torn).1, "invalid_argument");
    let unknown = a.unary("GetWatcherEvents", &json!({"watcherId": "wnope"}));
    let msg = "watcher with id wnope not found";
    assert_eq!(error(&unknown), (404, "not_found".into(), msg.into()));
    // The other form of a procedure: 415, as connect-go.
    let stream_form = a.call(
        "/filesystem.Filesystem/CreateWatcher",
        "application/connect+json",
        &envelope(&json!({"path": "/w"})),
        &[],
    );
    assert_eq!(stream_form.status, 415);
    step(
        t0,
        "missing path, file, relative, torn body, unknown id, wrong form",
    );

    // The per-sandbox cap: resource_exhausted, and room again after a RemoveWatcher.
    let ids: Vec<String> = (0..MAX_WATCHERS_PER_SANDBOX)
        .map(|_| {
            let w = a.unary("CreateWatcher", &json!({"path": "/w"}));
            assert_eq!(w.status, 200, "{}", w.text());
            w.json()["watcherId"].as_str().unwrap().to_string()
        })
        .collect();
    let over = a.unary("CreateWatcher", &json!({"path": "/w"}));
    let (status, code, message) = error(&over);
    assert_eq!(
        (status, code.as_str()),
        (429, "resource_exhausted"),
        "{message}"
    );
    assert!(message.contains("16 watchers"), "{message}");
    // B has its own allowance.
    assert_eq!(b.unary("CreateWatcher", &json!({"path": "/"})).status, 200);
    assert_eq!(
        a.unary("RemoveWatcher", &json!({"watcherId": ids[0]}))
            .status,
        200
    );
    assert_eq!(a.unary("CreateWatcher", &json!({"path": "/w"})).status, 200);
    step(t0, "16 watchers per sandbox, then resource_exhausted");

    // WatchDir: start, the change, then the stream's timeout (deadline_exceeded).
    let writer = {
        let (proxy, id, token) = (a.proxy.clone(), a.id.clone(), a.token.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1500));
            Envd { proxy, id, token }.sh("echo 2 > /w/streamed");
        })
    };
    let s = a.call(
        "/filesystem.Filesystem/WatchDir",
        "application/connect+json",
        &envelope(&json!({"path": "/w", "recursive": false})),
        &[
            ("Connect-Timeout-Ms", "4000"),
            ("Keepalive-Ping-Interval", "1"),
        ],
    );
    writer.join().unwrap();
    assert_eq!(s.status, 200, "{}", s.text());
    let envs = s.envelopes();
    assert_eq!(envs[0], (0, json!({"start": {}})), "{envs:?}");
    let streamed = json!({"filesystem": {"name": "streamed", "type": "EVENT_TYPE_CREATE"}});
    assert!(envs.iter().any(|(_, m)| *m == streamed), "{envs:?}");
    assert!(
        envs.iter().any(|(_, m)| *m == json!({"keepalive": {}})),
        "{envs:?}"
    );
    let (flags, last) = &envs[envs.len() - 1];
    assert_eq!(*flags, 2, "{envs:?}");
    assert_eq!(last["error"]["code"], "deadline_exceeded", "{envs:?}");
    // A missing path ends the stream at once with not_found.
    let s = a.call(
        "/filesystem.Filesystem/WatchDir",
        "application/connect+json",
        &envelope(&json!({"path": "/no/such"})),
        &[],
    );
    let envs = s.envelopes();
    assert_eq!(envs.len(), 1, "{envs:?}");
    assert_eq!(envs[0].1["error"]["code"], "not_found", "{envs:?}");
    step(
        t0,
        "WatchDir: start, filesystem event, keepalive, deadline; not_found",
    );
}
