//! The API without booting VMs: auth, input validation (always 4xx with the
//! JSON error shape), oversize requests (413 before any sandbox is involved),
//! listeners (TCP, TLS, Unix socket), the served OpenAPI document and info.
mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;

use bytes::Bytes;
use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::{Client, ClientError};
use zygote_daemon::model::{MAX_FILE_BYTES, MAX_JSON_BODY_BYTES};
use zygote_proto::MAX_FRAME_LEN;

use common::{start_daemon, Daemon};

/// A daemon on `tmp` with `args` and a cgroup root without controllers.
fn daemon(tmp: &tempfile::TempDir, args: &[&str]) -> Daemon {
    let cg = tmp.path().join("cg");
    std::fs::create_dir_all(&cg).unwrap();
    std::fs::write(cg.join("cgroup.controllers"), "").unwrap();
    let cg = cg.display().to_string();
    let args = [args, &["--cgroup-root", &cg]].concat();
    start_daemon(&tmp.path().join("state"), &args)
}

const LOOPBACK: [&str; 2] = ["--listen", "127.0.0.1:0"];

/// Status and JSON body of a request; an error has a non-empty message.
async fn request(c: &Client, method: Method, path: &str, body: Option<Bytes>) -> (u16, Value) {
    let body = body.map(|b| (b, "application/json"));
    let resp = c.send(method, path, body).await.expect("request");
    let status = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let v: Value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("{path}: not JSON: {}", String::from_utf8_lossy(&bytes)));
    if status >= 400 {
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
    }
    (status, v)
}

async fn status_code(c: &Client, method: Method, path: &str, body: Option<&str>) -> (u16, String) {
    let body = body.map(|b| Bytes::from(b.to_string()));
    let (status, v) = request(c, method, path, body).await;
    (
        status,
        v["error"]["code"].as_str().unwrap_or("").to_string(),
    )
}

/// One HTTP/1.1 exchange written by hand (for what the client never sends): the
/// status and the JSON body.
fn raw_http(url: &str, head: &str) -> (u16, Value) {
    let addr = url.strip_prefix("http://").expect("an http:// daemon");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let req = format!("{head}Host: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp.split(' ').nth(1).and_then(|c| c.parse().ok());
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (
        status.unwrap_or_else(|| panic!("no status line: {resp:?}")),
        serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {resp:?}")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_validation_and_documents() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon(&tmp, &LOOPBACK);
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
            "/v1/sandboxes",
            Some(r#"{"image":"minimal","metadata":{"zygote.parent":"x"}}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/sandboxes",
            Some(r#"{"image":"minimal","metadata":{"bad key":"x"}}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::GET,
            "/v1/sandboxes?metadata=novalue",
            None,
            400,
            "invalid_argument",
        ),
        (
            Method::GET,
            "/v1/sandboxes?state=running",
            None,
            400,
            "invalid_argument",
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
            Some(r#"{"count":257}"#),
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
            "/v1/sandboxes/sb-none/branch",
            Some(r#"{"count":256}"#),
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
async fn the_bearer_scheme_is_case_insensitive() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon(&tmp, &LOOPBACK);
    let token = d.token();
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let head = format!("GET /v1/info HTTP/1.1\r\nAuthorization: {scheme} {token}\r\n");
        let (status, info) = raw_http(&d.url, &head);
        assert_eq!(status, 200, "{scheme}: {info}");
        assert!(info["runtime"]["name"].is_string(), "{info}");
    }
    for value in [
        format!("Basic {token}"),
        format!("Bearer{token}"),
        "bearer nope".into(),
    ] {
        let head = format!("GET /v1/info HTTP/1.1\r\nAuthorization: {value}\r\n");
        let (status, body) = raw_http(&d.url, &head);
        assert_eq!(
            (status, &body["error"]["code"]),
            (401, &json!("unauthorized")),
            "{value}"
        );
    }
}

/// A 413 whose message states `limit`.
fn assert_too_large(status: u16, v: &Value, limit: usize) {
    assert_eq!(
        (status, &v["error"]["code"]),
        (413, &json!("payload_too_large")),
        "{v}"
    );
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(&limit.to_string()),
        "limit {limit} not stated: {v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_requests_get_413_stating_the_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon(&tmp, &LOOPBACK);
    let c = d.client();
    let exec_of = |arg_len: usize| {
        Bytes::from(serde_json::to_vec(&json!({"argv": ["echo", "x".repeat(arg_len)]})).unwrap())
    };
    // Over the JSON body limit (nothing past the limit is kept), and under it but over
    // the guest agent's frame: the 502 this was, from the agent client, with a sandbox.
    let (huge, big) = (exec_of(40 << 20), exec_of(20 << 20));
    for (body, limit) in [(huge, MAX_JSON_BODY_BYTES), (big, MAX_FRAME_LEN)] {
        for route in ["exec", "exec/stream"] {
            let path = format!("/v1/sandboxes/sb-none/{route}");
            let (status, v) = request(&c, Method::POST, &path, Some(body.clone())).await;
            assert_too_large(status, &v, limit);
        }
    }
    // A declared size over every limit: answered without a body sent (or read).
    for (head, limit) in [
        ("PUT /v1/sandboxes/sb-none/files?path=/x", MAX_FILE_BYTES),
        ("POST /v1/sandboxes", MAX_JSON_BODY_BYTES),
    ] {
        let (token, len) = (d.token(), MAX_FILE_BYTES + 1);
        let head = format!(
            "{head} HTTP/1.1\r\nAuthorization: Bearer {token}\r\nContent-Length: {len}\r\n"
        );
        let (status, v) = raw_http(&d.url, &head);
        assert_too_large(status, &v, limit);
    }
    // Under the limits the same route answers as usual.
    let ok = exec_of(1 << 20);
    let (status, v) = request(&c, Method::POST, "/v1/sandboxes/sb-none/exec", Some(ok)).await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (404, &json!("not_found")),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_self_signed_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert_pem, key_pem) = (tmp.path().join("cert.pem"), tmp.path().join("key.pem"));
    std::fs::write(&cert_pem, cert.cert.pem()).unwrap();
    std::fs::write(&key_pem, cert.key_pair.serialize_pem()).unwrap();
    let (cert_arg, key_arg) = (cert_pem.to_str().unwrap(), key_pem.to_str().unwrap());
    let d = daemon(
        &tmp,
        &[
            &LOOPBACK[..],
            &["--tls-cert", cert_arg, "--tls-key", key_arg],
        ]
        .concat(),
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
    let d = daemon(&tmp, &["--unix", sock.to_str().unwrap()]);
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
