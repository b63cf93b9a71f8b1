//! E2B's control plane (issue 35) over raw HTTP: the routes of list, set_timeout,
//! pause, fork, snapshots and update_network refuse a missing or wrong `X-API-Key`,
//! malformed bodies, bad limits, tokens and counts, and unknown ids with E2B's status
//! and body, while the daemon keeps serving; with qemu, the same routes work on real
//! sandboxes (pages with `x-next-token`, a fork's per-child entries, pause twice,
//! snapshots in use). The unchanged Python SDK is exercised by
//! sdk/e2b-compat/test_e2b_control.py (scripts/e2b-test.sh).
mod common;
#[path = "e2b_envd/wire.rs"]
#[allow(dead_code)] // the Connect helpers are the envd tests'
mod wire;

use std::time::Instant;

use serde_json::{json, Value};

use common::{qemu_guest_ready, start_daemon, step, Scratch};
use wire::{daemon_without_vms, hostport, http, Answer};

const INVALID_KEY: &str =
    "Invalid API key, please visit https://e2b.dev/docs/api-key for more information.";

/// Every route this slice adds, with a body it would take.
const ROUTES: &[(&str, &str, &str)] = &[
    ("GET", "/e2b/v2/sandboxes", ""),
    (
        "POST",
        "/e2b/sandboxes/sb-none/timeout",
        r#"{"timeout": 30}"#,
    ),
    ("POST", "/e2b/sandboxes/sb-none/pause", "{}"),
    ("PUT", "/e2b/sandboxes/sb-none/network", "{}"),
    ("POST", "/e2b/sandboxes/sb-none/fork", "{}"),
    ("POST", "/e2b/sandboxes/sb-none/snapshots", "{}"),
    ("GET", "/e2b/snapshots", ""),
    ("DELETE", "/e2b/templates/snap-none", ""),
];

fn call(api: &str, key: &str, method: &str, path: &str, body: &str) -> Answer {
    http(api, method, path, &[("X-API-Key", key)], body.as_bytes())
}

/// A 400 whose message contains `says`.
fn assert_400(a: &Answer, says: &str) {
    assert_eq!(a.status, 400, "{}", a.text());
    let v = a.json();
    assert_eq!(v["code"], 400);
    let msg = v["message"].as_str().unwrap();
    assert!(msg.contains(says), "{msg:?} does not say {says:?}");
    assert!(
        !msg.contains("/tmp") && !msg.contains("/var"),
        "a host path: {msg}"
    );
}

