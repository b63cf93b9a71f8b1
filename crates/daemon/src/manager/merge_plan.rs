//! The three-way comparison behind `merge`: given one directory as it was at the common
//! branch point (`base`), as it is here (`ours`) and in the sandbox merged from
//! (`theirs`), which changes make ours carry theirs, and where both sides changed the
//! same path differently. Pure data in, steps out: the caller walks the guests and
//! makes the steps.
//!
//! Trees are maps from a path relative to the merged directory to its walk entry; the
//! empty path is the directory itself. A subtree is decided as a whole when `theirs`
//! removes or replaces a directory: if ours changed anything inside it, that is one
//! conflict on the directory, not one per file.
use std::collections::{BTreeMap, BTreeSet};

use zygote_proto::{FileKind, WalkEntry};

use super::diff::same;
use crate::model::{MergeChange, MergeConflict, OnConflict};

pub(super) type Tree = BTreeMap<String, WalkEntry>;

/// One change to make in the merged-into guest, relative to the merged directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    Remove {
        rel: String,
        recursive: bool,
    },
    Mkdir {
        rel: String,
        mode: u32,
    },
    /// Copy theirs' file (its content hashes to `sha256`).
    Write {
        rel: String,
        mode: u32,
        size: u64,
        sha256: String,
    },
    Symlink {
        rel: String,
        target: String,
    },
    Chmod {
        rel: String,
        mode: u32,
    },
}

impl Step {
    /// Removals first (deepest first), then directories (shallowest first), then the
    /// rest: every step finds its directory made and nothing of the old kind in its way.
    fn order(&self) -> (u8, i64) {
        let depth = |rel: &str| rel.split('/').count() as i64;
        match self {
            Step::Remove { rel, .. } => (0, -depth(rel)),
            Step::Mkdir { rel, .. } => (1, depth(rel)),
            _ => (2, 0),
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Plan {
    pub steps: Vec<Step>,
    /// Relative paths, as reported (the caller makes them absolute).
    pub changes: Vec<MergeChange>,
    pub conflicts: Vec<MergeConflict>,
    pub skipped: Vec<String>,
}

fn same_opt(a: Option<&WalkEntry>, b: Option<&WalkEntry>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => same(a, b),
        _ => false,
    }
}

fn kind(e: Option<&WalkEntry>) -> Option<FileKind> {
    e.map(|e| e.meta.kind)
}

fn describe(base: Option<&WalkEntry>, side: Option<&WalkEntry>) -> &'static str {
    match (base, side) {
        (None, _) => "added",
        (Some(_), None) => "removed",
        (Some(_), Some(_)) => "modified",
    }
}

/// `rel`'s ancestors, nearest first, ending with the merged directory itself ("").
fn ancestors(rel: &str) -> impl Iterator<Item = &str> {
    let mut cut = Some(rel);
    std::iter::from_fn(move || {
        let cur = cut?;
        if cur.is_empty() {
            cut = None;
            return None;
        }
        let up = cur.rfind('/').map_or("", |i| &cur[..i]);
        cut = Some(up);
        Some(up)
    })
}

/// Entries strictly below `rel` in `tree`.
fn below<'a>(tree: &'a Tree, rel: &str) -> impl Iterator<Item = (&'a String, &'a WalkEntry)> {
    let prefix = if rel.is_empty() {
        String::new()
    } else {
        format!("{rel}/")
    };
    tree.range(prefix.clone()..)
        .take_while(move |(k, _)| k.starts_with(&prefix))
        .filter(|(k, _)| !k.is_empty())
}

