//! A sandbox's event log (`GET /v1/sandboxes/{id}/events`, and E2B's sandbox logs read
//! from it): bad queries and unknown sandboxes are refused without a VM; on the qemu
//! runtime, what is done to a sandbox and in it shows up in order (started, commands
//! and how they ended, timeout and network changes, snapshot, branch on both sides,
//! pause, resume), filters work, the log survives a daemon restart and goes with the
//! sandbox.
mod common;
#[path = "e2b_envd/wire.rs"]
#[allow(dead_code)] // the Connect helpers are the envd tests'
mod wire;

use std::time::Instant;

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::{Client, ClientError};
use zygote_daemon::model::{BranchResponse, EventLevel, EventList, EventOrder, EventsQuery};

use common::{create, qemu_guest_ready, sh, start_daemon, step, Scratch};
use wire::{daemon_without_vms, hostport, http, Answer};

fn e2b(api: &str, token: &str, path: &str) -> Answer {
    http(api, "GET", path, &[("X-API-Key", token)], b"")
}

fn messages(list: &EventList) -> Vec<&str> {
    list.events.iter().map(|e| e.message.as_str()).collect()
}

async fn events(c: &Client, id: &str, q: EventsQuery) -> EventList {
    c.events(id, &q)
        .await
        .unwrap_or_else(|e| panic!("events of {id}: {e}"))
}

