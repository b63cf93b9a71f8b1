//! Fan-out through the API (issue 17): a streamed branch answers at once, reports the
//! branch point and then each child as it comes up, while the children are listed
//! `creating` then `running` and the daemon goes on answering other requests; a client
//! that goes away mid-stream does not stop the branch; bad requests are refused before
//! any stream starts, and change nothing. A streamed create does the same for a fan-out
//! of new sandboxes.
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::Client;
use zygote_daemon::model::{BranchEvent, CreateEvent, Sandbox, SandboxList};

use super::{eventually, get, step, Cleanup};

async fn list(c: &Client) -> Vec<Sandbox> {
    let l: SandboxList = c
        .json(Method::GET, "/v1/sandboxes", None::<&()>)
        .await
        .expect("list");
    l.sandboxes
}

/// Refused with `code` before anything is streamed or recorded.
async fn refused(c: &Client, parent: &str, body: Value, code: &str) {
    let before = list(c).await.len();
    let e = c
        .json::<Value>(
            Method::POST,
            &format!("/v1/sandboxes/{parent}/branch"),
            Some(&body),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(code), "{body}: {e}");
    assert_eq!(list(c).await.len(), before, "{body} changed nothing");
}

/// The streamed branch and the dropped stream (see the module doc); their children go.
pub async fn check_fanout(c: &Client, parent: &str, cleanup: &Cleanup, t0: Instant) {
    let mut children = check_streamed_branch(c, parent).await;
    step(
        t0,
        "streamed branch: the point, then each child as it runs (listed creating, then \
         running), other requests answered meanwhile; bad requests refused first",
    );
    children.extend(check_disconnect(c, parent).await);
    step(
        t0,
        "a client gone after the first line: its children come up all the same",
    );
    children.extend(check_streamed_create(c).await);
    step(
        t0,
        "streamed create of 2: every sandbox recorded first, then each as it runs, then \
         the list; bad requests refused before the stream",
    );
    for id in &children {
        let path = get(c, id).await.cgroup.path;
        cleanup.cgroups.lock().unwrap().extend(path.map(Into::into));
        c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await
            .expect("delete a streamed branch's child");
    }
}

