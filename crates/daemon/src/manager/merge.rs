//! `merge`: bring one sandbox's file changes since the common branch point into another
//! sandbox of the same tree, three-way.
//!
//! The common state is a snapshot: the branch point (or snapshot) where the two lines
//! of descent part. Its files are read by starting a short-lived sandbox from it (no
//! network; recorded, so a daemon killed mid-merge removes it at start-up) and walking
//! its directory, like the two live sandboxes' (`merge_plan` decides what to do). A
//! snapshot never changes, so its walks are kept with it: later merges from the same
//! point start no sandbox. The changes are then made by `merge_apply`.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use sha2::{Digest, Sha256};
use zygote_proto::client::ClientError;
use zygote_proto::{ErrorCode, FileKind, Metadata, WalkEntry};

use super::intent::{write_synced, Intent};
use super::merge_apply::{apply_plans, staging_dir, Staged, STAGING_PREFIX};
use super::merge_intent::MergeIntent;
use super::merge_plan::{self, Plan, Tree};
use super::Manager;
use crate::error::{Error, Result};
use crate::fault;
use crate::model::{
    CreateSandboxRequest, MergeReport, MergeRequest, NetworkMode, OnConflict, Validate,
};

/// The sandbox holding the common state is deleted after the merge; if the daemon dies
/// first, its TTL does it.
const BASE_SANDBOX_TTL_SECS: u64 = 900;
/// Files the fork contract rewrites in every child: never merged.
const PER_SANDBOX_PATHS: &[&str] = &["/etc/machine-id", "/etc/hostname", "/run/zygote"];
/// How long a merge waits for a branch point's state still being written.
const STATE_WRITE_WAIT: std::time::Duration = std::time::Duration::from_secs(120);
/// Where a snapshot's directory keeps the walks of its trees merges made.
const WALK_CACHE_DIR: &str = "merge-walks";

impl Manager {
    pub async fn merge(self: &Arc<Self>, id: &str, req: MergeRequest) -> Result<MergeReport> {
        req.validate()?;
        let started = Instant::now();
        let dirs = req.dirs()?;
        let from = req.from.as_str();
        if from == id {
            return Err(Error::invalid("from names the sandbox itself"));
        }
        self.running_vm(&self.sandbox_row(id)?)?;
        self.running_vm(&self.sandbox_row(from)?)?;
        let base = self.merge_base(id, from)?;
        let snap = self.snapshot_row(&base)?;
        if !saved_state(&snap.data.state_file, &snap.data.dir).await {
            return Err(Error::Conflict(format!(
                "the common state of {id} and {from} ({base}) was not saved: on the {} runtime \
                 a branch keeps its point for merges only when asked (`mergeable: true`)",
                self.runtime.name()
            )));
        }
        // The common state's trees (walked once per snapshot and directory, in a sandbox
        // started from it) while the two live trees are walked. What the merge makes
        // that must not outlive it is recorded first (`merge_intent`).
        let nonce = super::random_hex(6);
        let intent = MergeIntent {
            base_sandbox: super::new_id("sb"),
            target: id.to_string(),
            staging: dirs.iter().map(|d| staging_dir(d, &nonce)).collect(),
        };
        let record = Intent::Merge(intent.clone());
        record.record(self)?;
        let (base_trees, ours, theirs) = tokio::join!(
            self.base_trees(&snap.data.dir, &base, &dirs, &intent.base_sandbox),
            self.walk_dirs(id, &dirs),
            self.walk_dirs(from, &dirs),
        );
        let result = async {
            let trees = [base_trees?, ours?, theirs?];
            let mut report = self
                .merge_trees(id, &req, &dirs, &base, trees, &nonce)
                .await?;
            report.duration_ms = started.elapsed().as_millis() as u64;
            Ok(report)
        }
        .await;
        if self.sandbox_row(&intent.base_sandbox).is_ok() {
            if let Err(e) = self.delete(&intent.base_sandbox).await {
                tracing::warn!(
                    "merge into {id}: deleting the base sandbox {}: {e}",
                    intent.base_sandbox
                );
            }
        }
        record.forget(self);
        result
    }

