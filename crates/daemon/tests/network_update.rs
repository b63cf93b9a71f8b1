//! Changing a running sandbox's egress policy (`PUT /v1/sandboxes/{id}/network`) on
//! real namespaces and nftables: the test's own "remote host" (a network namespace with
//! two servers, [`remote`]) is reachable, then not once denied, then again; bad input is
//! refused as at create; branch children inherit the policy in force; a paused sandbox
//! resumes under the policy set while it was paused; the recorded policy is what a
//! restarted daemon loads, also after a kill -9 between the steps of a change. No
//! packet leaves this machine. Needs root, iproute2, nftables and the qemu runtime.
mod common;
#[path = "network/probe.rs"]
mod probe;
#[path = "network/remote.rs"]
mod remote;

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::{Client, ClientError};
use zygote_daemon::model::{BranchResponse, Sandbox};

use common::{create, get, sh, start_daemon, start_daemon_with_env, step, Scratch};
use probe::{reach, unavailable};
use remote::{Remote, REMOTE_PORT, SINK_PORT};

async fn put_network(c: &Client, id: &str, body: Value) -> Result<Sandbox, (u16, String)> {
    c.json(
        Method::PUT,
        &format!("/v1/sandboxes/{id}/network"),
        Some(&body),
    )
    .await
    .map_err(|e| match e {
        ClientError::Api {
            status, message, ..
        } => (status, message),
        other => (0, other.to_string()),
    })
}

