//! Issue 33, defect 5: a daemon killed in the middle of a qemu branch (or pause) must
//! leave the parent running and whole after a restart. The qemu runtime's capture is
//! `stop`, a migration of RAM and device state to a file, a disk-layer switch, `cont`;
//! a kill between them leaves QEMU stopped, or stopped with the migration still
//! running. Before the fix a restart `cont`inued such a VM with its migration in
//! flight, which made it a live migration: the guest went silent when it completed
//! ("agent: no response to hello") and every later snapshot was refused ("There's a
//! migration process in progress").
//!
//! The kill mid-migration is made deterministic by slowing the parent's migrations
//! down (QMP `max-bandwidth`, set by the test on the parent's own QEMU) so that the
//! fault point `capture.migrating` (right after QEMU accepted `migrate`) kills the
//! daemon with the migration certainly in flight, which the test checks before the
//! restart.
use std::path::Path;
use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::Client;
use zygote_daemon::model::{Sandbox, SandboxList};
use zygote_daemon::runtime::qmp::{migration_in_progress, Qmp};

use super::common::{create, get, start_daemon, start_daemon_with_env, step, Scratch};
use super::{
    assert_no_deleted_files_open, assert_no_orphans, assert_vm_processes, branch1,
    delete_dead_child, expect_killed, settled_and_snapshots, sh, snapshots,
};

/// Random data in the parent's RAM (tmpfs) whose checksum must survive every crash.
const RAM_DATA: &str = "/dev/shm/data";
/// The parent's migrations, slowed down: its RAM holds more than this many seconds'
/// worth, so a migration is still running when the restarted daemon looks.
const SLOW_BYTES_PER_SEC: u64 = 1 << 20;

/// The test's own QMP session with sandbox `id`'s QEMU. QEMU serves one QMP client at a
/// time: this one and the daemon's (which connects only while it works on the VM) wait
/// for each other.
fn qmp(state: &Path, id: &str) -> Qmp {
    let socket = state.join("vms").join(id).join("qmp.sock");
    Qmp::connect(&socket, Duration::from_secs(60)).unwrap_or_else(|e| panic!("QMP of {id}: {e}"))
}

/// Sets the migration speed limit of `id`'s QEMU; returns the previous one.
fn set_max_bandwidth(state: &Path, id: &str, bytes_per_sec: u64) -> u64 {
    let mut q = qmp(state, id);
    let params = q
        .execute("query-migrate-parameters", json!({}))
        .expect("query-migrate-parameters");
    q.execute(
        "migrate-set-parameters",
        json!({"max-bandwidth": bytes_per_sec}),
    )
    .expect("migrate-set-parameters");
    params["max-bandwidth"].as_u64().expect("max-bandwidth")
}

/// QEMU's run state and its last migration's state.
fn qemu_status(state: &Path, id: &str) -> (String, Option<String>) {
    let mut q = qmp(state, id);
    (
        q.status().expect("query-status"),
        q.migration_status().expect("query-migrate"),
    )
}

async fn sandbox_ids(c: &Client) -> Vec<String> {
    let list: SandboxList = c
        .json(Method::GET, "/v1/sandboxes", None::<&()>)
        .await
        .expect("list sandboxes");
    list.sandboxes.into_iter().map(|s| s.id).collect()
}