#[test]
fn bad_event_queries_and_unknown_sandboxes_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon_without_vms(tmp.path());
    let (api, token) = (hostport(&d.url), d.token());
    let native = |path: &str| {
        http(
            &api,
            "GET",
            path,
            &[("Authorization", &format!("Bearer {token}"))],
            b"",
        )
    };
    for (query, says) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("since_ms=5&until_ms=4", "after until_ms"),
        ("level=fatal", "level"),
        ("order=sideways", "order"),
        ("bogus=1", "bogus"),
    ] {
        let a = native(&format!("/v1/sandboxes/sb-none/events?{query}"));
        assert_eq!(a.status, 400, "{query}: {}", a.text());
        let msg = a.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains(says), "{query}: {msg:?} does not say {says:?}");
    }
    let search = format!("/v1/sandboxes/sb-none/events?search={}", "x".repeat(257));
    assert_eq!(native(&search).status, 400);
    let a = native("/v1/sandboxes/sb-none/events");
    assert_eq!(a.status, 404, "{}", a.text());
    assert!(http(&api, "GET", "/v1/sandboxes/sb-none/events", &[], b"").status == 401);

    // E2B's routes: its 401, 404 and 400s.
    for path in [
        "/e2b/sandboxes/sb-none/logs",
        "/e2b/v2/sandboxes/sb-none/logs",
    ] {
        let a = e2b(&api, "wrong", path);
        assert_eq!(a.status, 401, "{path}: {}", a.text());
        let a = e2b(&api, &token, path);
        assert_eq!(a.status, 404, "{path}: {}", a.text());
        assert_eq!(a.json()["code"], 404);
    }
    for query in [
        "cursor=-1",
        "limit=1001",
        "direction=up",
        "level=fatal",
        "cursor=x",
    ] {
        let a = e2b(
            &api,
            &token,
            &format!("/e2b/v2/sandboxes/sb-none/logs?{query}"),
        );
        assert_eq!(a.status, 400, "{query}: {}", a.text());
        assert!(a.json()["message"].as_str().unwrap().contains("parameter"));
    }
    let a = e2b(&api, &token, "/e2b/sandboxes/sb-none/logs?start=soon");
    assert_eq!(a.status, 400, "{}", a.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn what_happens_to_a_sandbox_is_in_its_event_log() {
    if !qemu_guest_ready("what_happens_to_a_sandbox_is_in_its_event_log") {
        return;
    }
    let t0 = Instant::now();
    let scratch = Scratch::new();
    let (state, cleanup) = (&scratch.state, &scratch.cleanup);
    let args = ["--listen", "127.0.0.1:0", "--runtime", "qemu"];
    let d = start_daemon(state, &args);
    let c = d.client();
    let id = create(&c, json!({"image": "minimal"}), cleanup).await[0]
        .id
        .clone();
    step(t0, &format!("created {id}"));
    sh(&c, &id, "true").await.unwrap();
    assert!(sh(&c, &id, "exit 3").await.is_err());
    let bg: Value = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&json!({"argv": ["sleep", "1"], "background": true, "env": {"SECRET_X": "hunter2"}})),
        )
        .await
        .expect("background process");
    let _: Value = c
        .json(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/ttl"),
            Some(&json!({"ttl_secs": 3600})),
        )
        .await
        .expect("ttl");
    let _: Value = c
        .json(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/network"),
            Some(&json!({"deny_out": ["192.0.2.0/24"]})),
        )
        .await
        .expect("network");
    let snap: Value = c
        .json(
            Method::POST,
            "/v1/snapshots",
            Some(&json!({"sandbox": id, "name": "events-snap"})),
        )
        .await
        .expect("snapshot");
    let br: BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{id}/branch"),
            Some(&json!({"count": 1})),
        )
        .await
        .expect("branch");
    let child = br.children[0].clone();
    let _: Value = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{id}/pause"),
            Some(&json!({})),
        )
        .await
        .expect("pause");
    let _: Value = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{id}/resume"),
            Some(&json!({})),
        )
        .await
        .expect("resume");
    step(t0, "did everything once");

    let all = events(&c, &id, EventsQuery::default()).await;
    assert_eq!(
        messages(&all),
        [
            "sandbox started",
            "command started",
            "command ended",
            "command started",
            "command ended",
            "command started",
            "timeout changed",
            "network policy changed",
            "snapshot taken",
            "branched",
            "paused",
            "resumed",
        ],
        "{all:#?}"
    );
    let e = &all.events;
    assert!(e.windows(2).all(|w| w[0].ts_ms <= w[1].ts_ms));
    assert_eq!(e[0].fields["image"], "minimal");
    assert_eq!(e[2].fields["exit_code"], "0");
    assert_eq!(e[2].level, EventLevel::Info);
    assert_eq!(
        (e[4].fields["exit_code"].as_str(), e[4].level),
        ("3", EventLevel::Warn)
    );
    assert_eq!(e[3].fields["cmd"], r#"sh -c "exit 3""#);
    assert_eq!(e[5].fields["mode"], "background");
    assert_eq!(e[5].fields["pid"], bg["pid"].to_string());
    let text = serde_json::to_string(&all).unwrap();
    assert!(
        !text.contains("hunter2"),
        "a command's environment is never logged"
    );
    assert_eq!(e[6].fields["ttl_secs"], "3600");
    assert_eq!(e[7].fields["deny_out"], "192.0.2.0/24");
    assert_eq!(e[8].fields["snapshot"], snap["id"].as_str().unwrap());
    assert_eq!(e[9].fields["children"], child);
    assert_eq!(e[9].fields["branch_point"], br.branch_point);

    let kid = events(&c, &child, EventsQuery::default()).await;
    assert_eq!(
        messages(&kid),
        ["sandbox started"],
        "a child's log starts at the branch"
    );
    assert_eq!(kid.events[0].fields["parent"], id);

    // Filters.
    let warn = EventsQuery {
        level: Some(EventLevel::Warn),
        ..Default::default()
    };
    assert_eq!(messages(&events(&c, &id, warn).await), ["command ended"]);
    let newest = EventsQuery {
        order: Some(EventOrder::Desc),
        limit: Some(2),
        ..Default::default()
    };
    assert_eq!(
        messages(&events(&c, &id, newest).await),
        ["resumed", "paused"]
    );
    let search = EventsQuery {
        search: Some("snapshot".into()),
        ..Default::default()
    };
    assert_eq!(messages(&events(&c, &id, search).await), ["snapshot taken"]);
    let since = EventsQuery {
        since_ms: Some(e[10].ts_ms),
        ..Default::default()
    };
    let later = events(&c, &id, since).await;
    assert_eq!(messages(&later).first(), Some(&"paused"));

    // E2B's view: v2 newest first, v1 oldest first with text lines.
    let (api, token) = (hostport(&d.url), d.token());
    let v2 = e2b(
        &api,
        &token,
        &format!("/e2b/v2/sandboxes/{id}/logs?limit=3"),
    );
    assert_eq!(v2.status, 200, "{}", v2.text());
    let logs = v2.json()["logs"].as_array().unwrap().clone();
    let said: Vec<_> = logs
        .iter()
        .map(|l| l["message"].as_str().unwrap())
        .collect();
    assert_eq!(said, ["resumed", "paused", "branched"]);
    assert!(logs[0]["timestamp"].as_str().unwrap().ends_with('Z'));
    assert_eq!(logs[0]["level"], "info");
    let cursor = e[4].ts_ms;
    let fwd = e2b(
        &api,
        &token,
        &format!("/e2b/v2/sandboxes/{id}/logs?direction=forward&cursor={cursor}&level=warn"),
    );
    let fwd = fwd.json()["logs"].as_array().unwrap().clone();
    assert_eq!(fwd.len(), 1, "{fwd:?}");
    assert_eq!(fwd[0]["fields"]["exit_code"], "3");
    let v1 = e2b(&api, &token, &format!("/e2b/sandboxes/{id}/logs?limit=2"));
    let v1 = v1.json();
    let first = format!(
        "sandbox started boot_ms={} image=minimal",
        e[0].fields["boot_ms"]
    );
    assert_eq!(v1["logs"][0]["line"], first);
    assert_eq!(v1["logEntries"].as_array().map(Vec::len), Some(2));
    step(t0, "filters and E2B's views agree");

    // The log outlives the daemon, not the sandbox.
    drop(d);
    let d = start_daemon(state, &args);
    let c = d.client();
    let again = events(&c, &id, EventsQuery::default()).await;
    assert_eq!(again.events.len(), all.events.len());
    for sb in [&child, &id] {
        c.raw(Method::DELETE, &format!("/v1/sandboxes/{sb}"), None)
            .await
            .expect("delete");
    }
    match c.events(&id, &EventsQuery::default()).await {
        Err(ClientError::Api { status: 404, .. }) => {}
        other => panic!("a deleted sandbox's events: {other:?}"),
    }
    let left: Vec<_> = std::fs::read_dir(state.join("events"))
        .map(|r| r.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "event logs left: {left:?}");
    step(t0, "survived a restart, gone with the sandbox");
}
