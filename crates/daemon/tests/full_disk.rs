//! Issue 19, defect 4: a full host disk. QEMU stops the guest when a disk write fails
//! for want of space; the API used to go on saying "running" while every exec hung. Now
//! the sandbox shows `error` with the reason, execs fail at once saying so, a snapshot
//! that cannot fit refuses with the free and needed space instead of "migration failed:
//! Broken pipe", and the VM goes on by itself once space is back (the guest's write
//! completes). The state database is on the full disk too, as it would be in use.
//!
//! The daemon's state directory is a small tmpfs (root only; skipped otherwise).
mod common;

use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::json;
use zygote_daemon::model::ExecResponse;

use common::{create, eventually, free_bytes, get, mount_tmpfs, start_daemon, step, Scratch};

/// Size of the tmpfs holding the state directory.
const STATE_FS_MIB: u64 = 256;
/// What the guest writes: more than the room left on the tmpfs.
const GUEST_WRITE_MIB: u64 = 96;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_host_disk_is_reported_and_survived() {
    let t0 = Instant::now();
    let scratch = Scratch::new();
    let state = &scratch.state;
    let _mount = match mount_tmpfs(state, STATE_FS_MIB) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("SKIP: cannot mount a tmpfs for the state directory ({e}); needs root");
            return;
        }
    };
    common::guest_assets();
    let d = start_daemon(state, &["--listen", "127.0.0.1:0", "--runtime", "qemu"]);
    let c = d.client();
    let body = json!({"image": "minimal", "name": "full-disk", "mem_mib": 256});
    let id = create(&c, body, &scratch.cleanup).await[0].id.clone();
    step(t0, &format!("created {id}"));

    // Leave 32 MiB free, then have the guest write three times that.
    let filler = state.join("filler");
    let keep_free = 32 << 20;
    let fill = free_bytes(state).saturating_sub(keep_free);
    let f = std::fs::File::create(&filler).unwrap();
    f.set_len(0).unwrap();
    {
        use std::io::Write;
        let mut w = std::io::BufWriter::new(f);
        let chunk = vec![0xa5u8; 1 << 20];
        for _ in 0..fill >> 20 {
            w.write_all(&chunk).unwrap();
        }
        w.flush().unwrap();
    }
    step(
        t0,
        &format!("{} MiB free on the state fs", free_bytes(state) >> 20),
    );
    // A snapshot that cannot fit says so before writing anything.
    let refused = c
        .json::<serde_json::Value>(Method::POST, "/v1/snapshots", Some(&json!({"sandbox": id})))
        .await
        .expect_err("no room for a snapshot");
    assert_eq!(refused.code(), Some("no_space"), "{refused}");
    let said = refused.to_string();
    assert!(
        said.contains("no space left on") && said.contains("MiB free") && said.contains("needed"),
        "{said}"
    );
    assert!(std::fs::read_dir(state.join("snapshots"))
        .unwrap()
        .next()
        .is_none());
    step(t0, &format!("snapshot refused: {said}"));
    let writer = {
        let c = d.client();
        let id = id.clone();
        tokio::spawn(async move {
            c.json::<ExecResponse>(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                Some(&json!({"argv": ["sh", "-c", format!(
                    "dd if=/dev/zero of=/root/big bs=1M count={GUEST_WRITE_MIB} conv=fsync 2>&1")],
                    "timeout_ms": 600_000})),
            )
            .await
        })
    };

    // The VM stops on the failed write: the sandbox says so, with the reason.
    let stopped = eventually(Duration::from_secs(120), async || {
        let sb = get(&c, &id).await;
        (sb.state == "error").then_some(sb)
    })
    .await
    .expect("the sandbox is reported in error once its disk is full");
    let reason = stopped.exit_reason.clone().unwrap_or_default();
    assert!(reason.contains("no space left on device"), "{reason}");
    step(t0, &format!("reported: {} ({reason})", stopped.state));

    // Execs fail at once, saying why.
    let asked = Instant::now();
    let refused = c
        .json::<ExecResponse>(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&json!({"argv": ["true"]})),
        )
        .await
        .expect_err("no exec on a stopped VM");
    assert!(asked.elapsed() < Duration::from_secs(5), "{refused}");
    assert_eq!(refused.code(), Some("sandbox_not_running"), "{refused}");
    assert!(refused.to_string().contains("no space left"), "{refused}");

    // And while the VM is stopped, a snapshot is refused saying why.
    let refused = c
        .json::<serde_json::Value>(Method::POST, "/v1/snapshots", Some(&json!({"sandbox": id})))
        .await
        .expect_err("no snapshot on a stopped VM");
    assert!(refused.to_string().contains("no space left"), "{refused}");
    step(t0, &format!("exec and snapshot refused: {refused}"));

    // Space comes back: the VM goes on by itself and the guest's write completes.
    std::fs::remove_file(&filler).unwrap();
    let back = eventually(Duration::from_secs(60), async || {
        let sb = get(&c, &id).await;
        (sb.state == "running").then_some(sb)
    })
    .await
    .expect("running again once space is back");
    assert_eq!(back.exit_reason, None);
    let wrote = tokio::time::timeout(Duration::from_secs(300), writer)
        .await
        .expect("the guest's write finishes")
        .unwrap()
        .expect("exec");
    assert_eq!(wrote.exit_code, Some(0), "{wrote:?}");
    let size = common::sh(&c, &id, "stat -c %s /root/big").await.unwrap();
    assert_eq!(size.trim(), (GUEST_WRITE_MIB << 20).to_string());
    step(t0, "resumed; the guest's write completed");

    c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
        .await
        .unwrap();
}
