//! Background-process requests of [`AgentClient`] (see [`crate::process`]).

use super::{expect_ok, unexpected, AgentClient, ClientError};
use crate::process::{
    ProcessInfo, ProcessOutput, ProcessOutputRequest, ProcessSignalRequest, ProcessStdinRequest,
};
use crate::{ExecRequest, Request, Response};

impl AgentClient {
    /// Start `req` as a background process; it outlives this request and connection.
    pub fn spawn_process(&self, req: ExecRequest) -> Result<ProcessInfo, ClientError> {
        match self.call(Request::Spawn(req), "spawn")? {
            Response::Spawned(info) => Ok(info),
            other => Err(unexpected("spawn", &other)),
        }
    }

    /// Every background process the agent tracks, oldest first.
    pub fn processes(&self) -> Result<Vec<ProcessInfo>, ClientError> {
        match self.call(Request::Processes, "processes")? {
            Response::Processes { processes } => Ok(processes),
            other => Err(unexpected("processes", &other)),
        }
    }

    /// Output of `pid` from `offset`, waiting up to `wait_ms` for some when there is
    /// none yet (the request's own timeout must be longer than that).
    pub fn process_output(&self, req: ProcessOutputRequest) -> Result<ProcessOutput, ClientError> {
        match self.call(Request::ProcessOutput(req), "process_output")? {
            Response::ProcessOutput(out) => Ok(out),
            other => Err(unexpected("process_output", &other)),
        }
    }

    pub fn process_stdin(&self, req: ProcessStdinRequest) -> Result<(), ClientError> {
        expect_ok(
            "process_stdin",
            self.call(Request::ProcessStdin(req), "process_stdin")?,
        )
    }

    pub fn process_signal(&self, pid: u32, signal: i32) -> Result<(), ClientError> {
        let req = Request::ProcessSignal(ProcessSignalRequest { pid, signal });
        expect_ok("process_signal", self.call(req, "process_signal")?)
    }
}
