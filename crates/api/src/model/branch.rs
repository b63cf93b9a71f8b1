//! Branching a sandbox into copy-on-write children.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{in_range, ttl, validate_vars, Validate, MAX_BRANCH_COUNT};
use crate::error::{RequestError, Result};

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchRequest {
    /// Number of children, 1..=256. On a runtime whose children each copy the parent's
    /// memory (qemu), at most as many as the host's available memory holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 256)]
    pub count: Option<u32>,
    /// Children's time-to-live (1..=604800); when absent they get the parent's `ttl_secs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 604800)]
    pub ttl_secs: Option<u64>,
    /// One object of environment variables per child (exactly `count` of them), added
    /// over the parent's `envs` for that child's execs: tokens, seeds, task ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<BTreeMap<String, String>>>,
    /// Keep the branch point's state so that the children can later be merged with
    /// their parent or each other (`POST .../merge`). The qemu runtime always keeps it;
    /// on the kvm runtime it costs a full memory file of the parent, written after the
    /// children run (the pause does not grow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mergeable: Option<bool>,
    /// Labels set on every child over those it inherits from its parent (same rules as
    /// create's `metadata`): e.g. the id of whatever asked for the branch, so that it can
    /// find its children again with `GET /v1/sandboxes?metadata=k=v`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Answer `200` at once with an NDJSON stream of [`BranchEvent`] lines (the branch
    /// point, then each child as it comes up or fails, then the summary) instead of
    /// `201` with the [`BranchResponse`] once every child is done. A client that goes
    /// away does not stop the branch: its children come up (or go) all the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
}

impl Validate for BranchRequest {
    fn validate(&self) -> Result<()> {
        ttl::validate_ttl(self.ttl_secs)?;
        let count = self.count.unwrap_or(1);
        in_range("count", count, 1, MAX_BRANCH_COUNT)?;
        if let Some(env) = &self.env {
            if env.len() != count as usize {
                return Err(RequestError::invalid(format!(
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
    /// How long each step took, so that a regression shows in its own column (`zygote
    /// bench linux`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases: Option<BranchPhases>,
}

/// The steps of a branch (ms). Each child's `vm_ms` and `agent_ms` run concurrently
/// with its siblings'.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BranchPhases {
    /// The request checked and the intent recorded (the parent, every child `creating`).
    pub record_ms: f64,
    /// Every child's network namespace, tap and rules made (0 without isolation).
    pub network_ms: f64,
    /// From then until the branch point was taken and recorded (the parent runs again).
    pub point_ms: f64,
    /// The children that run, by index.
    pub children: Vec<ChildPhases>,
}

/// One branch child's steps (ms).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChildPhases {
    pub index: u32,
    /// From the runtime's start of the branch to the child's VM running (kvm: the
    /// parent's pause, its fork, the child's VM build). Absent when the runtime does
    /// not tell it apart (qemu).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_ms: Option<f64>,
    /// The part of `vm_ms` the child spent building its VM over the inherited memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_build_ms: Option<f64>,
    /// Part of `vm_ms` (kvm, a child made from a warm spawner only): catching the
    /// spawner up with the parent's memory before the pause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_catch_up_ms: Option<f64>,
    /// Part of `vm_ms` (warm spawner only): sending it the state and the devices'
    /// private data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_state_ms: Option<f64>,
    /// From its VM running to its agent answering, reidentified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_ms: Option<f64>,
    /// Part of `agent_ms` (kvm): until the guest's agent took a connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_connect_ms: Option<f64>,
    /// Part of `agent_ms` (kvm): hello and reidentify, answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reidentify_ms: Option<f64>,
    /// What reidentify spent inside the guest, by part (agents that report it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reidentify_parts: Option<ReidentifyParts>,
    /// From the request to the child recorded `running`.
    pub recorded_ms: f64,
}

/// The parts of a child's reidentify inside the guest, in milliseconds (0: not asked).
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize, ToSchema)]
pub struct ReidentifyParts {
    /// Mixing in fresh entropy, reseeding the kernel's CRNG.
    pub entropy_ms: f64,
    /// Hostname, /etc/hostname, /etc/hosts.
    pub hostname_ms: f64,
    pub clock_ms: f64,
    /// The network interface's MAC, address and route.
    pub net_ms: f64,
    /// machine-id, the generation counter, the `forked.d` hooks.
    pub identity_ms: f64,
}

/// One line of the NDJSON stream of `POST /v1/sandboxes/{id}/branch` with `"stream":
/// true`. `ms` is the time since the daemon took the request.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BranchEvent {
    /// The branch point is taken and recorded; the parent runs on. `children` are the
    /// ids of every requested child, in order: listed as `creating` until each runs.
    Point {
        parent: String,
        branch_point: String,
        /// How long the parent's vCPUs were stopped.
        pause_ms: Option<f64>,
        children: Vec<String>,
        ms: u64,
    },
    /// A child runs and answers through its agent (it is `running` from now on).
    Child { index: u32, id: String, ms: u64 },
    /// A child did not come up; nothing of it is left.
    ChildFailed {
        index: u32,
        id: String,
        error: String,
        ms: u64,
    },
    /// The last line when at least one child runs: what the non-streaming request
    /// answers.
    Done(BranchResponse),
    /// The last line when the branch failed (no point taken, or no child came up).
    Error { code: String, message: String },
}

/// One child of a branch that did not come up, and why.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BranchFailure {
    /// Its position among the requested children (0-based).
    pub index: u32,
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_tagged_lines_and_done_is_the_plain_response() {
        let done = BranchEvent::Done(BranchResponse {
            parent: "sb-1".into(),
            branch_point: "snap-1".into(),
            children: vec!["sb-2".into()],
            failed: Vec::new(),
            duration_ms: 7,
            pause_ms: Some(1.5),
            phases: None,
        });
        let v = serde_json::to_value(&done).unwrap();
        assert_eq!(v["type"], "done");
        assert_eq!(v["children"], serde_json::json!(["sb-2"]));
        // A client reading the summary as a BranchResponse ignores the tag.
        let r: BranchResponse = serde_json::from_value(v).unwrap();
        assert_eq!(r.duration_ms, 7);
        let failed = BranchEvent::ChildFailed {
            index: 3,
            id: "sb-9".into(),
            error: "boom".into(),
            ms: 12,
        };
        let v = serde_json::to_value(&failed).unwrap();
        assert_eq!(v["type"], "child_failed");
        assert_eq!(v["index"], 3);
    }

    #[test]
    fn stream_is_optional_and_known() {
        let r: BranchRequest = serde_json::from_str(r#"{"count": 2, "stream": true}"#).unwrap();
        assert_eq!(r.stream, Some(true));
        assert!(r.validate().is_ok());
        assert!(serde_json::from_str::<BranchRequest>(r#"{"streaming": true}"#).is_err());
    }
}
