//! Comparing two sandboxes' file trees.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::validate::validate_guest_path;
use crate::error::{RequestError, Result};

/// The query of `GET /v1/sandboxes/{id}/diff`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DiffQuery {
    /// The sandbox to compare with (a sibling, the parent, any sandbox).
    pub against: String,
    /// Directory compared in both guests (default `/root`).
    #[serde(default)]
    pub path: Option<String>,
    /// Also give a unified text diff of each modified text file (up to 256 KiB each).
    #[serde(default)]
    pub content: Option<bool>,
}

impl DiffQuery {
    pub fn dir(&self) -> Result<String> {
        let path = self.path.clone().unwrap_or_else(|| "/root".into());
        validate_guest_path(&path)?;
        if path.split('/').any(|c| c == "..") {
            return Err(RequestError::invalid(format!(
                "path {path:?} must not contain `..`"
            )));
        }
        Ok(path)
    }
}

/// One entry that is only on one side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DiffEntry {
    /// Relative to the compared directory.
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    pub size: u64,
    pub mode: u32,
}

/// An entry on both sides that differs (content, type, mode or link target).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DiffChange {
    pub path: String,
    /// Its kind in `against` and in this sandbox.
    pub kind_before: String,
    pub kind: String,
    pub size_before: u64,
    pub size: u64,
    pub mode_before: u32,
    pub mode: u32,
    /// `content=true`, both sides text files of at most 256 KiB: the unified diff from
    /// `against` to this sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unified: Option<String>,
}

/// `GET /v1/sandboxes/{id}/diff`: how this sandbox's tree differs from `against`'s.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxDiff {
    pub sandbox: String,
    pub against: String,
    pub path: String,
    /// Only in this sandbox.
    pub added: Vec<DiffEntry>,
    /// Only in `against`.
    pub removed: Vec<DiffEntry>,
    pub modified: Vec<DiffChange>,
    /// Entries compared on each side.
    pub entries: usize,
    pub against_entries: usize,
}
