//! Background processes end to end: started by exec with `background`, fed through
//! stdin, read from offsets and followed, signalled, refused when the input is bad, and
//! carried into a branch child as its own copy.
use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::{Client, ClientError};
use zygote_daemon::model::{BranchResponse, Process, ProcessList, ProcessOutput};

async fn start(c: &Client, id: &str, script: &str) -> Process {
    c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(&json!({"argv": ["sh", "-c", script], "background": true})),
    )
    .await
    .unwrap_or_else(|e| panic!("background {script:?} in {id}: {e}"))
}

async fn post(c: &Client, id: &str, pid: u32, what: &str, body: Value) -> Result<(), ClientError> {
    let path = format!("/v1/sandboxes/{id}/processes/{pid}/{what}");
    let bytes = serde_json::to_vec(&body).unwrap().into();
    c.raw(Method::POST, &path, Some((bytes, "application/json")))
        .await
        .map(drop)
}

async fn output(c: &Client, id: &str, pid: u32, query: &str) -> ProcessOutput {
    c.json(
        Method::GET,
        &format!("/v1/sandboxes/{id}/processes/{pid}/output?{query}"),
        None::<&()>,
    )
    .await
    .unwrap_or_else(|e| panic!("output of {pid} in {id}: {e}"))
}

/// Follows `pid` to its end: (stdout, stderr, the exit line).
async fn follow(c: &Client, id: &str, pid: u32) -> (String, String, Value) {
    let path = format!("/v1/sandboxes/{id}/processes/{pid}/output?follow=true");
    let body = c.raw(Method::GET, &path, None).await.expect("follow");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut last = Value::Null;
    for line in String::from_utf8(body.to_vec()).unwrap().lines() {
        let ev: Value = serde_json::from_str(line).unwrap();
        if ev["type"] == "output" {
            let data = zygote_proto::b64::decode(ev["data"].as_str().unwrap()).unwrap();
            match ev["stream"].as_str() {
                Some("stdout") => out.extend(data),
                _ => err.extend(data),
            }
        }
        last = ev;
    }
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (text(out), text(err), last)
}

/// The process once it has ended (all its output read), waiting for that.
async fn ended(c: &Client, id: &str, pid: u32) -> Process {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut offset = 0;
    loop {
        let out = output(c, id, pid, &format!("offset={offset}&wait_ms=10000")).await;
        if out.process.state == "exited" && out.next_offset == out.process.output_bytes {
            return out.process;
        }
        assert!(
            Instant::now() < deadline,
            "{pid} in {id} did not end: {out:?}"
        );
        offset = out.next_offset;
    }
}