/// A streamed branch of `parent` into 3 children, followed as it happens; returns them.
async fn check_streamed_branch(c: &Client, parent: &str) -> Vec<String> {
    for (body, code) in [
        (json!({"count": 0, "stream": true}), "invalid_argument"),
        (json!({"count": 1000, "stream": true}), "invalid_argument"),
        (json!({"count": 2, "stream": "yes"}), "malformed_body"),
    ] {
        refused(c, parent, body, code).await;
    }
    refused(
        c,
        "sb-nosuchthing",
        json!({"count": 2, "stream": true}),
        "not_found",
    )
    .await;
    let e = c
        .json::<Value>(
            Method::POST,
            "/v1/sandboxes",
            Some(&json!({"image": "minimal", "n": 257})),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("invalid_argument"), "{e}");

    let t0 = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = {
        let (c, path) = (c.clone(), format!("/v1/sandboxes/{parent}/branch"));
        tokio::spawn(async move {
            c.ndjson(
                Method::POST,
                &path,
                Some(&json!({"count": 3, "stream": true})),
                |ev: BranchEvent| {
                    let _ = tx.send(ev);
                },
            )
            .await
        })
    };
    let mut events = Vec::new();
    let mut children = Vec::new();
    let mut answered_during = 0;
    while let Some(ev) = rx.recv().await {
        match &ev {
            BranchEvent::Point {
                parent: p,
                children: ids,
                ..
            } => {
                assert!(events.is_empty(), "the point comes first: {events:?}");
                assert_eq!(p, parent);
                assert_eq!(ids.len(), 3, "{ev:?}");
                children = ids.clone();
                // Recorded before it is told: the parent runs on, every child is listed.
                assert_eq!(get(c, parent).await.state, "running");
                let listed = list(c).await;
                for id in ids {
                    let s = listed.iter().find(|s| &s.id == id).expect("child listed");
                    assert!(
                        ["creating", "running"].contains(&s.state.as_str()),
                        "{id}: {}",
                        s.state
                    );
                }
            }
            BranchEvent::Child { index, id, .. } => {
                assert_eq!(children.get(*index as usize), Some(id), "{ev:?}");
                assert_eq!(get(c, id).await.state, "running", "{ev:?}");
            }
            BranchEvent::ChildFailed { .. } => panic!("a child failed: {ev:?}"),
            BranchEvent::Done(_) | BranchEvent::Error { .. } => {}
        }
        // Another request while the branch streams (it has not ended yet).
        let ended = matches!(ev, BranchEvent::Done(_) | BranchEvent::Error { .. });
        if !ended {
            let asked = Instant::now();
            get(c, parent).await;
            answered_during += 1;
            eprintln!(
                "    GET /v1/sandboxes/{parent} answered in {:.1} ms during the branch",
                asked.elapsed().as_secs_f64() * 1e3
            );
        }
        events.push(ev);
    }
    reader.await.unwrap().expect("the stream reads whole");
    assert!(answered_during >= 1, "{events:?}");
    let Some(BranchEvent::Done(done)) = events.last() else {
        panic!("the last line is the summary: {events:?}");
    };
    let mut ready: Vec<(u32, String, u64)> = events
        .iter()
        .filter_map(|e| match e {
            BranchEvent::Child { index, id, ms } => Some((*index, id.clone(), *ms)),
            _ => None,
        })
        .collect();
    assert_eq!(ready.len(), 3, "{events:?}");
    let in_order: Vec<u64> = ready.iter().map(|r| r.2).collect();
    assert!(in_order.windows(2).all(|w| w[0] <= w[1]), "{in_order:?}");
    ready.sort();
    let ids: Vec<String> = ready.into_iter().map(|r| r.1).collect();
    assert_eq!(done.children, ids, "{done:?}");
    assert_eq!(children, ids);
    assert!(done.failed.is_empty(), "{done:?}");
    eprintln!(
        "    streamed branch of 3: {} ms in all ({:.0} ms here), {answered_during} other requests answered meanwhile",
        done.duration_ms,
        t0.elapsed().as_secs_f64() * 1e3
    );
    ids
}

/// A client that reads only the first line of a streamed branch and goes away: the
/// children come up all the same, and nothing is left `creating`.
async fn check_disconnect(c: &Client, parent: &str) -> Vec<String> {
    let body = serde_json::to_vec(&json!({"count": 2, "stream": true})).unwrap();
    let resp = c
        .send(
            Method::POST,
            &format!("/v1/sandboxes/{parent}/branch"),
            Some((body.into(), "application/json")),
        )
        .await
        .expect("streamed branch");
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "application/x-ndjson",
        "{resp:?}"
    );
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    while !buf.contains(&b'\n') {
        let frame = body.frame().await.expect("a first line").expect("frame");
        buf.extend_from_slice(frame.data_ref().map_or(&[][..], |d| d.as_ref()));
    }
    let line = &buf[..buf.iter().position(|b| *b == b'\n').unwrap()];
    let children = match serde_json::from_slice(line).expect("an event") {
        BranchEvent::Point { children, .. } => children,
        other => panic!("the first line is the point: {other:?}"),
    };
    drop(body);
    let up = eventually(Duration::from_secs(300), async || {
        let listed = list(c).await;
        let states: Vec<String> = children
            .iter()
            .filter_map(|id| listed.iter().find(|s| &s.id == id))
            .map(|s| s.state.clone())
            .collect();
        (states.len() == children.len() && states.iter().all(|s| s == "running")).then_some(())
    })
    .await;
    assert!(
        up.is_some(),
        "children of a dropped stream: {:?}",
        list(c).await
    );
    for id in &children {
        let r = super::exec(c, id, "hostname").await;
        assert_eq!(r.stdout.trim(), id.as_str());
    }
    assert!(
        list(c).await.iter().all(|s| s.state != "creating"),
        "{:?}",
        list(c).await
    );
    children
}

