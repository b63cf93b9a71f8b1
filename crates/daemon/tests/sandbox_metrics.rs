//! Issue 35, per-sandbox metrics: `GET /v1/sandboxes/{id}/metrics` answers the samples
//! the daemon's sampler took of a running sandbox (here every second): CPU time burnt
//! in the guest shows as a busy percentage, a 64 MiB file as used disk; `start`/`end`
//! select samples; bad queries are 400s, an unknown sandbox a 404; a paused sandbox
//! keeps its history and gets no new samples until it runs again.
mod common;

use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::json;
use zygote_api::client::{Client, ClientError};
use zygote_daemon::model::{MetricSample, MetricsList};

use common::{create, eventually, qemu_guest_ready, sh, start_daemon, step, Scratch};

async fn metrics(c: &Client, id: &str, query: &str) -> Result<Vec<MetricSample>, (u16, String)> {
    c.json::<MetricsList>(
        Method::GET,
        &format!("/v1/sandboxes/{id}/metrics{query}"),
        None::<&()>,
    )
    .await
    .map(|l| l.metrics)
    .map_err(|e| match e {
        ClientError::Api {
            status, message, ..
        } => (status, message),
        other => (0, other.to_string()),
    })
}

/// Waits (up to 60 s) for a sample taken after `after` (unix s) for which `want` holds.
async fn sample_where(
    c: &Client,
    id: &str,
    after: u64,
    want: impl Fn(&MetricSample) -> bool,
) -> Option<MetricSample> {
    eventually(Duration::from_secs(60), async || {
        let all = metrics(c, id, "").await.ok()?;
        all.into_iter()
            .find(|s| s.timestamp_unix > after && want(s))
    })
    .await
}

/// `POST /v1/sandboxes/{id}/{verb}` (pause, resume).
async fn lifecycle(c: &Client, id: &str, verb: &str) {
    c.json::<serde_json::Value>(
        Method::POST,
        &format!("/v1/sandboxes/{id}/{verb}"),
        Some(&json!({})),
    )
    .await
    .unwrap_or_else(|e| panic!("{verb} {id}: {e}"));
}

