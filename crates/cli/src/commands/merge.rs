//! `zygote merge ID FROM [PATH...]`: bring FROM's file changes since the two sandboxes'
//! common branch point into ID (three-way; a path both changed is a conflict).
use zygote_api::client::{block_on, Method};
use zygote_api::model::{MergeReport, MergeRequest, OnConflict};

use super::daemon_client::{print_json, spinner, ApiArgs};

#[derive(clap::Args)]
pub struct MergeArgs {
    /// The sandbox merged into.
    id: String,
    /// The sandbox whose changes are brought in (a child, a sibling, ...).
    from: String,
    /// Directories merged (default: /root).
    paths: Vec<String>,
    /// What to do with a path both sides changed.
    #[arg(long, value_enum, default_value = "fail")]
    on_conflict: ConflictArg,
    /// Show what would change; change nothing.
    #[arg(long, short = 'n')]
    dry_run: bool,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ConflictArg {
    /// Change nothing and list the conflicts.
    Fail,
    /// Take FROM's version.
    Theirs,
    /// Keep ID's version.
    Ours,
}

impl From<ConflictArg> for OnConflict {
    fn from(c: ConflictArg) -> Self {
        match c {
            ConflictArg::Fail => OnConflict::Fail,
            ConflictArg::Theirs => OnConflict::Theirs,
            ConflictArg::Ours => OnConflict::Ours,
        }
    }
}

pub fn run(args: MergeArgs) -> anyhow::Result<i32> {
    let body = MergeRequest {
        from: args.from.clone(),
        paths: (!args.paths.is_empty()).then(|| args.paths.clone()),
        on_conflict: Some(OnConflict::from(args.on_conflict)),
        dry_run: Some(args.dry_run),
    };
    let pb = (!args.json).then(|| spinner(&format!("merging {} into {}", args.from, args.id)));
    let res: Result<MergeReport, _> = block_on(args.api.client()?.json(
        Method::POST,
        &format!("/v1/sandboxes/{}/merge", args.id),
        Some(&body),
    ));
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let r = res?;
    if args.json {
        print_json(&r)?;
    } else {
        print!("{}", render(&r));
    }
    // Like git merge: 1 when conflicts stopped it.
    Ok(if !r.applied && !args.dry_run { 1 } else { 0 })
}

/// One line per change (`A`dded, `M`odified, `D`eleted, mode `m`), then conflicts
/// (`C`), then the outcome.
fn render(r: &MergeReport) -> String {
    let mut out = String::new();
    for c in &r.changes {
        let tag = match c.action.as_str() {
            "add" => "A",
            "remove" => "D",
            "mode" => "m",
            _ => "M",
        };
        out.push_str(&format!("{tag} {}\n", c.path));
    }
    for c in &r.conflicts {
        let resolved = c
            .resolution
            .as_deref()
            .map(|w| format!(", kept {w}"))
            .unwrap_or_default();
        out.push_str(&format!(
            "C {} (here: {}, in {}: {}{resolved})\n",
            c.path, c.ours, r.from, c.theirs
        ));
    }
    for s in &r.skipped {
        out.push_str(&format!("skipped {s} (not a file, directory or symlink)\n"));
    }
    let outcome = if r.applied {
        format!(
            "merged {} change(s) from {} ({} bytes) in {} ms",
            r.changes.len(),
            r.from,
            r.bytes_copied,
            r.duration_ms
        )
    } else if r.conflicts.iter().any(|c| c.resolution.is_none()) {
        format!(
            "{} conflict(s): nothing merged (use --on-conflict theirs|ours)",
            r.conflicts.len()
        )
    } else {
        format!("would merge {} change(s) (dry run)", r.changes.len())
    };
    out.push_str(&format!("{outcome}; common state {}\n", r.base));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use zygote_api::model::{MergeChange, MergeConflict};

    fn report(applied: bool, resolution: Option<&str>) -> MergeReport {
        MergeReport {
            sandbox: "a".into(),
            from: "b".into(),
            base: "snap-1".into(),
            paths: vec!["/root".into()],
            applied,
            changes: vec![
                MergeChange {
                    path: "/root/x".into(),
                    action: "add".into(),
                    kind: "file".into(),
                    size: 3,
                },
                MergeChange {
                    path: "/root/y".into(),
                    action: "remove".into(),
                    kind: "file".into(),
                    size: 0,
                },
            ],
            conflicts: vec![MergeConflict {
                path: "/root/z".into(),
                ours: "modified".into(),
                theirs: "removed".into(),
                resolution: resolution.map(Into::into),
            }],
            skipped: vec![],
            bytes_copied: 3,
            duration_ms: 12,
        }
    }

    #[test]
    fn renders_changes_conflicts_and_the_outcome() {
        let text = render(&report(false, None));
        assert_eq!(
            text.lines().collect::<Vec<_>>(),
            [
                "A /root/x",
                "D /root/y",
                "C /root/z (here: modified, in b: removed)",
                "1 conflict(s): nothing merged (use --on-conflict theirs|ours); common state snap-1"
            ]
        );
        let text = render(&report(true, Some("theirs")));
        assert!(text.contains("C /root/z (here: modified, in b: removed, kept theirs)"));
        assert!(
            text.ends_with("merged 2 change(s) from b (3 bytes) in 12 ms; common state snap-1\n")
        );
    }
}
