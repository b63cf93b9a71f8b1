//! envd's unary `process.Process` procedures: `List`, `SendInput`, `SendSignal` and
//! `CloseStdin`, each a call of the agent's process API by pid.
//!
//! The agent keeps every background process (those `Start` made included), so these
//! need no host-side state: `List` shows the running ones with their argv split as
//! envd's `ProcessConfig` (`cmd` and `args`), and the others act on one pid. A pid the
//! agent does not know, or one that already ended, is envd's `not_found` (`process
//! with pid N not found`), which the SDK's `commands.kill` turns into `False`.
//! Processes are picked by pid only: zygote keeps no tags yet.
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::connect::{Code, ConnectError};
use super::pty::{Details, PtyRequest};
use super::selector::{pid_error, ProcessSelector, Procs};
use crate::manager::{Manager, PtyInput};
use crate::model::{SignalRequest, SignalSpec, StdinRequest};

/// A unary procedure of the process service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unary {
    List,
    SendInput,
    SendSignal,
    CloseStdin,
    Update,
}

#[derive(Debug, Deserialize)]
struct SelectRequest {
    process: ProcessSelector,
}

#[derive(Debug, Deserialize)]
struct SendInputRequest {
    process: ProcessSelector,
    input: ProcessInput,
}

/// `ProcessInput`: `{"stdin": b64}` or `{"pty": b64}`.
#[derive(Debug, Deserialize)]
pub struct ProcessInput {
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

/// `UpdateRequest`: `{"process": sel, "pty"?: {"size": {...}}}`.
#[derive(Debug, Deserialize)]
struct UpdateRequest {
    process: ProcessSelector,
    #[serde(default)]
    pty: Option<PtyRequest>,
}

#[derive(Debug, Deserialize)]
struct SendSignalRequest {
    process: ProcessSelector,
    #[serde(default)]
    signal: Value,
}

#[derive(Debug, Serialize)]
struct ListResponse {
    processes: Vec<ProcessInfo>,
}

#[derive(Debug, Serialize)]
struct ProcessInfo {
    config: ProcessConfig,
    pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    tag: Option<String>,
}

#[derive(Debug, Serialize)]
struct ProcessConfig {
    cmd: String,
    args: Vec<String>,
    envs: std::collections::BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cwd: Option<String>,
}

impl ProcessInfo {
    fn of(pid: u32, d: Details) -> ProcessInfo {
        ProcessInfo {
            config: ProcessConfig {
                cmd: d.cmd,
                args: d.args,
                envs: d.envs,
                cwd: d.cwd,
            },
            pid,
            tag: d.tag,
        }
    }
}

/// envd's answer to an input or resize meant for the other kind of process.
fn precondition(message: &str) -> ConnectError {
    ConnectError::new(Code::FailedPrecondition, message)
}

fn decode<'a, T: Deserialize<'a>>(what: &str, body: &'a [u8]) -> Result<T, ConnectError> {
    serde_json::from_slice(body)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("{what}: {e}")))
}

/// envd's `SIGNAL_*` enum (by name or number): SIGKILL and SIGTERM only, as envd.
fn signal_number(signal: &Value) -> Result<i64, ConnectError> {
    match signal {
        Value::String(s) if s == "SIGNAL_SIGKILL" => Ok(9),
        Value::String(s) if s == "SIGNAL_SIGTERM" => Ok(15),
        Value::Number(n) if matches!(n.as_i64(), Some(9 | 15)) => Ok(n.as_i64().unwrap_or(9)),
        other => Err(ConnectError::new(
            Code::Unimplemented,
            format!("invalid signal: {other}"),
        )),
    }
}

