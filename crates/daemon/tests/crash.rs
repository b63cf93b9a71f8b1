//! Issue 19, defect 3: a daemon killed in the middle of a multi-step operation leaves
//! nothing broken. Each fault point (`ZYGOTE_FAULT`, crates/daemon/src/fault.rs) kills the
//! daemon with SIGKILL at one step of a snapshot, branch, restore, merge, pause, resume,
//! snapshot deletion or sandbox deletion; a clean daemon on the same state then has to show the sandbox
//! running with every write its guest made, its VM holding no deleted file, later
//! snapshots and branches working, half-made children gone, and no file or process left
//! that no record explains. Before the fix, a kill after the disk-layer switch made the
//! restarted daemon delete the parent's active layer.
mod common;
#[path = "crash/pause.rs"]
mod pause;
#[path = "crash/qemu_branch.rs"]
mod qemu_branch;

use std::path::Path;
use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::Client;
use zygote_daemon::model::{BranchResponse, Sandbox, SandboxList, SnapshotList};

use common::{
    create, get, processes_using, start_daemon, start_daemon_with_env, step, Daemon, Scratch,
};

async fn sh(c: &Client, id: &str, script: &str) -> String {
    common::sh(c, id, script)
        .await
        .unwrap_or_else(|e| panic!("{script:?}: {e}"))
}

/// Branches `id` into one child.
async fn branch1(c: &Client, id: &str) -> Result<BranchResponse, String> {
    c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/branch"),
        Some(&json!({"count": 1})),
    )
    .await
    .map_err(|e| e.to_string())
}

async fn snapshot(c: &Client, id: &str, name: &str) -> Result<Value, String> {
    c.json(
        Method::POST,
        "/v1/snapshots",
        Some(&json!({"sandbox": id, "name": name})),
    )
    .await
    .map_err(|e| e.to_string())
}

async fn snapshots(c: &Client) -> SnapshotList {
    c.json(Method::GET, "/v1/snapshots", None::<&()>)
        .await
        .expect("list snapshots")
}

async fn sandbox_ids(c: &Client) -> Vec<String> {
    let list: SandboxList = c
        .json(Method::GET, "/v1/sandboxes", None::<&()>)
        .await
        .expect("list sandboxes");
    list.sandboxes.into_iter().map(|s| s.id).collect()
}

/// A snapshot name for a fault point (names take no dots).
fn name_at(what: &str, point: &str) -> String {
    format!("{what}-{}", point.replace('.', "-"))
}

/// The daemon dies at its fault point: the request fails and the process ends by SIGKILL.
async fn expect_killed<T: std::fmt::Debug>(
    mut d: Daemon,
    point: &str,
    result: Result<T, impl std::fmt::Display>,
) {
    let error = match &result {
        Ok(v) => panic!("{point}: the request succeeded ({v:?}) instead of killing the daemon"),
        Err(e) => e.to_string(),
    };
    // The request ended because the daemon died: it is gone (or going) by now.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = d.child.try_wait().expect("waiting for zygoted") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "{point}: zygoted still runs; the request said: {error}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{point}: {status:?}");
}

/// No file descriptor of the sandbox's VM names a deleted file: its disk chain is whole.
fn assert_no_deleted_files_open(sb: &Sandbox, what: &str) {
    let pid = sb.pid.expect("a running sandbox has a VM process");
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        assert!(
            !target.to_string_lossy().ends_with(" (deleted)"),
            "{what}: the VM of {} has a deleted file open: {}",
            sb.id,
            target.display()
        );
    }
}

