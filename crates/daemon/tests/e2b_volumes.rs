//! E2B's volumes (issue 35) over raw HTTP: `/e2b/volumes` needs the API key; the
//! volume content API (`/e2b/volumecontent/...`) takes only the volume's own token
//! (never the daemon's, never another volume's) with E2B's error bodies; bad names and
//! mount paths are 400s. With qemu: a content call on a volume no sandbox has boots a
//! helper sandbox that holds it; deleting the volume (or a create naming it) removes
//! the helper first, and a daemon killed while a helper runs deletes it on restart.
//! The unchanged Python SDK is exercised by sdk/e2b-compat/test_e2b_volumes.py.
mod common;
#[path = "e2b_envd/wire.rs"]
#[allow(dead_code)] // the Connect helpers are the envd tests'
mod wire;

use serde_json::{json, Value};

use common::{qemu_guest_ready, start_daemon, Scratch};
use wire::{daemon_without_vms, hostport, http, Answer};

fn call(api: &str, key: &str, method: &str, path: &str, body: &str) -> Answer {
    http(api, method, path, &[("X-API-Key", key)], body.as_bytes())
}

fn content(api: &str, token: &str, method: &str, path: &str, body: &[u8]) -> Answer {
    let bearer = format!("Bearer {token}");
    http(
        api,
        method,
        path,
        &[("Authorization", bearer.as_str())],
        body,
    )
}

#[test]
fn e2b_volumes_refuse_bad_input_and_foreign_tokens_without_a_vm() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon_without_vms(tmp.path());
    let (api, token) = (hostport(&d.url), d.token());

    // The control routes need the API key.
    for (method, path) in [
        ("GET", "/e2b/volumes"),
        ("POST", "/e2b/volumes"),
        ("GET", "/e2b/volumes/vol-x"),
        ("DELETE", "/e2b/volumes/vol-x"),
    ] {
        let a = http(
            &api,
            method,
            path,
            &[("X-API-Key", "wrong")],
            b"{\"name\":\"a\"}",
        );
        assert_eq!(a.status, 401, "{method} {path}: {}", a.text());
        assert_eq!(a.json()["code"], 401);
    }
    // Bad names and bodies: E2B's 400 shape.
    for body in [
        r#"{"name": ""}"#,
        r#"{"name": "a/b"}"#,
        r#"{"name": "-a"}"#,
        r#"{"x": "#,
        "{}",
    ] {
        let a = call(&api, &token, "POST", "/e2b/volumes", body);
        assert_eq!(a.status, 400, "{body}: {}", a.text());
        assert_eq!(a.json()["code"], 400);
    }
    for (method, path) in [
        ("GET", "/e2b/volumes/vol-none"),
        ("DELETE", "/e2b/volumes/vol-none"),
    ] {
        let a = call(&api, &token, method, path, "");
        assert_eq!(a.status, 404, "{method} {path}: {}", a.text());
        assert_eq!(
            a.json(),
            json!({"code": 404, "message": "volume 'vol-none' not found"})
        );
    }

    let made = |name: &str| -> Value {
        let a = call(
            &api,
            &token,
            "POST",
            "/e2b/volumes",
            &format!(r#"{{"name": "{name}"}}"#),
        );
        assert_eq!(a.status, 201, "{}", a.text());
        a.json()
    };
    let (a, b) = (made("vol-a"), made("vol-b"));
    let (a_id, a_token) = (
        a["volumeID"].as_str().unwrap(),
        a["token"].as_str().unwrap(),
    );
    let b_token = b["token"].as_str().unwrap();
    assert_ne!(a_token, token, "a volume token is never the daemon's");
    assert_ne!(a_token, b_token);
    let dup = call(&api, &token, "POST", "/e2b/volumes", r#"{"name": "vol-a"}"#);
    assert_eq!(dup.status, 409, "{}", dup.text());
    let got = call(&api, &token, "GET", &format!("/e2b/volumes/{a_id}"), "");
    assert_eq!(got.json(), a);
    let listed = call(&api, &token, "GET", "/e2b/volumes", "").json();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v.get("token").is_none()),
        "{listed}"
    );

    // The content API: only volume a's token opens volume a, on every route; unknown
    // volumes answer the same 401 (no way to tell which ids exist).
    for (method, route) in [
        ("GET", "file"),
        ("PUT", "file"),
        ("GET", "dir"),
        ("POST", "dir"),
        ("GET", "path"),
        ("PATCH", "path"),
        ("DELETE", "path"),
    ] {
        let path = format!("/e2b/volumecontent/{a_id}/{route}?path=/x");
        for wrong in ["", "nope", b_token, token.as_str()] {
            let r = content(&api, wrong, method, &path, b"{}");
            assert_eq!(
                r.status,
                401,
                "{method} {route} with {wrong:?}: {}",
                r.text()
            );
            assert_eq!(
                r.json(),
                json!({"code": 401, "message": "invalid or missing volume token"})
            );
        }
        let none = format!("/e2b/volumecontent/vol-none/{route}?path=/x");
        let r = content(&api, a_token, method, &none, b"{}");
        assert_eq!(r.status, 401, "{}", r.text());
    }

    // Mount paths E2B would never mount: 400 before anything boots.
    for path in ["/", "rel", "/proc/x", "/a/../b"] {
        let body = json!({"templateID": "base", "volumeMounts": [{"name": "vol-a", "path": path}]});
        let r = call(&api, &token, "POST", "/e2b/v2/sandboxes", &body.to_string());
        assert_eq!(r.status, 400, "{path}: {}", r.text());
    }
    let body = json!({"templateID": "base", "volumeMounts": [{"name": "nope", "path": "/d"}]});
    let r = call(&api, &token, "POST", "/e2b/v2/sandboxes", &body.to_string());
    assert_eq!(
        r.json(),
        json!({"code": 404, "message": "volume 'nope' not found"})
    );

    for v in [&a, &b] {
        let path = format!("/e2b/volumes/{}", v["volumeID"].as_str().unwrap());
        assert_eq!(call(&api, &token, "DELETE", &path, "").status, 204);
    }
    assert_eq!(
        call(&api, &token, "GET", "/e2b/volumes", "").json(),
        json!([])
    );
}

