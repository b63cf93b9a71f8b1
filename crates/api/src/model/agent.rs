//! How the daemon sees a sandbox's guest agent (`agent` in the sandbox's JSON): a
//! sandbox may be `running` while its agent is silent or sends garbage, and every exec
//! or file call then fails; this says so before a call is made, and why.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The state of the daemon's channel to a running sandbox's agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    /// Answering (or nothing has gone wrong since the last connection).
    Ok,
    /// A request went unanswered past its deadline, and so did a health check: the
    /// connection was dropped; the next call (or the daemon's watch) connects again.
    Unresponsive,
    /// The agent sent something that is not a well-formed reply: the connection was
    /// dropped.
    MalformedReply,
    /// The channel broke, or a new connection failed (refused, closed before an answer).
    Unreachable,
    /// A new connection is being made after one of the above.
    Reconnecting,
}

/// `agent` in a sandbox's JSON while its VM runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AgentHealth {
    pub state: AgentState,
    /// The last problem with the agent, kept after it recovered (null: none since the
    /// daemon started).
    pub last_error: Option<String>,
    /// When that was (unix seconds).
    pub last_error_at: Option<u64>,
}
