//! Sandbox time-to-live: the bound on `ttl_secs` and the body of
//! `PUT /v1/sandboxes/{id}/ttl`.
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

use super::{in_range, Validate};
use crate::error::Result;

/// A week: long enough for any agent run, short enough that a forgotten
/// sandbox does not live on indefinitely by accident.
pub const MAX_TTL_SECS: u64 = 7 * 24 * 3600;

pub(crate) fn validate_ttl(ttl_secs: Option<u64>) -> Result<()> {
    match ttl_secs {
        Some(t) => in_range("ttl_secs", t, 1, MAX_TTL_SECS),
        None => Ok(()),
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetTtlRequest {
    /// New time-to-live counted from now (1..=604800), or null to keep the
    /// sandbox until it is deleted. Required, so `{}` cannot clear a TTL by
    /// accident.
    #[serde(deserialize_with = "present_or_null")]
    #[schema(required = true, minimum = 1, maximum = 604800)]
    pub ttl_secs: Option<u64>,
    /// What the TTL running out does: `delete` or `pause`; absent: unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_action: Option<TtlAction>,
}

/// What happens to a sandbox when its TTL runs out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TtlAction {
    /// Deleted, with everything it owns.
    #[default]
    Delete,
    /// Paused to disk (it keeps its id, files and processes; resume brings it back
    /// with a fresh TTL).
    Pause,
}

impl TtlAction {
    pub fn as_str(self) -> &'static str {
        match self {
            TtlAction::Delete => "delete",
            TtlAction::Pause => "pause",
        }
    }
}

/// With `deserialize_with`, serde no longer treats a missing `Option` field
/// as `None`: the field must be given, though it may be null.
fn present_or_null<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<u64>, D::Error> {
    Option::<u64>::deserialize(d)
}

impl Validate for SetTtlRequest {
    fn validate(&self) -> Result<()> {
        validate_ttl(self.ttl_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{BranchRequest, CreateSandboxRequest};

    #[test]
    fn ttl_bounds_apply_to_create_branch_and_set() {
        for (ttl, ok) in [
            (None, true),
            (Some(0), false),
            (Some(1), true),
            (Some(MAX_TTL_SECS), true),
            (Some(MAX_TTL_SECS + 1), false),
        ] {
            let create = CreateSandboxRequest {
                image: Some("minimal".into()),
                ttl_secs: ttl,
                ..Default::default()
            };
            let branch = BranchRequest {
                ttl_secs: ttl,
                ..Default::default()
            };
            let set = SetTtlRequest {
                ttl_secs: ttl,
                ttl_action: None,
            };
            assert_eq!(create.validate().is_ok(), ok, "create {ttl:?}");
            assert_eq!(branch.validate().is_ok(), ok, "branch {ttl:?}");
            assert_eq!(set.validate().is_ok(), ok, "set {ttl:?}");
        }
    }

    #[test]
    fn set_ttl_needs_the_field_but_accepts_null() {
        let null: SetTtlRequest = serde_json::from_str(r#"{"ttl_secs": null}"#).unwrap();
        assert_eq!(null.ttl_secs, None);
        let n: SetTtlRequest = serde_json::from_str(r#"{"ttl_secs": 30}"#).unwrap();
        assert_eq!(n.ttl_secs, Some(30));
        assert!(serde_json::from_str::<SetTtlRequest>("{}").is_err());
        assert!(serde_json::from_str::<SetTtlRequest>(r#"{"ttl_secs": -1}"#).is_err());
    }
}
