//! envd's streaming `process.Process` procedures: `Start`, a program started through
//! the agent's `spawn` and followed as E2B's event stream (`start`, `data`*, `end`),
//! and `Connect`, the same stream for a process that already runs, from its current
//! output on (no replay, as envd).
//!
//! Spawn, not exec: an E2B process outlives the request that started it (a client that
//! goes away does not kill it, as with envd), and it lives in the agent, so it survives
//! a daemon restart and is carried into branch children. Its output is read from the
//! agent's buffer from offset 0, so nothing printed before the follower starts is lost.
//! A silent program gets a `keepalive` event every `Keepalive-Ping-Interval` seconds,
//! so the client's read timeout does not end a long quiet command.
use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::connect::{self, Code, ConnectError};
use super::pty::{Details, PtyRequest};
use super::selector::{pid_error, ProcessSelector, Procs};
use crate::model::{ExecEvent, ExecRequest, StdinRequest, Validate};

/// `StartRequest` (process.proto), as proto3 JSON.
#[derive(Debug, Deserialize)]
pub struct StartRequest {
    process: ProcessConfig,
    #[serde(default)]
    pty: Option<PtyRequest>,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    stdin: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// `StartResponse`: `{"event": ProcessEvent}`.
#[derive(Debug, Serialize)]
struct StartResponse {
    event: ProcessEvent,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "lowercase")]
enum ProcessEvent {
    Start { pid: u32 },
    Data(DataEvent),
    End(EndEvent),
    Keepalive {},
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "lowercase")]
enum DataEvent {
    Stdout(String),
    Stderr(String),
    Pty(String),
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct EndEvent {
    exit_code: i32,
    exited: bool,
    status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl EndEvent {
    /// As envd reports Go's `ProcessState`: `exit status N`, or `signal: <name>` with
    /// exit code -1; `error` set when the program failed.
    fn of(exit_code: Option<i32>, signal: Option<i32>) -> EndEvent {
        match (exit_code, signal) {
            (_, Some(sig)) => {
                let status = format!("signal: {}", signal_name(sig));
                EndEvent {
                    exit_code: -1,
                    exited: false,
                    error: Some(status.clone()),
                    status,
                }
            }
            (code, None) => {
                let code = code.unwrap_or(-1);
                let status = format!("exit status {code}");
                EndEvent {
                    exit_code: code,
                    exited: true,
                    error: (code != 0).then(|| status.clone()),
                    status,
                }
            }
        }
    }
}

/// Go's names of signals, as `ProcessState.String()` prints them.
fn signal_name(sig: i32) -> String {
    match sig {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        3 => "quit".into(),
        6 => "aborted".into(),
        9 => "killed".into(),
        11 => "segmentation fault".into(),
        13 => "broken pipe".into(),
        15 => "terminated".into(),
        n => format!("signal {n}"),
    }
}

/// Serves `Start` for sandbox `id`; `body` is the request's envelope(s).
pub async fn start(procs: Procs<'_>, headers: &HeaderMap, body: &[u8]) -> Response {
    match start_stream(procs, headers, body).await {
        Ok(resp) => resp,
        Err(e) => e.stream_response(),
    }
}

async fn start_stream(
    procs: Procs<'_>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ConnectError> {
    let Procs {
        manager, ptys, id, ..
    } = procs;
    let json = connect::single_message(body)?;
    let req: StartRequest = serde_json::from_slice(json)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("StartRequest: {e}")))?;
    let timeout_ms = connect::timeout_ms(headers)?.filter(|&t| t > 0);
    let details = Details {
        cmd: req.process.cmd,
        args: req.process.args,
        envs: req.process.envs,
        cwd: req.process.cwd,
        tag: req.tag,
    };
    check_program(&details)?;
    let launch = Launch::for_user(manager, id, headers, &details).await?;
    if let Some(pty) = &req.pty {
        let size = pty.size()?;
        let deadline = timeout_ms.map(|t| Instant::now() + Duration::from_millis(t));
        let (pid, events) = ptys
            .open(manager, id, details, launch, size, deadline)
            .await?;
        // The pump bounds the program by the timeout; the stream ends with its end.
        return Ok(event_stream(
            pid,
            events,
            connect::keepalive_interval(headers),
            None,
        ));
    }
    let mut argv = vec![details.cmd.clone()];
    argv.extend(details.args.iter().cloned());
    let exec = ExecRequest {
        argv,
        env: launch.env,
        cwd: Some(launch.cwd),
        user: Some(launch.user),
        timeout_ms,
        background: true,
        ..Default::default()
    };
    let started = manager
        .spawn_process(id, exec.clone())
        .await
        .map_err(|e| ConnectError::from_zygote(&e))?;
    let pid = started.pid;
    // Drop what is kept of sandboxes that no longer run, then keep this one's.
    procs.book.forget_sandboxes(|other| {
        other != id
            && !manager
                .get(other)
                .is_ok_and(|s| !matches!(s.state.as_str(), "dead" | "deleting"))
    });
    procs.book.record(id, pid, started.started_at_ms, details);
    if !req.stdin.unwrap_or(false) {
        // The program reads end of file at once, as with envd's `stdin: false`.
        let eof = StdinRequest {
            eof: true,
            ..Default::default()
        };
        if let Err(e) = manager.process_stdin(id, pid, eof).await {
            tracing::debug!(sandbox = id, pid, "closing stdin: {e}");
        }
    }
    let events = manager
        .follow_process(id, pid, 0)
        .await
        .map_err(|e| ConnectError::from_zygote(&e))?;
    let events = manager.noting_the_end(id, &exec, events);
    // The agent bounds the program by the timeout; the stream ends with its end.
    Ok(event_stream(
        pid,
        events,
        connect::keepalive_interval(headers),
        None,
    ))
}

