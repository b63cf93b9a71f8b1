//! Branch trees: the lineage of a sandbox, and keeping one branch.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::SnapshotKind;

/// One sandbox of a tree.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TreeNode {
    pub id: String,
    pub name: Option<String>,
    pub state: String,
    /// The sandbox it was branched from, or whose snapshot it was started from (null:
    /// a root, or its parent is gone).
    pub parent: Option<String>,
    /// The branch point (a branch child) or snapshot (a restore) it started from.
    pub started_from: Option<String>,
    /// Its children, oldest first (same second: by id).
    pub children: Vec<String>,
    /// Memory of its VM process not shared with any other process (what deleting it
    /// gives back to the host); null when it has no running VM.
    pub unique_memory_bytes: Option<u64>,
    /// Bytes on disk of its own writable disk layer (null: the runtime keeps the disk
    /// in the VM's memory, or the sandbox has none).
    pub disk_bytes: Option<u64>,
}

/// A snapshot or branch point taken of a sandbox of the tree.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TreeSnapshot {
    pub id: String,
    pub kind: SnapshotKind,
    pub source_sandbox: String,
    pub size_bytes: u64,
}

/// `GET /v1/sandboxes/{id}/tree`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxTree {
    /// The topmost ancestor that still exists.
    pub root: String,
    /// Every sandbox of the tree, parents before their children.
    pub sandboxes: Vec<TreeNode>,
    pub snapshots: Vec<TreeSnapshot>,
}

/// `POST /v1/sandboxes/{id}/keep`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KeepRequest {
    /// Also replace the parent by this sandbox: the parent is deleted and this one
    /// takes its name.
    #[serde(default)]
    pub promote: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KeepResponse {
    pub kept: String,
    /// Siblings and their descendants (and, with `promote`, the parent), deleted.
    pub deleted: Vec<String>,
    /// The name it took from its parent (`promote`).
    pub name: Option<String>,
}
