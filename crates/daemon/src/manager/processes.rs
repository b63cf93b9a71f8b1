//! Background processes: started through the agent's `spawn`, then listed, read,
//! fed and signalled by pid. The agent keeps them and their output (see
//! `zygote_proto::process`); the daemon keeps nothing, so they survive a daemon restart,
//! and a branch child or restored sandbox has its own copies, found by the same pids.
use std::sync::Arc;

use tokio::sync::mpsc;
use zygote_proto::b64;
use zygote_proto::process::{ProcessOutputRequest, ProcessState, ProcessStdinRequest};
use zygote_proto::Stream;

use super::Manager;
use crate::error::{Error, Result};
use crate::model::{
    ExecEvent, ExecRequest, OutputQuery, Process, ProcessList, ProcessOutput, SignalRequest,
    StdinRequest, Validate,
};

/// How long one agent call of a follower waits for output before asking again (and
/// noticing a client that left).
const FOLLOW_WAIT_MS: u64 = 10_000;

impl Manager {
    /// Starts `req` in the background; answers once it runs.
    pub async fn spawn_process(self: &Arc<Self>, id: &str, req: ExecRequest) -> Result<Process> {
        req.validate()?;
        let agent_req = self.agent_exec(id, &req)?;
        // Not through `agent_call`: a spawn whose answer was lost may have started the
        // program, and retrying would start a second one.
        let client = self.agent(id).await?;
        let info = self
            .blocking(move || client.spawn_process(agent_req))
            .await?
            .map_err(Error::agent)?;
        tracing::info!(sandbox = id, pid = info.pid, argv = ?info.argv, "background process started");
        self.note_command_started(id, &req, Some(info.pid), "background");
        Ok(info.into())
    }

    pub async fn processes(self: &Arc<Self>, id: &str) -> Result<ProcessList> {
        let list = self.agent_call(id, |c| c.processes()).await?;
        Ok(ProcessList {
            processes: list.into_iter().map(Process::from).collect(),
        })
    }

    pub async fn process(self: &Arc<Self>, id: &str, pid: u32) -> Result<Process> {
        self.processes(id)
            .await?
            .processes
            .into_iter()
            .find(|p| p.pid == pid)
            .ok_or_else(|| Error::NotFound {
                what: "process",
                id: pid.to_string(),
            })
    }

    pub async fn process_output(
        self: &Arc<Self>,
        id: &str,
        pid: u32,
        q: &OutputQuery,
    ) -> Result<ProcessOutput> {
        q.validate()?;
        let asked = q.offset.unwrap_or(0);
        let req = ProcessOutputRequest {
            pid,
            offset: asked,
            wait_ms: q.wait_ms.unwrap_or(0),
        };
        let out = self
            .agent_call(id, move |c| c.process_output(req.clone()))
            .await?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        for chunk in &out.chunks {
            match chunk.stream {
                Stream::Stdout => stdout.extend_from_slice(&chunk.data),
                Stream::Stderr => stderr.extend_from_slice(&chunk.data),
            }
        }
        Ok(ProcessOutput {
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            offset: out.offset,
            next_offset: out.next_offset,
            dropped_bytes: out.offset.saturating_sub(asked),
            process: out.process.into(),
        })
    }

    /// The process's output from `offset` as it is printed, then its end, as the events
    /// of a streamed exec. An unknown pid is an error here (so an HTTP error status);
    /// the stream stops when the receiver is dropped.
    pub async fn follow_process(
        self: &Arc<Self>,
        id: &str,
        pid: u32,
        offset: u64,
    ) -> Result<mpsc::Receiver<ExecEvent>> {
        // Checks the sandbox and the pid before answering.
        let first = ProcessOutputRequest {
            pid,
            offset,
            wait_ms: 0,
        };
        let mut out = self
            .agent_call(id, move |c| c.process_output(first.clone()))
            .await?;
        let (tx, rx) = mpsc::channel(64);
        let this = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            loop {
                for chunk in out.chunks.drain(..) {
                    let event = ExecEvent::Output {
                        stream: match chunk.stream {
                            Stream::Stdout => "stdout".into(),
                            Stream::Stderr => "stderr".into(),
                        },
                        data: b64::encode(&chunk.data),
                    };
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
                let p = &out.process;
                if p.state == ProcessState::Exited && out.next_offset >= p.output_bytes {
                    let exit = p.exit.clone().unwrap_or_default();
                    let _ = tx
                        .send(ExecEvent::Exit {
                            exit_code: exit.exit_code,
                            signal: exit.signal,
                            timed_out: exit.timed_out,
                            duration_ms: exit.duration_ms,
                        })
                        .await;
                    return;
                }
                let next = ProcessOutputRequest {
                    pid,
                    offset: out.next_offset,
                    wait_ms: FOLLOW_WAIT_MS,
                };
                let call = this.agent_call(&id, move |c| c.process_output(next.clone()));
                let got = tokio::select! {
                    got = call => got,
                    _ = tx.closed() => return,
                };
                out = match got {
                    Ok(o) => o,
                    Err(e) => {
                        let body = e.body();
                        let _ = tx
                            .send(ExecEvent::Error {
                                code: body.error.code,
                                message: body.error.message,
                            })
                            .await;
                        return;
                    }
                };
            }
        });
        Ok(rx)
    }

    pub async fn process_stdin(
        self: &Arc<Self>,
        id: &str,
        pid: u32,
        req: StdinRequest,
    ) -> Result<()> {
        let req = ProcessStdinRequest {
            pid,
            data: req.bytes()?,
            eof: req.eof,
        };
        // Not retried either: the first attempt may have written part of the data.
        let client = self.agent(id).await?;
        self.blocking(move || client.process_stdin(req))
            .await?
            .map_err(Error::agent)
    }

    pub async fn process_signal(
        self: &Arc<Self>,
        id: &str,
        pid: u32,
        req: &SignalRequest,
    ) -> Result<()> {
        let signal = req.number()?;
        self.agent_call(id, move |c| c.process_signal(pid, signal))
            .await
    }
}