    async fn merge_trees(
        self: &Arc<Self>,
        id: &str,
        req: &MergeRequest,
        dirs: &[String],
        base: &str,
        [base_trees, ours, theirs]: [Vec<Tree>; 3],
        nonce: &str,
    ) -> Result<MergeReport> {
        let on_conflict = req.on_conflict.unwrap_or_default();
        let plans: Vec<Plan> = (0..dirs.len())
            .map(|i| merge_plan::plan(&base_trees[i], &ours[i], &theirs[i], on_conflict))
            .collect();
        let mut report = MergeReport {
            sandbox: id.to_string(),
            from: req.from.clone(),
            base: base.to_string(),
            paths: dirs.to_vec(),
            applied: false,
            changes: Vec::new(),
            conflicts: Vec::new(),
            skipped: Vec::new(),
            bytes_copied: 0,
            duration_ms: 0,
        };
        for (dir, plan) in dirs.iter().zip(&plans) {
            let abs = |rel: &str| join(dir, rel);
            report.changes.extend(plan.changes.iter().map(|c| {
                let mut c = c.clone();
                c.path = abs(&c.path);
                c
            }));
            report.conflicts.extend(plan.conflicts.iter().map(|c| {
                let mut c = c.clone();
                c.path = abs(&c.path);
                c
            }));
            report.skipped.extend(plan.skipped.iter().map(|s| abs(s)));
        }
        let blocked = on_conflict == OnConflict::Fail && !report.conflicts.is_empty();
        let has_steps = plans.iter().any(|p| !p.steps.is_empty());
        if blocked || req.dry_run.unwrap_or(false) {
            return Ok(report);
        }
        // Nothing to change is a merge done too.
        report.applied = true;
        if has_steps {
            let _guard = self.lock(id).await;
            let ours_client = self.agent(id).await?;
            let theirs_client = self.agent(&req.from).await?;
            let dirs = dirs.to_vec();
            let from = req.from.clone();
            let roots: Vec<bool> = ours.iter().map(|t| t.contains_key("")).collect();
            let nonce = nonce.to_string();
            report.bytes_copied = self
                .blocking(move || {
                    let staged = Staged {
                        from: &from,
                        dirs: &dirs,
                        roots: &roots,
                        nonce: &nonce,
                    };
                    apply_plans(&ours_client, &theirs_client, staged, &plans)
                })
                .await?
                .map_err(Error::agent)?;
            tracing::info!(
                "merged {} into {id}: {} changes, {} bytes",
                req.from,
                report.changes.len(),
                report.bytes_copied
            );
        }
        Ok(report)
    }

    /// The snapshot holding the state `a` and `b` last had in common (see
    /// [`common_point`]).
    fn merge_base(&self, a: &str, b: &str) -> Result<String> {
        let rows = self.db.sandboxes()?;
        let parents = self.lineage_parents(&rows)?;
        // Where a point stands among its sandbox's captures: its place in the sandbox's
        // chain (if the sandbox still exists), then the time it was taken.
        let order = |ancestor: &str, point: &str| -> Option<(usize, u64)> {
            let pos = rows
                .iter()
                .find(|r| r.id == ancestor)
                .and_then(|r| r.depends_on.iter().position(|d| d == point))
                .unwrap_or(usize::MAX);
            Some((pos, self.snapshot_row(point).ok()?.created_at))
        };
        common_point(&parents, a, b, order)
    }

    /// Each directory's tree in sandbox `id` (an absent directory: an empty tree).
    async fn walk_dirs(self: &Arc<Self>, id: &str, dirs: &[String]) -> Result<Vec<Tree>> {
        let mut trees = Vec::new();
        for dir in dirs {
            trees.push(tree_of(id, dir, self.walk_raw(id, dir).await?)?);
        }
        Ok(trees)
    }

    /// `dir` as sandbox `id`'s agent walks it (None: no such directory).
    async fn walk_raw(self: &Arc<Self>, id: &str, dir: &str) -> Result<Option<Vec<WalkEntry>>> {
        let d = dir.to_string();
        self.agent_call(id, move |c| match c.walk(&d, true) {
            Err(e) if e.code() == Some(ErrorCode::NotFound) => Ok(None),
            r => r.map(Some),
        })
        .await
    }

