//! Branching a sandbox into copy-on-write children.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{in_range, ttl, validate_vars, Validate, MAX_BRANCH_COUNT};
use crate::error::{Error, Result};

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchRequest {
    /// Number of children, 1..=256. On a runtime whose children each copy the parent's
    /// memory (qemu), at most as many as the host's available memory holds.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 256)]
    pub count: Option<u32>,
    /// Children's time-to-live (1..=604800); when absent they get the parent's `ttl_secs`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 604800)]
    pub ttl_secs: Option<u64>,
    /// One object of environment variables per child (exactly `count` of them), added
    /// over the parent's `envs` for that child's execs: tokens, seeds, task ids.
    #[serde(default)]
    pub env: Option<Vec<BTreeMap<String, String>>>,
    /// Keep the branch point's state so that the children can later be merged with
    /// their parent or each other (`POST .../merge`). The qemu runtime always keeps it;
    /// on the kvm runtime it costs a full memory file of the parent, written after the
    /// children run (the pause does not grow).
    #[serde(default)]
    pub mergeable: Option<bool>,
    /// Labels set on every child over those it inherits from its parent (same rules as
    /// create's `metadata`): e.g. the id of whatever asked for the branch, so that it can
    /// find its children again with `GET /v1/sandboxes?metadata=k=v`.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

impl Validate for BranchRequest {
    fn validate(&self) -> Result<()> {
        ttl::validate_ttl(self.ttl_secs)?;
        let count = self.count.unwrap_or(1);
        in_range("count", count, 1, MAX_BRANCH_COUNT)?;
        if let Some(env) = &self.env {
            if env.len() != count as usize {
                return Err(Error::invalid(format!(
                    "env has {} entries for {count} children: give one object per child",
                    env.len()
                )));
            }
            for (i, vars) in env.iter().enumerate() {
                validate_vars(&format!("env[{i}]"), vars)?;
            }
        }
        if let Some(m) = &self.metadata {
            super::metadata::validate_metadata(m)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BranchResponse {
    pub parent: String,
    /// The snapshot the children (and the parent's new disk layer) share.
    pub branch_point: String,
    /// The children that run, each answering through its agent.
    pub children: Vec<String>,
    /// The requested children that could not be brought up (nothing of theirs is
    /// left). The request succeeds when at least one child runs; it fails with the
    /// causes when none does.
    #[serde(default)]
    pub failed: Vec<BranchFailure>,
    pub duration_ms: u64,
    /// How long the parent's vCPUs were stopped for the branch.
    pub pause_ms: Option<f64>,
}

/// One child of a branch that did not come up, and why.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BranchFailure {
    /// Its position among the requested children (0-based).
    pub index: u32,
    pub error: String,
}
