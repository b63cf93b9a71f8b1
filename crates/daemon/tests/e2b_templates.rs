//! E2B's template API (issue 35) over raw HTTP: unknown templates and builds are 404s,
//! malformed requests and steps 400s, the upload URL is one-time, expiring and needs no
//! API key but refuses oversize bodies and hostile archives (`../`, absolute names,
//! symlinks out of the tree); with qemu, an upload that does not match its filesHash
//! fails its COPY step, and a daemon killed mid-build leaves the build `error` and no
//! sandbox or snapshot behind. The unchanged Python SDK is exercised by
//! sdk/e2b-compat/test_e2b_template.py (scripts/e2b-test.sh).
mod common;
#[path = "e2b_envd/wire.rs"]
#[allow(dead_code)] // the Connect helpers are the envd tests'
mod wire;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::{qemu_guest_ready, start_daemon_with_env, step, Scratch};
use wire::{hostport, http, Answer};

const HASH: &str = "0000000000000000000000000000000000000000000000000000000000000001";

fn call(api: &str, key: &str, method: &str, path: &str, body: &str) -> Answer {
    http(api, method, path, &[("X-API-Key", key)], body.as_bytes())
}

/// A status and an E2B error body whose message says `says` (and no host path).
fn assert_error(a: &Answer, status: u16, says: &str) {
    assert_eq!(a.status, status, "{}", a.text());
    let v = a.json();
    assert_eq!(v["code"], status);
    let msg = v["message"].as_str().unwrap();
    assert!(msg.contains(says), "{msg:?} does not say {says:?}");
    assert!(!msg.contains("/tmp/"), "a host path: {msg}");
}