/// Kills the daemon at each step of a branch of a qemu parent (and in the middle of a
/// pause's migration), restarts it, and checks the parent: running, QEMU running with
/// no migration left, its RAM and disk data intact, exec and a full snapshot working;
/// the half-made child dead and gone once deleted; nothing left that no record names.
pub async fn branch_steps(runtime: &str) {
    let t0 = Instant::now();
    super::common::guest_assets();
    let scratch = Scratch::new();
    let (state, cleanup) = (&scratch.state, &scratch.cleanup);
    let args = ["--listen", "127.0.0.1:0", "--runtime", runtime];
    let faulty = |point: &str| start_daemon_with_env(state, &args, &[("ZYGOTE_FAULT", point)]);

    let d = start_daemon(state, &args);
    let c = d.client();
    let made = create(&c, json!({"image": "minimal", "name": "mid"}), cleanup).await;
    let parent = made[0].id.clone();
    sh(
        &c,
        &parent,
        &format!("head -c 24M /dev/urandom > {RAM_DATA}; echo disk > /root/disk-mark; sync"),
    )
    .await;
    let ram_sum = sh(&c, &parent, &format!("md5sum < {RAM_DATA}")).await;
    step(t0, &format!("parent {parent} holds 24 MiB of data in RAM"));
    drop(d);

    // Before the migration, with it in flight (the parent's migrations slowed down), once
    // it completed (before the layer switch), after the layer switch (before `cont`);
    // and a pause with its migration in flight.
    for point in [
        "capture.stopped",
        "capture.migrating",
        "capture.migrated",
        "capture.disk-switched",
        "pause.migrating",
    ] {
        let in_flight = point.ends_with(".migrating");
        let normal_speed = in_flight.then(|| set_max_bandwidth(state, &parent, SLOW_BYTES_PER_SEC));
        let d = faulty(point);
        let c = d.client();
        let before = sandbox_ids(&c).await;
        let snaps_before: Vec<String> = snapshots(&c)
            .await
            .snapshots
            .into_iter()
            .map(|s| s.id)
            .collect();
        if point.starts_with("pause.") {
            let r = c
                .json::<Sandbox>(
                    Method::POST,
                    &format!("/v1/sandboxes/{parent}/pause"),
                    None::<&()>,
                )
                .await;
            expect_killed(d, point, r).await;
        } else {
            let r = branch1(&c, &parent).await;
            expect_killed(d, point, r).await;
        }
        let (run, migration) = qemu_status(state, &parent);
        step(
            t0,
            &format!("{point}: daemon killed there; QEMU {run}, migration {migration:?}"),
        );
        if in_flight {
            // What this step is about: the crash left the migration running.
            assert_eq!(run, "paused", "{point}");
            assert!(
                migration.as_deref().is_some_and(migration_in_progress),
                "{point}: the migration is no longer in flight ({migration:?}): slow it more"
            );
        }

        let d = start_daemon(state, &args);
        let c = d.client();
        let sb = get(&c, &parent).await;
        assert_eq!(sb.state, "running", "{point}: {sb:?}");
        let (run, migration) = qemu_status(state, &parent);
        assert_eq!(run, "running", "{point}: QEMU after the restart");
        assert!(
            !migration.as_deref().is_some_and(migration_in_progress),
            "{point}: a migration still runs after the restart: {migration:?}"
        );
        if let Some(speed) = normal_speed {
            set_max_bandwidth(state, &parent, speed);
        }
        assert_no_deleted_files_open(&sb, point);
        assert_eq!(
            sh(&c, &parent, &format!("md5sum < {RAM_DATA}")).await,
            ram_sum,
            "{point}: the parent's RAM data"
        );
        assert_eq!(sh(&c, &parent, "cat /root/disk-mark").await, "disk\n");
        // The capture is recorded only if QEMU had switched layers; the child never ran.
        let new_snaps: Vec<String> = snapshots(&c)
            .await
            .snapshots
            .into_iter()
            .map(|s| s.id)
            .filter(|s| !snaps_before.contains(s))
            .collect();
        let completed = point == "capture.disk-switched";
        assert_eq!(new_snaps.len(), usize::from(completed), "{point}");
        for child in sandbox_ids(&c).await {
            if before.contains(&child) {
                continue;
            }
            delete_dead_child(&c, &child, point).await;
        }
        let snap = settled_and_snapshots(&c, state, &parent, point).await;
        assert_eq!(snap["kind"], json!("full"), "{snap}");
        step(
            t0,
            &format!("{point}: parent running, data intact, snapshot works"),
        );
        drop(d);
    }

    // A branch after all that: the child has the parent's RAM and disk data.
    let d = start_daemon(state, &args);
    let c = d.client();
    let br = branch1(&c, &parent)
        .await
        .expect("branch after the crashes");
    let child = &br.children[0];
    assert_eq!(
        sh(&c, child, &format!("md5sum < {RAM_DATA}")).await,
        ram_sum
    );
    assert_eq!(sh(&c, child, "cat /root/disk-mark").await, "disk\n");
    step(t0, "a branch after the crashes works");
    drop(d);
}

