//! Bringing one sandbox's file changes into another of the same tree.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::validate::validate_guest_path;
use super::Validate;
use crate::error::{RequestError, Result};

/// Most directories one merge takes.
pub const MAX_MERGE_PATHS: usize = 16;

/// What to do with a path both sides changed since their common branch point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnConflict {
    /// Apply nothing at all and list the conflicts.
    #[default]
    Fail,
    /// Take `from`'s version.
    Theirs,
    /// Keep this sandbox's version.
    Ours,
}

impl OnConflict {
    pub fn as_str(self) -> &'static str {
        match self {
            OnConflict::Fail => "fail",
            OnConflict::Theirs => "theirs",
            OnConflict::Ours => "ours",
        }
    }
}

/// `POST /v1/sandboxes/{id}/merge`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeRequest {
    /// The sandbox whose changes since the common branch point are applied here (a
    /// child, a sibling, any sandbox of the same tree).
    pub from: String,
    /// Directories merged (default `["/root"]`), absolute, none inside another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 16)]
    pub paths: Option<Vec<String>>,
    /// `fail` (default), `theirs` or `ours`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_conflict: Option<OnConflict>,
    /// Work out and report the merge, change nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
}

impl MergeRequest {
    /// The merged directories, checked and without trailing slashes.
    pub fn dirs(&self) -> Result<Vec<String>> {
        let paths = self.paths.clone().unwrap_or_else(|| vec!["/root".into()]);
        if paths.is_empty() || paths.len() > MAX_MERGE_PATHS {
            return Err(RequestError::invalid(format!(
                "paths must name 1..={MAX_MERGE_PATHS} directories, got {}",
                paths.len()
            )));
        }
        let mut dirs = Vec::new();
        for p in &paths {
            validate_guest_path(p)?;
            if p.split('/').any(|c| c == ".." || c == ".") {
                return Err(RequestError::invalid(format!(
                    "path {p:?} must not contain `.` or `..` components"
                )));
            }
            let d = p.trim_end_matches('/');
            if d.is_empty() {
                return Err(RequestError::invalid(
                    "merging / is refused: name directories below it",
                ));
            }
            dirs.push(d.to_string());
        }
        for a in &dirs {
            for b in &dirs {
                if a != b && b.starts_with(&format!("{a}/")) {
                    return Err(RequestError::invalid(format!("path {b:?} is inside {a:?}")));
                }
            }
        }
        dirs.sort();
        dirs.dedup();
        Ok(dirs)
    }
}

impl Validate for MergeRequest {
    fn validate(&self) -> Result<()> {
        if self.from.is_empty() {
            return Err(RequestError::invalid("from must name a sandbox"));
        }
        self.dirs().map(|_| ())
    }
}

/// One change a merge makes (or would make) here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MergeChange {
    /// Absolute path in the guest.
    pub path: String,
    /// `add`, `modify`, `remove` or `mode`.
    pub action: String,
    /// The kind it has afterwards (`file`, `dir`, `symlink`); for `remove`, the kind removed.
    pub kind: String,
    /// Bytes copied for it (files).
    pub size: u64,
}

/// A path both sides changed differently since the branch point.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MergeConflict {
    pub path: String,
    /// What this sandbox did to it: `added`, `modified`, `removed`, or `changed below`
    /// (a directory `from` removed or replaced has changes of ours inside).
    pub ours: String,
    /// What `from` did to it.
    pub theirs: String,
    /// `theirs` or `ours` when `on_conflict` resolved it; absent when it stopped the merge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<String>,
}

/// `POST /v1/sandboxes/{id}/merge`: what was merged, or why nothing was.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MergeReport {
    pub sandbox: String,
    pub from: String,
    /// The snapshot (branch point) holding the common state both descend from.
    pub base: String,
    pub paths: Vec<String>,
    /// Whether the changes were made: false with `dry_run`, or when a conflict stopped
    /// the merge (`on_conflict: fail`), in which case nothing was changed.
    pub applied: bool,
    pub changes: Vec<MergeChange>,
    pub conflicts: Vec<MergeConflict>,
    /// Entries of `from` that cannot be merged (FIFOs, sockets, devices), left alone.
    pub skipped: Vec<String>,
    pub bytes_copied: u64,
    pub duration_ms: u64,
}