pub(super) fn plan(base: &Tree, ours: &Tree, theirs: &Tree, on_conflict: OnConflict) -> Plan {
    let mut plan = Plan::default();
    // Subtrees decided as a whole: nothing below them is looked at on its own.
    let mut decided: BTreeSet<String> = BTreeSet::new();
    // Directories ours has (or will have) once the steps so far are made.
    let mut dirs: BTreeSet<String> = ours
        .iter()
        .filter(|(_, e)| e.meta.kind == FileKind::Dir)
        .map(|(k, _)| k.clone())
        .collect();
    let keys: BTreeSet<&String> = base.keys().chain(theirs.keys()).collect();
    for rel in keys {
        if ancestors(rel).any(|a| decided.contains(a)) {
            continue;
        }
        let (b, o, t) = (base.get(rel), ours.get(rel), theirs.get(rel));
        if same_opt(b, t) || same_opt(o, t) {
            continue; // Theirs did not change it, or both made the same change.
        }
        if kind(t) == Some(FileKind::Other) {
            plan.skipped.push(rel.clone());
            continue;
        }
        let t_is_dir = kind(t) == Some(FileKind::Dir);
        let replaces_dir = kind(o) == Some(FileKind::Dir) && !t_is_dir;
        let changed_below =
            replaces_dir && below(ours, rel).any(|(k, e)| !same_opt(base.get(k), Some(e)));
        let parent_gone = t.is_some() && ancestors(rel).next().is_some_and(|p| !dirs.contains(p));
        let conflict = if !same_opt(b, o) {
            Some(describe(b, o))
        } else if changed_below {
            Some("changed below")
        } else if parent_gone {
            Some("removed its directory")
        } else {
            None
        };
        if let Some(ours_did) = conflict {
            let resolution = match on_conflict {
                OnConflict::Fail => None,
                r => Some(r.as_str().to_string()),
            };
            plan.conflicts.push(MergeConflict {
                path: rel.clone(),
                ours: ours_did.into(),
                theirs: describe(b, t).into(),
                resolution,
            });
            if on_conflict != OnConflict::Theirs {
                // Nothing below a directory whose fate is open or kept is decided alone.
                if t_is_dir || replaces_dir {
                    decided.insert(rel.clone());
                }
                continue;
            }
        }
        take_theirs(&mut plan, &mut decided, &mut dirs, theirs, rel, b, o, t);
    }
    plan.steps.sort_by_key(Step::order);
    plan
}

/// The steps that make ours' `rel` what theirs' is.
#[allow(clippy::too_many_arguments)]
fn take_theirs(
    plan: &mut Plan,
    decided: &mut BTreeSet<String>,
    dirs: &mut BTreeSet<String>,
    theirs: &Tree,
    rel: &str,
    b: Option<&WalkEntry>,
    o: Option<&WalkEntry>,
    t: Option<&WalkEntry>,
) {
    // Missing directories on the way (ours removed them; theirs wins a conflict).
    if t.is_some() {
        let mut missing: Vec<&str> = ancestors(rel).take_while(|a| !dirs.contains(*a)).collect();
        missing.reverse();
        for a in missing {
            let mode = theirs.get(a).map_or(0o755, |e| e.meta.mode);
            plan.steps.push(Step::Mkdir {
                rel: a.to_string(),
                mode,
            });
            dirs.insert(a.to_string());
        }
    }
    let rel_s = rel.to_string();
    let o_is_dir = kind(o) == Some(FileKind::Dir);
    if let Some(o) = o {
        let keep_dir = o_is_dir && kind(t) == Some(FileKind::Dir);
        if !keep_dir && (t.is_none() || o.meta.kind != kind(t).unwrap_or(FileKind::Other)) {
            plan.steps.push(Step::Remove {
                rel: rel_s.clone(),
                recursive: o_is_dir,
            });
            if o_is_dir {
                decided.insert(rel_s.clone());
                dirs.retain(|d| d != rel && !d.starts_with(&format!("{rel}/")));
            }
        }
    }
    let action = match (b, t) {
        (_, None) => "remove",
        (None, Some(_)) => "add",
        (Some(b), Some(t)) if b.meta.kind == t.meta.kind && same_content(b, t) => "mode",
        _ => "modify",
    };
    let Some(t) = t else {
        plan.changes.push(change(
            rel,
            "remove",
            o.map_or(FileKind::Other, |o| o.meta.kind),
            0,
        ));
        return;
    };
    let mode = t.meta.mode;
    let same_kind = o.is_some_and(|o| o.meta.kind == t.meta.kind);
    match t.meta.kind {
        FileKind::Dir => {
            if same_kind {
                plan.steps.push(Step::Chmod { rel: rel_s, mode });
            } else {
                plan.steps.push(Step::Mkdir {
                    rel: rel_s.clone(),
                    mode,
                });
                dirs.insert(rel_s);
            }
            plan.changes.push(change(rel, action, FileKind::Dir, 0));
        }
        FileKind::File => {
            let content_same = o.is_some_and(|o| same_kind && same_content(o, t));
            let size = if content_same { 0 } else { t.meta.size };
            if content_same {
                plan.steps.push(Step::Chmod { rel: rel_s, mode });
            } else {
                plan.steps.push(Step::Write {
                    rel: rel_s,
                    mode,
                    size,
                    sha256: t.sha256.clone().unwrap_or_default(),
                });
            }
            plan.changes.push(change(rel, action, FileKind::File, size));
        }
        FileKind::Symlink => {
            plan.steps.push(Step::Symlink {
                rel: rel_s,
                target: t.meta.symlink_target.clone().unwrap_or_default(),
            });
            plan.changes.push(change(rel, action, FileKind::Symlink, 0));
        }
        FileKind::Other => {}
    }
}

