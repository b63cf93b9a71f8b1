//! Sandbox networking end to end (issue 13), on real namespaces and nftables: a
//! "remote host" of the test's own (a network namespace with a veth to the host, two
//! small TCP servers and a DNS server: [`remote`]) stands in for the internet; the host
//! runs services on every address; the daemon listens on every address too. No packet
//! goes anywhere outside this machine. Needs root, iproute2 and nftables (skips, saying
//! why, without them).
mod common;
#[path = "network/dns.rs"]
mod dns;
#[path = "network/ports.rs"]
mod ports;
#[path = "network/probe.rs"]
mod probe;
#[path = "network/remote.rs"]
mod remote;

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::{Client, ClientError};
use zygote_daemon::model::{BranchResponse, Sandbox};

use common::{create, get, proxy_url, sh, start_daemon, step, Scratch};
use ports::{exposed_ports, http_get};
use probe::{reach, unavailable};
use remote::{ip, serve, Remote, REMOTE_PORT};

/// The host's IPv4 addresses (every one must be out of a guest's reach).
fn host_addresses() -> Vec<Ipv4Addr> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let addr = w.get(3)?.split('/').next()?.parse().ok()?;
            (w[1] != "lo" && !w[1].starts_with("zyv")).then_some(addr)
        })
        .collect()
}

fn addr_of(sb: &Sandbox) -> Ipv4Addr {
    sb.network
        .address
        .as_deref()
        .unwrap_or_else(|| panic!("{} has no address: {:?}", sb.id, sb.network))
        .parse()
        .unwrap()
}

/// A sandbox's slot, from its address (crates/daemon/src/network/plan.rs).
fn slot(guest: Ipv4Addr) -> u32 {
    u32::from(guest) - u32::from(Ipv4Addr::new(10, 213, 0, 1))
}

/// The host end of a sandbox's link, and its name.
fn host_end(guest: Ipv4Addr) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 214, 0, 0)) + 4 * slot(guest) + 1)
}

fn host_link(guest: Ipv4Addr) -> String {
    format!("zyv{}", slot(guest))
}

fn namespaces() -> Vec<String> {
    zygote_daemon::network::host::netns_names()
}

fn links() -> Vec<String> {
    zygote_daemon::network::host::link_names()
}

fn leftovers(ids: &[String]) -> Vec<String> {
    namespaces()
        .into_iter()
        .filter(|n| ids.iter().any(|id| n.ends_with(id.as_str())))
        .collect()
}

async fn api_error(c: &Client, body: Value) -> (u16, String) {
    match c
        .json::<Value>(Method::POST, "/v1/sandboxes", Some(&body))
        .await
    {
        Err(ClientError::Api {
            status, message, ..
        }) => (status, message),
        other => panic!("{body}: expected an API error, got {other:?}"),
    }
}

