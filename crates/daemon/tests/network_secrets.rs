//! Secrets bound to hosts (issue 39, part 4), on real namespaces and the qemu runtime:
//! the guest holds only a placeholder; its HTTPS requests to the bound host reach the
//! real server with the value in their headers (the proxy ends the guest's TLS with the
//! daemon's CA, which the guest trusts, and verifies the server against the test's CA,
//! which the daemon is told to trust); everywhere else the placeholder goes literally:
//! another host, plain HTTP to the bound host, a request whose Host is not the TLS name
//! (refused), a forged address whose server cannot prove the name (refused). An echoing
//! server does not carry the value back. A branch child keeps inherited secrets only; a
//! restarted daemon swaps them in again; the value is in neither the snapshot's files
//! (the guest's memory among them) nor its pack. Needs root, iproute2, nftables and the
//! qemu runtime (`kvm_`: the kvm runtime, in the nested lane; skips, saying why).
mod common;
#[path = "network/echo.rs"]
mod echo;
#[path = "network/probe.rs"]
#[allow(dead_code)] // reach: the other suites'
mod probe;
#[path = "network/remote.rs"]
mod remote;

use std::io::Read;
use std::time::Instant;

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::Client;
use zygote_daemon::model::{BranchResponse, EgressList, Snapshot};

use common::{create, sh, start_daemon, step, Scratch};
use echo::{Seen, TestCa};
use probe::unavailable;
use remote::Remote;

const TLS_PORT: u16 = 8443;
const PLAIN_PORT: u16 = 8444;

