//! Pause and resume, killed at each of their fault points (see the parent module).
use std::path::Path;
use std::time::Instant;

use hyper::Method;
use zygote_daemon::client::Client;
use zygote_daemon::model::Sandbox;

use super::common::{get, start_daemon, step, Daemon};
use super::{
    assert_no_deleted_files_open, assert_no_orphans, assert_vm_processes, expect_killed, sh,
};

/// The marks in number order (a glob puts `mark-10` before `mark-2`).
const MARKS_IN_ORDER: &str = "ls /root/mark-* | sort -t- -k2 -n | xargs cat";

/// `POST /v1/sandboxes/{id}/{op}` (pause or resume).
async fn pause(c: &Client, id: &str, op: &str) -> Result<Sandbox, String> {
    c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/{op}"),
        None::<&()>,
    )
    .await
    .map_err(|e| e.to_string())
}

/// Each pause and resume fault point on sandbox `a` (running, with `marks` marks
/// written so far); leaves it running.
pub async fn crash_points(
    state: &Path,
    args: &[&str],
    faulty: &dyn Fn(&str) -> Daemon,
    a: &str,
    marks: u32,
    t0: Instant,
) {
    let mut marks = marks;
    // Pause: killed before the runtime starts, with the state saved but the VM not yet
    // ended, or with the VM ended but not yet recorded: the sandbox is running (the pause
    // undone) or paused (the state was complete: a VM still there is killed), never lost;
    // resume brings every mark back.
    for point in ["pause.recorded", "pause.saved", "pause.stopped"] {
        let d = faulty(point);
        let c = d.client();
        marks += 1;
        sh(&c, a, &format!("echo {marks} > /root/mark-{marks}; sync")).await;
        let r = pause(&c, a, "pause").await;
        expect_killed(d, point, r).await;
        let d = start_daemon(state, args);
        let c = d.client();
        let sb = get(&c, a).await;
        // Once the state is saved the pause is finished at start-up.
        let want_state = if point == "pause.recorded" {
            "running"
        } else {
            "paused"
        };
        assert_eq!(sb.state, want_state, "{point}: {sb:?}");
        assert_vm_processes(&c, state, point).await;
        assert_no_orphans(&c, state, point).await;
        if sb.state == "paused" {
            assert_eq!(sb.pid, None, "{point}: {sb:?}");
            pause(&c, a, "resume")
                .await
                .unwrap_or_else(|e| panic!("{point}: resume: {e}"));
        }
        let sb = get(&c, a).await;
        assert_no_deleted_files_open(&sb, point);
        let want: String = (1..=marks).map(|m| format!("{m}\n")).collect();
        assert_eq!(sh(&c, a, MARKS_IN_ORDER).await, want, "{point}");
        // Pausing works again.
        pause(&c, a, "pause")
            .await
            .unwrap_or_else(|e| panic!("{point}: pause after recovery: {e}"));
        pause(&c, a, "resume")
            .await
            .unwrap_or_else(|e| panic!("{point}: resume after recovery: {e}"));
        assert_no_orphans(&c, state, point).await;
        step(
            t0,
            &format!("{point}: {want_state} after the restart, marks intact"),
        );
        drop(d);
    }
    // Resume: killed before or after the VM started: paused again (no VM of it runs), and
    // resuming then works.
    for point in ["resume.recorded", "resume.started"] {
        let d = start_daemon(state, args);
        let c = d.client();
        marks += 1;
        sh(&c, a, &format!("echo {marks} > /root/mark-{marks}; sync")).await;
        pause(&c, a, "pause").await.expect("pause");
        drop(d);
        let d = faulty(point);
        let r = pause(&d.client(), a, "resume").await;
        expect_killed(d, point, r).await;
        let d = start_daemon(state, args);
        let c = d.client();
        let sb = get(&c, a).await;
        assert_eq!(
            (sb.state.as_str(), sb.pid),
            ("paused", None),
            "{point}: {sb:?}"
        );
        assert_vm_processes(&c, state, point).await;
        assert_no_orphans(&c, state, point).await;
        pause(&c, a, "resume")
            .await
            .unwrap_or_else(|e| panic!("{point}: resume again: {e}"));
        let want: String = (1..=marks).map(|m| format!("{m}\n")).collect();
        assert_eq!(sh(&c, a, MARKS_IN_ORDER).await, want, "{point}");
        step(
            t0,
            &format!("{point}: paused after the restart, resumed, marks intact"),
        );
        drop(d);
    }
}
