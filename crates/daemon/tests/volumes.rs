//! Named volumes on a live daemon (qemu runtime; the first two suites also on the kvm
//! runtime, where Linux guests boot: the nested lane's full run): a volume outlives the sandbox that
//! wrote it; a branch child sees a copy-on-write view (its writes never reach the
//! volume, and the parent's later writes never reach it); one writer at a time (409s);
//! bad input is a 400; a daemon killed in the middle of a volume create leaves nothing
//! half-made. Skips with a printed reason without QEMU.
mod common;

use std::time::Instant;

use common::{create, qemu_guest_ready, sh, start_daemon, start_daemon_with_env, step, Scratch};

/// A port of its own for each daemon: the tests run at once, and 7420 (the default)
/// may be taken on the host.
const QEMU_ARGS: &[&str] = &["--listen", "127.0.0.1:0", "--runtime", "qemu"];
const KVM_ARGS: &[&str] = &["--listen", "127.0.0.1:0", "--runtime", "kvm"];

/// The kvm runtime's counterpart of `qemu_guest_ready`: a host where zygote's VMM boots
/// Linux, and the guest kernel and `minimal` image.
fn kvm_guest_ready(test: &str) -> bool {
    if !zygote_vmm::host::linux_guests_or_skip(test) {
        return false;
    }
    zygote_images::build_kernel(&mut |l| eprintln!("    {l}")).expect("guest kernel");
    zygote_images::build_image("minimal", &mut |l| eprintln!("    {l}")).expect("minimal image");
    true
}
use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::{Client, ClientError};

