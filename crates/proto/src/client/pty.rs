//! A program on a pty as seen by the client: output arrives through
//! [`PtyHandle::wait`], keystrokes and resizes go through a [`PtyControl`], which can
//! be used from another thread while `wait` runs.

use std::sync::mpsc::Receiver;

use super::{expect_ok, unexpected, AgentClient, ClientError};
use crate::{ExecResult, PtyInputRequest, PtyResizeRequest, Request, Response, Stream};

/// A pty opened with [`AgentClient::open_pty`]. Dropping it before the exit event
/// kills the program (the agent then also ends the rest of its session, once the
/// connection closes).
pub struct PtyHandle {
    control: PtyControl,
    pid: u32,
    rx: Receiver<Response>,
    finished: bool,
}

/// Sends keystrokes and resizes to a running pty; cheap to clone.
#[derive(Clone)]
pub struct PtyControl {
    client: AgentClient,
    id: u64,
}

impl PtyControl {
    /// The `pty_open` request id (what `kill` takes).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Raw bytes for the terminal (at most [`crate::MAX_PTY_INPUT`] per call). An
    /// agent whose queue is full answers `busy`: retry after a moment.
    pub fn input(&self, data: &[u8]) -> Result<(), ClientError> {
        let req = Request::PtyInput(PtyInputRequest {
            pty_id: self.id,
            data: data.to_vec(),
        });
        expect_ok("pty_input", self.client.call(req, "pty_input")?)
    }

    pub fn resize(&self, cols: u16, rows: u16) -> Result<(), ClientError> {
        let req = Request::PtyResize(PtyResizeRequest {
            pty_id: self.id,
            cols,
            rows,
        });
        expect_ok("pty_resize", self.client.call(req, "pty_resize")?)
    }

    /// Signal the program's process group.
    pub fn kill(&self, signal: i32) -> Result<(), ClientError> {
        self.client.kill(self.id, signal)
    }
}

impl PtyHandle {
    pub(super) fn new(client: AgentClient, id: u64, pid: u32, rx: Receiver<Response>) -> Self {
        PtyHandle {
            control: PtyControl { client, id },
            pid,
            rx,
            finished: false,
        }
    }

    /// The program's pid in the guest (also its session and process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn control(&self) -> PtyControl {
        self.control.clone()
    }

    /// Deliver terminal output to `on_output` as it arrives; return how the
    /// program ended. Waits as long as the program runs.
    pub fn wait(mut self, mut on_output: impl FnMut(&[u8])) -> Result<ExecResult, ClientError> {
        let (client, id) = (self.control.client.clone(), self.control.id);
        loop {
            match client.recv(id, &self.rx, None, "pty exit") {
                Ok(Response::Output {
                    stream: Stream::Stdout,
                    data,
                }) => on_output(&data),
                Ok(Response::Exit(result)) => {
                    self.finished = true;
                    return Ok(result);
                }
                Ok(other) => return Err(unexpected("pty_open", &other)),
                Err(e) => {
                    // An agent error ends the request on the agent side too.
                    self.finished = e.ends_request();
                    return Err(e);
                }
            }
        }
    }
}

impl Drop for PtyHandle {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.control.client.abandon(self.control.id);
    }
}
