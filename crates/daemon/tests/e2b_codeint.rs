//! E2B's code interpreter port (49999) over raw HTTP (issue 37): routing, tokens and bad
//! input (env_vars that are not strings), answered before any kernel is involved. A `minimal` sandbox (no interpreter)
//! is enough: what passes the checks ends as 422 no interpreter. The unchanged SDKs run
//! against a real code-interpreter sandbox in sdk/e2b-compat (scripts/e2b-test.sh).
mod common;
#[path = "e2b_envd/wire.rs"]
#[allow(dead_code)] // shared with e2b_envd.rs, which uses all of it
mod wire;

use std::time::Instant;

use common::{qemu_guest_ready, start_daemon, step, Scratch};
use wire::{daemon_without_vms, hostport, http, proxy_addr};

#[test]
fn the_code_port_of_an_unknown_sandbox_is_not_found() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon_without_vms(tmp.path());
    let proxy = proxy_addr(&d);
    let route = [("E2b-Sandbox-Id", "sb-0123"), ("E2b-Sandbox-Port", "49999")];
    let a = http(&proxy, "POST", "/execute", &route, br#"{"code": "1"}"#);
    assert_eq!(a.status, 502, "{}", a.text());
    assert_eq!(a.json()["message"], "The sandbox was not found");
}

#[test]
fn the_code_port_checks_tokens_and_input() {
    if !qemu_guest_ready("the_code_port_checks_tokens_and_input") {
        return;
    }
    let t0 = Instant::now();
    let scratch = Scratch::new();
    let d = start_daemon(
        &scratch.state,
        &["--listen", "127.0.0.1:0", "--runtime", "qemu"],
    );
    let (api, proxy, token) = (hostport(&d.url), proxy_addr(&d), d.token());
    let key = [("X-API-Key", token.as_str())];
    let create = || {
        let body = br#"{"templateID": "minimal", "timeout": 600}"#;
        let a = http(&api, "POST", "/e2b/v2/sandboxes", &key, body);
        assert_eq!(a.status, 201, "{}", a.text());
        let v = a.json();
        (
            v["sandboxID"].as_str().unwrap().to_string(),
            v["envdAccessToken"].as_str().unwrap().to_string(),
        )
    };
    let (a_id, a_tok) = create();
    let (_b_id, b_tok) = create();
    step(t0, "two minimal sandboxes");
    let call = |tok: Option<&str>, method: &str, path: &str, body: &[u8]| {
        let mut h = vec![
            ("E2b-Sandbox-Id", a_id.as_str()),
            ("E2b-Sandbox-Port", "49999"),
        ];
        h.extend(tok.map(|t| ("X-Access-Token", t)));
        http(&proxy, method, path, &h, body)
    };
    let (a_tok, b_tok) = (a_tok.as_str(), b_tok.as_str());
    let code = br#"{"code": "1", "context_id": null, "language": null, "env_vars": null}"#;

    // /execute needs the sandbox's own token.
    assert_eq!(call(None, "POST", "/execute", code).status, 401);
    assert_eq!(call(Some(b_tok), "POST", "/execute", code).status, 401);
    // The context routes take a missing token (E2B's SDK sends none) but not a wrong one.
    assert_eq!(call(Some(b_tok), "GET", "/contexts", b"").status, 401);
    assert_eq!(call(Some(b_tok), "DELETE", "/contexts/x", b"").status, 401);
    // Bad input, before the guest is asked.
    let a = call(Some(a_tok), "POST", "/execute", b"{\"code\": ");
    assert_eq!(a.status, 400, "{}", a.text());
    // env_vars: strings only, and the native bounds (names, count).
    let a = call(
        Some(a_tok),
        "POST",
        "/execute",
        br#"{"code": "1", "env_vars": {"A": 1}}"#,
    );
    assert_eq!(a.status, 400, "{}", a.text());
    assert!(a.text().contains("env_vars"), "{}", a.text());
    let a = call(
        Some(a_tok),
        "POST",
        "/execute",
        br#"{"code": "1", "env_vars": {"1A": "x"}}"#,
    );
    assert_eq!(a.status, 400, "{}", a.text());
    assert!(a.text().contains("not a variable name"), "{}", a.text());
    let a = call(
        Some(a_tok),
        "POST",
        "/execute",
        br#"{"code": "1", "language": "r"}"#,
    );
    assert_eq!(a.status, 400, "{}", a.text());
    let a = call(Some(a_tok), "POST", "/execute", br#"{"code": ""}"#);
    assert_eq!(a.status, 400, "{}", a.text());
    let a = call(Some(a_tok), "DELETE", "/contexts/..%2Fx", b"");
    assert_eq!(a.status, 400, "{}", a.text());
    assert_eq!(call(Some(a_tok), "GET", "/no/such", b"").status, 404);
    // What passes (env_vars included) reaches the guest, which has no interpreter: 422,
    // saying so.
    let envs = br#"{"code": "1", "env_vars": {"ZYG_A": "1"}}"#;
    for (tok, method, path, body) in [
        (Some(a_tok), "POST", "/execute", &code[..]),
        (Some(a_tok), "POST", "/execute", &envs[..]),
        (None, "GET", "/contexts", b""),
        (None, "POST", "/contexts", b"{}"),
    ] {
        let a = call(tok, method, path, body);
        assert_eq!(a.status, 422, "{method} {path}: {}", a.text());
        assert!(a.text().contains("code-interpreter"), "{}", a.text());
    }
    step(
        t0,
        "tokens, bad input and a sandbox without interpreter answered",
    );
}
