//! What a sandbox's guest did about being forked (see the agent's `forked` module).
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// How one of the guest's `/etc/zygote/forked.d` hooks ended the last time the sandbox
/// was started, branched or restored. Hooks run before the sandbox is reported ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ForkHook {
    /// File name in `/etc/zygote/forked.d`.
    pub name: String,
    /// Exit code; null when it was killed (timeout, signal) or could not start.
    pub exit_code: Option<i32>,
    /// Why it failed; null when it exited with 0.
    pub error: Option<String>,
    /// The end of what it wrote to stderr (at most 2 KiB).
    pub stderr_tail: String,
}

impl From<&zygote_proto::HookOutcome> for ForkHook {
    fn from(h: &zygote_proto::HookOutcome) -> Self {
        ForkHook {
            name: h.name.clone(),
            exit_code: h.exit_code,
            error: h.error.clone(),
            stderr_tail: h.stderr_tail.clone(),
        }
    }
}