async fn suite(runtime: &str) {
    let t0 = Instant::now();
    common::guest_assets();
    let remote = Remote::start();
    // A host service on every address, and one on loopback only.
    let any = TcpListener::bind("0.0.0.0:0").unwrap();
    let any_port = any.local_addr().unwrap().port();
    serve(any, "host-any".into());
    let lo = TcpListener::bind("127.0.0.1:0").unwrap();
    let lo_port = lo.local_addr().unwrap().port();
    serve(lo, "host-loopback".into());
    let scratch = Scratch::new();
    // The daemon on every address: a guest must still not reach its port.
    // Guests' DNS goes to the remote namespace's server.
    let args = remote.daemon_args("0.0.0.0:0", runtime);
    let d = start_daemon(
        &scratch.state,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let api_port: u16 = d.url.rsplit(':').next().unwrap().parse().unwrap();
    let c = d.client();
    let info: Value = c.json(Method::GET, "/v1/info", None::<&()>).await.unwrap();
    assert_eq!(info["network"]["backend"], "isolated", "{info}");
    step(t0, "daemon up, isolated networking");

    // Bad policies are the caller's 400s, before anything starts.
    let (status, msg) =
        api_error(&c, json!({"image": "minimal", "allow_out": ["10.0.0.1/8"]})).await;
    assert_eq!(status, 400, "{msg}");
    assert!(msg.contains("10.0.0.0/8"), "{msg}");
    let (status, msg) = api_error(
        &c,
        json!({"image": "minimal", "network": "none", "deny_out": ["10.0.0.0/8"]}),
    )
    .await;
    assert_eq!((status, msg.contains("egress")), (400, true), "{msg}");
    let (status, _) = api_error(&c, json!({"image": "minimal", "network": "offline"})).await;
    assert_eq!(status, 400);

    let cleanup = &scratch.cleanup;
    let egress = create(
        &c,
        json!({"image": "minimal", "deny_out": [remote.b.to_string()]}),
        cleanup,
    )
    .await
    .remove(0);
    let none = create(&c, json!({"image": "minimal", "network": "none"}), cleanup)
        .await
        .remove(0);
    let only_b = create(
        &c,
        json!({"image": "minimal", "allow_out": [format!("{}/32", remote.b)], "auto_resume": true}),
        cleanup,
    )
    .await
    .remove(0);
    step(t0, "three sandboxes: egress minus b, none, only b");
    for sb in [&egress, &none, &only_b] {
        assert!(sb.network.isolated, "{:?}", sb.network);
    }
    assert_eq!(egress.network.deny_out, vec![format!("{}/32", remote.b)]);
    let (ea, na, oa) = (addr_of(&egress), addr_of(&none), addr_of(&only_b));
    assert!(ea != na && na != oa && ea != oa, "{ea} {na} {oa}");

    let r = |a| (a, REMOTE_PORT);
    let remote_targets = [r(remote.a), r(remote.b)];
    assert_eq!(reach(&c, &egress.id, &remote_targets).await, [true, false]);
    assert_eq!(reach(&c, &none.id, &remote_targets).await, [false, false]);
    assert_eq!(reach(&c, &only_b.id, &remote_targets).await, [false, true]);
    step(t0, "egress / none / allow_out / deny_out as asked");

    // DNS: the daemon's resolver judges names; an allow_out of addresses names none,
    // even when it lists the upstream (b), and deny_out of the upstream does not stop
    // the daemon from asking it.
    let only_a = create(
        &c,
        json!({"image": "minimal", "allow_out": [remote.a.to_string()]}),
        cleanup,
    )
    .await
    .remove(0);
    assert_eq!(reach(&c, &only_a.id, &remote_targets).await, [true, false]);
    dns::dns_obeys_the_policy(&c, &remote, &[&egress.id], &[&only_b.id, &only_a.id]).await;
    c.raw(
        Method::DELETE,
        &format!("/v1/sandboxes/{}", only_a.id),
        None,
    )
    .await
    .unwrap();
    step(
        t0,
        "DNS by name: resolved without allow_out (deny_out naming the upstream or not), \
         refused under an allow_out of addresses, even one naming the upstream",
    );

    // Never the host (any address: its own link, the remote link, the others; the
    // daemon's port; a service on every address), the gateway, the metadata range.
    let mut forbidden = vec![
        (host_end(ea), any_port),
        (host_end(ea), api_port),
        (remote.host, any_port),
        (remote.host, api_port),
        (Ipv4Addr::new(10, 213, 0, 1), any_port),
        (Ipv4Addr::new(10, 213, 0, 1), lo_port),
        r(remote.ll),
    ];
    for a in host_addresses() {
        forbidden.extend([(a, any_port), (a, api_port), (a, lo_port)]);
    }
    let got = reach(&c, &egress.id, &forbidden).await;
    let open: Vec<_> = forbidden.iter().zip(&got).filter(|(_, o)| **o).collect();
    assert!(open.is_empty(), "a guest reached {open:?}");
    // The same targets answer from the host: the rules, not absent servers, said no.
    let host_sees = TcpStream::connect_timeout(
        &SocketAddr::from((remote.host, any_port)),
        Duration::from_secs(2),
    );
    assert!(host_sees.is_ok(), "the host service answers the host");
    step(
        t0,
        &format!("{} host/metadata targets unreachable", forbidden.len()),
    );

    // Another sandbox: unreachable from a guest, reachable from the host (exposed ports
    // use that path).
    sh(
        &c,
        &only_b.id,
        "(nc -l -p 9000 -e echo host-from-sandbox &) ; sleep 0.3",
    )
    .await
    .unwrap();
    assert_eq!(reach(&c, &egress.id, &[(oa, 9000)]).await, [false]);
    let mut s = TcpStream::connect_timeout(&SocketAddr::from((oa, 9000)), Duration::from_secs(5))
        .expect("the host reaches a guest's port");
    let mut got = String::new();
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.read_to_string(&mut got);
    assert!(got.contains("host-from-sandbox"), "{got:?}");
    step(t0, "no sandbox reaches another; the host reaches a guest");

    exposed_ports(&c, &d.token(), &only_b.id).await;
    step(
        t0,
        "an exposed port serves the guest's HTTP server through the proxy",
    );

    // Pause and resume: the same address, policy and exposed port come back, and the
    // guest's HTTP server (a process that was running) serves again.
    for op in ["pause", "resume"] {
        let s: Sandbox = c
            .json(
                Method::POST,
                &format!("/v1/sandboxes/{}/{op}", only_b.id),
                None::<&()>,
            )
            .await
            .unwrap_or_else(|e| panic!("{op}: {e}"));
        assert_eq!(
            s.network.address, only_b.network.address,
            "{op}: {:?}",
            s.network
        );
    }
    assert_eq!(reach(&c, &only_b.id, &remote_targets).await, [false, true]);
    let proxy = proxy_url(&c).await.expect("the daemon runs its proxy");
    let page = http_get(
        &proxy,
        "127.0.0.1",
        &format!("/sandboxes/{}/ports/8080/", only_b.id),
        None,
    );
    assert!(page.contains("guest-page"), "{page}");
    // auto_resume: a request through the proxy to a paused sandbox resumes it.
    c.raw(
        Method::POST,
        &format!("/v1/sandboxes/{}/pause", only_b.id),
        None,
    )
    .await
    .expect("pause");
    let page = http_get(
        &proxy,
        "127.0.0.1",
        &format!("/sandboxes/{}/ports/8080/", only_b.id),
        None,
    );
    assert!(page.contains("guest-page"), "{page}");
    assert_eq!(get(&c, &only_b.id).await.state, "running");
    step(
        t0,
        "paused and resumed: same address and policy, the exposed port serves again; \
         with auto_resume a proxied request resumes it",
    );

    // A branch child: its own address and MAC, its parent's policy.
    let br: BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{}/branch", egress.id),
            Some(&json!({"count": 1})),
        )
        .await
        .unwrap();
    let child = get(&c, &br.children[0]).await;
    let ca = addr_of(&child);
    assert_ne!(ca, ea);
    assert_eq!(child.network.deny_out, egress.network.deny_out);
    let inside = sh(&c, &child.id, "ifconfig eth0").await.unwrap();
    assert!(inside.contains(&format!("inet addr:{ca}")), "{inside}");
    assert_eq!(reach(&c, &child.id, &remote_targets).await, [true, false]);
    assert_eq!(reach(&c, &egress.id, &remote_targets).await, [true, false]);
    step(
        t0,
        &format!("branch child {ca}: own address, parent's policy"),
    );

    // Delete: namespace and link go at once.
    assert!(links().contains(&host_link(ca)));
    c.raw(Method::DELETE, &format!("/v1/sandboxes/{}", child.id), None)
        .await
        .unwrap();
    assert!(leftovers(std::slice::from_ref(&child.id)).is_empty());
    assert!(
        !links().contains(&host_link(ca)),
        "the child's host link is gone"
    );

    // kill -9, restart: sandboxes keep their network; a namespace no sandbox recorded
    // (a crash mid-create) is swept.
    let prefix = namespaces()
        .into_iter()
        .find_map(|n| n.strip_suffix(egress.id.as_str()).map(str::to_string))
        .expect("the egress sandbox's namespace");
    let stray = format!("{prefix}sb-left-behind");
    ip(&["netns", "add", &stray]);
    // One sandbox is paused, and its namespace and host link vanish while the daemon is
    // down, as a host reboot would have it.
    c.raw(
        Method::POST,
        &format!("/v1/sandboxes/{}/pause", only_b.id),
        None,
    )
    .await
    .expect("pause");
    d.kill9();
    ip(&["netns", "del", &format!("{prefix}{}", only_b.id)]);
    let _ = Command::new("ip")
        .args(["link", "del", &host_link(oa)])
        .output();
    let args = remote.daemon_args("127.0.0.1:0", runtime);
    let d = start_daemon(
        &scratch.state,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let c = d.client();
    assert!(!namespaces().contains(&stray), "swept at start-up");
    assert_eq!(reach(&c, &egress.id, &remote_targets).await, [true, false]);
    assert_eq!(reach(&c, &none.id, &remote_targets).await, [false, false]);
    let resumed: Sandbox = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{}/resume", only_b.id),
            None::<&()>,
        )
        .await
        .expect("resume on a namespace made anew");
    let ra = addr_of(&resumed);
    let inside = sh(&c, &only_b.id, "ifconfig eth0").await.unwrap();
    assert!(inside.contains(&format!("inet addr:{ra}")), "{inside}");
    assert_eq!(reach(&c, &only_b.id, &remote_targets).await, [false, true]);
    let proxy = proxy_url(&c).await.expect("the daemon runs its proxy");
    let page = http_get(
        &proxy,
        "127.0.0.1",
        &format!("/sandboxes/{}/ports/8080/", only_b.id),
        None,
    );
    assert!(page.contains("guest-page"), "{page}");
    step(
        t0,
        "after kill -9 + restart: same policies, leftover swept; a paused sandbox whose \
         namespace vanished resumes on a new one, with its policy and exposed port",
    );

    // A VM that dies: the daemon finds it dead and its namespace goes.
    let pid = get(&c, &none.id).await.pid.expect("the VM's pid");
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let dead = common::eventually(Duration::from_secs(30), async || {
        let sb = get(&c, &none.id).await;
        (sb.state == "dead").then_some(sb)
    })
    .await
    .expect("the daemon notices the VM died");
    assert!(leftovers(std::slice::from_ref(&none.id)).is_empty());
    assert!(!links().contains(&host_link(na)));
    assert!(!dead.network.isolated, "{:?}", dead.network);
    step(t0, "a VM that died lost its namespace");

    let ids = [egress.id, none.id, only_b.id];
    for id in &ids {
        c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await
            .unwrap();
    }
    assert!(leftovers(&ids).is_empty(), "{:?}", leftovers(&ids));
    for a in [ea, na, oa, ra] {
        assert!(!links().contains(&host_link(a)), "{} is left", host_link(a));
    }
    // (The daemon's spare namespaces, made ahead for the next sandboxes, stay while it
    // runs: tests/network_spares.rs.)
    let ours: Vec<String> = namespaces()
        .into_iter()
        .filter(|n| n.starts_with(&prefix) && !n.starts_with(&format!("{prefix}spare-")))
        .collect();
    assert!(ours.is_empty(), "{ours:?}");
    step(t0, "deleted: no namespace or link left");
}

#[tokio::test(flavor = "multi_thread")]
async fn qemu_sandbox_networking() {
    if let Some(why) = unavailable() {
        eprintln!("skipping the networking suite: {why}");
        return;
    }
    suite("qemu").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kvm_sandbox_networking() {
    if let Some(why) = unavailable() {
        eprintln!("skipping the networking suite: {why}");
        return;
    }
    if !zygote_vmm::host::linux_guests_or_skip("the kvm networking suite") {
        return;
    }
    suite("kvm").await;
}
