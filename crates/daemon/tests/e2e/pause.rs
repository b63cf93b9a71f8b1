//! Pause to disk and resume, end to end: a background process counting into a file
//! goes on where it was (same pid) after a resume, the VM process is gone while
//! paused, guest calls on a paused sandbox are refused (or resume it with
//! `auto_resume`), a TTL with `ttl_action: pause` pauses, and wrong-state calls change
//! nothing. [`check_pause`] leaves one sandbox paused for the daemon restart the suite
//! does; [`check_after_restart`] resumes it there.
use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::Client;
use zygote_daemon::model::{Sandbox, Snapshot, SnapshotKind, SnapshotList};

use super::common::{create, eventually, get, Cleanup};
use super::{exec, read, write};

/// Counts into /root/count every 0.2 s, in its own session (outlives the exec), and
/// records its pid. Each count is renamed into place, so a reader never sees the file
/// truncated and not yet written.
const COUNTER: &str = "setsid sh -c 'echo $$ > /root/counter.pid; i=0; \
    while :; do i=$((i+1)); echo $i > /root/count.new; mv /root/count.new /root/count; \
    sleep 0.2; done' </dev/null >/dev/null 2>&1 &";

async fn post(
    c: &Client,
    id: &str,
    what: &str,
) -> Result<Sandbox, zygote_daemon::client::ClientError> {
    c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/{what}"),
        None::<&()>,
    )
    .await
}

async fn count(c: &Client, id: &str) -> u64 {
    read(c, id, "/root/count")
        .await
        .expect("count file")
        .trim()
        .parse()
        .expect("a number")
}

/// The counter's pid, if that process still runs the counting loop.
async fn counter_pid(c: &Client, id: &str) -> u32 {
    let r = exec(
        c,
        id,
        "p=$(cat /root/counter.pid); kill -0 $p && grep -q count /proc/$p/cmdline && echo $p",
    )
    .await;
    assert_eq!(r.exit_code, Some(0), "the counter is not running: {r:?}");
    r.stdout.trim().parse().expect("pid")
}

/// Pauses `id` and checks what a paused sandbox shows; returns the view.
async fn pause_and_check(c: &Client, id: &str) -> Sandbox {
    let before = get(c, id).await;
    let vm_pid = before.pid.expect("a running sandbox has a VM");
    let paused = post(c, id, "pause").await.expect("pause");
    assert_eq!(paused.state, "paused", "{paused:?}");
    assert_eq!(paused.pid, None, "no VM process while paused");
    assert!(paused.paused_at.is_some());
    assert_eq!(paused.expires_at, None, "the TTL does not run while paused");
    // The VM process is gone and its memory with it.
    let gone = eventually(Duration::from_secs(10), async || {
        let stat = std::fs::read_to_string(format!("/proc/{vm_pid}/stat")).unwrap_or_default();
        (stat.is_empty() || stat.contains(") Z ")).then_some(())
    })
    .await;
    assert!(gone.is_some(), "VM process {vm_pid} outlived the pause");
    assert_eq!(get(c, id).await.state, "paused");
    paused
}

/// A sandbox left paused across the daemon restart: its counter's pid and count.
pub struct Parked {
    pub id: String,
    pid: u32,
    counted: u64,
    /// A diff snapshot of it taken after a resume (runtimes that have them).
    diff: Option<String>,
}

