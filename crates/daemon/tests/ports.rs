//! The exposed-port API and the proxy listener of a real daemon, without booting a VM:
//! validation, unknown sandboxes, the proxy's address in `GET /v1/info`, and the
//! backends and flags that leave ports unsupported. (A sandbox serving HTTP through
//! the proxy is in the networking end-to-end tests.)
mod common;

use bytes::Bytes;
use hyper::Method;
use serde_json::Value;
use zygote_daemon::client::Client;

use common::{proxy_url, start_daemon, Daemon};

/// A daemon on `tmp` with `args` and a cgroup root without controllers.
fn daemon(tmp: &tempfile::TempDir, args: &[&str]) -> Daemon {
    let cg = tmp.path().join("cg");
    std::fs::create_dir_all(&cg).unwrap();
    std::fs::write(cg.join("cgroup.controllers"), "").unwrap();
    let cg = cg.display().to_string();
    let args = [args, &["--listen", "127.0.0.1:0", "--cgroup-root", &cg]].concat();
    start_daemon(&tmp.path().join("state"), &args)
}

/// Status and error code of a request.
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
    if status >= 400 {
        let message = v["error"]["message"].as_str().unwrap_or("");
        assert!(!message.is_empty(), "{v}");
    }
    (status, v["error"]["code"].as_str().unwrap_or("").into())
}

async fn backend(c: &Client) -> String {
    let info: Value = c.json(Method::GET, "/v1/info", None::<&()>).await.unwrap();
    info["network"]["backend"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_unknown_sandboxes_and_the_proxy_listener() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon(&tmp, &[]);
    let c = d.client();
    let url = proxy_url(&c).await.expect("a proxy");
    let port: u16 = url
        .strip_prefix("http://127.0.0.1:")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{url}"));
    assert_ne!(port, 0);

    // Without isolated networking (no root here?) exposing is unsupported, not missing.
    let (exposing, exposing_code) = match backend(&c).await.as_str() {
        "isolated" => (404, "not_found"),
        _ => (422, "unsupported"),
    };
    let ports = "/v1/sandboxes/sb-none/ports";
    let cases: &[(Method, &str, Option<&str>, u16, &str)] = &[
        (
            Method::POST,
            ports,
            Some(r#"{"port":0}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            ports,
            Some(r#"{"port":65536}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            ports,
            Some(r#"{"port":-1}"#),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            ports,
            Some(r#"{"port":"80"}"#),
            400,
            "malformed_body",
        ),
        (Method::POST, ports, Some(r#"{}"#), 400, "malformed_body"),
        (
            Method::POST,
            ports,
            Some(r#"{"port":80,"bogus":1}"#),
            400,
            "malformed_body",
        ),
        (
            Method::POST,
            ports,
            Some(r#"{"port":80}"#),
            exposing,
            exposing_code,
        ),
        (
            Method::POST,
            ports,
            Some(r#"{"port":65535,"public":true}"#),
            exposing,
            exposing_code,
        ),
        (Method::GET, ports, None, 404, "not_found"),
        (
            Method::DELETE,
            "/v1/sandboxes/sb-none/ports/80",
            None,
            404,
            "not_found",
        ),
        (
            Method::DELETE,
            "/v1/sandboxes/sb-none/ports/0",
            None,
            400,
            "invalid_argument",
        ),
        (
            Method::DELETE,
            "/v1/sandboxes/sb-none/ports/x",
            None,
            400,
            "invalid_argument",
        ),
        (
            Method::DELETE,
            "/v1/sandboxes/sb-none/ports/70000",
            None,
            400,
            "invalid_argument",
        ),
        (Method::PUT, ports, None, 405, "method_not_allowed"),
    ];
    for (method, path, body, want_status, want_code) in cases {
        let got = status_code(&c, method.clone(), path, *body).await;
        assert_eq!(
            got,
            (*want_status, want_code.to_string()),
            "{method} {path} {body:?}"
        );
    }
    let anon = Client::new(&d.url, None).unwrap();
    assert_eq!(status_code(&anon, Method::GET, ports, None).await.0, 401);

    // The proxy: the API's token and error format; nothing is exposed.
    let proxied = Client::new(&url, Some(d.token())).unwrap();
    let port_path = "/sandboxes/sb-none/ports/80/";
    assert_eq!(
        status_code(&proxied, Method::GET, port_path, None).await,
        (404, "not_found".into())
    );
    assert_eq!(
        status_code(&proxied, Method::GET, "/", None).await,
        (404, "route_not_found".into())
    );
    let proxied_anon = Client::new(&url, None).unwrap();
    assert_eq!(
        status_code(&proxied_anon, Method::GET, port_path, None).await,
        (401, "unauthorized".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_need_isolated_networking_and_the_proxy() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon(&tmp, &["--network", "user"]);
    let c = d.client();
    assert!(proxy_url(&c).await.is_some());
    let body = Some(r#"{"port":8080}"#);
    let path = "/v1/sandboxes/sb-none/ports";
    let resp = c
        .send(
            Method::POST,
            path,
            body.map(|b| (Bytes::from(b), "application/json")),
        )
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 422);
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["error"]["code"], "unsupported", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("isolated networking"), "{message}");
    drop(d);

    let tmp = tempfile::tempdir().unwrap();
    let d = daemon(&tmp, &["--proxy-listen", "none"]);
    let c = d.client();
    assert_eq!(proxy_url(&c).await, None);
    assert_eq!(
        status_code(&c, Method::POST, path, body).await,
        (422, "unsupported".into())
    );
    // Listing shows URLs, so it needs the proxy too; an unknown sandbox is still a 404.
    assert_eq!(
        status_code(&c, Method::GET, path, None).await,
        (404, "not_found".into())
    );
}
