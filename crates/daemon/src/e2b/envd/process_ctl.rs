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
use crate::error::Error;
use crate::manager::Manager;
use crate::model::{SignalRequest, SignalSpec, StdinRequest};

/// A unary procedure of the process service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unary {
    List,
    SendInput,
    SendSignal,
    CloseStdin,
}

/// `ProcessSelector`: `{"pid": N}` or `{"tag": "t"}` (a oneof).
#[derive(Debug, Deserialize)]
pub struct ProcessSelector {
    #[serde(default)]
    pid: Option<Value>,
    #[serde(default)]
    tag: Option<String>,
}

impl ProcessSelector {
    /// The pid it names. proto3 JSON writes a uint32 as a number, and readers take a
    /// decimal string too.
    pub fn pid(&self) -> Result<u32, ConnectError> {
        let bad = |m: String| ConnectError::new(Code::InvalidArgument, m);
        match (&self.pid, &self.tag) {
            (Some(v), None) => match v {
                Value::Number(n) => n.as_u64(),
                Value::String(s) if !s.is_empty() && s.len() <= 10 => s.parse().ok(),
                _ => None,
            }
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad(format!("process.pid: {v} is not a uint32"))),
            (None, Some(tag)) => Err(ConnectError::new(
                Code::NotFound,
                format!("process with tag {tag} not found (zygote's envd keeps no tags yet)"),
            )),
            _ => Err(bad("process: give exactly one of pid and tag".into())),
        }
    }
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
struct ProcessInput {
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    pty: Option<String>,
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
}

#[derive(Debug, Serialize)]
struct ProcessConfig {
    cmd: String,
    args: Vec<String>,
    envs: serde_json::Map<String, Value>,
}

/// A daemon error about `pid`, as envd names a missing or ended process.
pub fn pid_error(pid: u32, e: &Error) -> ConnectError {
    let gone = matches!(
        e,
        Error::NotFound {
            what: "process",
            ..
        }
    ) || matches!(e.status_code().1, "guest_not_found" | "process_exited");
    if gone {
        ConnectError::new(Code::NotFound, format!("process with pid {pid} not found"))
    } else {
        ConnectError::from_zygote(e)
    }
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
pub async fn serve(
    manager: &Arc<Manager>,
    id: &str,
    procedure: Unary,
    body: &[u8],
) -> Result<Value, ConnectError> {
    match procedure {
        Unary::List => {
            decode::<serde_json::Map<String, Value>>("ListRequest", body)?;
            let list = manager
                .processes(id)
                .await
                .map_err(|e| ConnectError::from_zygote(&e))?;
            let processes = list
                .processes
                .into_iter()
                .filter(|p| p.state == "running")
                .map(|p| {
                    let mut argv = p.argv.into_iter();
                    ProcessInfo {
                        config: ProcessConfig {
                            cmd: argv.next().unwrap_or_default(),
                            args: argv.collect(),
                            envs: Default::default(),
                        },
                        pid: p.pid,
                    }
                })
                .collect();
            Ok(serde_json::to_value(ListResponse { processes }).unwrap_or_default())
        }
        Unary::SendInput => {
            let req: SendInputRequest = decode("SendInputRequest", body)?;
            let pid = req.process.pid()?;
            let data = match (req.input.stdin, req.input.pty) {
                (Some(data), None) => data,
                (None, Some(_)) => {
                    return Err(ConnectError::new(
                        Code::Unimplemented,
                        "zygote's envd does not run programs on a PTY yet",
                    ))
                }
                _ => {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        "input: give exactly one of stdin and pty",
                    ))
                }
            };
            if data.is_empty() {
                // Nothing to write; still, the pid must name a live process.
                return match manager.process(id, pid).await {
                    Ok(p) if p.state == "running" => Ok(serde_json::json!({})),
                    Ok(_) => Err(ConnectError::new(
                        Code::NotFound,
                        format!("process with pid {pid} not found"),
                    )),
                    Err(e) => Err(pid_error(pid, &e)),
                };
            }
            let req = StdinRequest {
                data_base64: Some(data),
                ..Default::default()
            };
            write_stdin(manager, id, pid, req).await
        }
        Unary::CloseStdin => {
            let req: SelectRequest = decode("CloseStdinRequest", body)?;
            let pid = req.process.pid()?;
            let req = StdinRequest {
                eof: true,
                ..Default::default()
            };
            write_stdin(manager, id, pid, req).await
        }
        Unary::SendSignal => {
            let req: SendSignalRequest = decode("SendSignalRequest", body)?;
            let pid = req.process.pid()?;
            let signal = SignalRequest {
                signal: SignalSpec::Number(signal_number(&req.signal)?),
            };
            manager
                .process_signal(id, pid, &signal)
                .await
                .map_err(|e| pid_error(pid, &e))?;
            Ok(serde_json::json!({}))
        }
    }
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
        .map_err(|e| pid_error(pid, &e))?;
    Ok(serde_json::json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_and_signals_are_read_as_envd_does() {
        let sel = |j: &str| serde_json::from_str::<ProcessSelector>(j).unwrap().pid();
        assert_eq!(sel(r#"{"pid": 42}"#).unwrap(), 42);
        assert_eq!(sel(r#"{"pid": "42"}"#).unwrap(), 42);
        for bad in [
            r#"{"pid": -1}"#,
            r#"{"pid": 4294967296}"#,
            r#"{"pid": "x"}"#,
            "{}",
        ] {
            assert_eq!(sel(bad).unwrap_err().code, Code::InvalidArgument, "{bad}");
        }
        assert_eq!(sel(r#"{"tag": "t"}"#).unwrap_err().code, Code::NotFound);
        assert_eq!(signal_number(&"SIGNAL_SIGKILL".into()).unwrap(), 9);
        assert_eq!(signal_number(&15.into()).unwrap(), 15);
        assert_eq!(
            signal_number(&"SIGNAL_SIGINT".into()).unwrap_err().code,
            Code::Unimplemented
        );
    }
}