/// Serves one unary procedure for sandbox `id`; the answer is the response message.
pub async fn serve(procs: Procs<'_>, procedure: Unary, body: &[u8]) -> Result<Value, ConnectError> {
    let Procs {
        manager, ptys, id, ..
    } = procs;
    match procedure {
        Unary::List => {
            decode::<serde_json::Map<String, Value>>("ListRequest", body)?;
            let list = manager
                .processes(id)
                .await
                .map_err(|e| ConnectError::from_zygote(&e))?;
            let running: Vec<_> = list
                .processes
                .into_iter()
                .filter(|p| p.state == "running")
                .collect();
            let alive: Vec<_> = running.iter().map(|p| (p.pid, p.started_at_ms)).collect();
            procs.book.keep_only(id, &alive);
            let mut processes: Vec<ProcessInfo> = running
                .into_iter()
                .map(|p| {
                    let details = procs.book.details(id, p.pid, p.started_at_ms);
                    let mut argv = p.argv.into_iter();
                    let details = details.unwrap_or_else(|| Details {
                        cmd: argv.next().unwrap_or_default(),
                        args: argv.collect(),
                        ..Default::default()
                    });
                    ProcessInfo::of(p.pid, details)
                })
                .collect();
            let terminals = ptys.list(id).into_iter();
            processes.extend(terminals.map(|(pid, d)| ProcessInfo::of(pid, d)));
            Ok(serde_json::to_value(ListResponse { processes }).unwrap_or_default())
        }
        Unary::SendInput => {
            let req: SendInputRequest = decode("SendInputRequest", body)?;
            let pid = procs.pid(&req.process).await?;
            send_input(procs, pid, req.input).await?;
            Ok(serde_json::json!({}))
        }
        Unary::CloseStdin => {
            let req: SelectRequest = decode("CloseStdinRequest", body)?;
            let pid = procs.pid(&req.process).await?;
            if ptys.has(id, pid) {
                return Err(precondition(
                    "cannot close stdin for PTY process — send Ctrl+D (0x04) instead",
                ));
            }
            let req = StdinRequest {
                eof: true,
                ..Default::default()
            };
            write_stdin(manager, id, pid, req).await
        }
        Unary::SendSignal => {
            let req: SendSignalRequest = decode("SendSignalRequest", body)?;
            let pid = procs.pid(&req.process).await?;
            let number = signal_number(&req.signal)?;
            if let Some(sent) = ptys.signal(id, pid, number as i32).await {
                return sent.map(|()| serde_json::json!({}));
            }
            let signal = SignalRequest {
                signal: SignalSpec::Number(number),
            };
            manager
                .process_signal(id, pid, &signal)
                .await
                .map_err(|e| pid_error(pid, &e))?;
            Ok(serde_json::json!({}))
        }
        Unary::Update => {
            let req: UpdateRequest = decode("UpdateRequest", body)?;
            let pid = procs.pid(&req.process).await?;
            let Some(pty) = req.pty else {
                // Nothing to change; still, the pid must name a live process.
                if ptys.has(id, pid) {
                    return Ok(serde_json::json!({}));
                }
                return procs.running(pid).await.map(|()| serde_json::json!({}));
            };
            let (cols, rows) = pty.size()?;
            match ptys.send(id, pid, PtyInput::Resize { cols, rows }).await {
                Some(sent) => sent.map(|()| serde_json::json!({})),
                None => {
                    procs.running(pid).await?;
                    Err(precondition(
                        "error resizing tty: tty not assigned to process",
                    ))
                }
            }
        }
    }
}

/// `input` to process `pid` (SendInput's and StreamInput's): stdin for a program,
/// keystrokes for a terminal; the other kind is envd's `failed_precondition`.
pub async fn send_input(
    procs: Procs<'_>,
    pid: u32,
    input: ProcessInput,
) -> Result<(), ConnectError> {
    let Procs {
        manager, ptys, id, ..
    } = procs;
    let data = match (input.stdin, input.pty) {
        (Some(_), None) if ptys.has(id, pid) => {
            return Err(precondition(
                "tty assigned to process — input should be written to the pty, not the stdin",
            ))
        }
        (Some(data), None) => data,
        (None, Some(data)) => return pty_input(procs, pid, &data).await.map(|_| ()),
        _ => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "input: give exactly one of stdin and pty",
            ))
        }
    };
    if data.is_empty() {
        // Nothing to write; still, the pid must name a live process.
        return procs.running(pid).await;
    }
    let req = StdinRequest {
        data_base64: Some(data),
        ..Default::default()
    };
    write_stdin(manager, id, pid, req).await.map(|_| ())
}

/// SendInput's `pty` input: base64 of the keystrokes, for a terminal's pid.
async fn pty_input(procs: Procs<'_>, pid: u32, data: &str) -> Result<Value, ConnectError> {
    let Procs { ptys, id, .. } = procs;
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("input.pty: {e}")))?;
    if bytes.is_empty() {
        if ptys.has(id, pid) {
            return Ok(serde_json::json!({}));
        }
    } else if let Some(sent) = ptys.send(id, pid, PtyInput::Data(bytes)).await {
        return sent.map(|()| serde_json::json!({}));
    }
    procs.running(pid).await?;
    Err(precondition(
        "tty not assigned to process — input should be written to the stdin, not the tty",
    ))
}

async fn write_stdin(
    manager: &Arc<Manager>,
    id: &str,
    pid: u32,
    req: StdinRequest,
) -> Result<Value, ConnectError> {
    manager
        .process_stdin(id, pid, req)
        .await
        .map_err(|e| match e.status_code().1 {
            // The agent's "stdin of process N is closed": started with `stdin: false`,
            // or closed since (envd's sentinel and code for both).
            "guest_bad_request" => precondition("stdin not enabled or closed"),
            _ => pid_error(pid, &e),
        })?;
    Ok(serde_json::json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_read_as_envd_does() {
        assert_eq!(signal_number(&"SIGNAL_SIGKILL".into()).unwrap(), 9);
        assert_eq!(signal_number(&15.into()).unwrap(), 15);
        assert_eq!(
            signal_number(&"SIGNAL_SIGINT".into()).unwrap_err().code,
            Code::Unimplemented
        );
    }
}