/// Longest tag Start takes (envd sets none; zygote keeps tags in memory).
pub const MAX_TAG_BYTES: usize = 256;

/// The checks zygote's exec applies to a program (argv, environment, cwd), and the
/// tag's length.
fn check_program(details: &Details) -> Result<(), ConnectError> {
    let bad = |m: String| ConnectError::new(Code::InvalidArgument, m);
    if details
        .tag
        .as_ref()
        .is_some_and(|t| t.len() > MAX_TAG_BYTES)
    {
        return Err(bad(format!("tag: longer than {MAX_TAG_BYTES} bytes")));
    }
    let mut argv = vec![details.cmd.clone()];
    argv.extend(details.args.iter().cloned());
    let exec = ExecRequest {
        argv,
        env: details.envs.clone(),
        cwd: details.cwd.clone(),
        ..Default::default()
    };
    exec.validate().map_err(|e| bad(format!("process: {e}")))
}

/// `ConnectRequest`: `{"process": ProcessSelector}`.
#[derive(Debug, Deserialize)]
struct ConnectRequest {
    process: ProcessSelector,
}

/// Serves `Connect` for sandbox `id`: `start`, then the output printed from now on and
/// the end. `connect-timeout-ms` bounds the stream only; the process keeps running.
pub async fn connect(procs: Procs<'_>, headers: &HeaderMap, body: &[u8]) -> Response {
    match connect_stream(procs, headers, body).await {
        Ok(resp) => resp,
        Err(e) => e.stream_response(),
    }
}

async fn connect_stream(
    procs: Procs<'_>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ConnectError> {
    let Procs {
        manager, ptys, id, ..
    } = procs;
    let json = connect::single_message(body)?;
    let req: ConnectRequest = serde_json::from_slice(json)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("ConnectRequest: {e}")))?;
    let pid = procs.pid(&req.process).await?;
    let deadline = connect::timeout_ms(headers)?
        .filter(|&t| t > 0)
        .map(|t| Instant::now() + Duration::from_millis(t));
    let keepalive = connect::keepalive_interval(headers);
    if let Some(follower) = ptys.follow(id, pid) {
        return Ok(event_stream(pid, follower?, keepalive, deadline));
    }
    let process = manager
        .process(id, pid)
        .await
        .map_err(|e| pid_error(pid, &e))?;
    let events = manager
        .follow_process(id, pid, process.output_bytes)
        .await
        .map_err(|e| pid_error(pid, &e))?;
    Ok(event_stream(pid, events, keepalive, deadline))
}

/// The streamed answer: `start`, then the follower's events.
fn event_stream(
    pid: u32,
    events: mpsc::Receiver<ExecEvent>,
    keepalive: Duration,
    deadline: Option<Instant>,
) -> Response {
    let first = connect::message(&StartResponse {
        event: ProcessEvent::Start { pid },
    });
    let rest = envelopes(events, keepalive, deadline);
    let stream = futures_util::stream::once(async move { first })
        .chain(rest)
        .map(Ok::<Bytes, std::convert::Infallible>);
    connect::stream_response(Body::from_stream(stream))
}