/// A Python script run in the guest: GET `url` with `headers` (JSON; `$VAR` in a value
/// is the exec's environment variable); prints the status, the X-Echo header and the
/// body, or the error.
fn fetch(url: &str, headers: &str, verify: bool) -> String {
    format!(
        r#"python3 - <<'EOF'
import json, os, ssl, urllib.request, urllib.error
ctx = None if {verify} else ssl._create_unverified_context()
headers = {{k: os.path.expandvars(v) for k, v in json.loads('{headers}').items()}}
req = urllib.request.Request("{url}", headers=headers)
try:
    r = urllib.request.urlopen(req, context=ctx, timeout=15)
    print(r.status, r.headers.get("X-Echo"), r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
except Exception as e:
    print("ERR", e)
EOF"#,
        verify = if verify { "True" } else { "False" },
    )
}

async fn run(c: &Client, id: &str, script: &str) -> String {
    sh(c, id, script)
        .await
        .unwrap_or_else(|e| panic!("{id}: {e}"))
        .trim()
        .to_string()
}

fn seen_count(s: &Seen) -> usize {
    s.lock().unwrap().len()
}

fn last(s: &Seen) -> String {
    s.lock().unwrap().last().cloned().unwrap_or_default()
}

fn random_hex() -> String {
    let mut b = [0u8; 12];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Whether `needle` occurs in any file under `dir`.
fn found_in_files(dir: &std::path::Path, needle: &[u8]) -> Vec<String> {
    common::files_under(dir)
        .into_iter()
        .filter(|f| {
            let bytes = std::fs::read(f).unwrap_or_default();
            bytes.windows(needle.len()).any(|w| w == needle)
        })
        .map(|f| f.display().to_string())
        .collect()
}

/// Whether `needle` occurs in any (zstd-decoded) member of a pack tar.
fn found_in_pack(pack: &[u8], needle: &[u8]) -> (usize, Vec<String>) {
    let mut archive = tar::Archive::new(pack);
    let (mut members, mut hits) = (0, Vec::new());
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry.path().unwrap().display().to_string();
        let mut raw = Vec::new();
        entry.read_to_end(&mut raw).unwrap();
        let decoded = zstd::stream::decode_all(raw.as_slice()).unwrap_or(raw);
        members += 1;
        if decoded.windows(needle.len()).any(|w| w == needle) {
            hits.push(name);
        }
    }
    (members, hits)
}

#[tokio::test(flavor = "multi_thread")]
async fn qemu_secrets_bound_to_hosts() {
    if let Some(why) = unavailable() {
        eprintln!("skipping qemu_secrets_bound_to_hosts: {why}");
        return;
    }
    suite("qemu").await;
}

/// The same on the kvm runtime (the nested lane; skips where KVM cannot boot Linux).
#[tokio::test(flavor = "multi_thread")]
async fn kvm_secrets_bound_to_hosts() {
    if let Some(why) = unavailable() {
        eprintln!("skipping kvm_secrets_bound_to_hosts: {why}");
        return;
    }
    if !zygote_vmm::host::linux_guests_or_skip("the kvm secrets bound to hosts suite") {
        return;
    }
    suite("kvm").await;
}

async fn suite(runtime: &str) {
    let t0 = Instant::now();
    common::guest_assets();
    // The first build runs debootstrap (minutes); later ones are cached.
    zygote_images::build_image("python", &mut |l| eprintln!("    {l}")).expect("python image");
    let remote = Remote::start();
    let (a, b) = (remote.a, remote.b);
    let ca = TestCa::new();
    let tls_a = ca.server(&["*.a.zygote.test"]);
    let seen_a = echo::serve(remote.listen(a, TLS_PORT), Some(tls_a), "a");
    let tls_b = ca.server(&["*.b.zygote.test"]);
    let seen_b = echo::serve(remote.listen(b, TLS_PORT), Some(tls_b), "b");
    let seen_plain = echo::serve(remote.listen(a, PLAIN_PORT), None, "plain");
    let scratch = Scratch::new();
    let trust = scratch.state.with_file_name("remote-ca.pem");
    std::fs::write(&trust, &ca.ca_pem).unwrap();
    let mut args = remote.daemon_args("127.0.0.1:0", runtime);
    args.extend(["--egress-trust".to_string(), trust.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = start_daemon(&scratch.state, &args);
    let c = d.client();
    let cleanup = &scratch.cleanup;
    step(
        t0,
        "remote with HTTPS (its own CA) and plain HTTP; daemon trusts the CA",
    );

    // Bad bindings are 400s that say why.
    for (body, why) in [
        (
            json!({"image": "minimal", "secrets": {"K": {"value": "v", "hosts": ["*.com"]}}}),
            "secret K: hosts",
        ),
        (
            json!({"image": "minimal", "network": "none",
                   "secrets": {"K": {"value": "v", "hosts": ["api.a.zygote.test"]}}}),
            "need network egress",
        ),
    ] {
        let e = c
            .json::<Value>(Method::POST, "/v1/sandboxes", Some(&body))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{body}: {e}");
    }

    let (secret, once) = (
        format!("sk-live-{}", random_hex()),
        format!("once-{}", random_hex()),
    );
    let api = format!("api.a.zygote.test:{TLS_PORT}");
    let body = json!({"image": "python", "mem_mib": 256, "secrets": {
        "KEY": {"value": secret, "hosts": [api, format!("api.a.zygote.test:{PLAIN_PORT}")]},
        "ONCE": {"value": once, "hosts": [api], "inherit": false},
        "PLAIN": {"value": "an-ordinary-secret"},
    }});
    let sb = create(&c, body, cleanup).await.remove(0);
    let id = sb.id.clone();
    let placeholder = run(&c, &id, "echo $KEY").await;
    let once_placeholder = run(&c, &id, "echo $ONCE").await;
    assert!(placeholder.starts_with("zygote-secret-"), "{placeholder}");
    assert_ne!(placeholder, once_placeholder);
    assert_eq!(run(&c, &id, "echo $PLAIN").await, "an-ordinary-secret");
    let env = run(&c, &id, "env; cat /etc/zygote/egress-ca.pem").await;
    assert!(!env.contains(&secret) && !env.contains(&once), "{env}");
    assert!(env.contains("BEGIN CERTIFICATE"), "{env}");
    step(t0, "the guest holds placeholders and trusts the egress CA");

    // HTTPS to the bound host, verified by the guest: the server gets the values.
    let url = format!("https://api.a.zygote.test:{TLS_PORT}/v1/chat");
    let headers = r#"{"Authorization": "Bearer $KEY", "X-Once": "$ONCE"}"#;
    let got = run(&c, &id, &fetch(&url, headers, true)).await;
    assert!(got.starts_with("200"), "{got}");
    assert!(
        got.contains(&format!("Bearer {placeholder}")),
        "the echo carries the placeholder back: {got}"
    );
    assert!(!got.contains(&secret), "{got}");
    let head = last(&seen_a);
    assert!(head.contains(&format!("Bearer {secret}")), "{head}");
    assert!(head.contains(&once), "{head}");
    assert!(!head.contains("zygote-secret-"), "{head}");
    step(
        t0,
        "HTTPS to the bound host: the server got the values, the guest the echo's placeholder",
    );

    // A request on that connection naming another host: refused, nothing sent.
    let n = seen_count(&seen_a) + seen_count(&seen_b);
    let misdirected = r#"{"Authorization": "Bearer $KEY", "Host": "api.b.zygote.test"}"#;
    let got = run(&c, &id, &fetch(&url, misdirected, true)).await;
    assert!(got.starts_with("421"), "{got}");
    assert_eq!(
        seen_count(&seen_a) + seen_count(&seen_b),
        n,
        "nothing reached a server"
    );
    // Another host (over HTTPS the guest does not verify: it does not trust the test's
    // CA) and plain HTTP to the bound host: the placeholder, literally.
    let other = format!("https://api.b.zygote.test:{TLS_PORT}/");
    let got = run(
        &c,
        &id,
        &fetch(&other, r#"{"Authorization": "Bearer $KEY"}"#, false),
    )
    .await;
    assert!(got.starts_with("200"), "{got}");
    assert!(
        last(&seen_b).contains(&format!("Bearer {placeholder}")),
        "{}",
        last(&seen_b)
    );
    let plain = format!("http://api.a.zygote.test:{PLAIN_PORT}/");
    let got = run(
        &c,
        &id,
        &fetch(&plain, r#"{"Authorization": "Bearer $KEY"}"#, true),
    )
    .await;
    assert!(got.starts_with("200"), "{got}");
    assert!(
        last(&seen_plain).contains(&format!("Bearer {placeholder}")),
        "{}",
        last(&seen_plain)
    );
    step(
        t0,
        "another host and plain HTTP get the placeholder; a misdirected Host gets 421",
    );

    // The guest points the bound name at another server (its own /etc/hosts): that
    // server cannot prove the name, so it gets no request at all.
    let n = seen_count(&seen_b);
    run(
        &c,
        &id,
        &format!("cp /etc/hosts /tmp/hosts; echo '{b} api.a.zygote.test' >> /etc/hosts"),
    )
    .await;
    let got = run(
        &c,
        &id,
        &fetch(&url, r#"{"Authorization": "Bearer $KEY"}"#, true),
    )
    .await;
    run(&c, &id, "cp /tmp/hosts /etc/hosts").await;
    assert!(
        got.starts_with("502") && got.contains("did not prove"),
        "{got}"
    );
    assert_eq!(seen_count(&seen_b), n, "the impostor got no request");
    step(
        t0,
        "a forged address for the bound name: 502, the impostor got nothing",
    );

    // The egress record names the secrets used (never their values).
    let record: EgressList = c
        .json(
            Method::GET,
            &format!("/v1/sandboxes/{id}/egress"),
            None::<&()>,
        )
        .await
        .unwrap();
    let text = serde_json::to_string(&record).unwrap();
    assert!(!text.contains(&secret), "{text}");
    let used = record.entries.iter().find(|e| {
        let mut names = e.secrets.clone();
        names.sort();
        e.event == "closed" && names == ["KEY", "ONCE"] && e.address == a.to_string()
    });
    assert!(used.is_some(), "{text}");
    let failed = record
        .entries
        .iter()
        .find(|e| e.event == "failed" && e.address == b.to_string() && e.port == TLS_PORT);
    assert!(failed.is_some_and(|e| e.secrets.is_empty()), "{text}");

    // A branch child: KEY (inherited) is swapped in, ONCE (not inherited) is not even
    // when the child sends the parent's placeholder.
    let branched: BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{id}/branch"),
            Some(&json!({"count": 1})),
        )
        .await
        .expect("branch");
    let child = branched.children[0].clone();
    assert_eq!(run(&c, &child, "echo $KEY").await, placeholder);
    assert_eq!(run(&c, &child, "echo ${ONCE:-unset}").await, "unset");
    let child_headers =
        format!(r#"{{"Authorization": "Bearer $KEY", "X-Once": "{once_placeholder}"}}"#);
    let got = run(&c, &child, &fetch(&url, &child_headers, true)).await;
    assert!(got.starts_with("200"), "{got}");
    let head = last(&seen_a);
    assert!(head.contains(&format!("Bearer {secret}")), "{head}");
    assert!(
        head.contains(&once_placeholder) && !head.contains(&once),
        "{head}"
    );
    step(t0, "a branch child swaps inherited secrets only");

    // kill -9 and restart: the proxy gets the secrets again.
    d.kill9();
    let d = start_daemon(&scratch.state, &args);
    let c = d.client();
    let got = run(
        &c,
        &id,
        &fetch(&url, r#"{"Authorization": "Bearer $KEY"}"#, true),
    )
    .await;
    assert!(got.starts_with("200"), "after restart: {got}");
    assert!(
        last(&seen_a).contains(&format!("Bearer {secret}")),
        "{}",
        last(&seen_a)
    );
    step(t0, "after kill -9 and restart, swapped in again");

    // A snapshot while a process holds the placeholder in its environment: the
    // placeholder is in its files (the guest's memory), the value is not; nor in its pack.
    run(&c, &id, "nohup sleep 3600 >/dev/null 2>&1 &").await;
    let snap: Snapshot = c
        .json(Method::POST, "/v1/snapshots", Some(&json!({"sandbox": id})))
        .await
        .expect("snapshot");
    let dir = scratch.state.join("snapshots").join(&snap.id);
    assert!(
        !found_in_files(&dir, placeholder.as_bytes()).is_empty(),
        "the scan finds what the guest's memory holds"
    );
    assert_eq!(
        found_in_files(&dir, secret.as_bytes()),
        Vec::<String>::new()
    );
    assert_eq!(found_in_files(&dir, once.as_bytes()), Vec::<String>::new());
    let mut pack = Vec::new();
    c.download(
        &format!("/v1/snapshots/{}/export", snap.id),
        &mut pack,
        |_| {},
    )
    .await
    .expect("export");
    let (members, hits) = found_in_pack(&pack, placeholder.as_bytes());
    assert!(
        members > 1 && !hits.is_empty(),
        "{members} members, placeholder in {hits:?}"
    );
    assert_eq!(
        found_in_pack(&pack, secret.as_bytes()).1,
        Vec::<String>::new()
    );
    step(
        t0,
        "the value is in neither the snapshot's files nor its pack",
    );

    // Deleting the child revokes its binding; the parent's stays.
    c.raw(Method::DELETE, &format!("/v1/sandboxes/{child}"), None)
        .await
        .expect("delete child");
    let got = run(
        &c,
        &id,
        &fetch(&url, r#"{"Authorization": "Bearer $KEY"}"#, true),
    )
    .await;
    assert!(got.starts_with("200"), "{got}");
    step(t0, "done");
}