/// The last number a counting process printed, waiting for it to print at least `above`.
async fn count_above(c: &Client, id: &str, pid: u32, above: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = output(c, id, pid, "offset=0").await;
        let last = out
            .stdout
            .lines()
            .last()
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        if last > above {
            return last;
        }
        assert_eq!(out.process.state, "running", "{out:?}");
        assert!(Instant::now() < deadline, "{pid} in {id} stuck at {last}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

pub async fn check_processes(c: &Client, id: &str) {
    // stdin stays open; output is read from any offset, or followed to the end.
    let p = start(
        c,
        id,
        "echo start; while read l; do echo \"got $l\"; done; echo bye >&2; exit 3",
    )
    .await;
    assert_eq!(p.state, "running");
    assert!(p.stdin_open);
    post(c, id, p.pid, "stdin", json!({"data": "hello\n"}))
        .await
        .unwrap();
    post(
        c,
        id,
        p.pid,
        "stdin",
        json!({"data_base64": "d29ybGQK", "eof": true}),
    )
    .await
    .unwrap();
    let (out, err, exit) = follow(c, id, p.pid).await;
    assert_eq!(out, "start\ngot hello\ngot world\n");
    assert_eq!(err, "bye\n");
    assert_eq!(exit["type"], "exit", "{exit}");
    assert_eq!(exit["exit_code"], 3, "{exit}");
    let tail = output(c, id, p.pid, "offset=6").await;
    assert_eq!(tail.offset, 6);
    assert_eq!(tail.stdout, "got hello\ngot world\n");
    assert_eq!(tail.stderr, "bye\n");
    assert_eq!(tail.process.state, "exited");
    assert_eq!(tail.process.exit_code, Some(3));
    assert_eq!(tail.next_offset, tail.process.output_bytes);
    let e = post(c, id, p.pid, "stdin", json!({"data": "late"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("process_exited"), "{e}");
    let e = post(c, id, p.pid, "signal", json!({"signal": "SIGKILL"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("process_exited"), "{e}");

    // A signal by name reaches it; the list shows both.
    let sleeper = start(c, id, "exec sleep 1000").await;
    let list: ProcessList = c
        .json(
            Method::GET,
            &format!("/v1/sandboxes/{id}/processes"),
            None::<&()>,
        )
        .await
        .unwrap();
    let pids: Vec<u32> = list.processes.iter().map(|p| p.pid).collect();
    assert!(
        pids.contains(&p.pid) && pids.contains(&sleeper.pid),
        "{pids:?}"
    );
    post(c, id, sleeper.pid, "signal", json!({"signal": "term"}))
        .await
        .unwrap();
    assert_eq!(ended(c, id, sleeper.pid).await.signal, Some(15));

    // Bad input: clear 4xx, nothing started.
    let bad = |path: String| async move { c.raw(Method::GET, &path, None).await.unwrap_err() };
    let e = bad(format!("/v1/sandboxes/{id}/processes/abc")).await;
    assert_eq!(e.code(), Some("invalid_argument"), "{e}");
    let e = bad(format!("/v1/sandboxes/{id}/processes/999999")).await;
    assert_eq!(e.code(), Some("not_found"), "{e}");
    let e = bad(format!("/v1/sandboxes/{id}/processes/999999/output")).await;
    assert_eq!(e.code(), Some("guest_not_found"), "{e}");
    let e = bad(format!(
        "/v1/sandboxes/{id}/processes/{}/output?wait_ms=40000",
        p.pid
    ))
    .await;
    assert_eq!(e.code(), Some("invalid_argument"), "{e}");
    let e = post(c, id, sleeper.pid, "signal", json!({"signal": "NOPE"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("invalid_argument"), "{e}");
    let e = post(c, id, sleeper.pid, "stdin", json!({}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("invalid_argument"), "{e}");
    let streamed = json!({"argv": ["true"], "background": true});
    let e = c
        .raw(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec/stream"),
            Some((
                serde_json::to_vec(&streamed).unwrap().into(),
                "application/json",
            )),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("invalid_argument"), "{e}");
    let listed: ProcessList = c
        .json(
            Method::GET,
            &format!("/v1/sandboxes/{id}/processes"),
            None::<&()>,
        )
        .await
        .unwrap();
    assert_eq!(
        listed.processes.len(),
        list.processes.len(),
        "nothing new started"
    );
}

/// A background process running at the branch runs on in the child as the child's own:
/// same pid, its count going on from the branch point, killed there without touching the
/// parent's. Deletes the child it makes.
pub async fn check_processes_branch(c: &Client, id: &str) {
    let counter = start(
        c,
        id,
        "i=0; while :; do i=$((i+1)); echo $i; sleep 0.2; done",
    )
    .await;
    let before = count_above(c, id, counter.pid, 3).await;
    let br: BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{id}/branch"),
            Some(&json!({"count": 1})),
        )
        .await
        .expect("branch");
    let child = &br.children[0];
    let in_child: Process = c
        .json(
            Method::GET,
            &format!("/v1/sandboxes/{child}/processes/{}", counter.pid),
            None::<&()>,
        )
        .await
        .expect("the counter in the child");
    assert_eq!(in_child.state, "running");
    assert!(in_child.output_bytes > 0, "its output so far came along");
    let after = count_above(c, child, counter.pid, before).await;
    assert!(after > before);
    post(c, child, counter.pid, "signal", json!({"signal": 9}))
        .await
        .unwrap();
    assert_eq!(ended(c, child, counter.pid).await.signal, Some(9));
    // The parent's goes on.
    let parent_count = count_above(c, id, counter.pid, after).await;
    assert!(parent_count > after);
    post(c, id, counter.pid, "signal", json!({"signal": "KILL"}))
        .await
        .unwrap();
    c.raw(Method::DELETE, &format!("/v1/sandboxes/{child}"), None)
        .await
        .expect("delete the child");
}

/// A background process goes on after a pause and resume: same pid, its output kept
/// and growing, still taking signals.
pub async fn check_processes_pause(c: &Client, id: &str) {
    let counter = start(
        c,
        id,
        "i=0; while :; do i=$((i+1)); echo $i; sleep 0.2; done",
    )
    .await;
    let before = count_above(c, id, counter.pid, 3).await;
    for what in ["pause", "resume"] {
        c.raw(Method::POST, &format!("/v1/sandboxes/{id}/{what}"), None)
            .await
            .unwrap_or_else(|e| panic!("{what} {id}: {e}"));
    }
    let after = count_above(c, id, counter.pid, before).await;
    assert!(after > before);
    let kept = output(c, id, counter.pid, "offset=0").await;
    assert_eq!(kept.offset, 0, "the output from before the pause is kept");
    assert!(kept.stdout.starts_with("1\n2\n3\n"), "{}", kept.stdout);
    post(c, id, counter.pid, "signal", json!({"signal": "KILL"}))
        .await
        .unwrap();
    assert_eq!(ended(c, id, counter.pid).await.signal, Some(9));
}
