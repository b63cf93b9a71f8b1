//! Merge end to end: a child's changes since the branch point brought into its parent
//! (a conflict stops it with nothing changed; `theirs` resolves it) and into a sibling.
use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::{Client, ClientError};
use zygote_daemon::model::{BranchResponse, MergeReport, SandboxDiff};

use super::exec;

async fn merge(c: &Client, id: &str, body: Value) -> Result<MergeReport, ClientError> {
    c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/merge"),
        Some(&body),
    )
    .await
}

/// Sandboxes the daemon has started (`zygote_boot_duration_seconds_count`).
async fn boot_count(c: &Client) -> u64 {
    let body = c.raw(Method::GET, "/metrics", None).await.expect("metrics");
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix("zygote_boot_duration_seconds_count "))
        .and_then(|v| v.trim().parse().ok())
        .expect("a boot count in /metrics")
}

async fn sh(c: &Client, id: &str, script: &str) -> String {
    let r = exec(c, id, script).await;
    assert_eq!(r.exit_code, Some(0), "{script} in {id}: {}", r.stderr);
    r.stdout
}

/// Branches `parent` (mergeable) and merges one child back into it and into its sibling.
/// Deletes the two children it made.
pub async fn check_merge(c: &Client, parent: &str) {
    sh(
        c,
        parent,
        "mkdir -p /root/m/sub && cd /root/m && echo keep > keep.txt && echo old > edit.txt \
         && echo del > del.txt && echo base > both.txt && echo s > sub/s.txt && sync",
    )
    .await;
    let br: BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{parent}/branch"),
            Some(&json!({"count": 2, "mergeable": true})),
        )
        .await
        .expect("mergeable branch");
    let (x, y) = (br.children[0].clone(), br.children[1].clone());
    sh(
        c,
        &x,
        "cd /root/m && echo new > edit.txt && rm del.txt && mkdir -p new/deep \
         && echo deep > new/deep/f.txt && ln -s edit.txt link && chmod 600 keep.txt \
         && echo x > both.txt && rm -r sub",
    )
    .await;
    sh(
        c,
        parent,
        "cd /root/m && echo parent > both.txt && echo mine > mine.txt",
    )
    .await;
    let paths = json!(["/root/m"]);

    // Both changed both.txt: nothing is applied, the conflict is listed.
    let r = merge(c, parent, json!({"from": x, "paths": paths}))
        .await
        .expect("merge with a conflict");
    assert!(!r.applied, "{r:?}");
    assert_eq!(r.base, br.branch_point);
    let conflicts: Vec<(&str, &str, &str)> = r
        .conflicts
        .iter()
        .map(|c| (c.path.as_str(), c.ours.as_str(), c.theirs.as_str()))
        .collect();
    assert_eq!(
        conflicts,
        [("/root/m/both.txt", "modified", "modified")],
        "{r:?}"
    );
    assert_eq!(sh(c, parent, "cat /root/m/edit.txt").await, "old\n");

    // A dry run says what `theirs` would do, and does nothing. The common state's walk
    // was kept: no sandbox is started for it again.
    let boots = boot_count(c).await;
    let r = merge(
        c,
        parent,
        json!({"from": x, "paths": paths, "on_conflict": "theirs", "dry_run": true}),
    )
    .await
    .expect("dry run");
    assert!(!r.applied);
    assert_eq!(
        boot_count(c).await,
        boots,
        "no base sandbox for a known point"
    );
    let mut changes: Vec<(String, String)> = r
        .changes
        .iter()
        .map(|c| (c.path.clone(), c.action.clone()))
        .collect();
    changes.sort();
    let want: Vec<(String, String)> = [
        ("both.txt", "modify"),
        ("del.txt", "remove"),
        ("edit.txt", "modify"),
        ("keep.txt", "mode"),
        ("link", "add"),
        ("new", "add"),
        ("new/deep", "add"),
        ("new/deep/f.txt", "add"),
        ("sub", "remove"),
    ]
    .iter()
    .map(|(p, a)| (format!("/root/m/{p}"), a.to_string()))
    .collect();
    assert_eq!(changes, want, "{r:?}");
    assert_eq!(sh(c, parent, "cat /root/m/edit.txt").await, "old\n");

    let r = merge(
        c,
        parent,
        json!({"from": x, "paths": paths, "on_conflict": "theirs"}),
    )
    .await
    .expect("merge, theirs winning");
    assert!(r.applied, "{r:?}");
    assert_eq!(r.conflicts[0].resolution.as_deref(), Some("theirs"));
    assert_eq!(
        r.bytes_copied,
        "new\n".len() as u64 + 2 + "deep\n".len() as u64
    );
    let state = sh(
        c,
        parent,
        "cd /root/m && cat edit.txt both.txt new/deep/f.txt mine.txt && readlink link \
         && stat -c %a keep.txt && test ! -e del.txt && test ! -e sub && ls -A",
    )
    .await;
    assert_eq!(
        state.lines().collect::<Vec<_>>(),
        [
            "new", "x", "deep", "mine", "edit.txt", "600", "both.txt", "edit.txt", "keep.txt",
            "link", "mine.txt", "new"
        ],
        "the parent has the child's changes and keeps its own, with no staging left"
    );

    // Into the sibling, which changed nothing there: no conflict, same tree after.
    let r = merge(c, &y, json!({"from": x, "paths": paths}))
        .await
        .expect("merge into the sibling");
    assert!(r.applied && r.conflicts.is_empty(), "{r:?}");
    let d: SandboxDiff = c
        .json(
            Method::GET,
            &format!("/v1/sandboxes/{y}/diff?against={x}&path=/root/m"),
            None::<&()>,
        )
        .await
        .expect("diff after merge");
    assert!(
        d.added.is_empty() && d.removed.is_empty() && d.modified.is_empty(),
        "{d:?}"
    );

    // Bad input: nothing changes, a clear 4xx.
    for (body, code) in [
        (json!({"from": parent}), "invalid_argument"),
        (json!({"from": "sb-000000000000"}), "not_found"),
        (
            json!({"from": x, "paths": ["/root/../etc"]}),
            "invalid_argument",
        ),
        (json!({"from": x, "paths": ["/"]}), "invalid_argument"),
        (
            json!({"from": x, "paths": ["/root", "/root/m"]}),
            "invalid_argument",
        ),
        (json!({"from": x, "on_conflict": "mine"}), "malformed_body"),
    ] {
        let e = merge(c, parent, body.clone()).await.unwrap_err();
        assert_eq!(e.code(), Some(code), "{body}: {e}");
    }
    for id in [&x, &y] {
        c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await
            .expect("delete a merge child");
    }
}