/// Every file in `layers/` and `snapshots/` is named by a record, or held by a VM.
async fn assert_no_orphans(c: &Client, state: &Path, what: &str) {
    let snaps = snapshots(c).await;
    let list: SandboxList = c
        .json(Method::GET, "/v1/sandboxes", None::<&()>)
        .await
        .unwrap();
    let mut named: Vec<String> = snaps.snapshots.iter().map(|s| s.id.clone()).collect();
    // A paused sandbox's saved state (the kvm runtime keeps it after a resume too).
    named.extend(list.sandboxes.iter().map(|s| format!("{}.park-", s.id)));
    for e in std::fs::read_dir(state.join("snapshots"))
        .unwrap()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(
            named
                .iter()
                .any(|n| name == *n || (n.ends_with(".park-") && name.starts_with(n.as_str()))),
            "{what}: orphan snapshot dir {name}"
        );
    }
    let vms: Vec<String> = list.sandboxes.iter().map(|s| s.id.clone()).collect();
    for e in std::fs::read_dir(state.join("vms")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(vms.contains(&name), "{what}: orphan VM dir {name}");
    }
}

/// Sandbox ids and the daemon's live VM processes match: no leftover VM of a half-made
/// child or restore runs.
async fn assert_vm_processes(c: &Client, state: &Path, what: &str) {
    let list: SandboxList = c
        .json(Method::GET, "/v1/sandboxes", None::<&()>)
        .await
        .unwrap();
    let recorded: Vec<u32> = list.sandboxes.iter().filter_map(|s| s.pid).collect();
    let daemon_children: Vec<u32> = processes_using(state)
        .into_iter()
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            // A zygote VMM process without a KVM VM is a branch spawner (it forked the
            // children, wrote a kept branch point and only reaps): not a VM.
            comm.trim().starts_with("qemu")
                || (comm.trim().starts_with("zygote") && holds_kvm_vm(*pid))
        })
        .filter(|pid| !is_daemon(*pid))
        .collect();
    for pid in &daemon_children {
        assert!(
            recorded.contains(pid),
            "{what}: VM process {pid} runs but no sandbox records it ({recorded:?})"
        );
    }
}

/// Whether the process has a KVM VM open (`anon_inode:kvm-vm`).
fn holds_kvm_vm(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy().contains("kvm-vm"))
        })
}

fn is_daemon(pid: u32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.to_string_lossy().contains("zygoted"))
        .unwrap_or(false)
}

/// Waits for the child state of a sandbox a crash interrupted.
async fn dead_with_reason(c: &Client, id: &str) -> String {
    let sb = get(c, id).await;
    assert_eq!(sb.state, "dead", "{sb:?}");
    sb.exit_reason.expect("a dead sandbox says why")
}

/// After the restart that followed a crash at `point`: no VM process or file that no
/// record explains, and sandbox `id`'s chain works (a snapshot succeeds). Returns it.
async fn settled_and_snapshots(c: &Client, state: &Path, id: &str, point: &str) -> Value {
    assert_vm_processes(c, state, point).await;
    assert_no_orphans(c, state, point).await;
    snapshot(c, id, &name_at("after", point))
        .await
        .unwrap_or_else(|e| panic!("{point}: snapshot after recovery: {e}"))
}

/// A branch child the crash at `point` left half-made: reported dead for that reason,
/// then deleted.
async fn delete_dead_child(c: &Client, id: &str, point: &str) {
    let reason = dead_with_reason(c, id).await;
    assert!(reason.contains("daemon stopped"), "{point}: {reason}");
    c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
        .await
        .expect("delete the dead child");
}

