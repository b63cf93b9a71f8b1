//! Namespaces made ahead (issue 36, `zygote serve --network-spares N`), on real
//! namespaces and the qemu runtime: the daemon keeps N spares; a create takes one (it
//! is then named after its sandbox, and its rules are the sandbox's policy, the default
//! one or not), a branch child too, and the spares come back; the guest reaches the
//! test's remote host as its policy says; a kill -9 leaves spares that the next start
//! sweeps (and makes anew), a graceful stop removes them; nothing is left at the end.
//! Needs root, iproute2, nftables and the qemu runtime (skips, saying why).
mod common;
#[path = "network/probe.rs"]
mod probe;
#[path = "network/remote.rs"]
mod remote;

use std::process::Command;
use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::json;
use zygote_daemon::model::BranchResponse;

use common::{create, eventually, start_daemon, step, Scratch};
use probe::{reach, unavailable};
use remote::{Remote, REMOTE_PORT};

/// This daemon's namespaces: (spares, the others).
fn namespaces(state: &std::path::Path) -> (Vec<String>, Vec<String>) {
    let prefix = zygote_daemon::network::netns_prefix_for(&state.canonicalize().unwrap());
    zygote_daemon::network::host::netns_names()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .partition(|n| n.starts_with(&format!("{prefix}spare-")))
}

async fn spares_become(state: &std::path::Path, n: usize) -> Vec<String> {
    eventually(Duration::from_secs(30), async || {
        let (spares, _) = namespaces(state);
        (spares.len() == n).then_some(spares)
    })
    .await
    .unwrap_or_else(|| panic!("{} spares, not {n}", namespaces(state).0.len()))
}