/// Everything but the restart; returns a sandbox left paused for it.
pub async fn check_pause(c: &Client, cleanup: &Cleanup) -> Parked {
    let p = &create(
        c,
        json!({"image": "minimal", "name": "e2e-pause", "ttl_secs": 3600}),
        cleanup,
    )
    .await[0];
    let id = p.id.as_str();
    assert_eq!((p.auto_resume, p.ttl_action.as_str()), (false, "delete"));
    assert_eq!(exec(c, id, COUNTER).await.exit_code, Some(0));
    write(c, id, "/root/kept.txt", "written before the pause").await;
    let pid = counter_pid(c, id).await;
    let counted = eventually(Duration::from_secs(30), async || {
        let n = count(c, id).await;
        (n >= 3).then_some(n)
    })
    .await
    .expect("the counter counts");

    let started = Instant::now();
    let paused = pause_and_check(c, id).await;
    eprintln!("    paused {id} in {} ms", started.elapsed().as_millis());
    let console = c
        .raw(Method::GET, &format!("/v1/sandboxes/{id}/logs"), None)
        .await
        .expect("logs of a paused sandbox");
    assert!(
        !console.is_empty(),
        "a paused sandbox keeps its console log"
    );
    let left = paused.ttl_left_secs.expect("TTL set aside");
    assert!(left <= 3600 && left > 3000, "{left}");

    // Guest calls, branch, snapshot and a second pause are refused; nothing changes.
    let e = c
        .json::<Value>(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&json!({"argv": ["true"]})),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("sandbox_paused"), "{e}");
    assert!(e.to_string().contains("resume"), "{e}");
    let e = read(c, id, "/root/kept.txt").await.unwrap_err();
    assert_eq!(e.code(), Some("sandbox_paused"), "{e}");
    for body in [json!({}), json!({"count": 2, "stream": true})] {
        // A streamed branch is refused before any stream starts.
        let e = c
            .json::<Value>(
                Method::POST,
                &format!("/v1/sandboxes/{id}/branch"),
                Some(&body),
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("sandbox_paused"), "{body}: {e}");
    }
    let e = c
        .json::<Value>(Method::POST, "/v1/snapshots", Some(&json!({"sandbox": id})))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("sandbox_paused"), "{e}");
    let e = post(c, id, "pause").await.unwrap_err();
    assert_eq!(e.code(), Some("wrong_state"), "{e}");
    for what in ["pause", "resume"] {
        let e = post(c, "sb-nosuchthing", what).await.unwrap_err();
        assert_eq!(e.code(), Some("not_found"), "{what}: {e}");
    }
    assert_eq!(get(c, id).await.state, "paused");

    let started = Instant::now();
    let resumed = post(c, id, "resume").await.expect("resume");
    eprintln!("    resumed {id} in {} ms", started.elapsed().as_millis());
    assert_eq!(resumed.state, "running");
    assert!(
        resumed.pid.is_some() && resumed.pid != p.pid,
        "a new VM process"
    );
    assert_eq!((resumed.paused_at, resumed.ttl_left_secs), (None, None));
    let deadline = resumed.expires_at.expect("the TTL runs again");
    assert!(
        deadline >= zygote_daemon::manager::now() + 3000,
        "{deadline}"
    );
    check_same_guest(c, id, pid, counted).await;
    let e = post(c, id, "resume").await.unwrap_err();
    assert_eq!(e.code(), Some("wrong_state"), "{e}");

    check_auto_resume(c, cleanup).await;
    let diff = check_snapshots_after_resume(c, id, cleanup).await;

    // Left paused for the daemon restart.
    let counted = count(c, id).await;
    pause_and_check(c, id).await;
    Parked {
        id: id.to_string(),
        pid,
        counted,
        diff,
    }
}

/// Implicit snapshots (a resumed VM's saved state, on runtimes that read it: kvm) of
/// `id`, by id.
async fn implicit_of(c: &Client, id: &str) -> Vec<String> {
    let list: SnapshotList = c
        .json(Method::GET, "/v1/snapshots", None::<&()>)
        .await
        .expect("snapshots");
    list.snapshots
        .into_iter()
        .filter(|s| s.implicit && s.source_sandbox == id && s.kind != SnapshotKind::Branch)
        .map(|s| s.id)
        .collect()
}

