//! The guests' DNS under the policy (issue 39, part 1), on real namespaces and the
//! qemu runtime: each sandbox's resolver is the daemon, inside the sandbox's
//! namespace; it asks the upstream (`--dns-upstream`, here the test's "remote"
//! namespace, [`remote`], which counts the queries that reach it) only for names the
//! policy allows. Cases: a sandbox without lists resolves, over UDP (the image's
//! resolver address and the gateway) and TCP; one with an `allow_out` of addresses
//! (which even names the upstream) resolves nothing and a DNS tunnel from it (many
//! unique names) reaches the upstream not once; `network: none` resolves nothing; a
//! policy change applies to the next question; hostile TCP framing is cut off; a
//! branch child has its own resolver; after a kill -9 the restarted daemon serves
//! again; questions are counted and in the event log. No packet leaves this machine.
//! Needs root, iproute2, nftables and the qemu runtime (`kvm_`: the kvm runtime, in the
//! nested lane; skips, saying why).
mod common;
#[path = "network/probe.rs"]
mod probe;
#[path = "network/remote.rs"]
mod remote;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::Client;
use zygote_daemon::model::{BranchResponse, Sandbox};

use common::{create, get, sh, start_daemon, step, Scratch};
use probe::{reach, unavailable};
use remote::{Remote, DNS_ANSWER, REMOTE_PORT};

/// Whether `id` resolves `name` through `server` (busybox nslookup, bounded to 6 s).
async fn resolves(c: &Client, id: &str, name: &str, server: &str) -> (bool, String) {
    let out = sh(
        c,
        id,
        &format!("timeout 6 nslookup -type=a {name} {server} 2>&1; true"),
    )
    .await
    .unwrap();
    (out.contains(&DNS_ANSWER.to_string()), out)
}

/// The sandbox's namespace.
fn netns_of(id: &str) -> String {
    zygote_daemon::network::host::netns_names()
        .into_iter()
        .find(|n| n.starts_with("zygote-") && n.ends_with(id))
        .expect("the sandbox's namespace")
}

