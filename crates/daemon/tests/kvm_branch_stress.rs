//! BRANCH under load on the kvm runtime: `ZYGOTE_STRESS_ROUNDS` (default 50) rounds of
//! `branch -c 4` of a Linux sandbox while another sandbox runs a CPU and disk load and a
//! client keeps running execs in the parent. Every child of every round must come up,
//! answer its own exec from the parent's state, and keep its own state: zero dead or
//! unreachable children. Needs hardware virtualization; elsewhere it skips with the
//! reason printed (the nested lane runs it).
mod common;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use hyper::Method;
use serde_json::json;
use zygote_daemon::client::Client;
use zygote_daemon::model::{BranchResponse, SandboxList};

use common::{start_daemon, Cleanup};

async fn sh(c: &Client, id: &str, script: &str) -> Result<String, String> {
    common::sh(c, id, script)
        .await
        .map(|out| out.trim_end().to_string())
}

async fn create(c: &Client, name: &str) -> String {
    let made: SandboxList = c
        .json(
            Method::POST,
            "/v1/sandboxes",
            Some(&json!({"image": "minimal", "name": name, "mem_mib": 512})),
        )
        .await
        .expect("create");
    made.sandboxes[0].id.clone()
}

/// One round: branch 4, check each child's inherited and own state; returns the failures.
async fn round(c: &Client, parent: &str, n: usize) -> Vec<String> {
    let mut failures = Vec::new();
    let br: BranchResponse = match c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{parent}/branch"),
            Some(&json!({"count": 4})),
        )
        .await
    {
        Ok(b) => b,
        Err(e) => return vec![format!("round {n}: branch failed: {e}")],
    };
    for f in &br.failed {
        failures.push(format!(
            "round {n}: child {} did not come up: {}",
            f.index, f.error
        ));
    }
    // The children answer concurrently, as they would for a user.
    let checks: Vec<_> = br
        .children
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let (c, id) = (c.clone(), id.clone());
            tokio::spawn(async move {
                let mark = format!("round{n}-child{i}");
                let first = sh(
                    &c,
                    &id,
                    &format!("cat /root/state; echo {mark} >/root/state"),
                )
                .await?;
                if first != "parent" {
                    return Err(format!("inherited state {first:?}, want \"parent\""));
                }
                let own = sh(&c, &id, "cat /root/state; hostname").await?;
                if own != format!("{mark}\n{id}") {
                    return Err(format!("own state and name {own:?}"));
                }
                Ok(())
            })
        })
        .collect();
    for (check, id) in checks.into_iter().zip(&br.children) {
        if let Err(e) = check.await.expect("check task") {
            failures.push(format!("round {n}: child {id}: {e}"));
        }
    }
    for id in &br.children {
        if let Err(e) = c
            .raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await
        {
            failures.push(format!("round {n}: deleting {id}: {e}"));
        }
    }
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branch_4_under_load_fifty_times() {
    if !zygote_vmm::host::linux_guests_or_skip("branch_4_under_load_fifty_times") {
        return;
    }
    let rounds: usize = std::env::var("ZYGOTE_STRESS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let _cleanup = Cleanup {
        state: state.clone(),
        cgroups: Default::default(),
    };
    let d = start_daemon(&state, &["--listen", "127.0.0.1:0", "--runtime", "kvm"]);
    let c = d.client();
    let t0 = Instant::now();

    // The neighbour: one CPU-bound loop and one writing and syncing its disk, detached
    // from the exec that starts them.
    let load = create(&c, "stress-load").await;
    sh(
        &c,
        &load,
        "setsid sh -c 'while :; do :; done' >/dev/null 2>&1 </dev/null & \
         setsid sh -c 'while :; do dd if=/dev/zero of=/root/load bs=1M count=16 conv=fsync \
         2>/dev/null; done' >/dev/null 2>&1 </dev/null &",
    )
    .await
    .expect("starting the load");
    let parent = create(&c, "stress-parent").await;
    sh(&c, &parent, "echo parent >/root/state; sync")
        .await
        .unwrap();

    // Execs keep hitting the parent while it is branched.
    let stop = Arc::new(AtomicBool::new(false));
    let parent_execs = Arc::new(AtomicUsize::new(0));
    let hammer = {
        let (c, parent, stop, count) = (
            c.clone(),
            parent.clone(),
            stop.clone(),
            parent_execs.clone(),
        );
        tokio::spawn(async move {
            let mut errors = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                match sh(&c, &parent, "cat /root/state").await {
                    Ok(s) if s == "parent" => {}
                    Ok(s) => errors.push(format!("parent state changed to {s:?}")),
                    Err(e) => errors.push(e),
                }
                count.fetch_add(1, Ordering::Relaxed);
            }
            errors
        })
    };

    let mut failures = Vec::new();
    for n in 1..=rounds {
        failures.extend(round(&c, &parent, n).await);
        if n % 10 == 0 {
            let _ = writeln!(
                std::io::stderr(),
                "[{:6.1}s] {n}/{rounds} rounds, {} failures, {} parent execs",
                t0.elapsed().as_secs_f64(),
                failures.len(),
                parent_execs.load(Ordering::Relaxed)
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    failures.extend(hammer.await.unwrap());
    assert!(
        parent_execs.load(Ordering::Relaxed) >= rounds,
        "the parent was exercised during the rounds"
    );
    assert!(
        failures.is_empty(),
        "{} failures in {rounds} rounds:\n{}",
        failures.len(),
        failures.join("\n")
    );
    for id in [&parent, &load] {
        c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await
            .expect("delete");
    }
}