/// A tar of `(name, kind, data)`: `f` a file, `d` a directory, `l` a symlink to data.
/// Names are written raw (the builder itself refuses `..` and absolute ones).
fn tar_of(entries: &[(&str, char, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        let body: &[u8] = match kind {
            'd' => {
                h.set_entry_type(tar::EntryType::Directory);
                b""
            }
            'l' => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_link_name(data).unwrap();
                b""
            }
            _ => {
                h.set_entry_type(tar::EntryType::Regular);
                data.as_bytes()
            }
        };
        h.set_size(body.len() as u64);
        let field = &mut h.as_old_mut().name;
        field.fill(0);
        field[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
        b.append(&h, body).unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// A new `waiting` build of `name`: (templateID, buildID).
fn request_build(api: &str, key: &str, name: &str) -> (String, String) {
    let a = call(
        api,
        key,
        "POST",
        "/e2b/v3/templates",
        &json!({"name": name}).to_string(),
    );
    assert_eq!(a.status, 202, "{}", a.text());
    let v = a.json();
    assert_eq!(v["names"], json!([name]));
    assert_eq!(v["tags"], json!(["default"]));
    (
        v["templateID"].as_str().unwrap().to_string(),
        v["buildID"].as_str().unwrap().to_string(),
    )
}

/// The upload URL's path for `hash` of template `tpl`.
fn upload_url(api: &str, key: &str, tpl: &str, hash: &str) -> String {
    let a = call(
        api,
        key,
        "GET",
        &format!("/e2b/templates/{tpl}/files/{hash}"),
        "",
    );
    assert_eq!(a.status, 201, "{}", a.text());
    assert_eq!(a.json()["present"], false);
    let url = a.json()["url"].as_str().unwrap().to_string();
    let path = url.split_once(api).map(|(_, p)| p.to_string());
    path.unwrap_or_else(|| panic!("{url} is not on {api}"))
}

fn put(api: &str, path: &str, body: &[u8]) -> Answer {
    http(api, "PUT", path, &[], body)
}

#[test]
fn e2b_templates_refuse_bad_input_without_a_vm() {
    let tmp = tempfile::tempdir().unwrap();
    let cg = tmp.path().join("cg");
    std::fs::create_dir_all(&cg).unwrap();
    std::fs::write(cg.join("cgroup.controllers"), "").unwrap();
    let d = start_daemon_with_env(
        &tmp.path().join("state"),
        &[
            "--listen",
            "127.0.0.1:0",
            "--cgroup-root",
            &cg.display().to_string(),
        ],
        &[("ZYGOTE_E2B_UPLOAD_URL_TTL_SECS", "2")],
    );
    let (api, key) = (hostport(&d.url), d.token());
    let call = |method: &str, path: &str, body: &str| call(&api, &key, method, path, body);

    // Without the API key: E2B's 401 on the template routes.
    let a = http(&api, "POST", "/e2b/v3/templates", &[], br#"{"name":"x"}"#);
    assert_eq!(a.status, 401, "{}", a.text());

    // Unknown templates and builds: 404s.
    for (method, path, body, says) in [
        (
            "GET",
            "/e2b/templates/nope/builds/b/status",
            "",
            "not found",
        ),
        (
            "POST",
            "/e2b/v2/templates/nope/builds/b",
            r#"{"fromImage":"minimal"}"#,
            "not found",
        ),
        (
            "GET",
            &format!("/e2b/templates/nope/files/{HASH}"),
            "",
            "'nope' not found",
        ),
        ("GET", "/e2b/templates/aliases/nope", "", "'nope' not found"),
        ("GET", "/e2b/templates/nope/tags", "", "'nope' not found"),
        (
            "DELETE",
            "/e2b/templates/tags",
            r#"{"name":"nope","tags":["a"]}"#,
            "not found",
        ),
        (
            "POST",
            "/e2b/templates/tags",
            r#"{"target":"nope:x","tags":["a"]}"#,
            "not found",
        ),
        ("DELETE", "/e2b/templates/nope", "", "not found"),
    ] {
        assert_error(&call(method, path, body), 404, says);
    }

    // Malformed build requests.
    assert_error(
        &call("POST", "/e2b/v3/templates", "{}"),
        400,
        "name is required",
    );
    assert_error(&call("POST", "/e2b/v3/templates", "{nope"), 400, "parsing");
    let bad_name = json!({"name": "a/b"}).to_string();
    assert_error(
        &call("POST", "/e2b/v3/templates", &bad_name),
        400,
        "invalid template name",
    );
    for size in [
        json!({"cpuCount": 0}),
        json!({"cpuCount": 999}),
        json!({"memoryMB": 1}),
    ] {
        let mut body = size.clone();
        body["name"] = json!("ok");
        let a = call("POST", "/e2b/v3/templates", &body.to_string());
        assert_error(&a, 400, "cpuCount must be 1 to");
    }
    let bad_tag = json!({"name": "ok", "tags": ["a b"]}).to_string();
    assert_error(
        &call("POST", "/e2b/v3/templates", &bad_tag),
        400,
        "invalid tag",
    );

    let (tpl, build) = request_build(&api, &key, "bad-input");
    let start = format!("/e2b/v2/templates/{tpl}/builds/{build}");
    assert_error(
        &call(
            "GET",
            &format!("/e2b/templates/{tpl}/builds/nope/status"),
            "",
        ),
        404,
        "not found",
    );
    let status = call(
        "GET",
        &format!("/e2b/templates/{tpl}/builds/{build}/status"),
        "",
    );
    assert_eq!(status.status, 200, "{}", status.text());
    assert_eq!(status.json()["status"], "waiting");

    // Malformed steps: 400 before anything runs, and the build can still start.
    for (body, says) in [
        (json!({"steps": []}), "fromImage or fromTemplate"),
        (
            json!({"fromImage": "minimal", "fromImageRegistry": {"type": "registry", "username": "u", "password": "p"}}),
            "fromImageRegistry",
        ),
        (
            json!({"fromImage": "minimal", "steps": [{"type": "EXPLODE", "args": []}]}),
            "unknown type",
        ),
        (
            json!({"fromImage": "minimal", "steps": [{"type": "RUN", "args": []}]}),
            "takes 1 to 2",
        ),
        (
            json!({"fromImage": "minimal", "steps": [{"type": "ENV", "args": ["A", "1", "B"]}]}),
            "pairs",
        ),
        (
            json!({"fromImage": "minimal", "steps": [{"type": "ENV", "args": ["A=B", "1"]}]}),
            "pairs",
        ),
        (
            json!({"fromImage": "minimal", "steps": [{"type": "USER", "args": ["a", "b"]}]}),
            "takes 1 to 1",
        ),
        (
            json!({"fromImage": "minimal", "steps": [{"type": "COPY", "args": ["x", "/x"], "filesHash": HASH}]}),
            "were not uploaded",
        ),
        (
            json!({"fromImage": "minimal", "steps": [{"type": "RUN", "args": ["a\u{0}b"]}]}),
            "NUL",
        ),
        (json!({"fromImage": "minimal", "steps": "RUN"}), "parsing"),
    ] {
        assert_error(&call("POST", &start, &body.to_string()), 400, says);
    }

    // Uploads: a bad hash; then a URL that needs no key, works once, and expires.
    assert_error(
        &call("GET", &format!("/e2b/templates/{tpl}/files/xyz"), ""),
        400,
        "64 lowercase hex",
    );
    let ok = gzip(&tar_of(&[
        ("data/", 'd', ""),
        ("data/a.txt", 'f', "hi"),
        ("data/l", 'l', "a.txt"),
    ]));
    let path = upload_url(&api, &key, &tpl, HASH);
    assert!(
        path.starts_with("/e2b/_uploads/") && path.len() > 60,
        "{path}"
    );
    let a = put(&api, &path, &ok);
    assert_eq!(a.status, 200, "{}", a.text());
    assert_error(&put(&api, &path, &ok), 403, "was used already");
    let a = call("GET", &format!("/e2b/templates/{tpl}/files/{HASH}"), "");
    assert_eq!(
        (a.status, a.json()["present"].clone()),
        (201, json!(true)),
        "{}",
        a.text()
    );
    let guessed = format!("/e2b/_uploads/{}", "ab".repeat(32));
    assert_error(&put(&api, &guessed, &ok), 403, "unknown");
    assert_error(&put(&api, "/e2b/_uploads/short", &ok), 403, "unknown");
    let other = HASH.replace('1', "2");
    let expiring = upload_url(&api, &key, &tpl, &other);
    std::thread::sleep(Duration::from_millis(3200));
    assert_error(&put(&api, &expiring, &ok), 403, "expired");

    // Oversize: refused on its declared length, before the body is read.
    let big = upload_url(&api, &key, &tpl, &other);
    let a = declared_only(&api, &big, 300 << 20);
    assert_eq!(a.0, 413, "{}", a.1);
    assert!(
        a.1.contains("too large") || a.1.contains("larger"),
        "{}",
        a.1
    );

    // Hostile archives: refused, nothing kept.
    for (entries, says) in [
        (vec![("../evil", 'f', "x")], "'..'"),
        (vec![("data/../../evil", 'f', "x")], "'..'"),
        (vec![("/etc/evil", 'f', "x")], "absolute"),
        (vec![("l", 'l', "/etc")], "leaves the copied tree"),
        (vec![("d/l", 'l', "../../etc")], "leaves the copied tree"),
        (vec![("l", 'l', "d"), ("l/x", 'f', "x")], "under a symlink"),
    ] {
        let path = upload_url(&api, &key, &tpl, &other);
        assert_error(&put(&api, &path, &gzip(&tar_of(&entries))), 400, says);
        let a = call("GET", &format!("/e2b/templates/{tpl}/files/{other}"), "");
        assert_eq!(a.json()["present"], false, "{entries:?} was kept");
    }
    let path = upload_url(&api, &key, &tpl, &other);
    assert_error(
        &put(&api, &path, b"not a tar at all"),
        400,
        "not a valid tar",
    );

    // The daemon still serves, and the request is still waiting.
    let status = call(
        "GET",
        &format!("/e2b/templates/{tpl}/builds/{build}/status"),
        "",
    );
    assert_eq!(status.json()["status"], "waiting", "{}", status.text());
}

/// A PUT that declares `len` bytes and sends none: (status, body).
fn declared_only(api: &str, path: &str, len: u64) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(api).unwrap();
    let req = format!(
        "PUT {path} HTTP/1.1\r\nHost: {api}\r\nConnection: close\r\nContent-Length: {len}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

fn wait_build(api: &str, key: &str, tpl: &str, build: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let a = call(
            api,
            key,
            "GET",
            &format!("/e2b/templates/{tpl}/builds/{build}/status"),
            "",
        );
        assert_eq!(a.status, 200, "{}", a.text());
        let v = a.json();
        if v["status"] == "ready" || v["status"] == "error" {
            return v;
        }
        assert!(Instant::now() < deadline, "build still {}", v["status"]);
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn native_count(api: &str, key: &str, what: &str) -> usize {
    let bearer = format!("Bearer {key}");
    let a = http(
        api,
        "GET",
        &format!("/v1/{what}"),
        &[("Authorization", &bearer)],
        b"",
    );
    a.json()[what].as_array().map_or(0, |v| v.len())
}

#[test]
fn e2b_template_builds_fail_safely_on_real_sandboxes() {
    if !qemu_guest_ready("e2b_template_builds_fail_safely_on_real_sandboxes") {
        return;
    }
    let t0 = Instant::now();
    let scratch = Scratch::new();
    let args = ["--listen", "127.0.0.1:0", "--runtime", "qemu"];
    let d = start_daemon_with_env(&scratch.state, &args, &[]);
    let (api, key) = (hostport(&d.url), d.token());

    // An upload that is a valid archive but not what its filesHash says: the COPY step
    // fails, the build is `error` with the step, and its sandbox is gone.
    let (tpl, build) = request_build(&api, &key, "mismatch");
    let path = upload_url(&api, &key, &tpl, HASH);
    assert_eq!(
        put(&api, &path, &tar_of(&[("f.txt", 'f', "x")])).status,
        200
    );
    let steps = json!({"fromImage": "minimal", "steps": [
        {"type": "COPY", "args": ["f.txt", "/f.txt", "", ""], "filesHash": HASH}]});
    let a = call(
        &api,
        &key,
        "POST",
        &format!("/e2b/v2/templates/{tpl}/builds/{build}"),
        &steps.to_string(),
    );
    assert_eq!(a.status, 202, "{}", a.text());
    let v = wait_build(&api, &key, &tpl, &build);
    assert_eq!(v["status"], "error", "{v}");
    assert_eq!(v["reason"]["step"], "1", "{v}");
    let msg = v["reason"]["message"].as_str().unwrap();
    assert!(msg.contains("do not match their filesHash"), "{msg}");
    assert_eq!(native_count(&api, &key, "sandboxes"), 0);
    assert_eq!(native_count(&api, &key, "snapshots"), 0);
    step(t0, "mismatched upload refused at its COPY step");
    drop(d);

    // Killed right after a step's snapshot, before the cache names it: after a restart
    // the build is `error` and neither its sandbox nor the snapshot is left.
    let fault = [("ZYGOTE_FAULT", "template-build.snapshotted")];
    let d = start_daemon_with_env(&scratch.state, &args, &fault);
    let (api, key) = (hostport(&d.url), d.token());
    let (tpl, build) = request_build(&api, &key, "crash");
    let steps = json!({"fromImage": "minimal", "steps": [{"type": "WORKDIR", "args": ["/work"]}]});
    let a = call(
        &api,
        &key,
        "POST",
        &format!("/e2b/v2/templates/{tpl}/builds/{build}"),
        &steps.to_string(),
    );
    assert_eq!(a.status, 202, "{}", a.text());
    let pid = d.pid();
    let deadline = Instant::now() + Duration::from_secs(600);
    while std::path::Path::new(&format!("/proc/{pid}/stat")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z")
    {
        assert!(
            Instant::now() < deadline,
            "the daemon never reached the fault point"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    d.kill9();
    step(t0, "daemon killed after the step's snapshot");
    let d = start_daemon_with_env(&scratch.state, &args, &[]);
    let (api, key) = (hostport(&d.url), d.token());
    let v = wait_build(&api, &key, &tpl, &build);
    assert_eq!(v["status"], "error", "{v}");
    assert!(
        v["reason"]["message"]
            .as_str()
            .unwrap()
            .contains("interrupted"),
        "{v}"
    );
    assert_eq!(native_count(&api, &key, "sandboxes"), 0);
    assert_eq!(native_count(&api, &key, "snapshots"), 0);
    step(t0, "restart: build error, nothing left behind");
}