#[test]
fn e2b_control_refuses_bad_input_without_a_vm() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon_without_vms(tmp.path());
    let (api, token) = (hostport(&d.url), d.token());
    let bearer = format!("Bearer {token}");

    // No key, a wrong one, the daemon's Bearer form: E2B's 401 on every new route.
    for (method, path, body) in ROUTES {
        for headers in [
            vec![],
            vec![("X-API-Key", "wrong")],
            vec![("Authorization", bearer.as_str())],
        ] {
            let a = http(&api, method, path, &headers, body.as_bytes());
            assert_eq!(a.status, 401, "{method} {path} {headers:?}: {}", a.text());
            assert_eq!(a.json(), json!({"code": 401, "message": INVALID_KEY}));
        }
    }
    let call = |method: &str, path: &str, body: &str| call(&api, &token, method, path, body);

    // Unknown ids: E2B's 404s.
    let missing = "Sandbox \"sb-none\" doesn't exist or you don't have access to it";
    for (method, path, body) in &ROUTES[1..6] {
        let a = call(method, path, body);
        assert_eq!(a.status, 404, "{method} {path}: {}", a.text());
        assert_eq!(a.json(), json!({"code": 404, "message": missing}));
    }
    let a = call("DELETE", "/e2b/templates/snap-none", "");
    assert_eq!(
        a.json(),
        json!({"code": 404, "message": "template 'snap-none' not found"})
    );

    // Malformed and incomplete bodies.
    for path in ["timeout", "pause", "fork", "snapshots", "network"] {
        let method = if path == "network" { "PUT" } else { "POST" };
        let a = call(
            method,
            &format!("/e2b/sandboxes/sb-none/{path}"),
            "{\"x\": ",
        );
        assert_400(&a, "Error when parsing request: ");
    }
    assert_400(
        &call("POST", "/e2b/sandboxes/sb-none/timeout", "{}"),
        "missing field `timeout`",
    );
    assert_400(
        &call("POST", "/e2b/sandboxes/sb-none/fork", r#"{"count": "two"}"#),
        "Error when parsing request",
    );

    // Fork counts and timeouts, refused before the sandbox is looked up (as E2B's).
    for (body, says) in [
        (r#"{"count": 0}"#, "Count must be at least 1"),
        (r#"{"count": -3}"#, "Count must be at least 1"),
        (r#"{"count": 101}"#, "Count cannot be greater than 100"),
        (r#"{"timeout": 0}"#, "Timeout must be greater than 0"),
        (
            r#"{"timeout": 99999999}"#,
            "Timeout cannot be greater than 168 hours",
        ),
    ] {
        assert_400(&call("POST", "/e2b/sandboxes/sb-none/fork", body), says);
    }

    // The list: empty, one page, no token; then every bad parameter.
    let a = call("GET", "/e2b/v2/sandboxes", "");
    assert_eq!((a.status, a.json()), (200, json!([])), "{}", a.text());
    assert_eq!(a.header("x-next-token"), None, "the last page has no token");
    let a = call(
        "GET",
        "/e2b/v2/sandboxes?limit=100&state=running,paused&order=asc",
        "",
    );
    assert_eq!(a.status, 200, "{}", a.text());
    for (query, says) in [
        ("limit=0", "number must be at least 1"),
        ("limit=101", "number must be at most 100"),
        ("limit=-1", "number must be at least 1"),
        ("limit=ten", "an invalid integer"),
        ("state=dead", "not one of the allowed values"),
        ("state=running,", "not one of the allowed values"),
        ("order=up", "not one of the allowed values"),
        ("nextToken=bm90LWEtdG9rZW4", "Invalid next token"),
        ("nextToken=%21%21", "Invalid next token"),
        ("metadata=novalue", "Error parsing metadata"),
        ("metadata=a%3D1%3D2", "Error parsing metadata"),
        ("metadata=k%3D%25zz", "Error parsing metadata"),
        ("startedAfter=yesterday", "startedAfter"),
        ("template=python:3", "tags are not supported"),
    ] {
        assert_400(
            &call("GET", &format!("/e2b/v2/sandboxes?{query}"), ""),
            says,
        );
    }
    let a = call("GET", "/e2b/snapshots?sandboxID=sb-none&name=x", "");
    assert_eq!((a.status, a.json()), (200, json!([])), "{}", a.text());
    assert_400(&call("GET", "/e2b/snapshots?limit=0", ""), "at least 1");
    assert_400(
        &call("GET", "/e2b/snapshots?nextToken=xx", ""),
        "Invalid next token",
    );

    // Egress rules zygote cannot hold are refused at create, before any template lookup.
    let body = r#"{"templateID": "minimal", "network": {"allowOut": ["*.com"], "denyOut": ["0.0.0.0/0"]}}"#;
    assert_400(
        &call("POST", "/e2b/v2/sandboxes", body),
        "is not a name rule",
    );

    // And at update_network, before the id is looked up; `rules` is not served.
    for (body, says) in [
        (r#"{"allowOut": ["example.com"]}"#, "need denyOut"),
        (
            r#"{"denyOut": ["10.0.0.0/33"]}"#,
            "not an IPv4 address or CIDR",
        ),
        (r#"{"denyOut": "10.0.0.0/8"}"#, ""),
        (r#"{"rules": {"example.com": []}}"#, "not supported"),
    ] {
        assert_400(&call("PUT", "/e2b/sandboxes/sb-none/network", body), says);
    }

    // The daemon serves on, both APIs.
    let a = http(
        &api,
        "GET",
        "/v1/sandboxes",
        &[("Authorization", &bearer)],
        b"",
    );
    assert_eq!(a.status, 200);
    assert_eq!(call("GET", "/e2b/v2/sandboxes", "").status, 200);
}

#[test]
fn e2b_control_pages_forks_pauses_and_snapshots_real_sandboxes() {
    if !qemu_guest_ready("e2b_control_pages_forks_pauses_and_snapshots_real_sandboxes") {
        return;
    }
    let t0 = Instant::now();
    let scratch = Scratch::new();
    let d = start_daemon(
        &scratch.state,
        &["--listen", "127.0.0.1:0", "--runtime", "qemu"],
    );
    let (api, token) = (hostport(&d.url), d.token());
    let call = |method: &str, path: &str, body: &str| call(&api, &token, method, path, body);
    let create = |i: u32| {
        let body = json!({"templateID": "minimal", "timeout": 600, "metadata": {"suite": "ctl", "i": i.to_string()}});
        let a = call("POST", "/e2b/v2/sandboxes", &body.to_string());
        assert_eq!(a.status, 201, "{}", a.text());
        a.json()["sandboxID"].as_str().unwrap().to_string()
    };
    let ids: Vec<String> = (0..3).map(create).collect();
    step(t0, "three sandboxes");

    // One a page: three pages chained by x-next-token, each sandbox once; the last
    // page has no token; a token replayed under the other order is refused.
    for order in ["desc", "asc"] {
        let (mut seen, mut token) = (Vec::new(), None::<String>);
        loop {
            let mut q = format!("/e2b/v2/sandboxes?limit=1&order={order}&metadata=suite%3Dctl");
            if let Some(t) = &token {
                q.push_str(&format!("&nextToken={t}"));
            }
            let a = call("GET", &q, "");
            assert_eq!(a.status, 200, "{}", a.text());
            let page: Vec<Value> = serde_json::from_value(a.json()).unwrap();
            assert_eq!(page.len(), 1);
            assert_eq!(page[0]["state"], "running");
            assert_eq!(page[0]["metadata"]["suite"], "ctl");
            assert!(
                page[0].get("envdAccessToken").is_none(),
                "not in a listed sandbox"
            );
            seen.push(page[0]["sandboxID"].as_str().unwrap().to_string());
            token = a.header("x-next-token");
            if token.is_none() {
                break;
            }
            if order == "asc" {
                let other = format!("/e2b/v2/sandboxes?nextToken={}", token.as_ref().unwrap());
                assert_400(&call("GET", &other, ""), "Invalid next token");
            }
        }
        let mut sorted = seen.clone();
        sorted.sort();
        let mut want = ids.clone();
        want.sort();
        assert_eq!(sorted, want, "{order}: {seen:?}");
    }
    step(t0, "paged both ways");

    // Fork: one entry per child, each a Sandbox with its own id and token.
    let a = call(
        "POST",
        &format!("/e2b/sandboxes/{}/fork", ids[0]),
        r#"{"count": 2, "timeout": 600}"#,
    );
    assert_eq!(a.status, 201, "{}", a.text());
    let forks: Vec<Value> = serde_json::from_value(a.json()).unwrap();
    assert_eq!(forks.len(), 2, "{forks:?}");
    let children: Vec<String> = forks
        .iter()
        .map(|f| {
            f["sandbox"]["sandboxID"]
                .as_str()
                .expect("a started fork")
                .to_string()
        })
        .collect();
    assert_ne!(children[0], children[1]);
    assert!(!ids.contains(&children[0]));
    assert_ne!(
        forks[0]["sandbox"]["envdAccessToken"],
        forks[1]["sandbox"]["envdAccessToken"]
    );
    step(t0, "forked two children");

    // Pause: 204, then E2B's 409; a paused sandbox is not forked, snapshotted or
    // given a timeout; connect resumes it (201).
    let pause = format!("/e2b/sandboxes/{}/pause", ids[1]);
    assert_eq!(call("POST", &pause, "{}").status, 204);
    let a = call("POST", &pause, "{}");
    assert_eq!(a.status, 409, "{}", a.text());
    assert_eq!(
        a.json()["message"],
        format!(
            "Error pausing sandbox - sandbox '{}' is already paused",
            ids[1]
        )
    );
    let a = call("POST", &format!("/e2b/sandboxes/{}/fork", ids[1]), "{}");
    assert_eq!(a.status, 409, "{}", a.text());
    let a = call(
        "POST",
        &format!("/e2b/sandboxes/{}/snapshots", ids[1]),
        "{}",
    );
    assert_eq!(a.status, 409, "{}", a.text());
    let a = call(
        "POST",
        &format!("/e2b/sandboxes/{}/timeout", ids[1]),
        r#"{"timeout": 60}"#,
    );
    assert_eq!(a.status, 404, "{}", a.text());
    let a = call("GET", "/e2b/v2/sandboxes?state=paused", "");
    let paused: Vec<Value> = serde_json::from_value(a.json()).unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0]["sandboxID"], ids[1].as_str());
    let a = call(
        "POST",
        &format!("/e2b/v2/sandboxes/{}/connect", ids[1]),
        "{}",
    );
    assert_eq!(a.status, 201, "{}", a.text());
    step(t0, "paused, refused while paused, resumed");

    // set_timeout shortens; update_network replaces the rules (omitted = cleared).
    let a = call(
        "POST",
        &format!("/e2b/sandboxes/{}/timeout", ids[2]),
        r#"{"timeout": 40}"#,
    );
    assert_eq!(a.status, 204, "{}", a.text());
    let end = call("GET", &format!("/e2b/sandboxes/{}", ids[2]), "").json()["endAt"].clone();
    let a = call(
        "PUT",
        &format!("/e2b/sandboxes/{}/network", ids[2]),
        r#"{"denyOut": ["192.0.2.0/24"], "allowOut": ["192.0.2.7"]}"#,
    );
    assert_eq!(a.status, 204, "{}", a.text());
    let native = |id: &str| {
        let bearer = format!("Bearer {token}");
        let a = http(
            &api,
            "GET",
            &format!("/v1/sandboxes/{id}"),
            &[("Authorization", &bearer)],
            b"",
        );
        a.json()["network"].clone()
    };
    let net = native(&ids[2]);
    assert_eq!(net["allow_out"], json!([]), "{net}");
    let deny: Vec<String> = serde_json::from_value(net["deny_out"].clone()).unwrap();
    assert!(
        deny.contains(&"192.0.2.0/30".to_string()) && !deny.iter().any(|d| d.ends_with(".7/32")),
        "E2B's allow wins over its deny: {deny:?}"
    );
    let a = call("PUT", &format!("/e2b/sandboxes/{}/network", ids[2]), "{}");
    assert_eq!(a.status, 204, "{}", a.text());
    assert_eq!(native(&ids[2])["deny_out"], json!([]), "omitted = cleared");
    // Domain names: an allow list when everything else is denied; refused next to a
    // partial deny (zygote's deny wins: no named exception).
    let a = call(
        "PUT",
        &format!("/e2b/sandboxes/{}/network", ids[2]),
        r#"{"allow_internet_access": false, "allowOut": ["Example.com", "*.pypi.org"]}"#,
    );
    assert_eq!(a.status, 204, "{}", a.text());
    assert_eq!(
        native(&ids[2])["allow_out"],
        json!(["example.com", "*.pypi.org"])
    );
    assert_400(
        &call(
            "PUT",
            &format!("/e2b/sandboxes/{}/network", ids[2]),
            r#"{"denyOut": ["10.0.0.0/8"], "allowOut": ["example.com"]}"#,
        ),
        "need denyOut",
    );
    assert!(end.as_str().unwrap() < "9999", "a deadline: {end}");

    // Snapshots: 201, listed by sandbox, in use while its sandbox runs, then deleted.
    let a = call(
        "POST",
        &format!("/e2b/sandboxes/{}/snapshots", ids[2]),
        r#"{"name": "ctl-snap"}"#,
    );
    assert_eq!(a.status, 201, "{}", a.text());
    let snap = a.json();
    assert_eq!(snap["names"], json!(["ctl-snap"]));
    let snap_id = snap["snapshotID"].as_str().unwrap().to_string();
    let a = call("GET", &format!("/e2b/snapshots?sandboxID={}", ids[2]), "");
    assert_eq!(
        a.json(),
        json!([{"snapshotID": snap_id, "names": ["ctl-snap"]}])
    );
    let a = call("GET", "/e2b/snapshots", "");
    let all: Vec<Value> = serde_json::from_value(a.json()).unwrap();
    assert_eq!(
        all.len(),
        1,
        "the fork's branch point is not listed: {all:?}"
    );
    let delete = format!("/e2b/templates/{snap_id}");
    assert_400(&call("DELETE", &delete, ""), "running sandboxes using it");
    assert_eq!(
        call("DELETE", &format!("/e2b/sandboxes/{}", ids[2]), "").status,
        204
    );
    assert_eq!(call("DELETE", &delete, "").status, 204);
    assert_eq!(call("DELETE", &delete, "").status, 404);
    step(t0, "snapshot made, listed, refused in use, deleted");

    for id in ids[..2].iter().chain(&children) {
        assert_eq!(
            call("DELETE", &format!("/e2b/sandboxes/{id}"), "").status,
            204
        );
    }
    let a = call("GET", "/e2b/v2/sandboxes", "");
    assert_eq!(a.json(), json!([]), "killed sandboxes are not listed");
}