    /// The trees of snapshot `base` (files in `snap_dir`): walks kept from an earlier
    /// merge, the others walked in sandbox `sandbox_id` started from the snapshot for
    /// that (and deleted by the caller) and kept for the next merge: the snapshot never
    /// changes.
    async fn base_trees(
        self: &Arc<Self>,
        snap_dir: &std::path::Path,
        base: &str,
        dirs: &[String],
        sandbox_id: &str,
    ) -> Result<Vec<Tree>> {
        let cache = snap_dir.join(WALK_CACHE_DIR);
        let cached = |dir: &str| -> Option<Option<Vec<WalkEntry>>> {
            let kept: CachedWalk =
                serde_json::from_slice(&std::fs::read(cache.join(cache_name(dir))).ok()?).ok()?;
            (kept.dir == dir).then_some(kept.entries)
        };
        let mut walks: Vec<Option<Option<Vec<WalkEntry>>>> =
            dirs.iter().map(|d| cached(d)).collect();
        if walks.iter().any(Option::is_none) {
            let sb = self
                .create_with_ids(
                    CreateSandboxRequest {
                        snapshot: Some(base.to_string()),
                        ttl_secs: Some(BASE_SANDBOX_TTL_SECS),
                        network: Some(NetworkMode::None),
                        ..Default::default()
                    },
                    vec![sandbox_id.to_string()],
                )
                .await?;
            fault::point("merge.base-started");
            for (dir, walk) in dirs.iter().zip(walks.iter_mut()) {
                if walk.is_none() {
                    let kept = CachedWalk {
                        dir: dir.clone(),
                        entries: self.walk_raw(&sb[0].id, dir).await?,
                    };
                    keep_walk(&cache, &kept);
                    *walk = Some(kept.entries);
                }
            }
        }
        dirs.iter()
            .zip(walks)
            .map(|(dir, w)| tree_of(base, dir, w.flatten()))
            .collect()
    }
}

/// Where the lines of descent of `a` and `b` part: the point (branch point or
/// snapshot) one came down from the other through, or, when both come down from a
/// common ancestor, the earlier of the two points they left it through (the later one
/// carries the ancestor's changes in between, which are then that side's changes).
/// `parents` maps a sandbox to (its parent, the point it started from); `order` sorts
/// two points of one ancestor (None: the point is gone).
fn common_point<K: Ord>(
    parents: &BTreeMap<String, (String, String)>,
    a: &str,
    b: &str,
    order: impl Fn(&str, &str) -> Option<K>,
) -> Result<String> {
    // (ancestor, the point the line came down from it through), nearest first.
    let line = |start: &str| {
        let mut out: Vec<(&str, &str)> = Vec::new();
        let mut cur = start;
        while let Some((p, point)) = parents.get(cur) {
            if p == start || out.iter().any(|(x, _)| x == p) {
                break; // Lineage has no cycles; never loop if it had.
            }
            out.push((p, point));
            cur = p;
        }
        out
    };
    let (line_a, line_b) = (line(a), line(b));
    if let Some((_, point)) = line_b.iter().find(|(x, _)| *x == a) {
        return Ok(point.to_string());
    }
    if let Some((_, point)) = line_a.iter().find(|(x, _)| *x == b) {
        return Ok(point.to_string());
    }
    for (ancestor, pa) in &line_a {
        let Some((_, pb)) = line_b.iter().find(|(x, _)| x == ancestor) else {
            continue;
        };
        if pa == pb {
            return Ok(pa.to_string());
        }
        return match (order(ancestor, pa), order(ancestor, pb)) {
            (Some(x), Some(y)) => Ok(if x <= y { pa } else { pb }.to_string()),
            _ => Err(Error::Conflict(format!(
                "the common state of {a} and {b} is gone (snapshot {pa} or {pb} deleted)"
            ))),
        };
    }
    Err(Error::Conflict(format!(
        "{a} and {b} are not of one tree (no common branch point): merge works between \
         sandboxes branched from one another"
    )))
}