/// `keep --promote` killed after its first deletion: the restart finishes it (a deleted
/// sibling cannot be brought back, so undoing is not possible; finishing is what the
/// request asked for). Every sibling and the parent are gone, the kept child runs under
/// the parent's name, its tree is itself alone, and no record or file is left.
pub async fn keep_promote(runtime: &str) {
    let t0 = Instant::now();
    super::common::guest_assets();
    let scratch = Scratch::new();
    let (state, cleanup) = (&scratch.state, &scratch.cleanup);
    let args = ["--listen", "127.0.0.1:0", "--runtime", runtime];

    let d = start_daemon(state, &args);
    let c = d.client();
    let made = create(&c, json!({"image": "minimal", "name": "keeper"}), cleanup).await;
    let parent = made[0].id.clone();
    sh(&c, &parent, "echo parent > /root/mark; sync").await;
    let br: zygote_daemon::model::BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{parent}/branch"),
            Some(&json!({"count": 3})),
        )
        .await
        .expect("branch");
    assert_eq!(br.children.len(), 3, "{br:?}");
    let kept = br.children[0].clone();
    step(t0, &format!("{parent} branched into {:?}", br.children));
    drop(d);

    let d = start_daemon_with_env(state, &args, &[("ZYGOTE_FAULT", "keep.deleted-one")]);
    let c = d.client();
    let r = c
        .json::<Value>(
            Method::POST,
            &format!("/v1/sandboxes/{kept}/keep"),
            Some(&json!({"promote": true})),
        )
        .await;
    expect_killed(d, "keep.deleted-one", r).await;
    step(
        t0,
        "keep.deleted-one: daemon killed after the first deletion",
    );

    let d = start_daemon(state, &args);
    let c = d.client();
    let ids = sandbox_ids(&c).await;
    assert_eq!(ids, vec![kept.clone()], "only the kept sandbox is left");
    let me = get(&c, &kept).await;
    assert_eq!(me.state, "running", "{me:?}");
    assert_eq!(me.name.as_deref(), Some("keeper"), "{me:?}");
    assert_eq!(sh(&c, &kept, "cat /root/mark").await, "parent\n");
    // Issue 33: a branch child's /etc/hostname named its parent.
    assert_eq!(
        sh(&c, &kept, "cat /etc/hostname").await,
        format!("{kept}\n")
    );
    let tree: Value = c
        .json(
            Method::GET,
            &format!("/v1/sandboxes/{kept}/tree"),
            None::<&()>,
        )
        .await
        .expect("tree");
    assert_eq!(tree["root"], json!(kept), "{tree}");
    assert_eq!(
        tree["sandboxes"].as_array().map(Vec::len),
        Some(1),
        "{tree}"
    );
    assert_vm_processes(&c, state, "keep.deleted-one").await;
    assert_no_orphans(&c, state, "keep.deleted-one").await;
    let left: Vec<_> = std::fs::read_dir(state.join("intents"))
        .expect("intents/")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "intent records left: {left:?}");
    // The kept sandbox branches on as the tree's new root.
    let again = branch1(&c, &kept).await.expect("branch the kept sandbox");
    assert_eq!(
        sh(&c, &again.children[0], "cat /root/mark").await,
        "parent\n"
    );
    step(
        t0,
        "keep.deleted-one: finished at start-up, the kept one took the name",
    );
    drop(d);
}