/// On the qemu runtime (each VM its own copy of its memory) a create of more sandboxes
/// than the host holds is refused with 422 `insufficient_memory` before any VM starts.
pub async fn check_create_capacity(c: &Client, runtime: &str) {
    if runtime != "qemu" {
        return; // kvm: no capacity refusal.
    }
    let available_mib = zygote_vmm::host::meminfo_kib("MemAvailable").expect("MemAvailable") / 1024;
    if available_mib / 1024 >= 256 {
        eprintln!(
            "skip: {available_mib} MiB available holds 256 sandboxes of 1 GiB; the capacity \
             refusal is not reachable here"
        );
        return;
    }
    let before = list(c).await.len();
    let e = c
        .json::<Value>(
            Method::POST,
            "/v1/sandboxes",
            Some(&json!({"image": "minimal", "n": 256, "mem_mib": 1024})),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("insufficient_memory"), "{e}");
    assert!(e.to_string().contains("sandboxes of 1024 MiB"), "{e}");
    assert_eq!(list(c).await.len(), before, "nothing was created");
}

/// `POST /v1/sandboxes {"n": 2, "stream": true}`: refused before any stream when the
/// request is wrong; else `accepted` (both recorded and listed), one `sandbox` per
/// sandbox as it runs, then `done` with both. Returns their ids.
async fn check_streamed_create(c: &Client) -> Vec<String> {
    for (body, code) in [
        (
            json!({"image": "minimal", "n": 0, "stream": true}),
            "invalid_argument",
        ),
        (
            json!({"image": "minimal", "n": 2, "name": "Not A Name", "stream": true}),
            "invalid_argument",
        ),
        (json!({"image": "minimal", "stream": 1}), "malformed_body"),
    ] {
        let before = list(c).await.len();
        let e = c
            .json::<Value>(Method::POST, "/v1/sandboxes", Some(&body))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(code), "{body}: {e}");
        assert_eq!(list(c).await.len(), before, "{body} changed nothing");
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = {
        let c = c.clone();
        tokio::spawn(async move {
            c.ndjson(
                Method::POST,
                "/v1/sandboxes",
                Some(&json!({"image": "minimal", "n": 2, "mem_mib": 128, "stream": true})),
                |ev: CreateEvent| {
                    let _ = tx.send(ev);
                },
            )
            .await
        })
    };
    let mut events = Vec::new();
    let mut ids = Vec::new();
    while let Some(ev) = rx.recv().await {
        match &ev {
            CreateEvent::Accepted { ids: accepted, .. } => {
                assert!(events.is_empty(), "accepted comes first: {events:?}");
                assert_eq!(accepted.len(), 2, "{ev:?}");
                ids = accepted.clone();
                for id in accepted {
                    let state = get(c, id).await.state;
                    assert!(
                        ["creating", "running"].contains(&state.as_str()),
                        "{id}: {state}"
                    );
                }
            }
            CreateEvent::Sandbox { index, id, .. } => {
                assert_eq!(ids.get(*index as usize), Some(id), "{ev:?}");
                assert_eq!(get(c, id).await.state, "running", "{ev:?}");
            }
            CreateEvent::SandboxFailed { .. } | CreateEvent::Error { .. } => {
                panic!("the create failed: {ev:?}")
            }
            CreateEvent::Done { .. } => {}
        }
        events.push(ev);
    }
    reader.await.unwrap().expect("the stream reads whole");
    let Some(CreateEvent::Done { sandboxes }) = events.last() else {
        panic!("the last line is the list: {events:?}");
    };
    let done: Vec<String> = sandboxes.iter().map(|s| s.id.clone()).collect();
    assert_eq!(done, ids, "{events:?}");
    assert!(
        sandboxes.iter().all(|s| s.state == "running"),
        "{sandboxes:?}"
    );
    let ran = events
        .iter()
        .filter(|e| matches!(e, CreateEvent::Sandbox { .. }))
        .count();
    assert_eq!(ran, 2, "{events:?}");
    for id in &ids {
        let r = super::exec(c, id, "hostname").await;
        assert_eq!(r.stdout.trim(), id.as_str());
    }
    ids
}