/// The follower's events as envelopes, ending with the end-stream one (or with
/// `deadline_exceeded` at `deadline`, leaving the process alone).
fn envelopes(
    mut events: mpsc::Receiver<ExecEvent>,
    keepalive: Duration,
    deadline: Option<Instant>,
) -> impl futures_util::Stream<Item = Bytes> {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let past_deadline = async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(past_deadline);
        loop {
            let event = tokio::select! {
                e = events.recv() => e,
                _ = &mut past_deadline => {
                    let late = ConnectError::new(
                        Code::DeadlineExceeded,
                        "the stream reached its timeout (connect-timeout-ms); the process runs on",
                    );
                    let _ = tx.send(late.end_stream()).await;
                    return;
                }
                _ = tokio::time::sleep(keepalive) => {
                    let ping = StartResponse { event: ProcessEvent::Keepalive {} };
                    if tx.send(connect::message(&ping)).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let last = match event {
                Some(ExecEvent::Output { stream, data }) => {
                    let data = match stream.as_str() {
                        "stderr" => DataEvent::Stderr(data),
                        "pty" => DataEvent::Pty(data),
                        _ => DataEvent::Stdout(data),
                    };
                    let msg = StartResponse {
                        event: ProcessEvent::Data(data),
                    };
                    if tx.send(connect::message(&msg)).await.is_err() {
                        return;
                    }
                    continue;
                }
                Some(ExecEvent::Exit {
                    timed_out: true, ..
                }) => ConnectError::new(
                    Code::DeadlineExceeded,
                    "the command ran past its timeout (connect-timeout-ms) and was killed",
                )
                .end_stream(),
                Some(ExecEvent::Exit {
                    exit_code, signal, ..
                }) => {
                    let end = StartResponse {
                        event: ProcessEvent::End(EndEvent::of(exit_code, signal)),
                    };
                    if tx.send(connect::message(&end)).await.is_err() {
                        return;
                    }
                    connect::end_stream_ok()
                }
                Some(ExecEvent::Error { message, .. }) => {
                    ConnectError::new(Code::Unavailable, message).end_stream()
                }
                Some(ExecEvent::Started { .. }) => continue,
                None => ConnectError::new(
                    Code::Unavailable,
                    "the sandbox's agent stopped answering about the process",
                )
                .end_stream(),
            };
            let _ = tx.send(last).await;
            return;
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// How a program Start runs is launched: as the acting user (the request's, else E2B's
/// default `user` when the image has it, else root), with that user's `HOME`, `USER`
/// and `LOGNAME` under the request's own variables, in the request's directory
/// (relative to the home) or else the home when the image has it.
pub(super) struct Launch {
    pub env: std::collections::BTreeMap<String, String>,
    pub cwd: String,
    /// `uid:gid`, as zygote's exec and pty requests take it.
    pub user: String,
}

impl Launch {
    async fn for_user(
        manager: &std::sync::Arc<crate::manager::Manager>,
        id: &str,
        headers: &HeaderMap,
        details: &Details,
    ) -> Result<Launch, ConnectError> {
        let user = super::users::acting_user(manager, id, headers).await?;
        let mut env = details.envs.clone();
        for (k, v) in [
            ("HOME", &user.home),
            ("USER", &user.name),
            ("LOGNAME", &user.name),
        ] {
            env.entry(k.to_string()).or_insert_with(|| v.clone());
        }
        let cwd = match details.cwd.as_deref().filter(|c| !c.is_empty()) {
            // The home, when the image has it (an OCI image's root may have none).
            None => match manager.stat_path(id, &user.home, true).await {
                Ok(m) if m.kind == zygote_proto::FileKind::Dir => user.home.clone(),
                _ => "/".to_string(),
            },
            Some(c) => super::users::resolve_path(c, &user).ok_or_else(|| {
                ConnectError::new(Code::InvalidArgument, "process.cwd has a NUL byte")
            })?,
        };
        Ok(Launch {
            env,
            cwd,
            user: format!("{}:{}", user.uid, user.gid),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_have_envds_json_shape() {
        let json = |e: ProcessEvent| serde_json::to_string(&StartResponse { event: e }).unwrap();
        assert_eq!(
            json(ProcessEvent::Start { pid: 7 }),
            r#"{"event":{"start":{"pid":7}}}"#
        );
        assert_eq!(
            json(ProcessEvent::Data(DataEvent::Stdout("aGkK".into()))),
            r#"{"event":{"data":{"stdout":"aGkK"}}}"#
        );
        assert_eq!(
            json(ProcessEvent::End(EndEvent::of(Some(0), None))),
            r#"{"event":{"end":{"exitCode":0,"exited":true,"status":"exit status 0"}}}"#
        );
        assert_eq!(
            json(ProcessEvent::End(EndEvent::of(Some(3), None))),
            r#"{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}}}"#
        );
        let killed = EndEvent::of(None, Some(9));
        assert_eq!(
            (killed.exit_code, killed.status.as_str()),
            (-1, "signal: killed")
        );
        assert_eq!(
            json(ProcessEvent::Keepalive {}),
            r#"{"event":{"keepalive":{}}}"#
        );
    }
}