/// Same bytes (files) or same target (symlinks); modes aside.
fn same_content(a: &WalkEntry, b: &WalkEntry) -> bool {
    match a.meta.kind {
        FileKind::File => a.meta.size == b.meta.size && a.sha256 == b.sha256,
        FileKind::Symlink => a.meta.symlink_target == b.meta.symlink_target,
        _ => true,
    }
}

fn change(rel: &str, action: &str, kind: FileKind, size: u64) -> MergeChange {
    MergeChange {
        path: rel.to_string(),
        action: action.into(),
        kind: kind.as_str().into(),
        size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zygote_proto::Metadata;

    fn entry(kind: FileKind, mode: u32, content: &str) -> WalkEntry {
        WalkEntry {
            path: String::new(),
            meta: Metadata {
                kind,
                size: content.len() as u64,
                mode,
                uid: 0,
                gid: 0,
                mtime: 0,
                mtime_nanos: 0,
                symlink_target: (kind == FileKind::Symlink).then(|| content.to_string()),
            },
            sha256: (kind == FileKind::File).then(|| format!("h({content})")),
        }
    }

    /// A tree from `path=content` (file), `path/` (dir), `path->target` (symlink),
    /// `path|` (FIFO); `path:mode` after any of them sets the mode.
    fn tree(spec: &[&str]) -> Tree {
        let mut t = Tree::new();
        t.insert(String::new(), entry(FileKind::Dir, 0, ""));
        for s in spec {
            let (s, mode) = match s.split_once(':') {
                Some((s, m)) => (s, Some(u32::from_str_radix(m, 8).unwrap())),
                None => (*s, None),
            };
            let (path, e) = if let Some(p) = s.strip_suffix('/') {
                (p, entry(FileKind::Dir, mode.unwrap_or(0o755), ""))
            } else if let Some((p, target)) = s.split_once("->") {
                (p, entry(FileKind::Symlink, 0o777, target))
            } else if let Some(p) = s.strip_suffix('|') {
                (p, entry(FileKind::Other, 0o644, ""))
            } else {
                let (p, c) = s.split_once('=').unwrap();
                (p, entry(FileKind::File, mode.unwrap_or(0o644), c))
            };
            t.insert(path.to_string(), e);
        }
        t
    }

    fn conflict_paths(p: &Plan) -> Vec<&str> {
        p.conflicts.iter().map(|c| c.path.as_str()).collect()
    }

    #[test]
    fn takes_theirs_changes_where_ours_did_not_touch() {
        let base = tree(&["a=1", "b=1", "gone=1", "d/", "d/x=1", "m=1"]);
        let ours = tree(&["a=1", "b=ours", "gone=1", "d/", "d/x=1", "m=1", "mine=1"]);
        let theirs = tree(&[
            "a=2", "b=1", "d/", "d/x=1", "d/new=n", "m=1:755", "l->a", "e/",
        ]);
        let p = plan(&base, &ours, &theirs, OnConflict::Fail);
        assert!(p.conflicts.is_empty(), "{:?}", p.conflicts);
        assert_eq!(
            p.steps,
            vec![
                Step::Remove {
                    rel: "gone".into(),
                    recursive: false
                },
                Step::Mkdir {
                    rel: "e".into(),
                    mode: 0o755
                },
                Step::Write {
                    rel: "a".into(),
                    mode: 0o644,
                    size: 1,
                    sha256: "h(2)".into()
                },
                Step::Write {
                    rel: "d/new".into(),
                    mode: 0o644,
                    size: 1,
                    sha256: "h(n)".into()
                },
                Step::Symlink {
                    rel: "l".into(),
                    target: "a".into()
                },
                Step::Chmod {
                    rel: "m".into(),
                    mode: 0o755
                },
            ]
        );
        let actions: Vec<(&str, &str)> = p
            .changes
            .iter()
            .map(|c| (c.path.as_str(), c.action.as_str()))
            .collect();
        assert_eq!(
            actions,
            [
                ("a", "modify"),
                ("d/new", "add"),
                ("e", "add"),
                ("gone", "remove"),
                ("l", "add"),
                ("m", "mode")
            ]
        );
    }

    #[test]
    fn both_sides_changing_a_path_is_a_conflict_unless_identical() {
        let base = tree(&["f=1", "same=1", "del=1"]);
        let ours = tree(&["f=ours", "same=2"]);
        let theirs = tree(&["f=theirs", "same=2", "del=changed"]);
        let p = plan(&base, &ours, &theirs, OnConflict::Fail);
        assert_eq!(conflict_paths(&p), ["del", "f"]);
        assert_eq!(p.conflicts[0].ours, "removed");
        assert_eq!(p.conflicts[0].theirs, "modified");
        assert!(p.conflicts.iter().all(|c| c.resolution.is_none()));
        assert!(p.steps.is_empty(), "nothing applied: {:?}", p.steps);

        let p = plan(&base, &ours, &theirs, OnConflict::Ours);
        assert_eq!(conflict_paths(&p), ["del", "f"]);
        assert!(p.steps.is_empty());
        assert_eq!(p.conflicts[1].resolution.as_deref(), Some("ours"));

        let p = plan(&base, &ours, &theirs, OnConflict::Theirs);
        let written: Vec<&str> = p
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Write { rel, .. } => Some(rel.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(written, ["del", "f"]);
    }

    #[test]
    fn a_removed_directory_with_changes_of_ours_inside_is_one_conflict() {
        let base = tree(&["d/", "d/a=1", "d/b=1", "keep/", "keep/x=1"]);
        let ours = tree(&["d/", "d/a=1", "d/b=1", "d/added=1", "keep/", "keep/x=1"]);
        let theirs = tree(&["keep/"]);
        let p = plan(&base, &ours, &theirs, OnConflict::Fail);
        assert_eq!(conflict_paths(&p), ["d"]);
        assert_eq!(p.conflicts[0].ours, "changed below");

        // Without ours' addition, theirs' removals are taken, the directory as one step.
        let ours = tree(&["d/", "d/a=1", "d/b=1", "keep/", "keep/x=1"]);
        let p = plan(&base, &ours, &theirs, OnConflict::Fail);
        assert!(p.conflicts.is_empty());
        assert_eq!(
            p.steps,
            vec![
                Step::Remove {
                    rel: "keep/x".into(),
                    recursive: false
                },
                Step::Remove {
                    rel: "d".into(),
                    recursive: true
                },
            ]
        );

        // Theirs wins: the whole directory goes.
        let ours = tree(&["d/", "d/a=1", "d/b=1", "d/added=1", "keep/", "keep/x=1"]);
        let p = plan(&base, &ours, &theirs, OnConflict::Theirs);
        assert!(p.steps.contains(&Step::Remove {
            rel: "d".into(),
            recursive: true
        }));
    }

    #[test]
    fn adding_into_a_directory_ours_removed_is_a_conflict_theirs_recreates_it() {
        let base = tree(&["d/:750", "d/a=1"]);
        let ours = tree(&[]);
        let theirs = tree(&["d/:750", "d/a=1", "d/new=n"]);
        let p = plan(&base, &ours, &theirs, OnConflict::Fail);
        assert_eq!(conflict_paths(&p), ["d/new"]);
        assert_eq!(p.conflicts[0].ours, "removed its directory");
        let p = plan(&base, &ours, &theirs, OnConflict::Theirs);
        assert_eq!(
            p.steps[0],
            Step::Mkdir {
                rel: "d".into(),
                mode: 0o750
            }
        );
        assert!(matches!(&p.steps[1], Step::Write { rel, .. } if rel == "d/new"));
    }

    #[test]
    fn kind_changes_replace_and_fifos_are_skipped() {
        let base = tree(&["x=1", "y/", "y/z=1", "link->a"]);
        let ours = base.clone();
        let theirs = tree(&["x/", "x/in=1", "y=file", "link->b", "pipe|"]);
        let p = plan(&base, &ours, &theirs, OnConflict::Fail);
        assert!(p.conflicts.is_empty(), "{:?}", p.conflicts);
        assert_eq!(p.skipped, ["pipe"]);
        assert_eq!(
            p.steps,
            vec![
                Step::Remove {
                    rel: "x".into(),
                    recursive: false
                },
                Step::Remove {
                    rel: "y".into(),
                    recursive: true
                },
                Step::Mkdir {
                    rel: "x".into(),
                    mode: 0o755
                },
                Step::Symlink {
                    rel: "link".into(),
                    target: "b".into()
                },
                Step::Write {
                    rel: "x/in".into(),
                    mode: 0o644,
                    size: 1,
                    sha256: "h(1)".into()
                },
                Step::Write {
                    rel: "y".into(),
                    mode: 0o644,
                    size: 4,
                    sha256: "h(file)".into()
                },
            ]
        );
    }

    #[test]
    fn ancestors_walk_up_to_the_merged_directory() {
        assert_eq!(ancestors("a/b/c").collect::<Vec<_>>(), ["a/b", "a", ""]);
        assert_eq!(ancestors("a").collect::<Vec<_>>(), [""]);
        assert_eq!(ancestors("").count(), 0);
    }
}