/// Whether a snapshot's state file is there, waiting while it is still being written
/// (a kept kvm branch point is written after the branch returns).
async fn saved_state(state_file: &std::path::Path, dir: &std::path::Path) -> bool {
    let deadline = Instant::now() + STATE_WRITE_WAIT;
    loop {
        if state_file.exists() {
            return true;
        }
        let writing = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().contains(".tmp-"));
        if !writing || Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A walk of a snapshot's directory, kept in the snapshot's own directory.
#[derive(serde::Serialize, serde::Deserialize)]
struct CachedWalk {
    dir: String,
    entries: Option<Vec<WalkEntry>>,
}

fn cache_name(dir: &str) -> String {
    format!(
        "{}.json",
        &hex::encode(Sha256::digest(dir.as_bytes()))[..16]
    )
}

/// Best effort: a walk not kept is walked again next time.
fn keep_walk(cache: &std::path::Path, walk: &CachedWalk) {
    let written = std::fs::create_dir_all(cache).and_then(|()| {
        let body = serde_json::to_vec(walk).map_err(std::io::Error::other)?;
        write_synced(&cache.join(cache_name(&walk.dir)), &body)
    });
    if let Err(e) = written {
        tracing::warn!(
            "keeping the walk of {} in {}: {e}",
            walk.dir,
            cache.display()
        );
    }
}

pub(super) fn join(dir: &str, rel: &str) -> String {
    if rel.is_empty() {
        dir.to_string()
    } else {
        format!("{dir}/{rel}")
    }
}

/// A walk as a tree, checked: what a guest reports is not trusted. Every path is a
/// plain relative one whose parent directory is in the same walk, so no later step can
/// be sent through a symlink the guest slipped in as a "directory".
fn tree_of(id: &str, dir: &str, walked: Option<Vec<WalkEntry>>) -> Result<Tree> {
    let mut tree = Tree::new();
    let Some(entries) = walked else {
        return Ok(tree);
    };
    let bad = |what: String| {
        Error::Guest(ClientError::Protocol(format!(
            "sandbox {id}'s walk of {dir}: {what}"
        )))
    };
    tree.insert(String::new(), root_entry());
    for e in entries {
        let ok = !e.path.is_empty()
            && e.path.len() <= 4096
            && !e.path.contains('\0')
            && e.path
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        if !ok {
            return Err(bad(format!("bad entry path {:?}", e.path)));
        }
        if e.meta.kind == FileKind::File && e.sha256.as_ref().is_none_or(|h| h.len() != 64) {
            return Err(bad(format!("file {:?} without a sha256", e.path)));
        }
        let abs = join(dir, &e.path);
        let per_sandbox = PER_SANDBOX_PATHS
            .iter()
            .any(|p| abs == *p || abs.starts_with(&format!("{p}/")));
        // A merge interrupted before its `apply` leaves its staging directory behind.
        let staging = e.path.starts_with(STAGING_PREFIX);
        if !(per_sandbox || staging) {
            tree.insert(e.path.clone(), e);
        }
    }
    let orphan = tree.keys().find(|k| {
        let parent = k.rfind('/').map_or("", |i| &k[..i]);
        !k.is_empty()
            && tree
                .get(parent)
                .is_none_or(|p| p.meta.kind != FileKind::Dir)
    });
    if let Some(k) = orphan {
        return Err(bad(format!("{k:?} is not inside a directory of the walk")));
    }
    Ok(tree)
}

/// Stands for the merged directory itself: present or absent, never "changed".
fn root_entry() -> WalkEntry {
    WalkEntry {
        path: String::new(),
        meta: Metadata {
            kind: FileKind::Dir,
            size: 0,
            mode: 0o755,
            uid: 0,
            gid: 0,
            mtime: 0,
            mtime_nanos: 0,
            symlink_target: None,
        },
        sha256: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walked(path: &str, kind: FileKind) -> WalkEntry {
        let mut e = root_entry();
        e.path = path.into();
        e.meta.kind = kind;
        if kind == FileKind::File {
            e.sha256 = Some("0".repeat(64));
        }
        e
    }

    #[test]
    fn the_common_point_is_where_the_lines_of_descent_part() {
        // p branched at bp1 into c1, c2, and later at bp2 into c3; c1 at bp3 into g;
        // s started from snapshot snap of c2; z is of another tree.
        let parents: BTreeMap<String, (String, String)> = [
            ("c1", "p", "bp1"),
            ("c2", "p", "bp1"),
            ("c3", "p", "bp2"),
            ("g", "c1", "bp3"),
            ("s", "c2", "snap"),
            ("z2", "z", "bpz"),
        ]
        .into_iter()
        .map(|(c, p, pt)| (c.to_string(), (p.to_string(), pt.to_string())))
        .collect();
        let order = |_: &str, point: &str| match point {
            "bp1" => Some(1),
            "bp2" => Some(2),
            _ => None,
        };
        let base = |a, b| common_point(&parents, a, b, order);
        assert_eq!(base("p", "c1").unwrap(), "bp1");
        assert_eq!(base("c1", "p").unwrap(), "bp1");
        assert_eq!(base("c1", "c2").unwrap(), "bp1");
        assert_eq!(base("p", "g").unwrap(), "bp1");
        assert_eq!(base("c1", "g").unwrap(), "bp3");
        assert_eq!(base("g", "c2").unwrap(), "bp1");
        assert_eq!(base("s", "c2").unwrap(), "snap");
        assert_eq!(base("s", "c1").unwrap(), "bp1");
        // Siblings of different branches: the earlier point, whichever side asks.
        assert_eq!(base("c1", "c3").unwrap(), "bp1");
        assert_eq!(base("c3", "c2").unwrap(), "bp1");
        for (x, y) in [("c1", "z2"), ("z", "p"), ("p", "unknown")] {
            let e = base(x, y).unwrap_err();
            assert!(e.to_string().contains("not of one tree"), "{x} {y}: {e}");
        }
        let gone = |_: &str, _: &str| None::<u8>;
        let e = common_point(&parents, "c1", "c3", gone).unwrap_err();
        assert!(e.to_string().contains("is gone"), "{e}");
    }

    #[test]
    fn a_guest_walk_is_checked_before_it_is_used() {
        let ok = tree_of(
            "sb",
            "/root",
            Some(vec![
                walked("d", FileKind::Dir),
                walked("d/f", FileKind::File),
            ]),
        )
        .unwrap();
        assert_eq!(ok.keys().collect::<Vec<_>>(), ["", "d", "d/f"]);
        assert!(tree_of("sb", "/root", None).unwrap().is_empty());
        for bad in [
            vec![walked("../etc/passwd", FileKind::File)],
            vec![walked("/etc/passwd", FileKind::File)],
            vec![walked("a//b", FileKind::File)],
            vec![walked("", FileKind::File)],
            // Through a symlink posing as a directory, or with no directory at all.
            vec![
                walked("l", FileKind::Symlink),
                walked("l/shadow", FileKind::File),
            ],
            vec![walked("nodir/f", FileKind::File)],
        ] {
            let e = tree_of("sb", "/root", Some(bad.clone())).unwrap_err();
            assert!(e.to_string().contains("walk of /root"), "{bad:?}: {e}");
        }
        let mut no_hash = walked("f", FileKind::File);
        no_hash.sha256 = None;
        assert!(tree_of("sb", "/root", Some(vec![no_hash])).is_err());
    }

    #[test]
    fn per_sandbox_files_and_staging_leftovers_are_never_merged() {
        let t = tree_of(
            "sb",
            "/etc",
            Some(vec![
                walked("machine-id", FileKind::File),
                walked("hostname", FileKind::File),
                walked("motd", FileKind::File),
            ]),
        )
        .unwrap();
        assert_eq!(t.keys().collect::<Vec<_>>(), ["", "motd"]);
        let t = tree_of(
            "sb",
            "/root",
            Some(vec![
                walked(".zygote-merge-abc", FileKind::Dir),
                walked(".zygote-merge-abc/0", FileKind::File),
            ]),
        )
        .unwrap();
        assert_eq!(t.keys().collect::<Vec<_>>(), [""]);
    }
}
