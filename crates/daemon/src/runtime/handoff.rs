//! The connection that brought a VM up, kept for the daemon's first agent call instead of
//! being closed: it is already authenticated (its `hello` moved the agent to the
//! sandbox's token), so the first exec after a create or branch pays no new connection
//! and no second `hello`; and on the qemu runtime's one-connection channel, closing only
//! to reconnect would make the guest see a close right next to the new connection's
//! first request.
use std::collections::HashMap;
use std::sync::Mutex;

use zygote_proto::client::AgentClient;

use super::{RuntimeError, VmRecord};

/// How long a new connection's `hello` may take.
pub const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Default)]
pub struct BroughtUp(Mutex<HashMap<String, AgentClient>>);

impl BroughtUp {
    /// Keeps `client`, the connection that brought up the VM whose agent is at `addr`.
    pub fn keep(&self, addr: &str, client: AgentClient) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr.to_string(), client);
    }

    /// Closes the kept connection of a VM that goes away unused (destroyed, or its
    /// bring-up's caller gave up on it).
    pub fn forget(&self, addr: &str) {
        let kept = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(addr);
        if let Some(client) = kept {
            client.close();
        }
    }

    /// The kept connection to `vm`'s agent if it is still open, else a new one made by
    /// `connect` and authenticated with `token`.
    pub fn take_or_connect(
        &self,
        vm: &VmRecord,
        token: &str,
        connect: impl FnOnce() -> Result<AgentClient, zygote_proto::client::ClientError>,
    ) -> Result<AgentClient, RuntimeError> {
        let kept = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&vm.agent_addr);
        if let Some(client) = kept.filter(|c| !c.is_closed()) {
            return Ok(client);
        }
        let client = connect()?;
        // Every new connection opens with the sandbox's token (a new session). A live
        // agent answers at once; one that does not is not waited for long (a bounded
        // deadline, no liveness check on top of it).
        client
            .clone()
            .with_request_timeout(Some(HELLO_TIMEOUT))
            .with_liveness(None)
            .hello(token, None)?;
        Ok(client)
    }
}