async fn suite(runtime: &str) {
    let t0 = Instant::now();
    common::guest_assets();
    let scratch = Scratch::new();
    let (state, cleanup) = (&scratch.state, &scratch.cleanup);
    let args = ["--listen", "127.0.0.1:0", "--runtime", runtime];
    let faulty = |point: &str| start_daemon_with_env(state, &args, &[("ZYGOTE_FAULT", point)]);

    let d = start_daemon(state, &args);
    let c = d.client();
    let made = create(
        &c,
        json!({"image": "minimal", "name": "crash", "n": 2}),
        cleanup,
    )
    .await;
    let (a, b) = (made[0].id.clone(), made[1].id.clone());
    step(t0, &format!("created {a} and {b} on the {runtime} runtime"));
    drop(d);

    // Captures: the guest writes a mark, the daemon dies at the point, a clean daemon
    // must show every mark, a whole disk chain, and take snapshots and branches again.
    let mut capture_points = vec!["snapshot.recorded", "snapshot.captured"];
    if runtime == "qemu" {
        // Inside the qemu runtime's capture: after the state file, after the layer switch.
        capture_points.extend(["capture.migrated", "capture.disk-switched"]);
    }
    // A branch: recorded; point taken (not recorded); point recorded (the child not yet);
    // the child recorded running.
    capture_points.extend([
        "branch.recorded",
        "branch.captured",
        "branch.point-recorded",
        "branch.child-recorded",
    ]);
    let mut marks = 0;
    for point in capture_points {
        let d = faulty(point);
        let c = d.client();
        marks += 1;
        sh(&c, &a, &format!("echo {marks} > /root/mark-{marks}; sync")).await;
        let before: Vec<String> = (snapshots(&c).await.snapshots)
            .into_iter()
            .map(|s| s.id)
            .collect();
        let sandboxes_before: SandboxList = c
            .json(Method::GET, "/v1/sandboxes", None::<&()>)
            .await
            .unwrap();
        if point.starts_with("branch.") {
            let r = branch1(&c, &a).await;
            expect_killed(d, point, r).await;
        } else {
            let r = snapshot(&c, &a, &name_at("at", point)).await;
            expect_killed(d, point, r).await;
        }
        step(t0, &format!("{point}: daemon killed there"));

        let d = start_daemon(state, &args);
        let c = d.client();
        let sb = get(&c, &a).await;
        assert_eq!(sb.state, "running", "{point}: {sb:?}");
        assert_no_deleted_files_open(&sb, point);
        let seen = sh(&c, &a, "cat /root/mark-*").await;
        let want: String = (1..=marks).map(|m| format!("{m}\n")).collect();
        assert_eq!(seen, want, "{point}: the guest's writes");
        // The capture is recorded if the runtime had finished it, else gone entirely.
        let after = snapshots(&c).await.snapshots;
        let new: Vec<_> = after.iter().filter(|s| !before.contains(&s.id)).collect();
        let completed = matches!(
            point,
            "snapshot.captured"
                | "capture.disk-switched"
                | "branch.point-recorded"
                | "branch.child-recorded"
        ) || (point == "branch.captured" && runtime == "qemu");
        assert_eq!(new.len(), usize::from(completed), "{point}: {new:?}");
        if let Some(s) = new.first() {
            assert!(sb.depends_on.contains(&s.id), "{point}: {sb:?} / {s:?}");
            if !point.starts_with("branch.") {
                assert_eq!(s.name.as_deref(), Some(&*name_at("at", point)), "{s:?}");
            }
        }
        // A half-made branch child is reported dead with the reason, nothing of it runs;
        // one recorded running before the crash runs on, with the parent's marks.
        let list: SandboxList = c
            .json(Method::GET, "/v1/sandboxes", None::<&()>)
            .await
            .unwrap();
        for child in list
            .sandboxes
            .iter()
            .filter(|s| !sandboxes_before.sandboxes.iter().any(|o| o.id == s.id))
        {
            if point == "branch.child-recorded" {
                assert_eq!(get(&c, &child.id).await.state, "running", "{point}");
                assert_eq!(sh(&c, &child.id, "cat /root/mark-*").await, want);
                c.raw(Method::DELETE, &format!("/v1/sandboxes/{}", child.id), None)
                    .await
                    .expect("delete the child");
            } else {
                delete_dead_child(&c, &child.id, point).await;
            }
        }
        settled_and_snapshots(&c, state, &a, point).await;
        step(
            t0,
            &format!("{point}: recovered, marks intact, snapshot works"),
        );
        drop(d);
    }

    // A branch after all that: the child sees every mark.
    let d = start_daemon(state, &args);
    let c = d.client();
    let br = branch1(&c, &a).await.expect("branch after the crashes");
    let child = br.children[0].clone();
    let want: String = (1..=marks).map(|m| format!("{m}\n")).collect();
    assert_eq!(sh(&c, &child, "cat /root/mark-*").await, want);
    c.raw(Method::DELETE, &format!("/v1/sandboxes/{child}"), None)
        .await
        .unwrap();
    step(t0, "a branch child sees every mark");
    drop(d);

    // Snapshot deletion: the record goes first, the files follow at the next start.
    // (Of a branch child that is deleted first: a live sandbox's snapshots back its disk.)
    let d = faulty("snapshot-delete.forgotten");
    let c = d.client();
    let br = branch1(&c, &a).await.expect("branch");
    let victim = snapshot(&c, &br.children[0], "doomed")
        .await
        .expect("snapshot");
    c.raw(
        Method::DELETE,
        &format!("/v1/sandboxes/{}", br.children[0]),
        None,
    )
    .await
    .expect("delete the child");
    let victim = victim["id"].as_str().unwrap().to_string();
    let r = c
        .raw(Method::DELETE, &format!("/v1/snapshots/{victim}"), None)
        .await;
    expect_killed(d, "snapshot-delete.forgotten", r).await;
    let d = start_daemon(state, &args);
    let c = d.client();
    assert!(!snapshots(&c).await.snapshots.iter().any(|s| s.id == victim));
    assert!(!state.join("snapshots").join(&victim).exists());
    assert_no_orphans(&c, state, "snapshot-delete.forgotten").await;
    step(t0, "snapshot-delete.forgotten: record and files gone");
    drop(d);

    // Restore: interrupted before or after the new VM started, the sandbox is dead with
    // the reason and its VMs gone; restoring again works.
    for point in ["restore.recorded", "restore.started"] {
        let d = faulty(point);
        let c = d.client();
        let snap = snapshot(&c, &a, &name_at("restore", point))
            .await
            .expect("snapshot");
        let r = c
            .json::<Sandbox>(
                Method::POST,
                &format!("/v1/sandboxes/{a}/restore"),
                Some(&json!({"snapshot": snap["id"]})),
            )
            .await;
        expect_killed(d, point, r).await;
        let d = start_daemon(state, &args);
        let c = d.client();
        let reason = dead_with_reason(&c, &a).await;
        step(t0, &format!("{point}: sandbox reported dead: {reason}"));
        assert_vm_processes(&c, state, point).await;
        let restored: Sandbox = c
            .json(
                Method::POST,
                &format!("/v1/sandboxes/{a}/restore"),
                Some(&json!({"snapshot": snap["id"]})),
            )
            .await
            .unwrap_or_else(|e| panic!("{point}: restore again: {e}"));
        assert_eq!(restored.state, "running");
        assert_eq!(sh(&c, &a, "cat /root/mark-*").await, want, "{point}");
        assert_no_orphans(&c, state, point).await;
        step(t0, &format!("{point}: restored again, marks intact"));
        drop(d);
    }

    // Merge: killed once the common state's sandbox runs, or with the files staged in
    // the guest; the sandbox merged into is unchanged, the short-lived sandbox and the
    // staging are gone after the restart, and merging again works.
    let d = start_daemon(state, &args);
    let c = d.client();
    sh(&c, &a, "mkdir -p /root/m").await;
    let br: BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{a}/branch"),
            Some(&json!({"count": 1, "mergeable": true})),
        )
        .await
        .expect("mergeable branch");
    let k = br.children[0].clone();
    sh(&c, &k, "echo merged > /root/m/f").await;
    drop(d);
    let merge_req = json!({"from": k, "paths": ["/root/m"]});
    for point in ["merge.base-started", "merge.staged"] {
        let d = faulty(point);
        let c = d.client();
        let before = sandbox_ids(&c).await;
        let r = c
            .json::<Value>(
                Method::POST,
                &format!("/v1/sandboxes/{a}/merge"),
                Some(&merge_req),
            )
            .await;
        expect_killed(d, point, r).await;
        let d = start_daemon(state, &args);
        let c = d.client();
        let after = sandbox_ids(&c).await;
        assert_eq!(after, before, "{point}: the base sandbox is gone");
        assert_eq!(
            sh(&c, &a, "ls -A /root/m").await,
            "",
            "{point}: nothing merged, no staging left"
        );
        assert_vm_processes(&c, state, point).await;
        assert_no_orphans(&c, state, point).await;
        step(
            t0,
            &format!("{point}: unchanged, base sandbox and staging gone"),
        );
        drop(d);
    }
    let d = start_daemon(state, &args);
    let c = d.client();
    let merged: Value = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{a}/merge"),
            Some(&merge_req),
        )
        .await
        .expect("merge after the crashes");
    assert_eq!(merged["applied"], json!(true), "{merged}");
    assert_eq!(sh(&c, &a, "cat /root/m/f").await, "merged\n");
    // a and b were created side by side from the image: no common branch point.
    let e = c
        .json::<Value>(
            Method::POST,
            &format!("/v1/sandboxes/{a}/merge"),
            Some(&json!({"from": b, "paths": ["/root/m"]})),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("conflict"), "{e}");
    assert!(e.to_string().contains("not of one tree"), "{e}");
    c.raw(Method::DELETE, &format!("/v1/sandboxes/{k}"), None)
        .await
        .unwrap();
    step(t0, "merged after the crashes");
    drop(d);

    pause::crash_points(state, &args, &faulty, &a, marks, t0).await;

    // Deletion: finished by the next start, whether the VM was killed yet or not.
    for (point, id) in [("delete.recorded", &a), ("delete.destroyed", &b)] {
        let d = faulty(point);
        let c = d.client();
        let r = c
            .raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await;
        expect_killed(d, point, r).await;
        let d = start_daemon(state, &args);
        let c = d.client();
        let gone = c
            .json::<Value>(Method::GET, &format!("/v1/sandboxes/{id}"), None::<&()>)
            .await
            .unwrap_err();
        assert_eq!(gone.code(), Some("not_found"), "{point}: {gone}");
        assert_vm_processes(&c, state, point).await;
        assert_no_orphans(&c, state, point).await;
        step(t0, &format!("{point}: deletion finished at start-up"));
        drop(d);
    }

    // Nothing of either sandbox is left but the snapshots taken on the way.
    let d = start_daemon(state, &args);
    let c = d.client();
    // Leaves first: a snapshot others build on cannot go before them.
    loop {
        let all = snapshots(&c).await.snapshots;
        let Some(leaf) = all.iter().find(|s| s.dependents.is_empty()) else {
            assert!(
                all.is_empty(),
                "snapshots that all have dependents: {all:?}"
            );
            break;
        };
        c.raw(Method::DELETE, &format!("/v1/snapshots/{}", leaf.id), None)
            .await
            .unwrap_or_else(|e| panic!("deleting {}: {e}", leaf.id));
    }
    drop(d);
    let left: Vec<_> = ["vms", "layers", "snapshots"]
        .iter()
        .flat_map(|d| common::files_under(&state.join(d)))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let procs: Vec<u32> = processes_using(state)
        .into_iter()
        .filter(|p| !is_daemon(*p))
        .collect();
    assert!(procs.is_empty(), "processes left: {procs:?}");
    step(t0, "everything deleted, nothing left behind");
}

/// Whether QEMU (and its image tool) can run sandboxes here; says why not otherwise.
fn qemu_or_skip(test: &str) -> bool {
    let missing = ["qemu-system-x86_64", "qemu-img"].into_iter().find(|tool| {
        !std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).exists()))
    });
    if let Some(tool) = missing {
        eprintln!("skipping {test}: {tool} is not on PATH, so no qemu sandbox can boot");
    }
    missing.is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_runtime_survives_a_crash_at_every_step() {
    if !qemu_or_skip("the qemu runtime crash suite") {
        return;
    }
    suite("qemu").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_branch_killed_at_every_step_leaves_the_parent_whole() {
    if !qemu_or_skip("the qemu branch crash test") {
        return;
    }
    qemu_branch::branch_steps("qemu").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_promote_killed_midway_is_finished_at_start_up() {
    if !qemu_or_skip("the keep crash test") {
        return;
    }
    qemu_branch::keep_promote("qemu").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvm_runtime_survives_a_crash_at_every_step() {
    if !zygote_vmm::host::linux_guests_or_skip("the kvm runtime crash suite") {
        return;
    }
    suite("kvm").await;
}
