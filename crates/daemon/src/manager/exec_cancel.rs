//! An exec must not outlive the HTTP request that started it (issue 19, defect 5).
//!
//! The request's future is dropped when its client disconnects; the exec itself runs on
//! the blocking pool, waiting for the agent's exit event, and would keep the program
//! (and an agent slot) alive until the program ends on its own. [`ExecGuard`] lives in
//! the request's future: dropped before [`ExecGuard::finish`], it kills the program's
//! process group in the guest. The blocking side reports the exec id once the agent has
//! started the program, and checks whether the request was already abandoned then.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use zygote_proto::client::AgentClient;

/// What the request side and the blocking side share.
#[derive(Default)]
pub(super) struct ExecShared {
    /// The agent's id of the running exec (0: not started yet).
    exec_id: AtomicU64,
    /// The request was abandoned.
    cancelled: AtomicBool,
}

impl ExecShared {
    /// The program runs as `exec_id`. False when the request was abandoned meanwhile:
    /// the caller then drops its `ExecHandle`, which kills the program.
    pub(super) fn started(&self, exec_id: u64) -> bool {
        self.exec_id.store(exec_id, Ordering::SeqCst);
        !self.cancelled.load(Ordering::SeqCst)
    }
}

/// Kills the exec when dropped before [`finish`](Self::finish).
pub(super) struct ExecGuard {
    client: AgentClient,
    sandbox: String,
    shared: Arc<ExecShared>,
    done: bool,
}

impl ExecGuard {
    pub(super) fn new(client: AgentClient, sandbox: &str) -> Self {
        ExecGuard {
            client,
            sandbox: sandbox.to_string(),
            shared: Arc::default(),
            done: false,
        }
    }

    pub(super) fn shared(&self) -> Arc<ExecShared> {
        self.shared.clone()
    }

    /// The exec ended (or failed) and its result was delivered.
    pub(super) fn finish(mut self) {
        self.done = true;
    }
}

impl Drop for ExecGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.shared.cancelled.store(true, Ordering::SeqCst);
        let exec_id = self.shared.exec_id.load(Ordering::SeqCst);
        if exec_id == 0 {
            // Not started yet: the blocking side sees `cancelled` and drops the handle.
            return;
        }
        tracing::info!(sandbox = %self.sandbox, exec_id, "client went away: killing its exec");
        let client = self.client.clone();
        // Drop runs inside the runtime; the kill request blocks on the agent's answer,
        // so it runs on the blocking pool, detached (nobody waits for its outcome).
        drop(tokio::task::spawn_blocking(move || {
            client.kill(exec_id, libc::SIGKILL)
        }));
    }
}
