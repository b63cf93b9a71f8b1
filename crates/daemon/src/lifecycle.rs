//! What the daemon stores about pausing a sandbox to disk (its [`Lifecycle`], one JSON
//! column of its row), never sent as is: `crate::manager::pause` applies it.
//!
//! A paused sandbox has no VM process: its memory and device state are a saved state
//! file ([`Park`]), its disk layer stays where it was. Its TTL does not run while it is
//! paused: the time left is set aside at pause and a new deadline is set at resume
//! (the rules: `crate::manager::ttl`).
use serde::{Deserialize, Serialize};

use crate::model::TtlAction;
use crate::runtime::SnapshotData;

/// A sandbox's pause settings and, while it is paused (or being paused or resumed),
/// where its saved state is. Stored as one JSON column; rows from before pause/resume
/// read back as the defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Lifecycle {
    /// Exec and file calls on the paused sandbox resume it first.
    #[serde(default)]
    pub auto_resume: bool,
    #[serde(default)]
    pub ttl_action: TtlAction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park: Option<Park>,
    /// The implicit snapshot a resumed VM still reads its memory from (a runtime whose
    /// resume maps the saved state: [`crate::runtime::Runtime::resumed_needs_park`]).
    /// The sandbox depends on it until it is paused again; snapshots taken meanwhile
    /// (a diff names it as its parent) keep it for as long as they exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<String>,
}

/// A sandbox's saved memory and device state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Park {
    /// Where the runtime writes (or wrote) the state; its `state_file` exists only once
    /// the state is complete and synced, which is how start-up tells a finished pause
    /// from an interrupted one.
    pub data: SnapshotData,
    /// The VM's disk layer when it was paused: the resumed VM's (unused by the kvm
    /// runtime, whose disk is in the saved state).
    pub disk: std::path::PathBuf,
    /// Unix seconds at which the VM stopped.
    pub paused_at: u64,
    /// Seconds of TTL the sandbox had left when paused (None: no deadline ran).
    pub ttl_left_secs: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_rows_read_as_defaults_and_actions_parse() {
        let l: Lifecycle = serde_json::from_str("{}").unwrap();
        assert_eq!(l, Lifecycle::default());
        assert_eq!(l.ttl_action, TtlAction::Delete);
        let a: TtlAction = serde_json::from_str("\"pause\"").unwrap();
        assert_eq!(a, TtlAction::Pause);
        assert!(serde_json::from_str::<TtlAction>("\"stop\"").is_err());
    }
}