/// The sandboxes the daemon lists (helpers included).
fn sandboxes(api: &str, token: &str) -> Vec<Value> {
    let bearer = format!("Bearer {token}");
    let a = http(
        api,
        "GET",
        "/v1/sandboxes",
        &[("Authorization", bearer.as_str())],
        b"",
    );
    a.json()["sandboxes"].as_array().unwrap().clone()
}

#[test]
fn a_content_call_boots_a_helper_that_goes_with_the_volume_or_the_daemon() {
    if !qemu_guest_ready("a_content_call_boots_a_helper_that_goes_with_the_volume_or_the_daemon") {
        return;
    }
    let scratch = Scratch::new();
    let d = start_daemon(
        &scratch.state,
        &["--runtime", "qemu", "--listen", "127.0.0.1:0"],
    );
    let (api, token) = (hostport(&d.url), d.token());
    let made = call(&api, &token, "POST", "/e2b/volumes", r#"{"name": "h"}"#).json();
    let (id, vtoken) = (
        made["volumeID"].as_str().unwrap().to_string(),
        made["token"].as_str().unwrap().to_string(),
    );
    let file = format!("/e2b/volumecontent/{id}/file?path=/greeting");

    // Detached: a helper sandbox (labelled, no network) serves the call and holds it.
    let w = content(&api, &vtoken, "PUT", &file, b"hello");
    assert_eq!(w.status, 201, "{}", w.text());
    assert_eq!(w.json()["size"], 5);
    assert_eq!(content(&api, &vtoken, "GET", &file, b"").body, b"hello");
    let helpers = sandboxes(&api, &token);
    assert_eq!(helpers.len(), 1, "{helpers:?}");
    assert_eq!(helpers[0]["metadata"]["zygote.volume-helper"], json!(id));
    let held = call(&api, &token, "GET", &format!("/v1/volumes/{id}"), "");
    let bearer = format!("Bearer {token}");
    let native = http(
        &api,
        "GET",
        &format!("/v1/volumes/{id}"),
        &[("Authorization", bearer.as_str())],
        b"",
    );
    assert_eq!(
        native.json()["attached_to"],
        helpers[0]["id"],
        "{}",
        held.text()
    );
    // Paths stay under the volume.
    let up = content(
        &api,
        &vtoken,
        "GET",
        &format!("/e2b/volumecontent/{id}/file?path=/../etc/passwd"),
        b"",
    );
    assert_eq!(up.status, 400, "{}", up.text());
    let missing = content(
        &api,
        &vtoken,
        "GET",
        &format!("/e2b/volumecontent/{id}/path?path=/nope"),
        b"",
    );
    assert_eq!(
        missing.json(),
        json!({"code": 404, "message": "path '/nope' not found"})
    );

    // A daemon killed while the helper runs: the next one deletes the helper and the
    // volume is free again.
    d.kill9();
    let d = start_daemon(
        &scratch.state,
        &["--runtime", "qemu", "--listen", "127.0.0.1:0"],
    );
    let (api, token) = (hostport(&d.url), d.token());
    assert_eq!(sandboxes(&api, &token), Vec::<Value>::new());
    let bearer = format!("Bearer {token}");
    let native = http(
        &api,
        "GET",
        &format!("/v1/volumes/{id}"),
        &[("Authorization", bearer.as_str())],
        b"",
    );
    assert_eq!(native.json()["attached_to"], Value::Null);

    // A new helper; deleting the volume deletes it first.
    assert_eq!(content(&api, &vtoken, "GET", &file, b"").body, b"hello");
    assert_eq!(sandboxes(&api, &token).len(), 1);
    assert_eq!(
        call(&api, &token, "DELETE", &format!("/e2b/volumes/{id}"), "").status,
        204
    );
    assert_eq!(sandboxes(&api, &token), Vec::<Value>::new());
    drop(d);
}
