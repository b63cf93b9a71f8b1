//! The web console's daemon side without a VM: the assets at `/ui` (content types,
//! security headers; or the page saying the console was not built), the one-time login
//! codes (issued with the token only, good once, a wrong one refused), and the API's
//! token check unchanged beside them.
mod common;
// The raw HTTP/1.1 client of the E2B tests: status, headers and body as sent.
#[allow(dead_code)]
#[path = "e2b_envd/wire.rs"]
mod wire;

use wire::{daemon_without_vms, hostport, Answer};

/// One request; `token` as `Authorization: Bearer`, `body` as JSON.
fn http(
    d: &common::Daemon,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Answer {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    let body = body.unwrap_or("").as_bytes();
    wire::http(&hostport(&d.url), method, path, &headers, body)
}

fn header(a: &Answer, name: &str) -> String {
    a.header(name).unwrap_or_default()
}

/// The headers every answer under /ui carries.
fn assert_secured(a: &Answer, what: &str) {
    let csp = header(a, "content-security-policy");
    let script = csp
        .split(';')
        .map(str::trim)
        .find(|d| d.starts_with("script-src"));
    assert_eq!(script, Some("script-src 'self'"), "{what}: {csp:?}");
    assert!(csp.contains("frame-ancestors 'none'"), "{what}: {csp:?}");
    assert_eq!(header(a, "x-frame-options"), "DENY", "{what}");
    assert_eq!(header(a, "x-content-type-options"), "nosniff", "{what}");
    assert_eq!(header(a, "referrer-policy"), "no-referrer", "{what}");
}

#[test]
fn the_console_is_served_with_its_headers_or_says_it_was_not_built() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon_without_vms(tmp.path());

    let a = http(&d, "GET", "/ui", None, None);
    assert_eq!(a.status, 308);
    assert_eq!(header(&a, "location"), "/ui/");
    assert_secured(&a, "/ui");

    let index = http(&d, "GET", "/ui/", None, None);
    assert_secured(&index, "/ui/");
    assert_eq!(header(&index, "content-type"), "text/html; charset=utf-8");
    let html = index.text();
    if index.status == 503 {
        // cargo built the daemon without `console/dist`: a page that says so and how to
        // build it, and no console.
        assert!(
            html.contains("not built") && html.contains("make build"),
            "{html}"
        );
        assert!(!html.contains("<script"), "{html}");
        eprintln!("the console was not built: only its not-built page was checked");
    } else {
        assert_eq!(index.status, 200, "{html}");
        // The page loads its script and stylesheet from the daemon, nothing inline.
        assert!(
            html.contains(r#"<script type="module" src="app.js"></script>"#),
            "{html}"
        );
        assert!(!html.contains("<script>"), "no inline script: {html}");
        for (asset, ctype) in [
            ("app.js", "text/javascript; charset=utf-8"),
            ("app.css", "text/css; charset=utf-8"),
            ("favicon.svg", "image/svg+xml"),
        ] {
            let a = http(&d, "GET", &format!("/ui/{asset}"), None, None);
            assert_eq!(a.status, 200, "{asset}");
            assert_eq!(header(&a, "content-type"), ctype, "{asset}");
            assert!(a.body.len() > 100, "{asset}: {} bytes", a.body.len());
            assert_secured(&a, asset);
        }
    }

    // Only embedded names are files; nothing else reaches the filesystem.
    for path in [
        "/ui/nope.js",
        "/ui/..%2f..%2fetc%2fpasswd",
        "/ui/%2e%2e/token",
    ] {
        let a = http(&d, "GET", path, None, None);
        assert_eq!(a.status, 404, "{path}");
        assert_secured(&a, path);
    }
}

#[test]
fn login_codes_work_once_and_only_with_the_token() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon_without_vms(tmp.path());
    let token = d.token();

    // The API's check is unchanged: no token, a wrong one, 401; the code route too.
    for (method, path) in [
        ("GET", "/v1/sandboxes"),
        ("GET", "/v1/info"),
        ("POST", "/v1/console/login"),
    ] {
        for t in [None, Some("wrong")] {
            let a = http(&d, method, path, t, None);
            assert_eq!(a.status, 401, "{method} {path} with {t:?}");
            assert_eq!(a.json()["error"]["code"], "unauthorized");
        }
    }

    let issued = http(&d, "POST", "/v1/console/login", Some(&token), None);
    assert_eq!(issued.status, 200, "{}", issued.text());
    let v = issued.json();
    let code = v["code"].as_str().unwrap().to_string();
    assert_eq!(code.len(), 64);
    assert!(code.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(v["path"], format!("/ui/#login={code}"));
    assert_eq!(v["expires_in_secs"], 60);
    assert!(
        !issued.text().contains(&token),
        "the code answer carries no token"
    );

    let exchange = |code: &str| {
        http(
            &d,
            "POST",
            "/ui/login",
            None,
            Some(&serde_json::json!({ "code": code }).to_string()),
        )
    };
    // A wrong code: 401, and nothing in the answer.
    let wrong = exchange(&"0".repeat(64));
    assert_eq!(wrong.status, 401);
    assert!(!wrong.text().contains(&token));
    assert_secured(&wrong, "a refused login");

    let ok = exchange(&code);
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.json()["token"], token.as_str());
    assert_eq!(header(&ok, "cache-control"), "no-store");
    assert_secured(&ok, "a login");

    // Used up.
    let again = exchange(&code);
    assert_eq!(again.status, 401);
    assert!(!again.text().contains(&token));

    // Malformed logins are 400s in the API's format; an oversize one a 413.
    for body in ["", "{", r#"{"code": 1}"#, r#"{"code": "x", "more": 1}"#] {
        let a = http(&d, "POST", "/ui/login", None, Some(body));
        assert_eq!(a.status, 400, "{body:?}: {}", a.text());
        assert_eq!(a.json()["error"]["code"], "malformed_body", "{body:?}");
    }
    let big = format!(r#"{{"code": "{}"}}"#, "a".repeat(4096));
    assert_eq!(http(&d, "POST", "/ui/login", None, Some(&big)).status, 413);
}
