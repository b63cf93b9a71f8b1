//! Sandbox time-to-live against a real `zygoted` on the qemu runtime: a
//! sandbox whose TTL runs out is deleted like `DELETE` would (process,
//! cgroup and files gone), also by a daemon restarted after the deadline
//! was set; clearing the TTL keeps a sandbox alive; children inherit it.
mod common;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::Client;
use zygote_daemon::model::{BranchResponse, Sandbox, SandboxList};

use common::{eventually, files_under, processes_using, start_daemon, Cleanup};

fn note(t0: Instant, what: &str) {
    let _ = writeln!(
        std::io::stderr(),
        "[{:6.1}s] {what}",
        t0.elapsed().as_secs_f64()
    );
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

async fn lookup(c: &Client, id: &str) -> Result<Sandbox, Option<String>> {
    c.json(Method::GET, &format!("/v1/sandboxes/{id}"), None::<&()>)
        .await
        .map_err(|e| e.code().map(str::to_string))
}

async fn set_ttl(c: &Client, id: &str, ttl_secs: Option<u64>) -> Sandbox {
    c.json(
        Method::PUT,
        &format!("/v1/sandboxes/{id}/ttl"),
        Some(&json!({ "ttl_secs": ttl_secs })),
    )
    .await
    .unwrap_or_else(|e| panic!("PUT ttl {ttl_secs:?} on {id}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_sandboxes_are_deleted_and_cleared_ttls_keep_them() {
    if !common::qemu_guest_ready("the TTL test") {
        return;
    }
    let t0 = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let cleanup = Cleanup {
        state: state.clone(),
        cgroups: Default::default(),
    };
    let args = ["--listen", "127.0.0.1:0", "--runtime", "qemu"];
    let d1 = start_daemon(&state, &args);
    let c = d1.client();

    let made: SandboxList = c
        .json(
            Method::POST,
            "/v1/sandboxes",
            Some(&json!({"image": "minimal", "name": "ttl", "n": 2, "ttl_secs": 3})),
        )
        .await
        .expect("create");
    let (doomed, keeper) = (made.sandboxes[0].clone(), made.sandboxes[1].clone());
    note(
        t0,
        &format!("created {} and {} with ttl_secs=3", doomed.id, keeper.id),
    );
    for s in &made.sandboxes {
        cleanup
            .cgroups
            .lock()
            .unwrap()
            .extend(s.cgroup.path.clone().map(Into::into));
        assert_eq!(s.ttl_secs, Some(3), "{s:?}");
        let deadline = s.expires_at.expect("expires_at with a TTL");
        // Counted from when it runs, never shorter than the TTL.
        assert!(deadline >= s.created_at + 3, "{s:?}");
        assert!(deadline <= unix_now() + 4, "{s:?}");
    }
    let old_deadline = keeper.expires_at.unwrap();

    let extended = set_ttl(&c, &keeper.id, Some(600)).await;
    assert_eq!(extended.ttl_secs, Some(600));
    assert!(
        extended.expires_at.unwrap() >= unix_now() + 599,
        "{extended:?}"
    );
    let cleared = set_ttl(&c, &keeper.id, None).await;
    assert_eq!((cleared.ttl_secs, cleared.expires_at), (None, None));

    // The deadline is in the database: a daemon started after a crash
    // honours it.
    d1.kill9();
    let d2 = start_daemon(&state, &args);
    let c = d2.client();
    note(t0, "daemon restarted after SIGKILL");

    let gone = eventually(Duration::from_secs(30), async || {
        (lookup(&c, &doomed.id).await.err()? == Some("not_found".into())).then_some(())
    })
    .await;
    assert!(gone.is_some(), "{} outlived its TTL", doomed.id);
    let gone_at = unix_now();
    note(t0, &format!("{} expired", doomed.id));
    assert!(
        gone_at >= doomed.expires_at.unwrap(),
        "deleted before its deadline"
    );
    let pid = doomed.pid.unwrap();
    assert!(
        eventually(Duration::from_secs(5), async || (!alive(pid)).then_some(()))
            .await
            .is_some(),
        "the expired sandbox's VM process {pid} survived"
    );
    if let Some(cg) = &doomed.cgroup.path {
        assert!(!Path::new(cg).exists(), "cgroup {cg} left behind");
    }
    assert!(!state.join("vms").join(&doomed.id).exists());
    let metrics =
        String::from_utf8(c.raw(Method::GET, "/metrics", None).await.unwrap().to_vec()).unwrap();
    assert!(
        metrics.contains("\nzygote_sandboxes_expired_total 1\n"),
        "{metrics}"
    );

    // Past the deadline it had before the TTL was cleared, it still runs.
    while unix_now() <= old_deadline + 1 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let kept = lookup(&c, &keeper.id).await.expect("the keeper is kept");
    assert_eq!((kept.state.as_str(), kept.expires_at), ("running", None));
    assert!(alive(kept.pid.unwrap()));

    // Children of an expiring sandbox inherit its TTL length.
    set_ttl(&c, &keeper.id, Some(600)).await;
    let br: BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{}/branch", keeper.id),
            Some(&json!({"count": 1})),
        )
        .await
        .expect("branch");
    let child = lookup(&c, &br.children[0]).await.expect("the child");
    cleanup
        .cgroups
        .lock()
        .unwrap()
        .extend(child.cgroup.path.clone().map(Into::into));
    assert_eq!(child.ttl_secs, Some(600), "{child:?}");
    assert!(child.expires_at.unwrap() >= unix_now() + 590, "{child:?}");
    note(t0, "branch child inherited the TTL");

    for id in [&child.id, &keeper.id] {
        c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await
            .expect("delete");
    }
    let daemon_pid = d2.pid();
    let left: Vec<u32> = processes_using(&state)
        .into_iter()
        .filter(|p| *p != daemon_pid)
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let vms = files_under(&state.join("vms"));
    assert!(vms.is_empty(), "{vms:?}");
    let listed: Value = c
        .json(Method::GET, "/v1/sandboxes", None::<&()>)
        .await
        .unwrap();
    assert_eq!(listed["sandboxes"], json!([]));
    note(t0, "done");
    drop(d2);
}
