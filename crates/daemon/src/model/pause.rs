//! Pausing a sandbox to disk and resuming it: what a sandbox stores about it (its
//! [`Lifecycle`]), and the pure rules the manager applies (`crate::manager::pause`).
//!
//! A paused sandbox has no VM process: its memory and device state are a saved state
//! file ([`Park`]), its disk layer stays where it was. Its TTL does not run while it is
//! paused: the time left is set aside at pause and a new deadline is set at resume.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::runtime::SnapshotData;

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

/// The TTL seconds left at `now` of a sandbox whose deadline is `expires_at`: what a
/// pause sets aside (0 once due: it was paused by its TTL).
pub fn ttl_left(expires_at: Option<u64>, now: u64) -> Option<u64> {
    expires_at.map(|deadline| deadline.saturating_sub(now))
}

/// The TTL seconds a paused sandbox gets when resumed: the time it had left when
/// paused, or a whole `ttl_secs` if none was left (its TTL paused it) or its TTL was
/// set while paused.
pub fn ttl_on_resume(ttl_secs: Option<u64>, left: Option<u64>) -> Option<u64> {
    let ttl = ttl_secs?;
    match left {
        Some(l) if l > 0 => Some(l.min(ttl)),
        _ => Some(ttl),
    }
}

/// The deadline a sandbox resumed at `now` gets ([`ttl_on_resume`] from now).
pub fn deadline_on_resume(ttl_secs: Option<u64>, left: Option<u64>, now: u64) -> Option<u64> {
    ttl_on_resume(ttl_secs, left).map(|t| now + t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paused_time_does_not_count_against_the_ttl() {
        // 100 s TTL, paused 30 s after start (70 s left), resumed an hour later.
        let left = ttl_left(Some(1_100), 1_030);
        assert_eq!(left, Some(70));
        assert_eq!(deadline_on_resume(Some(100), left, 4_630), Some(4_700));
    }

    #[test]
    fn a_sandbox_its_ttl_paused_gets_a_whole_ttl_at_resume() {
        let left = ttl_left(Some(1_000), 1_002);
        assert_eq!(left, Some(0));
        assert_eq!(deadline_on_resume(Some(60), left, 5_000), Some(5_060));
    }

    #[test]
    fn no_ttl_no_deadline() {
        assert_eq!(ttl_left(None, 10), None);
        assert_eq!(deadline_on_resume(None, Some(5), 10), None);
        // A TTL set while paused (nothing was set aside) runs from the resume.
        assert_eq!(deadline_on_resume(Some(30), None, 10), Some(40));
        // Shortened while paused: the new TTL bounds what was left.
        assert_eq!(deadline_on_resume(Some(30), Some(500), 10), Some(40));
    }

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