/// The nftables ruleset of `id`'s namespace (named after it).
fn ruleset(state: &std::path::Path, id: &str) -> String {
    let (_, owned) = namespaces(state);
    let ns = owned
        .iter()
        .find(|n| n.ends_with(id))
        .unwrap_or_else(|| panic!("no namespace named after {id} in {owned:?}"));
    let out = Command::new("ip")
        .args([
            "netns", "exec", ns, "nft", "list", "table", "inet", "zygote",
        ])
        .output()
        .expect("nft");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn qemu_namespaces_made_ahead() {
    if let Some(why) = unavailable() {
        eprintln!("skipping qemu_namespaces_made_ahead: {why}");
        return;
    }
    if !common::qemu_guest_ready("qemu_namespaces_made_ahead") {
        return;
    }
    let t0 = Instant::now();
    let remote = Remote::start();
    let scratch = Scratch::new();
    let mut args = remote.daemon_args("127.0.0.1:0", "qemu");
    args.extend(["--network-spares".to_string(), "2".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = start_daemon(&scratch.state, &args);
    let c = d.client();
    let first = spares_become(&scratch.state, 2).await;
    step(t0, "two spares ready");

    // A create with the default policy takes one: named after the sandbox, open.
    let open = create(&c, json!({"image": "minimal"}), &scratch.cleanup)
        .await
        .remove(0);
    let (spares, owned) = namespaces(&scratch.state);
    assert_eq!(owned.len(), 1, "{owned:?}");
    assert!(owned[0].ends_with(&open.id));
    assert!(
        spares.len() < 2 || spares.iter().any(|s| !first.contains(s)),
        "one of {first:?} was taken: {spares:?}"
    );
    let targets = [(remote.a, REMOTE_PORT), (remote.b, REMOTE_PORT)];
    assert_eq!(reach(&c, &open.id, &targets).await, [true, true]);
    // Another policy: the spare gets that policy's rules before the guest runs.
    let listed = create(
        &c,
        json!({"image": "minimal", "allow_out": [format!("{}/32", remote.a)]}),
        &scratch.cleanup,
    )
    .await
    .remove(0);
    assert!(ruleset(&scratch.state, &listed.id).contains(&remote.a.to_string()));
    assert_eq!(reach(&c, &listed.id, &targets).await, [true, false]);
    step(
        t0,
        "creates take spares: the default policy and an allow list, each in force",
    );

    // Branch children take spares too and keep their parent's policy.
    let branched: BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{}/branch", listed.id),
            Some(&json!({"count": 2})),
        )
        .await
        .expect("branch");
    for child in &branched.children {
        assert_eq!(reach(&c, child, &targets).await, [true, false], "{child}");
        assert!(ruleset(&scratch.state, child).contains(&remote.a.to_string()));
    }
    let network_ms = branched.phases.as_ref().map(|p| p.network_ms);
    spares_become(&scratch.state, 2).await;
    step(
        t0,
        &format!("branch children take spares (network set-up {network_ms:?} ms); refilled"),
    );

    // kill -9: the spares stay behind; the next start sweeps them and makes new ones;
    // the sandboxes keep their namespaces.
    let before = namespaces(&scratch.state).0;
    d.kill9();
    let d = start_daemon(&scratch.state, &args);
    let c = d.client();
    let after = spares_become(&scratch.state, 2).await;
    assert!(
        after.iter().all(|s| !before.contains(s)),
        "old spares swept: {before:?} -> {after:?}"
    );
    assert_eq!(namespaces(&scratch.state).1.len(), 4);
    assert_eq!(reach(&c, &open.id, &targets).await, [true, true]);
    step(
        t0,
        "after kill -9: old spares swept, new ones made, sandboxes unchanged",
    );

    // A restart that cannot isolate (here chosen: --network user) refuses to branch a
    // sandbox whose VM has an isolated interface, saying why, rather than start children
    // that could not restore it; the parent runs on. So for every other state holding
    // such an interface: a snapshot (and a sandbox from it), a paused sandbox's saved
    // state. The next isolated start branches, creates and resumes them.
    let snap: serde_json::Value = c
        .json(
            Method::POST,
            "/v1/snapshots",
            Some(&json!({"sandbox": open.id, "name": "isolated-nic"})),
        )
        .await
        .expect("snapshot");
    let snap_id = snap["id"].as_str().unwrap().to_string();
    let _: serde_json::Value = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{}/pause", listed.id),
            Some(&json!({})),
        )
        .await
        .expect("pause");
    d.kill9();
    let mut user_args = args.clone();
    user_args.extend(["--network", "user"]);
    let d = start_daemon(&scratch.state, &user_args);
    let c = d.client();
    let refused = c
        .json::<BranchResponse>(
            Method::POST,
            &format!("/v1/sandboxes/{}/branch", open.id),
            Some(&json!({"count": 1})),
        )
        .await;
    match refused {
        Err(zygote_daemon::client::ClientError::Api {
            status, message, ..
        }) => {
            assert_eq!(status, 409, "{message}");
            assert!(message.contains("without isolated networking"), "{message}");
        }
        other => panic!("a branch without isolation: {other:?}"),
    }
    let refused_create = c
        .json::<serde_json::Value>(
            Method::POST,
            "/v1/sandboxes",
            Some(&json!({"snapshot": snap_id})),
        )
        .await;
    let refused_resume = c
        .json::<serde_json::Value>(
            Method::POST,
            &format!("/v1/sandboxes/{}/resume", listed.id),
            Some(&json!({})),
        )
        .await;
    for (what, r) in [
        ("create from the snapshot", refused_create),
        ("resume", refused_resume),
    ] {
        match r {
            Err(zygote_daemon::client::ClientError::Api {
                status, message, ..
            }) => {
                assert_eq!(status, 409, "{what}: {message}");
                assert!(
                    message.contains("isolated network interface"),
                    "{what}: {message}"
                );
            }
            other => panic!("{what} without isolation: {other:?}"),
        }
    }
    let listing: zygote_daemon::model::SandboxList = c
        .json(Method::GET, "/v1/sandboxes", None::<&()>)
        .await
        .expect("list");
    assert_eq!(
        listing.sandboxes.len(),
        4,
        "a refused create left nothing behind"
    );
    assert_eq!(
        common::sh(&c, &open.id, "echo alive").await.as_deref(),
        Ok("alive\n")
    );
    d.kill9();
    let d = start_daemon(&scratch.state, &args);
    let c = d.client();
    let again: BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{}/branch", open.id),
            Some(&json!({"count": 1})),
        )
        .await
        .expect("branch once isolated again");
    assert_eq!(reach(&c, &again.children[0], &targets).await, [true, true]);
    let from_snap = create(&c, json!({"snapshot": snap_id}), &scratch.cleanup)
        .await
        .remove(0);
    assert_eq!(reach(&c, &from_snap.id, &targets).await, [true, true]);
    let _: serde_json::Value = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{}/resume", listed.id),
            Some(&json!({})),
        )
        .await
        .expect("resume once isolated again");
    assert_eq!(reach(&c, &listed.id, &targets).await, [true, false]);
    step(
        t0,
        "without isolation, a branch, a create from a snapshot and a resume of states with \
         an isolated interface are refused (409), parent alive; with it they work",
    );

    // Deleting the sandboxes removes their namespaces; a graceful stop the spares.
    for id in [open.id.clone(), listed.id.clone(), from_snap.id.clone()]
        .into_iter()
        .chain(branched.children.clone())
        .chain(again.children.clone())
    {
        c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await
            .expect("delete");
    }
    drop(d);
    let (spares, owned) = namespaces(&scratch.state);
    assert_eq!((spares.len(), owned.len()), (0, 0), "{spares:?} {owned:?}");
    step(t0, "deleted and stopped: nothing left");
}
