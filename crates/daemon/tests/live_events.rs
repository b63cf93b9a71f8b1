//! The daemon-wide event stream (`GET /v1/events`, Server-Sent Events): bad queries and
//! missing tokens are refused; the stream says `ready` first, tells a client with an
//! id of another daemon run that it lagged, and ends when the daemon shuts down (an
//! open console does not hold it up). On the qemu runtime: a create, a branch, a delete
//! and an expiry arrive in order, tagged with their sandboxes; a sandbox filter keeps
//! only its sandbox; a reconnect with `Last-Event-ID` gets exactly what it missed; the
//! CLI's `zygote events` follows them; the list carries each sandbox's disk and newest
//! metrics sample.
mod common;
#[path = "e2b_envd/wire.rs"]
#[allow(dead_code)] // the Connect helpers are the envd tests'
mod wire;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::json;
use tokio::sync::mpsc;
use zygote_api::event_stream_client::{SseParser, StreamMessage};
use zygote_daemon::client::Client;
use zygote_daemon::model::{BranchResponse, LiveEvent, LiveEventsQuery, SandboxList};

use common::{create, eventually, qemu_guest_ready, start_daemon, step, Scratch};
use wire::{daemon_without_vms, hostport, http};

/// A raw stream connection: the request line and headers as given, read as it comes.
/// HTTP/1.0, so the body is the bytes until the connection closes (no chunk framing).
struct RawStream {
    socket: BufReader<TcpStream>,
    parser: SseParser,
    head: String,
}

impl RawStream {
    fn open(addr: &str, path: &str, headers: &[(&str, &str)]) -> RawStream {
        let mut socket = TcpStream::connect(addr).unwrap();
        let mut req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        socket.write_all(req.as_bytes()).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut socket = BufReader::new(socket);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            socket.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            head.push_str(&line);
        }
        RawStream {
            socket,
            parser: SseParser::default(),
            head,
        }
    }

    /// The next `n` messages.
    fn messages(&mut self, n: usize) -> Vec<zygote_api::event_stream_client::SseMessage> {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while got.len() < n {
            let k = self.socket.read(&mut buf).expect("reading the stream");
            assert!(k > 0, "the stream ended after {got:?}");
            got.extend(self.parser.push(&buf[..k]).unwrap());
        }
        got
    }
}

#[test]
fn the_stream_is_guarded_says_ready_and_ends_with_the_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = daemon_without_vms(tmp.path());
    let (api, token) = (hostport(&d.url), d.token());
    let auth = format!("Bearer {token}");
    for (query, says) in [
        ("level=fatal", "level"),
        ("bogus=1", "bogus"),
        ("sandbox=", "sandbox"),
    ] {
        let a = http(
            &api,
            "GET",
            &format!("/v1/events?{query}"),
            &[("Authorization", &auth)],
            b"",
        );
        assert_eq!(a.status, 400, "{query}: {}", a.text());
        let msg = a.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains(says), "{query}: {msg:?} does not say {says:?}");
    }
    assert_eq!(http(&api, "GET", "/v1/events", &[], b"").status, 401);
    assert_eq!(
        http(
            &api,
            "GET",
            "/v1/events?token=x",
            &[("Authorization", "Bearer wrong")],
            b""
        )
        .status,
        401
    );

    let mut s = RawStream::open(&api, "/v1/events", &[("Authorization", &auth)]);
    assert!(
        s.head.starts_with("HTTP/1.0 200") || s.head.starts_with("HTTP/1.1 200"),
        "{}",
        s.head
    );
    assert!(
        s.head
            .to_ascii_lowercase()
            .contains("content-type: text/event-stream"),
        "{}",
        s.head
    );
    let ready = &s.messages(1)[0];
    assert_eq!(ready.event, "ready");
    let epoch = serde_json::from_str::<serde_json::Value>(&ready.data).unwrap()["epoch"]
        .as_u64()
        .unwrap();
    assert!(
        epoch > 1_700_000_000_000,
        "epoch {epoch} is not a start time"
    );

    // An id of another daemon run: told it lagged (how much is unknown), at once.
    let other = format!("{}-3", epoch - 1);
    let mut again = RawStream::open(
        &api,
        "/v1/events",
        &[("Authorization", &auth), ("Last-Event-ID", &other)],
    );
    let m = again.messages(2);
    assert_eq!(
        (m[0].event.as_str(), m[1].event.as_str()),
        ("ready", "lagged")
    );
    assert_eq!(m[1].data, r#"{"missed":0}"#);

    // SIGTERM with two streams open: the daemon still exits, and they end.
    unsafe { libc::kill(d.pid() as i32, libc::SIGTERM) };
    let t = Instant::now();
    let exited = loop {
        if let Ok(Some(status)) = d.child.try_wait() {
            break Some(status);
        }
        if t.elapsed() > Duration::from_secs(10) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        exited.is_some(),
        "an open event stream held the daemon's shutdown up"
    );
    let mut rest = Vec::new();
    let _ = s.socket.read_to_end(&mut rest);
    assert!(
        !String::from_utf8_lossy(&rest).contains("event: sandbox"),
        "{rest:?}"
    );
}