fn unix_now() -> u64 {
    zygote_api::time::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_metrics_follow_the_guest() {
    if !qemu_guest_ready("sandbox_metrics_follow_the_guest") {
        return;
    }
    let t0 = Instant::now();
    let scratch = Scratch::new();
    let d = start_daemon(
        &scratch.state,
        &[
            "--listen",
            "127.0.0.1:0",
            "--runtime",
            "qemu",
            "--metrics-interval",
            "1",
        ],
    );
    let c = d.client();
    // Auto-resume: a guest call would wake it when paused, which the sampler must not.
    let body = json!({"image": "minimal", "name": "metrics", "mem_mib": 256, "vcpus": 1,
                      "auto_resume": true});
    let id = create(&c, body, &scratch.cleanup).await[0].id.clone();
    step(t0, &format!("sandbox {id}"));

    // Samples come on their own, with sane figures.
    let first = sample_where(&c, &id, 0, |_| true)
        .await
        .expect("a first sample within 60 s");
    assert_eq!(first.cpu_count, 1, "{first:?}");
    assert!(
        first.mem_total > 128 << 20 && first.mem_total <= 256 << 20,
        "{first:?}"
    );
    assert!(
        first.mem_used > 0 && first.mem_used <= first.mem_total,
        "{first:?}"
    );
    assert!(first.mem_cache <= first.mem_total, "{first:?}");
    assert!(
        first.disk_total > 0 && first.disk_used <= first.disk_total,
        "{first:?}"
    );
    assert!((0.0..=100.0).contains(&first.cpu_used_pct), "{first:?}");
    assert!(first.timestamp.ends_with('Z') && first.timestamp.contains('T'));
    step(t0, &format!("first sample {first:?}"));

    // CPU burnt in the guest for 5 s: a sample taken during it shows the vCPU busy.
    let burn_from = unix_now();
    sh(
        &c,
        &id,
        "end=$(( $(date +%s) + 5 )); while [ $(date +%s) -lt $end ]; do :; done",
    )
    .await
    .unwrap();
    let burnt = metrics(&c, &id, "")
        .await
        .unwrap()
        .into_iter()
        .filter(|s| s.timestamp_unix > burn_from)
        .map(|s| s.cpu_used_pct)
        .fold(0.0, f64::max);
    assert!(burnt > 50.0, "busiest sample while burning: {burnt}%");
    step(t0, &format!("burning: {burnt}% busy"));

    // 64 MiB written to the root filesystem: used disk grows by about that much.
    let before = metrics(&c, &id, "").await.unwrap();
    let before = before.last().expect("samples").clone();
    let written_at = unix_now();
    sh(
        &c,
        &id,
        "dd if=/dev/zero of=/metrics-blob bs=1M count=64 2>/dev/null && sync",
    )
    .await
    .unwrap();
    let grown = sample_where(&c, &id, written_at, |s| {
        s.disk_used >= before.disk_used + (60 << 20)
    })
    .await;
    assert!(
        grown.is_some(),
        "disk_used never grew by 64 MiB from {}: {:?}",
        before.disk_used,
        metrics(&c, &id, "").await
    );
    step(t0, "disk use grew");

    // start / end select samples (inclusive).
    let all = metrics(&c, &id, "").await.unwrap();
    assert!(all.len() >= 5, "{} samples", all.len());
    assert!(all
        .windows(2)
        .all(|w| w[0].timestamp_unix <= w[1].timestamp_unix));
    let mid = all[all.len() / 2].timestamp_unix;
    let one = metrics(&c, &id, &format!("?start={mid}&end={mid}"))
        .await
        .unwrap();
    assert!(
        !one.is_empty() && one.iter().all(|s| s.timestamp_unix == mid),
        "{one:?}"
    );
    let later = metrics(&c, &id, &format!("?start={mid}")).await.unwrap();
    assert!(later.iter().all(|s| s.timestamp_unix >= mid));
    // The first sample at or after mid is where the answer starts.
    assert_eq!(later.first(), all.iter().find(|s| s.timestamp_unix >= mid));
    let earlier = metrics(&c, &id, &format!("?end={mid}")).await.unwrap();
    assert!(!earlier.is_empty() && earlier.iter().all(|s| s.timestamp_unix <= mid));
    assert!(metrics(&c, &id, "?start=1&end=2").await.unwrap().is_empty());

    // Bad queries and unknown sandboxes.
    for (q, says) in [
        ("?start=abc", "start"),
        ("?end=-1", "end"),
        ("?start=10&end=5", "start (10) must not be after end (5)"),
        ("?start=99999999999999999999", "start"),
        ("?since=5", "since"),
    ] {
        let (status, message) = metrics(&c, &id, q).await.unwrap_err();
        assert_eq!(status, 400, "{q}: {message}");
        assert!(message.contains(says), "{q}: {message}");
    }
    let (status, _) = metrics(&c, "nosuchsandbox", "").await.unwrap_err();
    assert_eq!(status, 404);
    step(t0, "queries");

    // Paused: the history stays, and no sample is taken until it runs again.
    lifecycle(&c, &id, "pause").await;
    let kept = metrics(&c, &id, "").await.unwrap();
    assert!(kept.len() >= all.len(), "history lost at pause");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = metrics(&c, &id, "").await.unwrap();
    assert_eq!(still, kept, "samples taken while paused");
    let state = common::get(&c, &id).await.state;
    assert_eq!(state, "paused", "the sampler woke the sandbox");
    step(t0, "paused: history kept, no new samples");
    let resumed_at = unix_now();
    lifecycle(&c, &id, "resume").await;
    assert!(sample_where(&c, &id, resumed_at, |_| true).await.is_some());
    let after = metrics(&c, &id, "").await.unwrap();
    assert_eq!(
        &after[..kept.len()],
        &kept[..],
        "history kept across the resume"
    );
    step(t0, "resumed: sampled again");

    // Deleted: its history goes with it.
    c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
        .await
        .unwrap();
    assert_eq!(metrics(&c, &id, "").await.unwrap_err().0, 404);
}