/// The sandbox's nftables ruleset, read from its namespace.
fn ruleset(id: &str) -> String {
    let ns = zygote_daemon::network::host::netns_names()
        .into_iter()
        .find(|n| n.starts_with("zygote-") && n.ends_with(id))
        .expect("the sandbox's namespace");
    let out = Command::new("ip")
        .args([
            "netns", "exec", &ns, "nft", "list", "table", "inet", "zygote",
        ])
        .output()
        .expect("nft");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn qemu_network_policy_changes_while_running() {
    if let Some(why) = unavailable() {
        eprintln!("skipping qemu_network_policy_changes_while_running: {why}");
        return;
    }
    if Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipping qemu_network_policy_changes_while_running: no qemu-system-x86_64");
        return;
    }
    let t0 = Instant::now();
    common::guest_assets();
    let remote = Remote::start();
    let scratch = Scratch::new();
    let args = remote.daemon_args("127.0.0.1:0", "qemu");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = start_daemon(&scratch.state, &args);
    let c = d.client();
    let sb = create(&c, json!({"image": "minimal"}), &scratch.cleanup)
        .await
        .remove(0);
    let targets = [(remote.a, REMOTE_PORT), (remote.b, REMOTE_PORT)];
    let (a, b) = (format!("{}/32", remote.a), format!("{}/32", remote.b));
    assert_eq!(reach(&c, &sb.id, &targets).await, [true, true]);
    step(t0, "egress: both remote servers reachable");

    // Bad input: the create checks, the sandbox's rules untouched.
    let before = ruleset(&sb.id);
    for (body, words) in [
        (json!({"deny_out": ["10.0.0.1/8"]}), "10.0.0.0/8"),
        (json!({"deny_out": ["*.com"]}), "not a name rule"),
        (
            json!({"network": "none", "deny_out": ["10.0.0.0/8"]}),
            "egress",
        ),
        (json!({"allow": ["10.0.0.0/8"]}), "unknown field"),
    ] {
        let (status, msg) = put_network(&c, &sb.id, body.clone()).await.unwrap_err();
        assert_eq!(status, 400, "{body}: {msg}");
        assert!(msg.contains(words), "{body}: {msg}");
    }
    let (status, _) = put_network(&c, "sb-nosuch", json!({})).await.unwrap_err();
    assert_eq!(status, 404);
    assert_eq!(ruleset(&sb.id), before);
    step(t0, "bad policies refused (400), unknown sandbox 404");

    // A connection the guest opened before the change: it keeps sending to a's sink.
    sh(
        &c,
        &sb.id,
        &format!(
            "(while :; do echo ping; sleep 0.1; done | nc {} {SINK_PORT}) \
             >/dev/null 2>&1 </dev/null &",
            remote.a
        ),
    )
    .await
    .unwrap();
    let flowing = common::eventually(Duration::from_secs(10), async || {
        (remote.sunk.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    assert!(
        flowing.is_some(),
        "the guest's connection to the sink carries data"
    );

    let s = put_network(&c, &sb.id, json!({"deny_out": [remote.a.to_string()]}))
        .await
        .unwrap();
    assert_eq!(s.network.deny_out, std::slice::from_ref(&a));
    assert_eq!(reach(&c, &sb.id, &targets).await, [false, true]);
    // The open connection is cut too: nothing more of it arrives.
    let settled = remote.sunk.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        remote.sunk.load(Ordering::SeqCst),
        settled,
        "a connection opened before the deny still sends"
    );
    step(
        t0,
        "deny_out a: a unreachable (also on a connection already open), b reachable",
    );

    // A branch child inherits the policy in force.
    let br: BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{}/branch", sb.id),
            Some(&json!({"count": 1})),
        )
        .await
        .unwrap();
    let child = get(&c, &br.children[0]).await;
    assert_eq!(child.network.deny_out, std::slice::from_ref(&a));
    assert_eq!(reach(&c, &child.id, &targets).await, [false, true]);
    c.raw(Method::DELETE, &format!("/v1/sandboxes/{}", child.id), None)
        .await
        .unwrap();
    step(t0, "a branch child has the changed policy");

    let s = put_network(&c, &sb.id, json!({"allow_out": [remote.a.to_string()]}))
        .await
        .unwrap();
    assert_eq!(
        (s.network.allow_out, s.network.deny_out),
        (vec![a.clone()], vec![])
    );
    assert_eq!(reach(&c, &sb.id, &targets).await, [true, false]);
    let s = put_network(&c, &sb.id, json!({"network": "none"}))
        .await
        .unwrap();
    assert_eq!(s.network.mode.as_str(), "none");
    assert_eq!(reach(&c, &sb.id, &targets).await, [false, false]);
    let s = put_network(&c, &sb.id, json!({})).await.unwrap();
    assert!(s.network.allow_out.is_empty() && s.network.deny_out.is_empty());
    assert_eq!(reach(&c, &sb.id, &targets).await, [true, true]);
    step(
        t0,
        "allow_out a, then none, then {} (cleared): each in force at once",
    );

    // Paused: the change is recorded and in force at resume.
    c.raw(
        Method::POST,
        &format!("/v1/sandboxes/{}/pause", sb.id),
        None,
    )
    .await
    .unwrap();
    put_network(&c, &sb.id, json!({"deny_out": [remote.b.to_string()]}))
        .await
        .unwrap();
    c.raw(
        Method::POST,
        &format!("/v1/sandboxes/{}/resume", sb.id),
        None,
    )
    .await
    .unwrap();
    assert_eq!(reach(&c, &sb.id, &targets).await, [true, false]);
    step(t0, "changed while paused: in force after resume");

    // Restart: the recorded policy is loaded again (the namespace's table is emptied
    // by hand while the daemon is down, so only the record can bring the rules back).
    d.kill9();
    let ns_table_gone = |id: &str| {
        let ns = zygote_daemon::network::host::netns_names()
            .into_iter()
            .find(|n| n.starts_with("zygote-") && n.ends_with(id))
            .unwrap();
        remote::ip(&[
            "netns", "exec", &ns, "nft", "delete", "table", "inet", "zygote",
        ]);
    };
    ns_table_gone(&sb.id);
    let d = start_daemon(&scratch.state, &args);
    let c = d.client();
    assert_eq!(
        get(&c, &sb.id).await.network.deny_out,
        std::slice::from_ref(&b)
    );
    assert_eq!(reach(&c, &sb.id, &targets).await, [true, false]);
    step(t0, "daemon restarted: the recorded policy is in force");
    d.kill9();

    // kill -9 inside a change (deny b -> deny a): the rules in force while the daemon
    // is down are both policies at once; the restarted daemon loads the recorded one,
    // the old before the record was written and the new after.
    for (fault, recorded, reached) in [
        ("network.narrowed", &b, [true, false]),
        ("network.recorded", &a, [false, true]),
    ] {
        let dying = start_daemon_with_env(&scratch.state, &args, &[("ZYGOTE_FAULT", fault)]);
        let e = put_network(
            &dying.client(),
            &sb.id,
            json!({"deny_out": [remote.a.to_string()]}),
        )
        .await
        .unwrap_err();
        assert_eq!(e.0, 0, "{fault}: the daemon died mid-request: {e:?}");
        dying.kill9();
        let rules = ruleset(&sb.id);
        assert!(
            rules.contains("deny_out_1") && rules.contains(&remote.a.to_string()),
            "{fault}: {rules}"
        );
        // In the old policy's deny set (the ruleset names b elsewhere too: it is the
        // upstream resolver the namespace's output chain lets the daemon ask).
        let old_deny = rules
            .split("set deny_out {")
            .nth(1)
            .and_then(|rest| rest.split('}').next())
            .unwrap_or_default();
        assert!(old_deny.contains(&remote.b.to_string()), "{fault}: {rules}");
        let d2 = start_daemon(&scratch.state, &args);
        let c2 = d2.client();
        assert_eq!(
            get(&c2, &sb.id).await.network.deny_out,
            std::slice::from_ref(recorded)
        );
        assert_eq!(reach(&c2, &sb.id, &targets).await, reached, "{fault}");
        // Back to deny b for the next round.
        put_network(&c2, &sb.id, json!({"deny_out": [remote.b.to_string()]}))
            .await
            .unwrap();
        d2.kill9();
    }
    step(
        t0,
        "kill -9 mid-change: never more open than the record, then the record",
    );

    let d = start_daemon(&scratch.state, &args);
    d.client()
        .raw(Method::DELETE, &format!("/v1/sandboxes/{}", sb.id), None)
        .await
        .unwrap();
}
