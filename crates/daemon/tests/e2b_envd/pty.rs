//! envd's terminals and tags (issue 35): Start with `pty`, SendInput `pty`, Update,
//! SendSignal and List, processes picked by tag, and the answers to bad input
//! (malformed sizes, input of the wrong kind, unknown tags, another sandbox's pids).
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

use crate::common::{qemu_guest_ready, start_daemon, step, Scratch};
use crate::wire::{envelope, hostport, http, proxy_addr, Answer};

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// What a sandbox's envd answers, by procedure.
struct Envd<'a> {
    proxy: &'a str,
    id: String,
    token: String,
}

impl Envd<'_> {
    fn call(&self, method: &str, ct: &str, extra: &[(&str, &str)], body: &[u8]) -> Answer {
        let mut h = vec![
            ("E2b-Sandbox-Id", self.id.as_str()),
            ("E2b-Sandbox-Port", "49983"),
            ("X-Access-Token", self.token.as_str()),
            ("Content-Type", ct),
            ("Connect-Protocol-Version", "1"),
        ];
        h.extend_from_slice(extra);
        let path = format!("/process.Process/{method}");
        http(self.proxy, "POST", &path, &h, body)
    }

    fn unary(&self, method: &str, body: Value) -> Answer {
        let body = serde_json::to_vec(&body).unwrap();
        self.call(method, "application/json", &[], &body)
    }

    fn stream(&self, method: &str, timeout_ms: &str, body: Value) -> Answer {
        let extra = [("Connect-Timeout-Ms", timeout_ms)];
        self.call(method, "application/connect+json", &extra, &envelope(&body))
    }

    /// The guest file at `path` (envd's `GET /files`), polled until it holds `want`.
    fn file_until(&self, path: &str, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let h = [
                ("E2b-Sandbox-Id", self.id.as_str()),
                ("E2b-Sandbox-Port", "49983"),
                ("X-Access-Token", self.token.as_str()),
            ];
            let a = http(self.proxy, "GET", &format!("/files?path={path}"), &h, b"");
            if a.status == 200 && a.text() == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{path}: {} {}",
                a.status,
                a.text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The running processes by pid, polled until `pred` holds of the list.
    fn list_until(&self, what: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let a = self.unary("List", json!({}));
            assert_eq!(a.status, 200, "{}", a.text());
            let list = a.json()["processes"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if pred(&list) {
                return list;
            }
            assert!(Instant::now() < deadline, "{what}: {list:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn create(api: &str, key: &str, proxy: &str) -> (String, String, String) {
    let body = br#"{"templateID": "minimal", "timeout": 600}"#;
    let a = http(
        api,
        "POST",
        "/e2b/v2/sandboxes",
        &[("X-API-Key", key)],
        body,
    );
    assert_eq!(a.status, 201, "{}", a.text());
    let v = a.json();
    let id = v["sandboxID"].as_str().unwrap().to_string();
    let tok = v["envdAccessToken"].as_str().unwrap().to_string();
    (id, tok, proxy.to_string())
}

fn tagged(list: &[Value], tag: &str) -> Option<Value> {
    list.iter().find(|p| p["tag"] == tag).cloned()
}

fn error(code: &str, message: String) -> Value {
    json!({"code": code, "message": message})
}

#[test]
fn e2b_envd_terminals_and_tags_refuse_bad_input() {
    if !qemu_guest_ready("e2b_envd_terminals_and_tags_refuse_bad_input") {
        return;
    }
    let t0 = Instant::now();
    let scratch = Scratch::new();
    let d = start_daemon(
        &scratch.state,
        &["--listen", "127.0.0.1:0", "--runtime", "qemu"],
    );
    let (api, proxy, key) = (hostport(&d.url), proxy_addr(&d), d.token());
    let (id, token, _) = create(&api, &key, &proxy);
    let a_envd = Envd {
        proxy: &proxy,
        id,
        token,
    };
    let (id, token, _) = create(&api, &key, &proxy);
    let b_envd = Envd {
        proxy: &proxy,
        id,
        token,
    };
    step(t0, "two sandboxes");

    // Malformed terminal sizes never reach the guest.
    let shell = |size: Value| {
        json!({"process": {"cmd": "/bin/sh", "args": ["-i"], "envs": {"ZY": "t"}, "cwd": "/tmp"},
               "pty": size, "tag": "term"})
    };
    for size in [
        json!({"size": {"cols": 0, "rows": 24}}),
        json!({"size": {"cols": 80, "rows": 1001}}),
        json!({"size": {"cols": 65616, "rows": 24}}),
        json!({"size": {"cols": 4_294_967_296_u64, "rows": 24}}),
        json!({"size": {"cols": -1, "rows": 24}}),
        json!({"size": {"cols": 80}}),
        json!({}),
    ] {
        let a = a_envd.stream("Start", "20000", shell(size.clone()));
        let envs = a.envelopes();
        assert_eq!(envs.len(), 1, "{size}: {envs:?}");
        assert_eq!(envs[0].1["error"]["code"], "invalid_argument", "{size}");
    }
    let long_tag = json!({"process": {"cmd": "/bin/true"}, "tag": "t".repeat(257)});
    let a = a_envd.stream("Start", "20000", long_tag);
    assert_eq!(a.envelopes()[0].1["error"]["code"], "invalid_argument");

    std::thread::scope(|s| {
        // A shell on a terminal and a plain background program, each tagged; their
        // Start streams end when they do.
        let term = s.spawn(|| {
            a_envd.stream(
                "Start",
                "60000",
                shell(json!({"size": {"cols": 80, "rows": 24}})),
            )
        });
        let plain = json!({"process": {"cmd": "/bin/sleep", "args": ["60"],
                           "envs": {"K": "v"}, "cwd": "/tmp"}, "tag": "bg", "stdin": true});
        let bg = s.spawn(|| a_envd.stream("Start", "60000", plain));
        let list = a_envd.list_until("both tagged processes listed", |l| {
            tagged(l, "term").is_some() && tagged(l, "bg").is_some()
        });
        let t = tagged(&list, "term").unwrap();
        assert_eq!(t["config"]["cmd"], "/bin/sh");
        assert_eq!(t["config"]["cwd"], "/tmp");
        assert_eq!(t["config"]["envs"], json!({"ZY": "t"}));
        let b = tagged(&list, "bg").unwrap();
        assert_eq!(b["config"]["args"], json!(["60"]));
        assert_eq!(
            (b["config"]["cwd"].clone(), b["config"]["envs"].clone()),
            (json!("/tmp"), json!({"K": "v"}))
        );
        let (tpid, bpid) = (t["pid"].as_u64().unwrap(), b["pid"].as_u64().unwrap());
        step(t0, "terminal and background process listed by tag");

        let by_tag = |tag: &str| json!({"tag": tag});
        let input =
            |sel: Value, kind: &str, data: &str| json!({"process": sel, "input": {kind: data}});
        let ok = |a: Answer| assert_eq!((a.status, a.json()), (200, json!({})), "{}", a.text());
        ok(a_envd.unary(
            "SendInput",
            input(by_tag("term"), "pty", &b64(b"echo $((6*7))\n")),
        ));
        ok(a_envd.unary(
            "Update",
            json!({"process": by_tag("term"), "pty": {"size": {"cols": 100, "rows": 30}}}),
        ));
        ok(a_envd.unary(
            "SendInput",
            input(json!({"pid": tpid}), "pty", &b64(b"stty size >/tmp/size\n")),
        ));
        a_envd.file_until("/tmp/size", "30 100\n");
        // Bad sizes and bad input to a terminal; input of the other kind.
        for size in [
            json!({"cols": 0, "rows": 30}),
            json!({"cols": 100, "rows": 70000}),
        ] {
            let a = a_envd.unary(
                "Update",
                json!({"process": by_tag("term"), "pty": {"size": size}}),
            );
            assert_eq!(
                (a.status, a.json()["code"].clone()),
                (400, json!("invalid_argument"))
            );
        }
        let a = a_envd.unary("SendInput", input(by_tag("term"), "pty", "%%%"));
        assert_eq!(
            (a.status, a.json()["code"].clone()),
            (400, json!("invalid_argument"))
        );
        let precondition = |a: Answer, message: &str| {
            assert_eq!(a.status, 400, "{}", a.text());
            assert_eq!(a.json(), error("failed_precondition", message.into()));
        };
        precondition(
            a_envd.unary("SendInput", input(by_tag("bg"), "pty", &b64(b"x"))),
            "tty not assigned to process — input should be written to the stdin, not the tty",
        );
        precondition(
            a_envd.unary(
                "Update",
                json!({"process": by_tag("bg"), "pty": {"size": {"cols": 9, "rows": 9}}}),
            ),
            "error resizing tty: tty not assigned to process",
        );
        precondition(
            a_envd.unary("SendInput", input(by_tag("term"), "stdin", &b64(b"x"))),
            "tty assigned to process — input should be written to the pty, not the stdin",
        );
        precondition(
            a_envd.unary("CloseStdin", json!({"process": by_tag("term")})),
            "cannot close stdin for PTY process — send Ctrl+D (0x04) instead",
        );
        // Unknown tags, and pids of the other sandbox.
        for (method, body) in [
            ("SendInput", input(by_tag("nope"), "pty", &b64(b"x"))),
            (
                "SendSignal",
                json!({"process": by_tag("nope"), "signal": "SIGNAL_SIGKILL"}),
            ),
            ("Update", json!({"process": by_tag("nope")})),
        ] {
            let a = a_envd.unary(method, body);
            assert_eq!(a.status, 404, "{method}: {}", a.text());
            assert_eq!(
                a.json(),
                error("not_found", "process with tag nope not found".into())
            );
        }
        let a = a_envd.stream("Connect", "5000", json!({"process": by_tag("nope")}));
        assert_eq!(a.envelopes()[0].1["error"]["code"], "not_found");
        for pid in [tpid, bpid] {
            for (method, body) in [
                ("SendInput", input(json!({"pid": pid}), "pty", &b64(b"x"))),
                (
                    "SendSignal",
                    json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
                ),
                (
                    "Update",
                    json!({"process": {"pid": pid}, "pty": {"size": {"cols": 9, "rows": 9}}}),
                ),
            ] {
                let a = b_envd.unary(method, body);
                assert_eq!(a.status, 404, "{method} {pid}: {}", a.text());
                assert_eq!(
                    a.json(),
                    error("not_found", format!("process with pid {pid} not found"))
                );
            }
        }
        let b_list = b_envd.list_until("the other sandbox lists its own", |_| true);
        assert!(b_list.is_empty(), "{b_list:?}");
        step(t0, "bad input refused");

        // StreamInput: a client stream, start first, then input.
        let stream_input = |envd: &Envd, messages: &[Value], tail: &[u8]| {
            let mut body: Vec<u8> = messages.iter().flat_map(envelope).collect();
            body.extend_from_slice(tail);
            envd.call("StreamInput", "application/connect+json", &[], &body)
        };
        let start = |sel: Value| json!({"start": {"process": sel}});
        let data = |kind: &str, d: &[u8]| json!({"data": {"input": {kind: b64(d)}}});
        let a = stream_input(
            &a_envd,
            &[
                start(by_tag("bg")),
                data("stdin", b"x\n"),
                json!({"keepalive": {}}),
            ],
            b"",
        );
        assert_eq!(
            a.envelopes(),
            [(0, json!({})), (2, json!({}))],
            "{}",
            a.text()
        );
        let code = |a: Answer| a.envelopes()[0].1["error"]["code"].clone();
        let cases: [(&Envd, Vec<Value>, &[u8], &str); 7] = [
            (&a_envd, vec![data("stdin", b"x")], b"", "invalid_argument"),
            (&a_envd, vec![start(by_tag("nope"))], b"", "not_found"),
            (&b_envd, vec![start(json!({"pid": bpid}))], b"", "not_found"),
            (
                &a_envd,
                vec![start(by_tag("bg")), data("pty", b"x")],
                b"",
                "failed_precondition",
            ),
            (
                &a_envd,
                vec![start(by_tag("bg")), start(by_tag("bg"))],
                b"",
                "invalid_argument",
            ),
            (
                &a_envd,
                vec![start(by_tag("bg"))],
                &[0, 0, 0],
                "invalid_argument",
            ),
            // A message announced past the cap is refused before it is read.
            (
                &a_envd,
                vec![start(by_tag("bg"))],
                &[0, 0x7f, 0xff, 0xff, 0xff],
                "resource_exhausted",
            ),
        ];
        for (envd, messages, tail, expected) in cases {
            let a = stream_input(envd, &messages, tail);
            assert_eq!(code(a), expected, "{messages:?} {tail:?}");
        }
        step(t0, "StreamInput");

        // A program started without stdin (`stdin: false`, the default) takes none.
        ok(a_envd.unary("CloseStdin", json!({"process": by_tag("bg")})));
        for _ in 0..2 {
            precondition(
                a_envd.unary("SendInput", input(by_tag("bg"), "stdin", &b64(b"x"))),
                "stdin not enabled or closed",
            );
        }

        // The terminal answered; SIGKILL by tag ends it and its stream.
        ok(a_envd.unary(
            "SendSignal",
            json!({"process": by_tag("term"), "signal": "SIGNAL_SIGKILL"}),
        ));
        let a = term.join().unwrap();
        let envs = a.envelopes();
        assert_eq!(envs[0].1, json!({"event": {"start": {"pid": tpid}}}));
        let output: Vec<u8> = envs
            .iter()
            .filter_map(|(_, m)| m["event"]["data"]["pty"].as_str())
            .flat_map(|d| base64::engine::general_purpose::STANDARD.decode(d).unwrap())
            .collect();
        let output = String::from_utf8_lossy(&output);
        assert!(output.contains("42\r\n"), "{output:?}");
        let n = envs.len();
        assert_eq!(
            envs[n - 2].1["event"]["end"]["status"],
            "signal: killed",
            "{envs:?}"
        );
        assert_eq!(envs[n - 1], (2, json!({})));
        let a = a_envd.unary("SendInput", input(json!({"pid": tpid}), "pty", &b64(b"x")));
        assert_eq!(
            a.json(),
            error("not_found", format!("process with pid {tpid} not found"))
        );
        let a = a_envd.unary(
            "SendSignal",
            json!({"process": by_tag("term"), "signal": "SIGNAL_SIGKILL"}),
        );
        assert_eq!(a.status, 404, "{}", a.text());

        // The plain one (its stdin closed above): killed by tag.
        ok(a_envd.unary(
            "SendSignal",
            json!({"process": by_tag("bg"), "signal": "SIGNAL_SIGKILL"}),
        ));
        let envs = bg.join().unwrap().envelopes();
        let n = envs.len();
        assert_eq!(envs[n - 2].1["event"]["end"]["exitCode"], -1, "{envs:?}");
        a_envd.list_until("both gone", |l| l.is_empty());
        let a = a_envd.unary("Update", json!({"process": by_tag("bg")}));
        assert_eq!(a.status, 404, "{}", a.text());
        step(t0, "terminal and background process killed by tag");
    });
}