/// A diff snapshot taken after a resume outlives the next pause: it restores with what
/// was written after the resume, and keeps the state it is a diff of (the first
/// resume's) while the sandbox reads the second's. Returns it; [`check_after_restart`]
/// checks that nothing of either is left once it and the sandbox are gone. (Runtimes
/// without diff snapshots skip that part, saying so.)
async fn check_snapshots_after_resume(c: &Client, id: &str, cleanup: &Cleanup) -> Option<String> {
    let resumed_from = implicit_of(c, id).await;
    assert!(resumed_from.len() <= 1, "{resumed_from:?}");
    write(c, id, "/root/after-resume.txt", "written after the resume").await;
    let diff = c
        .json::<Snapshot>(
            Method::POST,
            "/v1/snapshots",
            Some(&json!({"sandbox": id, "kind": "diff"})),
        )
        .await;
    let diff = match diff {
        Ok(d) => d,
        Err(e) if e.code() == Some("unsupported") => {
            eprintln!("    (diff snapshots after resume not checked: {e})");
            return None;
        }
        Err(e) => panic!("diff snapshot after resume: {e}"),
    };
    for what in ["pause", "resume"] {
        post(c, id, what)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    let from_diff = create(c, json!({"snapshot": diff.id}), cleanup).await;
    let copy = &from_diff[0].id;
    assert_eq!(
        read(c, copy, "/root/after-resume.txt").await.unwrap(),
        "written after the resume"
    );
    c.raw(Method::DELETE, &format!("/v1/sandboxes/{copy}"), None)
        .await
        .expect("delete the copy");
    // The sandbox's disk reads the diff's frozen layer: the diff stays while it lives.
    let e = c
        .raw(Method::DELETE, &format!("/v1/snapshots/{}", diff.id), None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("snapshot_in_use"), "{e}");
    // The diff keeps the first resume's state; the VM reads the second's.
    let now_from = implicit_of(c, id).await;
    assert!(
        resumed_from.iter().all(|s| now_from.contains(s)),
        "the state the diff depends on went: {now_from:?}"
    );
    assert_eq!(now_from.len(), resumed_from.len() + 1, "{now_from:?}");
    Some(diff.id)
}

/// After resume: the files, the hostname and the same counter process, counting on
/// from where it was.
async fn check_same_guest(c: &Client, id: &str, pid: u32, counted: u64) {
    assert_eq!(
        read(c, id, "/root/kept.txt").await.unwrap(),
        "written before the pause"
    );
    assert_eq!(exec(c, id, "hostname").await.stdout.trim(), "e2e-pause");
    assert_eq!(counter_pid(c, id).await, pid, "the same counter process");
    let first = count(c, id).await;
    assert!(first >= counted, "the count went back: {first} < {counted}");
    let later = eventually(Duration::from_secs(30), async || {
        let n = count(c, id).await;
        (n > first + 2).then_some(n)
    })
    .await;
    assert!(later.is_some(), "the counter does not go on after resume");
}

/// `auto_resume`: an exec resumes a paused sandbox; `ttl_action: pause` pauses it when
/// its TTL runs out, with a whole TTL for after the resume.
async fn check_auto_resume(c: &Client, cleanup: &Cleanup) {
    let a = &create(
        c,
        json!({"image": "minimal", "auto_resume": true, "ttl_action": "pause"}),
        cleanup,
    )
    .await[0];
    let id = a.id.as_str();
    assert_eq!((a.auto_resume, a.ttl_action.as_str()), (true, "pause"));
    write(c, id, "/root/a.txt", "auto").await;
    pause_and_check(c, id).await;
    // Two guest calls at once: one resumes it, the other waits for that.
    let (r, other) = tokio::join!(exec(c, id, "cat /root/a.txt"), exec(c, id, "echo too"));
    assert_eq!(r.stdout, "auto", "{r:?}");
    assert_eq!(other.stdout, "too\n", "{other:?}");
    assert_eq!(get(c, id).await.state, "running");

    let s: Sandbox = c
        .json(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/ttl"),
            Some(&json!({"ttl_secs": 2, "ttl_action": "pause"})),
        )
        .await
        .expect("set ttl");
    assert!(s.expires_at.is_some());
    let paused = eventually(Duration::from_secs(60), async || {
        let s = get(c, id).await;
        (s.state == "paused").then_some(s)
    })
    .await
    .expect("the TTL paused it");
    assert_eq!(paused.ttl_left_secs, Some(2), "a whole TTL after resume");
    assert_eq!(read(c, id, "/root/a.txt").await.unwrap(), "auto");
    let s = get(c, id).await;
    assert_eq!(s.state, "running", "a file read resumed it");
    // Its whole TTL runs again from the resume, and pauses it again; deleted while
    // paused, it leaves nothing (the suite checks the state directory at the end).
    eventually(Duration::from_secs(60), async || {
        (get(c, id).await.state == "paused").then_some(())
    })
    .await
    .expect("the TTL paused it again");
    c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
        .await
        .expect("delete while paused");
}

/// After the daemon restart: still paused with no VM, and resumes as itself.
pub async fn check_after_restart(c: &Client, parked: &Parked) {
    let id = parked.id.as_str();
    let s = get(c, id).await;
    assert_eq!((s.state.as_str(), s.pid), ("paused", None), "{s:?}");
    let resumed = post(c, id, "resume").await.expect("resume after restart");
    assert_eq!(resumed.state, "running");
    check_same_guest(c, id, parked.pid, parked.counted).await;
    c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
        .await
        .expect("delete");
    if let Some(diff) = &parked.diff {
        c.raw(Method::DELETE, &format!("/v1/snapshots/{diff}"), None)
            .await
            .expect("delete the diff once the sandbox is gone");
        let left = implicit_of(c, id).await;
        assert!(left.is_empty(), "saved states left: {left:?}");
    }
}