/// Every stream message, collected by a follower task.
fn follower(c: &Client, q: LiveEventsQuery) -> mpsc::UnboundedReceiver<StreamMessage> {
    let (tx, rx) = mpsc::unbounded_channel();
    let c = c.clone();
    tokio::spawn(async move {
        let _ = c.follow_events(&q, |m| tx.send(m).is_ok()).await;
    });
    rx
}

/// Waits for a message `want` accepts; the events seen until then, it included.
async fn until(
    rx: &mut mpsc::UnboundedReceiver<StreamMessage>,
    what: &str,
    want: impl Fn(&LiveEvent) -> bool,
) -> Vec<LiveEvent> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let m = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no {what} within 180 s; saw {seen:#?}"))
            .expect("the follower ended");
        match m {
            StreamMessage::Event(e) => {
                let done = want(&e);
                seen.push(e);
                if done {
                    return seen;
                }
            }
            StreamMessage::Lagged(l) => panic!("lagged ({l:?}) while waiting for {what}"),
            StreamMessage::Ready(_) => {}
        }
    }
}

fn said(events: &[LiveEvent], sandbox: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.sandbox == sandbox)
        .map(|e| e.event.message.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn what_happens_to_every_sandbox_streams_live() {
    if !qemu_guest_ready("what_happens_to_every_sandbox_streams_live") {
        return;
    }
    let t0 = Instant::now();
    let scratch = Scratch::new();
    let (state, cleanup) = (&scratch.state, &scratch.cleanup);
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--runtime",
        "qemu",
        "--metrics-interval",
        "1",
    ];
    let d = start_daemon(state, &args);
    let c = d.client();
    let mut all = follower(&c, LiveEventsQuery::default());
    assert!(matches!(all.recv().await, Some(StreamMessage::Ready(_))));

    // The CLI follows every sandbox too (its lines name the sandbox). It is built
    // beside zygoted by a workspace build (`make build`, `cargo test --workspace`).
    let cli_bin = std::path::Path::new(env!("CARGO_BIN_EXE_zygoted")).with_file_name("zygote");
    let mut cli = match cli_bin.is_file() {
        true => Some(
            std::process::Command::new(&cli_bin)
                .args(["events", "--url", &d.url])
                .env("ZYGOTE_TOKEN", d.token())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::inherit())
                .spawn()
                .expect("zygote events"),
        ),
        false => {
            eprintln!(
                "skipping the CLI part: no {} (build the workspace)",
                cli_bin.display()
            );
            None
        }
    };
    let (cli_tx, cli_rx) = std::sync::mpsc::channel::<String>();
    if let Some(out) = cli.as_mut().and_then(|c| c.stdout.take()) {
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = cli_tx.send(line);
            }
        });
    }

    let id = create(&c, json!({"image": "minimal"}), cleanup).await[0]
        .id
        .clone();
    let seen = until(&mut all, "the start", |e| {
        e.sandbox == id && e.event.message == "sandbox started"
    })
    .await;
    assert_eq!(
        said(&seen, &id),
        ["sandbox creating", "sandbox started"],
        "{seen:#?}"
    );
    step(t0, &format!("created {id}"));

    let br: BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{id}/branch"),
            Some(&json!({"count": 2})),
        )
        .await
        .expect("branch");
    let (a, b) = (br.children[0].clone(), br.children[1].clone());
    let mut seen = Vec::new();
    for child in [&a, &b] {
        if !said(&seen, child).contains(&"sandbox started".to_string()) {
            seen.extend(
                until(&mut all, "a child's start", |e| {
                    &e.sandbox == child && e.event.message == "sandbox started"
                })
                .await,
            );
        }
    }
    assert!(
        said(&seen, &id).contains(&"branched".to_string()),
        "{seen:#?}"
    );
    for child in [&a, &b] {
        assert_eq!(
            said(&seen, child),
            ["sandbox creating", "sandbox started"],
            "{seen:#?}"
        );
        let started = seen
            .iter()
            .find(|e| &e.sandbox == child && e.event.message == "sandbox started")
            .unwrap();
        assert_eq!(started.event.fields["parent"], id);
    }
    let ids: Vec<u64> = seen
        .iter()
        .map(|e| e.id.split_once('-').unwrap().1.parse().unwrap())
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids out of order: {ids:?}"
    );
    step(t0, "branched into 2");

    // Only `a`'s events on a filtered stream, from before its deletion.
    let mut only_a = follower(
        &c,
        LiveEventsQuery {
            sandbox: Some(a.clone()),
            level: None,
        },
    );
    assert!(matches!(only_a.recv().await, Some(StreamMessage::Ready(_))));
    let mark = seen.last().unwrap().id.clone();
    c.json::<serde_json::Value>(Method::DELETE, &format!("/v1/sandboxes/{a}"), None::<&()>)
        .await
        .expect("delete a");
    let gone = until(&mut all, "a's deletion", |e| {
        e.sandbox == a && e.event.message == "sandbox deleted"
    })
    .await;
    assert_eq!(gone.last().unwrap().event.fields["reason"], "deleted");
    let filtered = until(&mut only_a, "a's deletion, filtered", |e| {
        e.event.message == "sandbox deleted"
    })
    .await;
    assert!(filtered.iter().all(|e| e.sandbox == a), "{filtered:#?}");

    // `b` runs out of time: `timeout changed`, then deleted as expired.
    c.json::<serde_json::Value>(
        Method::PUT,
        &format!("/v1/sandboxes/{b}/ttl"),
        Some(&json!({"ttl_secs": 1})),
    )
    .await
    .expect("ttl");
    let expired = until(&mut all, "b's expiry", |e| {
        e.sandbox == b && e.event.message == "sandbox deleted"
    })
    .await;
    assert_eq!(
        said(&expired, &b),
        ["timeout changed", "sandbox deleted"],
        "{expired:#?}"
    );
    assert_eq!(expired.last().unwrap().event.fields["reason"], "expired");
    step(t0, "deleted one child, the other expired");

    // A reconnect from `mark` gets exactly what came after it: a's deletion through
    // b's, in order, nothing before.
    let api = hostport(&d.url);
    let auth = format!("Bearer {}", d.token());
    let mut s = RawStream::open(
        &api,
        "/v1/events",
        &[("Authorization", &auth), ("Last-Event-ID", &mark)],
    );
    let after: Vec<LiveEvent> = gone.iter().chain(&expired).cloned().collect();
    let replay = s.messages(1 + after.len());
    assert_eq!(replay[0].event, "ready");
    let replayed: Vec<LiveEvent> = replay[1..]
        .iter()
        .map(|m| {
            assert_eq!(m.event, "sandbox");
            serde_json::from_str(&m.data).unwrap()
        })
        .collect();
    // Only info and above (the default) in `after` as well; a metrics-driven event
    // may not exist, so the lists are equal.
    assert_eq!(replayed, after);
    assert_eq!(replay[1].id.as_deref(), Some(after[0].id.as_str()));

    // The CLI printed the same events, each line naming its sandbox.
    if let Some(mut cli) = cli {
        let want = [
            (&id, "sandbox started"),
            (&a, "sandbox deleted"),
            (&b, "sandbox deleted"),
        ];
        let mut lines = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !want.iter().all(|(s, m)| {
            lines
                .iter()
                .any(|l: &String| l.contains(s.as_str()) && l.contains(m))
        }) {
            let left = deadline.saturating_duration_since(Instant::now());
            match cli_rx.recv_timeout(left) {
                Ok(l) => lines.push(l),
                Err(_) => panic!("zygote events printed {lines:#?}"),
            }
        }
        let _ = cli.kill();
        let _ = cli.wait();
    }

    // The list: the parent's own disk and a metrics sample.
    let listed = eventually(Duration::from_secs(30), async || {
        let list: SandboxList = c
            .json(Method::GET, "/v1/sandboxes", None::<&()>)
            .await
            .ok()?;
        let sb = list.sandboxes.into_iter().find(|s| s.id == id)?;
        (sb.metrics.is_some() && sb.disk_bytes.is_some()).then_some(sb)
    })
    .await
    .expect("the parent listed with its disk and a metrics sample");
    assert!(listed.disk_bytes.unwrap() > 0);
    let m = listed.metrics.unwrap();
    assert!(m.mem_total > 0 && m.mem_used <= m.mem_total, "{m:?}");
    step(t0, "done");
}
