//! Snapshots (`/v1/snapshots`): taking one of a sandbox, what one is, and rolling a
//! sandbox back to one.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{validate_name, PackOrigin, Validate};
use crate::error::{RequestError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    /// All guest memory and device state (the VM pauses while it is written).
    Full,
    /// Only memory dirtied since the parent snapshot, layered on it.
    Diff,
    /// Taken without stopping the guest for the copy (copy-on-write).
    Live,
    /// Created by a branch: what the children and the parent share.
    Branch,
}

impl SnapshotKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Full => "full",
            SnapshotKind::Diff => "diff",
            SnapshotKind::Live => "live",
            SnapshotKind::Branch => "branch",
        }
    }

    pub fn parse(s: &str) -> Option<SnapshotKind> {
        [Self::Full, Self::Diff, Self::Live, Self::Branch]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// Which sandbox to snapshot.
    #[schema(min_length = 1)]
    pub sandbox: String,
    /// `full` (default), `diff` or `live`, as the runtime supports (see `GET /v1/info`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<SnapshotKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]
    pub name: Option<String>,
}

impl Validate for SnapshotRequest {
    fn validate(&self) -> Result<()> {
        if self.sandbox.is_empty() {
            return Err(RequestError::invalid("sandbox must name a sandbox"));
        }
        if self.kind == Some(SnapshotKind::Branch) {
            return Err(RequestError::invalid(
                "branch snapshots are made by POST .../branch",
            ));
        }
        if let Some(name) = &self.name {
            validate_name("name", name)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Snapshot {
    pub id: String,
    pub name: Option<String>,
    pub kind: SnapshotKind,
    pub runtime: String,
    /// The sandbox it was taken of.
    pub source_sandbox: String,
    /// Snapshots whose layers this one builds on (oldest first).
    pub depends_on: Vec<String>,
    /// Sandboxes and snapshots that need this one (deleting it is refused while any do).
    pub dependents: Vec<String>,
    pub mem_mib: u32,
    pub vcpus: u32,
    pub created_at: u64,
    /// Bytes of its own files (memory state and disk layer).
    pub size_bytes: u64,
    /// Made implicitly (by a branch); removed automatically once nothing depends on it.
    pub implicit: bool,
    /// How long taking it stopped the sandbox's vCPUs (null if not measured).
    pub pause_ms: Option<f64>,
    /// For a snapshot imported from a pack: where it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<PackOrigin>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// Snapshot to roll the sandbox back (or forward) to.
    #[schema(min_length = 1)]
    pub snapshot: String,
}