async fn call(
    c: &Client,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Result<Value, ClientError> {
    match body {
        Some(b) => c.json(method, path, Some(&b)).await,
        None => c.json(method, path, None::<&()>).await,
    }
}

/// The HTTP status of a failed call (panics on success: the test expected a refusal).
fn status_of(r: Result<Value, ClientError>, what: &str) -> (u16, String) {
    match r {
        Err(ClientError::Api {
            status, message, ..
        }) => (status, message),
        other => panic!("{what}: expected an API error, got {other:?}"),
    }
}

async fn delete(c: &Client, path: &str) -> Result<(), ClientError> {
    c.raw(Method::DELETE, path, None).await.map(drop)
}

async fn new_volume(c: &Client, name: &str) -> Value {
    call(
        c,
        Method::POST,
        "/v1/volumes",
        Some(json!({"name": name, "size_mib": 64})),
    )
    .await
    .unwrap_or_else(|e| panic!("create volume {name}: {e}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_outlives_its_sandbox_and_children_get_a_copy_on_write_view() {
    if qemu_guest_ready("a_volume_outlives_its_sandbox_and_children_get_a_copy_on_write_view") {
        outlives_and_views(QEMU_ARGS).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kvm_a_volume_outlives_its_sandbox_and_children_get_a_copy_on_write_view() {
    if kvm_guest_ready("kvm_a_volume_outlives_its_sandbox_and_children_get_a_copy_on_write_view") {
        outlives_and_views(KVM_ARGS).await;
    }
}

async fn outlives_and_views(daemon_args: &[&str]) {
    let t0 = Instant::now();
    let scratch = Scratch::new();
    let daemon = start_daemon(&scratch.state, daemon_args);
    let c = daemon.client();

    let vol = new_volume(&c, "data").await;
    let id = vol["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("vol-"), "{vol}");
    assert_eq!(vol["attached_to"], Value::Null);
    let listed = call(&c, Method::GET, "/v1/volumes", None).await.unwrap();
    assert_eq!(listed["volumes"].as_array().unwrap().len(), 1, "{listed}");
    let by_name = call(&c, Method::GET, "/v1/volumes/data", None)
        .await
        .unwrap();
    assert_eq!(by_name["id"], vol["id"]);
    // The image is sparse: 64 MiB of size, far less on disk.
    let image = scratch.state.join("volumes").join(format!("{id}.ext4"));
    let meta = std::fs::metadata(&image).expect("the volume's image");
    assert_eq!(meta.len(), 64 << 20);
    step(t0, "volume made");

    // A writes a file; the volume shows A as its writer.
    let a = create(
        &c,
        json!({"image": "minimal", "volumes": [{"name": "data", "path": "/data"}]}),
        &scratch.cleanup,
    )
    .await
    .remove(0);
    step(t0, "A runs with the volume");
    assert_eq!(a.volumes.len(), 1);
    assert!(a.volumes[0].writes_volume);
    sh(
        &c,
        &a.id,
        "echo from-a > /data/note && grep -q ' /data ext4 ' /proc/mounts",
    )
    .await
    .unwrap();
    let held = call(&c, Method::GET, "/v1/volumes/data", None)
        .await
        .unwrap();
    assert_eq!(held["attached_to"], json!(a.id));

    // One writer at a time: a second mount and a delete of the volume are refused,
    // naming A.
    let (status, msg) = status_of(
        call(
            &c,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": "minimal", "volumes": [{"name": "data", "path": "/v"}]})),
        )
        .await,
        "second attach",
    );
    assert_eq!(status, 409, "{msg}");
    assert!(msg.contains(&a.id), "{msg}");
    let (status, msg) = status_of(
        delete(&c, "/v1/volumes/data").await.map(|()| Value::Null),
        "delete attached",
    );
    assert_eq!(status, 409, "{msg}");
    assert!(msg.contains(&a.id), "{msg}");

    // A branch child sees the data, copy-on-write in both directions.
    let branch: Value = call(
        &c,
        Method::POST,
        &format!("/v1/sandboxes/{}/branch", a.id),
        Some(json!({"count": 1})),
    )
    .await
    .expect("branch A");
    let child = branch["children"][0].as_str().unwrap().to_string();
    step(t0, "A branched");
    let child_view = common::get(&c, &child).await;
    assert_eq!(child_view.volumes.len(), 1);
    assert!(!child_view.volumes[0].writes_volume);
    assert_eq!(sh(&c, &child, "cat /data/note").await.unwrap(), "from-a\n");
    sh(&c, &child, "echo from-child > /data/child && sync")
        .await
        .unwrap();
    sh(&c, &a.id, "echo later-a > /data/later && sync")
        .await
        .unwrap();
    assert!(
        sh(&c, &a.id, "test ! -e /data/child").await.is_ok(),
        "the child's write reached the parent's volume"
    );
    assert!(
        sh(&c, &child, "test ! -e /data/later").await.is_ok(),
        "the parent's later write reached the child's view"
    );
    delete(&c, &format!("/v1/sandboxes/{child}")).await.unwrap();

    // A is gone: the volume is free again and B reads what A wrote (the child's file
    // is not there).
    delete(&c, &format!("/v1/sandboxes/{}", a.id))
        .await
        .unwrap();
    let freed = call(&c, Method::GET, "/v1/volumes/data", None)
        .await
        .unwrap();
    assert_eq!(freed["attached_to"], Value::Null);
    step(t0, "A deleted");
    let b = create(
        &c,
        json!({"image": "minimal", "volumes": [{"name": id, "path": "/mnt/again/"}]}),
        &scratch.cleanup,
    )
    .await
    .remove(0);
    assert_eq!(
        sh(&c, &b.id, "cat /mnt/again/note /mnt/again/later")
            .await
            .unwrap(),
        "from-a\nlater-a\n"
    );
    assert!(sh(&c, &b.id, "test ! -e /mnt/again/child").await.is_ok());
    step(t0, "B read A's files");
    delete(&c, &format!("/v1/sandboxes/{}", b.id))
        .await
        .unwrap();
    delete(&c, "/v1/volumes/data").await.unwrap();
    assert!(!image.exists(), "the image outlived its volume");
    let (status, _) = status_of(
        call(&c, Method::GET, "/v1/volumes/data", None).await,
        "gone",
    );
    assert_eq!(status, 404);
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_volume_requests_are_400s_and_unknown_ones_404s() {
    if !qemu_guest_ready("bad_volume_requests_are_400s_and_unknown_ones_404s") {
        return;
    }
    let scratch = Scratch::new();
    let daemon = start_daemon(&scratch.state, QEMU_ARGS);
    let c = daemon.client();
    for body in [
        json!({"name": ""}),
        json!({"name": "-x"}),
        json!({"name": "a/b"}),
        json!({"name": "x".repeat(64)}),
        json!({"name": "ok", "size_mib": 1}),
        json!({"name": "ok", "size_mib": 1u64 << 40}),
        json!({"name": "ok", "extra": 1}),
    ] {
        let (status, msg) = status_of(
            call(&c, Method::POST, "/v1/volumes", Some(body.clone())).await,
            &body.to_string(),
        );
        assert_eq!(status, 400, "{body}: {msg}");
        assert!(!msg.contains(&*scratch.state.to_string_lossy()), "{msg}");
    }
    new_volume(&c, "v1").await;
    let (status, _) = status_of(
        call(&c, Method::POST, "/v1/volumes", Some(json!({"name": "v1"}))).await,
        "duplicate name",
    );
    assert_eq!(status, 409);
    for (mount, why) in [
        (json!({"name": "v1", "path": "/"}), "root"),
        (json!({"name": "v1", "path": "data"}), "relative"),
        (json!({"name": "v1", "path": "/a/../etc"}), "dot-dot"),
        (json!({"name": "v1", "path": "/proc/x"}), "proc"),
        (json!({"name": "v1", "path": "/sys"}), "sys"),
        (json!({"name": "v1", "path": "/dev/shm"}), "dev"),
        (
            json!({"name": "v1", "path": "/d", "shared": true}),
            "shared",
        ),
    ] {
        let (status, msg) = status_of(
            call(
                &c,
                Method::POST,
                "/v1/sandboxes",
                Some(json!({"image": "minimal", "volumes": [mount]})),
            )
            .await,
            why,
        );
        assert_eq!(status, 400, "{why}: {msg}");
    }
    let (status, msg) = status_of(
        call(
            &c,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": "minimal", "n": 2, "volumes": [{"name": "v1", "path": "/d"}]})),
        )
        .await,
        "fan-out",
    );
    assert_eq!(status, 400, "{msg}");
    let (status, _) = status_of(
        call(
            &c,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": "minimal", "volumes": [{"name": "nope", "path": "/d"}]})),
        )
        .await,
        "unknown volume",
    );
    assert_eq!(status, 404);
    // Nothing of the refused creates holds the volume.
    let v = call(&c, Method::GET, "/v1/volumes/v1", None).await.unwrap();
    assert_eq!(v["attached_to"], Value::Null);
    let (status, _) = status_of(
        delete(&c, "/v1/volumes/nope").await.map(|()| Value::Null),
        "delete unknown",
    );
    assert_eq!(status, 404);
    delete(&c, "/v1/volumes/v1").await.unwrap();
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_killed_mid_create_leaves_no_half_made_volume() {
    if !qemu_guest_ready("a_daemon_killed_mid_create_leaves_no_half_made_volume") {
        return;
    }
    let scratch = Scratch::new();
    // Killed once the image is whole and before its record: the restarted daemon must
    // not list it, must remove the image, and must let the name be used again.
    let daemon = start_daemon_with_env(
        &scratch.state,
        QEMU_ARGS,
        &[("ZYGOTE_FAULT", "volume.image-made")],
    );
    let c = daemon.client();
    let r = call(
        &c,
        Method::POST,
        "/v1/volumes",
        Some(json!({"name": "crash", "size_mib": 64})),
    )
    .await;
    assert!(
        r.is_err(),
        "the daemon answered although it was to die: {r:?}"
    );
    daemon.kill9();
    let volumes_dir = scratch.state.join("volumes");
    let left: Vec<_> = common::files_under(&volumes_dir);
    assert!(
        !left.is_empty(),
        "the fault point was not reached (no image was made)"
    );

    let daemon = start_daemon(&scratch.state, QEMU_ARGS);
    let c = daemon.client();
    let listed = call(&c, Method::GET, "/v1/volumes", None).await.unwrap();
    assert_eq!(listed["volumes"], json!([]), "{listed}");
    assert_eq!(
        common::files_under(&volumes_dir),
        Vec::<std::path::PathBuf>::new()
    );
    new_volume(&c, "crash").await;
    delete(&c, "/v1/volumes/crash").await.unwrap();
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_keeps_a_volume_and_a_snapshot_start_gets_a_copy_on_write_view() {
    if qemu_guest_ready("pause_keeps_a_volume_and_a_snapshot_start_gets_a_copy_on_write_view") {
        pause_and_snapshot_start(QEMU_ARGS).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kvm_pause_keeps_a_volume_and_a_snapshot_start_gets_a_copy_on_write_view() {
    if kvm_guest_ready("kvm_pause_keeps_a_volume_and_a_snapshot_start_gets_a_copy_on_write_view") {
        pause_and_snapshot_start(KVM_ARGS).await;
    }
}

async fn pause_and_snapshot_start(daemon_args: &[&str]) {
    let t0 = Instant::now();
    let scratch = Scratch::new();
    let daemon = start_daemon(&scratch.state, daemon_args);
    let c = daemon.client();
    new_volume(&c, "keep").await;
    let a = create(
        &c,
        json!({"image": "minimal", "volumes": [{"name": "keep", "path": "/keep"}]}),
        &scratch.cleanup,
    )
    .await
    .remove(0);
    sh(&c, &a.id, "echo one > /keep/f").await.unwrap();
    let snap: Value = call(
        &c,
        Method::POST,
        "/v1/snapshots",
        Some(json!({"sandbox": a.id})),
    )
    .await
    .expect("snapshot A");
    let snap_id = snap["id"].as_str().unwrap().to_string();
    // A pack carries the sandbox, never its volumes' data: refused.
    let (status, message) = status_of(
        call(
            &c,
            Method::GET,
            &format!("/v1/snapshots/{snap_id}/export"),
            None,
        )
        .await,
        "exporting a snapshot with a volume",
    );
    assert_eq!(status, 422, "{message}");
    assert!(message.contains("volumes"), "{message}");
    // Written after the snapshot: the volume has it, the snapshot's view does not.
    sh(&c, &a.id, "echo two > /keep/g").await.unwrap();
    step(t0, "A snapshotted");

    // Pause to disk and back: the volume is still mounted and written by A. The file
    // written just before the pause (still in the guest's page cache then) is in the
    // volume's image after it.
    sh(&c, &a.id, "echo three > /keep/h").await.unwrap();
    call(
        &c,
        Method::POST,
        &format!("/v1/sandboxes/{}/pause", a.id),
        None,
    )
    .await
    .expect("pause");
    let paused = common::get(&c, &a.id).await;
    assert_eq!(
        paused.volumes.len(),
        1,
        "a paused sandbox still shows its volume"
    );
    let held = call(&c, Method::GET, "/v1/volumes/keep", None)
        .await
        .unwrap();
    assert_eq!(held["attached_to"], json!(a.id));
    call(
        &c,
        Method::POST,
        &format!("/v1/sandboxes/{}/resume", a.id),
        None,
    )
    .await
    .expect("resume");
    assert_eq!(
        sh(&c, &a.id, "cat /keep/f /keep/g /keep/h").await.unwrap(),
        "one\ntwo\nthree\n"
    );
    step(t0, "A paused and resumed");

    // A sandbox from the snapshot sees the volume as it was then, copy-on-write.
    let from_snap = create(&c, json!({"snapshot": snap_id}), &scratch.cleanup)
        .await
        .remove(0);
    assert_eq!(from_snap.volumes.len(), 1);
    assert!(!from_snap.volumes[0].writes_volume);
    assert_eq!(sh(&c, &from_snap.id, "cat /keep/f").await.unwrap(), "one\n");
    assert!(sh(&c, &from_snap.id, "test ! -e /keep/g").await.is_ok());
    sh(&c, &from_snap.id, "echo snap > /keep/s && sync")
        .await
        .unwrap();
    // Volumes mount only at an image boot: a snapshot start naming one is a 400.
    let (status, msg) = status_of(
        call(
            &c,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"snapshot": snap_id, "volumes": [{"name": "keep", "path": "/k"}]})),
        )
        .await,
        "volumes on a snapshot start",
    );
    assert_eq!(status, 400, "{msg}");
    step(t0, "a sandbox from the snapshot read its view");

    for id in [&from_snap.id, &a.id] {
        delete(&c, &format!("/v1/sandboxes/{id}")).await.unwrap();
    }
    delete(&c, &format!("/v1/snapshots/{snap_id}"))
        .await
        .unwrap();
    let b = create(
        &c,
        json!({"image": "minimal", "volumes": [{"name": "keep", "path": "/keep"}]}),
        &scratch.cleanup,
    )
    .await
    .remove(0);
    assert_eq!(
        sh(&c, &b.id, "ls /keep | grep -v lost").await.unwrap(),
        "f\ng\nh\n"
    );
    delete(&c, &format!("/v1/sandboxes/{}", b.id))
        .await
        .unwrap();
    delete(&c, "/v1/volumes/keep").await.unwrap();
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_killed_between_claim_and_record_or_mid_delete_leaves_the_volume_whole() {
    if !qemu_guest_ready(
        "a_daemon_killed_between_claim_and_record_or_mid_delete_leaves_the_volume_whole",
    ) {
        return;
    }
    let scratch = Scratch::new();
    let daemon = start_daemon(&scratch.state, QEMU_ARGS);
    let c = daemon.client();
    new_volume(&c, "claimed").await;
    new_volume(&c, "dropped").await;
    drop(daemon);

    // Killed after the claim, before the sandbox's record: the restarted daemon frees it.
    let daemon = start_daemon_with_env(
        &scratch.state,
        QEMU_ARGS,
        &[("ZYGOTE_FAULT", "create.volumes-claimed")],
    );
    let c = daemon.client();
    let r = call(
        &c,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"image": "minimal", "volumes": [{"name": "claimed", "path": "/c"}]})),
    )
    .await;
    assert!(
        r.is_err(),
        "the daemon answered although it was to die: {r:?}"
    );
    daemon.kill9();

    // Killed after a delete's record, before the image's removal: the image goes.
    let daemon = start_daemon_with_env(
        &scratch.state,
        QEMU_ARGS,
        &[("ZYGOTE_FAULT", "volume.delete-recorded")],
    );
    let c = daemon.client();
    assert!(delete(&c, "/v1/volumes/dropped").await.is_err());
    daemon.kill9();

    let daemon = start_daemon(&scratch.state, QEMU_ARGS);
    let c = daemon.client();
    let v = call(&c, Method::GET, "/v1/volumes/claimed", None)
        .await
        .unwrap();
    assert_eq!(v["attached_to"], Value::Null, "{v}");
    let listed = call(&c, Method::GET, "/v1/volumes", None).await.unwrap();
    let names: Vec<&str> = listed["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["claimed"]);
    let images = common::files_under(&scratch.state.join("volumes"));
    assert_eq!(images.len(), 1, "{images:?}");
    // The freed volume mounts.
    let s = create(
        &c,
        json!({"image": "minimal", "volumes": [{"name": "claimed", "path": "/c"}]}),
        &scratch.cleanup,
    )
    .await
    .remove(0);
    sh(&c, &s.id, "touch /c/ok").await.unwrap();
    delete(&c, &format!("/v1/sandboxes/{}", s.id))
        .await
        .unwrap();
    delete(&c, "/v1/volumes/claimed").await.unwrap();
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_a_crash_interrupted_after_its_volume_copy_is_recovered_with_it() {
    if !qemu_guest_ready(
        "a_snapshot_a_crash_interrupted_after_its_volume_copy_is_recovered_with_it",
    ) {
        return;
    }
    let scratch = Scratch::new();
    // Dies once the capture is complete (volume copied, layer switched), before the
    // snapshot is recorded: start-up must record it with its volume copy.
    let daemon = start_daemon_with_env(
        &scratch.state,
        QEMU_ARGS,
        &[("ZYGOTE_FAULT", "capture.disk-switched")],
    );
    let c = daemon.client();
    new_volume(&c, "cap").await;
    let a = create(
        &c,
        json!({"image": "minimal", "volumes": [{"name": "cap", "path": "/cap"}]}),
        &scratch.cleanup,
    )
    .await
    .remove(0);
    sh(&c, &a.id, "echo kept > /cap/f && sync").await.unwrap();
    let r = call(
        &c,
        Method::POST,
        "/v1/snapshots",
        Some(json!({"sandbox": a.id})),
    )
    .await;
    assert!(
        r.is_err(),
        "the daemon answered although it was to die: {r:?}"
    );
    daemon.kill9();

    let daemon = start_daemon(&scratch.state, QEMU_ARGS);
    let c = daemon.client();
    let snaps = call(&c, Method::GET, "/v1/snapshots", None).await.unwrap();
    let snaps = snaps["snapshots"].as_array().unwrap().clone();
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    let snap_id = snaps[0]["id"].as_str().unwrap().to_string();
    let from_snap = create(&c, json!({"snapshot": snap_id}), &scratch.cleanup)
        .await
        .remove(0);
    assert_eq!(from_snap.volumes.len(), 1);
    assert!(!from_snap.volumes[0].writes_volume);
    assert_eq!(sh(&c, &from_snap.id, "cat /cap/f").await.unwrap(), "kept\n");
    // A runs on and still writes the volume itself.
    sh(&c, &a.id, "echo after > /cap/g && sync").await.unwrap();
    assert!(sh(&c, &from_snap.id, "test ! -e /cap/g").await.is_ok());
    for id in [&from_snap.id, &a.id] {
        delete(&c, &format!("/v1/sandboxes/{id}")).await.unwrap();
    }
    delete(&c, &format!("/v1/snapshots/{snap_id}"))
        .await
        .unwrap();
    delete(&c, "/v1/volumes/cap").await.unwrap();
    drop(daemon);
}