/// A one-question A query for `name` with id 0x4242.
fn a_query(name: &str) -> Vec<u8> {
    let mut q = vec![0x42, 0x42, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// Sends `framed` to the resolver's TCP port from inside `netns` (as the guest's
/// kernel would, minus the VM) and reads what comes back until EOF or 5 s.
fn tcp_exchange(netns: &str, framed: Vec<u8>) -> Vec<u8> {
    let ns = std::fs::File::open(format!("/run/netns/{netns}")).unwrap();
    std::thread::spawn(move || {
        // SAFETY: switches only this (test) thread's network namespace.
        assert_eq!(
            unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
            0
        );
        let mut s = TcpStream::connect((Ipv4Addr::new(10, 213, 0, 1), 53)).expect("resolver");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(&framed);
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = s.read(&mut buf) {
            got.extend_from_slice(&buf[..n]);
            // One framed answer is enough.
            if got.len() >= 2 && got.len() >= 2 + usize::from(u16::from_be_bytes([got[0], got[1]]))
            {
                break;
            }
        }
        got
    })
    .join()
    .unwrap()
}

fn framed(msg: &[u8]) -> Vec<u8> {
    let mut f = (msg.len() as u16).to_be_bytes().to_vec();
    f.extend_from_slice(msg);
    f
}

async fn put_network(c: &Client, id: &str, body: Value) -> Sandbox {
    c.json(
        Method::PUT,
        &format!("/v1/sandboxes/{id}/network"),
        Some(&body),
    )
    .await
    .unwrap_or_else(|e| panic!("PUT network {body}: {e}"))
}

async fn dns_events(c: &Client, id: &str) -> String {
    let v: Value = c
        .json(
            Method::GET,
            &format!("/v1/sandboxes/{id}/events?level=debug&search=dns&limit=1000"),
            None::<&()>,
        )
        .await
        .unwrap();
    v.to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn qemu_dns_is_the_daemons_and_obeys_the_policy() {
    if let Some(why) = unavailable() {
        eprintln!("skipping qemu_dns_is_the_daemons_and_obeys_the_policy: {why}");
        return;
    }
    suite("qemu").await;
}

/// The same on the kvm runtime (the nested lane; skips where KVM cannot boot Linux).
#[tokio::test(flavor = "multi_thread")]
async fn kvm_dns_is_the_daemons_and_obeys_the_policy() {
    if let Some(why) = unavailable() {
        eprintln!("skipping kvm_dns_is_the_daemons_and_obeys_the_policy: {why}");
        return;
    }
    if !zygote_vmm::host::linux_guests_or_skip("the kvm DNS under the policy suite") {
        return;
    }
    suite("kvm").await;
}

async fn suite(runtime: &str) {
    let t0 = Instant::now();
    common::guest_assets();
    let remote = Remote::start();
    let scratch = Scratch::new();
    let args = remote.daemon_args("127.0.0.1:0", runtime);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = start_daemon(&scratch.state, &args);
    let c = d.client();
    let cleanup = &scratch.cleanup;
    // `listed`'s allow_out names the upstream itself: before issue 39 its guest's
    // queries were forwarded there, whatever the name.
    let listed_cidrs = [format!("{}/32", remote.a), format!("{}/32", remote.b)];
    let made = futures_util::future::join3(
        create(&c, json!({"image": "minimal"}), cleanup),
        create(
            &c,
            json!({"image": "minimal", "allow_out": listed_cidrs}),
            cleanup,
        ),
        create(&c, json!({"image": "minimal", "network": "none"}), cleanup),
    )
    .await;
    let (open, listed, none) = (made.0[0].clone(), made.1[0].clone(), made.2[0].clone());
    step(
        t0,
        "daemon and three sandboxes: open, allow_out of addresses, none",
    );

    let queries = || remote.dns_queries.load(Ordering::SeqCst);
    let before = queries();
    for server in ["10.0.2.3", "10.213.0.1"] {
        let (ok, out) = resolves(&c, &open.id, "probe.zygote.test", server).await;
        assert!(ok, "open sandbox, via {server}: {out}");
    }
    assert!(queries() >= before + 2, "the upstream answered");
    // Addresses still work as before; the daemon's own sockets in the namespace are
    // not for the guest (the egress proxy only takes redirected connections).
    let targets = [
        (remote.a, REMOTE_PORT),
        (Ipv4Addr::new(10, 213, 0, 1), 15080),
    ];
    assert_eq!(reach(&c, &listed.id, &targets).await, [true, false]);
    step(t0, "an open sandbox resolves through its own resolver");

    let before = queries();
    for sb in [&listed, &none] {
        let (ok, out) = resolves(&c, &sb.id, "probe.zygote.test", "10.0.2.3").await;
        assert!(!ok, "{}: resolved {out}", sb.id);
        assert!(out.contains("REFUSED"), "{}: {out}", sb.id);
    }
    // The tunnel: many unique names under a domain nobody listed.
    let tunnel = "for i in $(seq 1 40); do \
                  timeout 3 nslookup -type=a d$i-6578666967.t.tunnel.example 10.0.2.3 \
                  >/dev/null 2>&1; done; echo done";
    for sb in [&listed, &none] {
        let out = sh(&c, &sb.id, tunnel).await.unwrap();
        assert!(out.contains("done"), "{out}");
    }
    assert_eq!(queries(), before, "a refused question reached the upstream");
    let counts = get(&c, &listed.id).await.network.dns.expect("dns counts");
    assert!(counts.refused >= 41 && counts.forwarded == 0, "{counts:?}");
    let log = dns_events(&c, &listed.id).await;
    assert!(
        log.contains("d7-6578666967.t.tunnel.example") && log.contains("refused"),
        "{log}"
    );
    step(
        t0,
        "allow_out of addresses and none: nothing resolves, the tunnel reaches nothing",
    );

    // The resolver over TCP, from inside the namespace; then hostile framing.
    let ns = netns_of(&open.id);
    let got = tcp_exchange(&ns, framed(&a_query("tcp.zygote.test")));
    assert!(got.len() > 14, "{got:?}");
    assert_eq!(&got[2..4], &[0x42, 0x42], "the query's id back");
    assert!(got.windows(4).any(|w| w == DNS_ANSWER.octets()), "{got:?}");
    // A length past any query: the connection is closed, nothing answered.
    let mut huge = vec![0xff, 0xff];
    huge.extend_from_slice(&a_query("tcp.zygote.test"));
    assert!(tcp_exchange(&ns, huge).is_empty());
    // A query refused by the policy over TCP too.
    let got = tcp_exchange(&netns_of(&listed.id), framed(&a_query("tcp.zygote.test")));
    assert_eq!(got.get(5).map(|b| b & 0x0f), Some(5), "REFUSED: {got:?}");
    step(
        t0,
        "TCP: answered, oversized framing cut off, refused under allow_out",
    );

    // A live change applies to the next question; and back.
    put_network(
        &c,
        &open.id,
        json!({"allow_out": [format!("{}/32", remote.a)]}),
    )
    .await;
    let before = queries();
    let (ok, out) = resolves(&c, &open.id, "after-change.zygote.test", "10.0.2.3").await;
    assert!(!ok && out.contains("REFUSED"), "{out}");
    assert_eq!(queries(), before);
    put_network(&c, &open.id, json!({})).await;
    let (ok, out) = resolves(&c, &open.id, "after-change.zygote.test", "10.0.2.3").await;
    assert!(ok, "{out}");
    step(t0, "a policy change applies to the next question");

    // A branch child: its own namespace, its own resolver and counts.
    let br: BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{}/branch", open.id),
            Some(&json!({"count": 1})),
        )
        .await
        .unwrap();
    let child = &br.children[0];
    let (ok, out) = resolves(&c, child, "child.zygote.test", "10.0.2.3").await;
    assert!(ok, "{out}");
    let child_counts = get(&c, child).await.network.dns.expect("child's counts");
    assert!(child_counts.forwarded >= 1, "{child_counts:?}");
    let parent_counts = get(&c, &open.id).await.network.dns.unwrap();
    assert_ne!(netns_of(child), netns_of(&open.id));
    assert!(
        parent_counts.queries > child_counts.queries,
        "{parent_counts:?}"
    );
    step(t0, "a branch child resolves through a resolver of its own");

    // kill -9, restart: the resolvers are made again in the namespaces.
    d.kill9();
    let d = start_daemon(&scratch.state, &args);
    let c = d.client();
    let (ok, out) = resolves(&c, &open.id, "restarted.zygote.test", "10.0.2.3").await;
    assert!(ok, "after restart: {out}");
    let (ok, out) = resolves(&c, &listed.id, "restarted.zygote.test", "10.0.2.3").await;
    assert!(!ok && out.contains("REFUSED"), "after restart: {out}");
    step(
        t0,
        "after kill -9 and a restart the resolvers serve again, by the policy",
    );

    for id in [&open.id, &listed.id, &none.id, child] {
        c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await
            .unwrap();
    }
}
