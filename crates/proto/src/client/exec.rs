//! A running exec as seen by the client.

use std::sync::mpsc::Receiver;
use std::time::Instant;

use super::{unexpected, AgentClient, ClientError};
use crate::{ExecResult, Response, Stream};

/// An exec started with [`AgentClient::spawn_exec`]. Dropping it before the
/// exit event sends SIGKILL to the exec's process group, so abandoned
/// programs do not linger in the guest.
pub struct ExecHandle {
    client: AgentClient,
    id: u64,
    pid: u32,
    rx: Receiver<Response>,
    /// The exec's `timeout_ms` from its request plus [`super::EXEC_GRACE`] (None: it
    /// may run as long as the agent lives; see `wait`).
    deadline: Option<Instant>,
    finished: bool,
}

/// Collected result of [`AgentClient::exec_output`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    pub result: ExecResult,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl ExecHandle {
    pub(super) fn new(
        client: AgentClient,
        id: u64,
        pid: u32,
        rx: Receiver<Response>,
        deadline: Option<Instant>,
    ) -> Self {
        ExecHandle {
            client,
            id,
            pid,
            rx,
            deadline,
            finished: false,
        }
    }

    /// The request id: what [`AgentClient::kill`] takes.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The program's pid in the guest (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Send `signal` to the exec's process group.
    pub fn kill(&self, signal: i32) -> Result<(), ClientError> {
        self.client.kill(self.id, signal)
    }

    /// Deliver output chunks to `on_output` as they arrive; return how the
    /// program ended.
    pub fn wait(
        mut self,
        mut on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<ExecResult, ClientError> {
        loop {
            let event = self
                .client
                .recv(self.id, &self.rx, self.deadline, "exec exit");
            match event {
                Ok(Response::Output { stream, data }) => on_output(stream, &data),
                Ok(Response::Exit(result)) => {
                    self.finished = true;
                    return Ok(result);
                }
                Ok(other) => return Err(unexpected("exec", &other)),
                Err(e) => {
                    // An agent error ends the request on the agent side too, and a
                    // closed connection ends it there.
                    self.finished = e.ends_request();
                    return Err(e);
                }
            }
        }
    }
}

impl Drop for ExecHandle {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.client.abandon(self.id);
    }
}
