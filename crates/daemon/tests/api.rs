//! The API without booting VMs: auth, input validation (always 4xx with the
//! JSON error shape), listeners (TCP, TLS, Unix socket), the served OpenAPI
//! document and info.
mod common;

use std::os::unix::fs::PermissionsExt;

use bytes::Bytes;
use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::{Client, ClientError};

use common::start_daemon;

fn fake_cgroups(dir: &std::path::Path) -> String {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("cgroup.controllers"), "").unwrap();
    dir.display().to_string()
}

async fn status_code(c: &Client, method: Method, path: &str, body: Option<&str>) -> (u16, String) {
    let body = body.map(|b| (Bytes::from(b.to_string()), "application/json"));
    let resp = c.send(method, path, body).await.expect("request");
    let status = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let v: Value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("{path}: not JSON: {}", String::from_utf8_lossy(&bytes)));
    let code = v["error"]["code"].as_str().unwrap_or("").to_string();
    if status >= 400 {
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
    }
    (status, code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_validation_and_documents() {
    let tmp = tempfile::tempdir().unwrap();
    let cg = fake_cgroups(&tmp.path().join("cg"));
    let d = start_daemon(
        &tmp.path().join("state"),
        &["--listen", "127.0.0.1:0", "--cgroup-root", &cg],
    );
    let mode = std::fs::metadata(d.state.join("token"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "token file mode {mode:o}");

    // Public routes, then auth.
    let anon = Client::new(&d.url, None).unwrap();
    let health: Value = anon
        .json(Method::GET, "/healthz", None::<&()>)
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    let doc: Value = anon
        .json(Method::GET, "/v1/openapi.json", None::<&()>)
        .await
        .unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    assert!(doc["paths"]["/v1/sandboxes/{id}/branch"]["post"].is_object());
    assert!(doc["paths"]["/v1/sandboxes/{id}/ttl"]["put"].is_object());
    for field in ["ttl_secs", "expires_at"] {
        assert!(
            doc["components"]["schemas"]["Sandbox"]["properties"][field].is_object(),
            "Sandbox.{field} documented"
        );
    }
    for c in [&anon, &Client::new(&d.url, Some("wrong".into())).unwrap()] {
        assert_eq!(
            status_code(c, Method::GET, "/v1/info", None).await,
            (401, "unauthorized".into())
        );
        assert_eq!(status_code(c, Method::GET, "/metrics", None).await.0, 401);
        assert_eq!(
            status_code(
                c,
                Method::POST,
                "/v1/sandboxes",
                Some(r#"{"image":"minimal"}"#)
            )
            .await
            .0,
            401
        );
    }

    let c = d.client();
    let info: Value = c.json(Method::GET, "/v1/info", None::<&()>).await.unwrap();
    // kvm where the host has hardware virtualization, else qemu with the reason.
    if info["runtime"]["name"] != "kvm" {
        assert_eq!(info["runtime"]["name"], "qemu", "{info}");
        assert!(
            info["runtime"]["unavailable"]["kvm"]
                .as_str()
                .is_some_and(|r| !r.is_empty()),
            "{info}"
        );
    }
    assert!(
        info["cgroups"]["limitations"][0]
            .as_str()
            .is_some_and(|l| l.contains("controller")),
        "{info}"
    );

    // Bad input: 4xx with a stable code, never a 5xx.
    let cases: &[(Method, &str, Option<&str>, u16, &str)] = &[
        (
            Method::POST,
            "/v1/sandboxes",
            Some("{"),
            400,
            "malformed_body",
        ),
        (
            Method::POST,
            "/v1/sandboxes",
            Some("[1,2]"),
            400,
            "malformed_body",
        ),
        (
            Method::POST,
            "/v1/sandboxes",
            Some(r#"{"image":"minimal","bogus":1}"#),
            400,
            "malformed_body",
        ),
        (
            Method::POST,
            "/v1/sandboxes",
            Some(r#"{"image":"minimal","n":0}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/sandboxes",
            Some(r#"{"image":"minimal","n":100000}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/sandboxes",
            Some(r#"{"image":"minimal","mem_mib":1}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/sandboxes",
            Some(r#"{"image":"minimal","name":"Bad Name"}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/sandboxes",
            Some(r#"{"image":"minimal","limits":{"pids":1}}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/sandboxes",
            Some(r#"{}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/sandboxes",
            Some(r#"{"image":"minimal","ttl_secs":0}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/sandboxes",
            Some(r#"{"image":"minimal","ttl_secs":604801}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::PUT,
            "/v1/sandboxes/sb-none/ttl",
            Some(r#"{"ttl_secs":0}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::PUT,
            "/v1/sandboxes/sb-none/ttl",
            Some(r#"{}"#),
            400,
            "malformed_body",
        ),
        (
            Method::PUT,
            "/v1/sandboxes/sb-none/ttl",
            Some(r#"{"ttl_secs":null}"#),
            404,
            "not_found",
        ),
        (
            Method::PUT,
            "/v1/sandboxes/sb-none/ttl",
            Some(r#"{"ttl_secs":60}"#),
            404,
            "not_found",
        ),
        (
            Method::POST,
            "/v1/sandboxes/sb-none/branch",
            Some(r#"{"ttl_secs":0}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/sandboxes",
            Some(r#"{"snapshot":"snap-none"}"#),
            404,
            "not_found",
        ),
        (
            Method::POST,
            "/v1/sandboxes",
            Some(r#"{"image":"no-such-image-here"}"#),
            404,
            "not_found",
        ),
        (Method::GET, "/v1/sandboxes/sb-none", None, 404, "not_found"),
        (
            Method::DELETE,
            "/v1/sandboxes/sb-none",
            None,
            404,
            "not_found",
        ),
        (
            Method::POST,
            "/v1/sandboxes/sb-none/exec",
            Some(r#"{"argv":[]}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/sandboxes/sb-none/exec",
            Some(r#"{"argv":["ls"],"cwd":"tmp"}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/sandboxes/sb-none/exec",
            Some(r#"{"argv":["ls"],"timeout_ms":0}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/sandboxes/sb-none/exec",
            Some(r#"{"argv":["ls"]}"#),
            404,
            "not_found",
        ),
        (
            Method::POST,
            "/v1/sandboxes/sb-none/exec/stream",
            Some(r#"{"argv":"ls"}"#),
            400,
            "malformed_body",
        ),
        (
            Method::GET,
            "/v1/sandboxes/sb-none/files?path=relative",
            None,
            400,
            "invalid_argument",
        ),
        (
            Method::GET,
            "/v1/sandboxes/sb-none/files",
            None,
            400,
            "invalid_argument",
        ),
        (
            Method::GET,
            "/v1/sandboxes/sb-none/files?path=/etc/hostname",
            None,
            404,
            "not_found",
        ),
        (
            Method::POST,
            "/v1/sandboxes/sb-none/branch",
            Some(r#"{"count":99}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/sandboxes/sb-none/branch",
            Some(r#"{"count":2}"#),
            404,
            "not_found",
        ),
        (
            Method::POST,
            "/v1/sandboxes/sb-none/restore",
            Some(r#"{"snapshot":""}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/snapshots",
            Some(r#"{"sandbox":"sb-none","kind":"weird"}"#),
            400,
            "malformed_body",
        ),
        (
            Method::POST,
            "/v1/snapshots",
            Some(r#"{"sandbox":"sb-none","kind":"branch"}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/snapshots",
            Some(r#"{"sandbox":"sb-none"}"#),
            404,
            "not_found",
        ),
        (
            Method::DELETE,
            "/v1/snapshots/snap-none",
            None,
            404,
            "not_found",
        ),
        (
            Method::POST,
            "/v1/images/build",
            Some(r#"{"name":"../etc"}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/images/build",
            Some(r#"{"name":"no-such-recipe"}"#),
            404,
            "not_found",
        ),
        (
            Method::GET,
            "/v1/nothing-here",
            None,
            404,
            "route_not_found",
        ),
        (
            Method::PATCH,
            "/v1/sandboxes",
            None,
            405,
            "method_not_allowed",
        ),
    ];
    for (method, path, body, want_status, want_code) in cases {
        let got = status_code(&c, method.clone(), path, *body).await;
        assert_eq!(
            got,
            (*want_status, want_code.to_string()),
            "{method} {path} {body:?}"
        );
    }

    let listed: Value = c
        .json(Method::GET, "/v1/sandboxes", None::<&()>)
        .await
        .unwrap();
    assert_eq!(listed["sandboxes"], json!([]));
    let images: Value = c
        .json(Method::GET, "/v1/images", None::<&()>)
        .await
        .unwrap();
    assert!(
        images["recipes"]
            .as_array()
            .unwrap()
            .contains(&json!("minimal")),
        "{images}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_self_signed_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert_pem, key_pem) = (tmp.path().join("cert.pem"), tmp.path().join("key.pem"));
    std::fs::write(&cert_pem, cert.cert.pem()).unwrap();
    std::fs::write(&key_pem, cert.key_pair.serialize_pem()).unwrap();
    let cg = fake_cgroups(&tmp.path().join("cg"));
    let d = start_daemon(
        &tmp.path().join("state"),
        &[
            "--listen",
            "127.0.0.1:0",
            "--cgroup-root",
            &cg,
            "--tls-cert",
            cert_pem.to_str().unwrap(),
            "--tls-key",
            key_pem.to_str().unwrap(),
        ],
    );
    let url = d.url.replace("127.0.0.1", "localhost");
    assert!(url.starts_with("https://"), "{url}");
    let c = Client::new(&url, Some(d.token()))
        .unwrap()
        .with_ca_file(&cert_pem)
        .unwrap();
    let info: Value = c.json(Method::GET, "/v1/info", None::<&()>).await.unwrap();
    assert!(
        matches!(info["runtime"]["name"].as_str(), Some("qemu" | "kvm")),
        "{info}"
    );
    let wrong = Client::new(&url, Some("nope".into()))
        .unwrap()
        .with_ca_file(&cert_pem)
        .unwrap();
    let e = wrong
        .json::<Value>(Method::GET, "/v1/info", None::<&()>)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("unauthorized"));
    // Plain HTTP to the TLS port gets no API answer.
    let plain = Client::new(&d.url.replace("https://", "http://"), Some(d.token())).unwrap();
    let e = plain
        .json::<Value>(Method::GET, "/v1/info", None::<&()>)
        .await
        .unwrap_err();
    assert!(!matches!(e, ClientError::Api { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_listener() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("zygoted.sock");
    let cg = fake_cgroups(&tmp.path().join("cg"));
    let d = start_daemon(
        &tmp.path().join("state"),
        &["--unix", sock.to_str().unwrap(), "--cgroup-root", &cg],
    );
    assert_eq!(d.url, format!("unix://{}", sock.display()));
    let info: Value = d
        .client()
        .json(Method::GET, "/v1/info", None::<&()>)
        .await
        .unwrap();
    assert!(
        matches!(info["runtime"]["name"].as_str(), Some("qemu" | "kvm")),
        "{info}"
    );
    let e = Client::new(&d.url, None)
        .unwrap()
        .json::<Value>(Method::GET, "/v1/sandboxes", None::<&()>)
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        Some("unauthorized"),
        "the socket needs the token too"
    );
}
