//! `diff`: what differs between two sandboxes' trees under a directory. Both agents
//! walk the directory and hash every regular file; entries are matched by path.
use std::collections::BTreeMap;
use std::sync::Arc;

use zygote_proto::{FileKind, WalkEntry};

use super::Manager;
use crate::error::{Error, Result};
use crate::model::{DiffChange, DiffEntry, DiffQuery, SandboxDiff};

/// Largest file whose text is compared line by line (`content=true`).
const MAX_TEXT_DIFF: u64 = 256 * 1024;

fn entry(e: &WalkEntry) -> DiffEntry {
    DiffEntry {
        path: e.path.clone(),
        kind: e.meta.kind.as_str().into(),
        size: e.meta.size,
        mode: e.meta.mode,
    }
}

/// Same entry on both sides? Directories compare by type and mode (their contents
/// are entries of their own); mtimes are ignored: a copy of a file is not a change.
pub(super) fn same(a: &WalkEntry, b: &WalkEntry) -> bool {
    a.meta.kind == b.meta.kind
        && a.meta.mode == b.meta.mode
        && a.meta.symlink_target == b.meta.symlink_target
        && (a.meta.kind != FileKind::File || (a.meta.size == b.meta.size && a.sha256 == b.sha256))
}

impl Manager {
    pub async fn diff(self: &Arc<Self>, id: &str, q: DiffQuery) -> Result<SandboxDiff> {
        let dir = q.dir()?;
        if q.against == id {
            return Err(Error::invalid("against names the sandbox itself"));
        }
        // Both must exist (and run) before either guest is asked to hash anything.
        self.running_vm(&self.sandbox_row(id)?)?;
        self.running_vm(&self.sandbox_row(&q.against)?)?;
        let walk = |sid: String| {
            let d = dir.clone();
            async move { self.agent_call(&sid, move |c| c.walk(&d, true)).await }
        };
        let (mine, theirs) = tokio::try_join!(walk(id.to_string()), walk(q.against.clone()))?;
        let before: BTreeMap<&str, &WalkEntry> =
            theirs.iter().map(|e| (e.path.as_str(), e)).collect();
        let after: BTreeMap<&str, &WalkEntry> = mine.iter().map(|e| (e.path.as_str(), e)).collect();
        let added = mine
            .iter()
            .filter(|e| !before.contains_key(e.path.as_str()))
            .map(entry)
            .collect();
        let removed = theirs
            .iter()
            .filter(|e| !after.contains_key(e.path.as_str()))
            .map(entry)
            .collect();
        let mut modified = Vec::new();
        for e in &mine {
            let Some(b) = before.get(e.path.as_str()) else {
                continue;
            };
            if same(b, e) {
                continue;
            }
            let text_files = e.meta.kind == FileKind::File
                && b.meta.kind == FileKind::File
                && e.meta.size <= MAX_TEXT_DIFF
                && b.meta.size <= MAX_TEXT_DIFF;
            let unified = if q.content.unwrap_or(false) && text_files {
                self.unified(id, &q.against, &dir, &e.path).await?
            } else {
                None
            };
            modified.push(DiffChange {
                path: e.path.clone(),
                kind_before: b.meta.kind.as_str().into(),
                kind: e.meta.kind.as_str().into(),
                size_before: b.meta.size,
                size: e.meta.size,
                mode_before: b.meta.mode,
                mode: e.meta.mode,
                unified,
            });
        }
        Ok(SandboxDiff {
            sandbox: id.to_string(),
            against: q.against.clone(),
            path: dir,
            added,
            removed,
            modified,
            entries: mine.len(),
            against_entries: theirs.len(),
        })
    }

    /// The unified diff of one file from `against` to `id`; None if either side is not
    /// UTF-8 text.
    async fn unified(
        self: &Arc<Self>,
        id: &str,
        against: &str,
        dir: &str,
        rel: &str,
    ) -> Result<Option<String>> {
        let path = format!("{}/{rel}", dir.trim_end_matches('/'));
        let read = |sid: String| {
            let p = path.clone();
            async move {
                self.agent_call(&sid, move |c| c.read_file_up_to(&p, MAX_TEXT_DIFF))
                    .await
            }
        };
        let (new, old) = tokio::try_join!(read(id.to_string()), read(against.to_string()))?;
        // Grown past the limit since the walk: no text diff.
        let (Some(old), Some(new)) = (old, new) else {
            return Ok(None);
        };
        let (Ok(old), Ok(new)) = (String::from_utf8(old), String::from_utf8(new)) else {
            return Ok(None);
        };
        let diff = similar::TextDiff::from_lines(&old, &new);
        let text = diff
            .unified_diff()
            .context_radius(3)
            .header(&format!("{against}:{path}"), &format!("{id}:{path}"))
            .to_string();
        Ok(Some(text))
    }
}
