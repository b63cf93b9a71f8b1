//! The code interpreter (issue 37): stateful Python in Jupyter kernels inside the guest,
//! one per context, reached through the agent.
//!
//! Image `code-interpreter` ships a code server (`zygote_codeint.py`) and its relay
//! `zygote-codeint`, which starts the server once and joins its own stdin/stdout to the
//! server's Unix socket. Each request here is one exec of the relay through the agent
//! (the request as one JSON line on stdin, the answer as JSON lines on stdout), so no
//! guest network and no host port is involved, and a connection lives exactly as long
//! as its request: after a pause/resume, a restore or a branch, the next request simply
//! runs a new relay against the same server and kernels, which the VM carried over.
//! When the client of an execution goes away, dropping the exec kills the relay; the
//! server sees its connection close and interrupts the kernel.
//!
//! Everything the relay prints is the guest's word: [`code_wire`](super::code_wire)
//! checks each line, and a broken stream ends with a `failure` event, never a panic or
//! an unbounded buffer.
use std::collections::VecDeque;
use std::sync::Arc;

use serde_json::json;
use tokio::sync::mpsc;
use zygote_api::model::{
    validate_context_id, CodeContext, CodeEvent, CodeRequest, CreateContextRequest, ExecEvent,
    ExecRequest, Validate, MAX_EXEC_TIMEOUT_MS,
};
use zygote_proto::b64;

use super::code_wire::{parse_line, FailureCode, GuestLine, LineSplitter, WireError};
use super::Manager;
use crate::error::{Error, Result};

/// The relay's name in the guest's PATH.
const RELAY: &str = "zygote-codeint";
/// Time the relay gets beyond an execution's own timeout before the agent kills it: the
/// server interrupts at the timeout itself, but the first request of a context also
/// starts its kernel (the server allows 300 s for that on a slow emulated guest).
const RELAY_GRACE_MS: u64 = 330_000;
/// Relay stderr kept for error messages (why the server did not start).
const MAX_STDERR: usize = 2048;

/// Why a code request failed.
#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    #[error(
        "sandbox {0} has no code interpreter: create it from image code-interpreter \
         (E2B template code-interpreter-v1)"
    )]
    NoInterpreter(String),
    #[error(
        "sandbox {0}'s code server predates per-execution envs (the sandbox comes from an \
         older code-interpreter image or a snapshot of one): the execution was interrupted as it started; \
         set the variables in the code (os.environ) or use a sandbox from the current image"
    )]
    EnvsUnsupported(String),
    #[error("no code context {0:?} in this sandbox (create one with POST .../code/contexts)")]
    UnknownContext(String),
    #[error("the code server refused the request: {0}")]
    Refused(String),
    #[error("the sandbox's code server: {0}")]
    LimitReached(String),
    #[error("the sandbox's code server failed: {0}")]
    Server(String),
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// One request's relay: its exec's events turned into checked lines.
struct Relay {
    events: mpsc::Receiver<ExecEvent>,
    splitter: LineSplitter,
    ready: VecDeque<Vec<u8>>,
    stderr: Vec<u8>,
    /// How the relay's exec ended, once it has (for the message of an early end).
    ended: Option<String>,
}

impl Relay {
    async fn start(
        manager: &Arc<Manager>,
        id: &str,
        request: serde_json::Value,
        timeout_ms: u64,
    ) -> Result<Relay> {
        let mut line = request.to_string();
        line.push('\n');
        let exec = ExecRequest {
            argv: vec![RELAY.into()],
            stdin: Some(line),
            timeout_ms: Some(
                timeout_ms
                    .saturating_add(RELAY_GRACE_MS)
                    .min(MAX_EXEC_TIMEOUT_MS),
            ),
            user: Some("root".into()),
            ..Default::default()
        };
        let events = match manager.exec_stream(id, exec).await {
            Ok(events) => events,
            Err(e @ Error::Guest(_)) if e.status_code().1 == "guest_spawn_failed" => {
                return Err(CodeError::NoInterpreter(id.to_string()).into());
            }
            Err(e) => return Err(e),
        };
        Ok(Relay {
            events,
            splitter: LineSplitter::default(),
            ready: VecDeque::new(),
            stderr: Vec::new(),
            ended: None,
        })
    }

    /// How the relay ended and what it wrote to stderr, for an error message: the
    /// guest's word, shortened.
    fn stderr_tail(&self) -> String {
        let text = String::from_utf8_lossy(&self.stderr);
        let text = text.trim();
        let ended = self.ended.as_deref().unwrap_or("its exec stream closed");
        if text.is_empty() {
            format!(" ({ended})")
        } else {
            format!(" ({ended}; {})", text.chars().take(500).collect::<String>())
        }
    }

    /// The next checked line; None when the relay ended after a complete line.
    async fn next(&mut self) -> Result<Option<GuestLine>, CodeError> {
        loop {
            if let Some(line) = self.ready.pop_front() {
                return parse_line(&line).map(Some).map_err(CodeError::from);
            }
            match self.events.recv().await {
                Some(ExecEvent::Output { stream, data }) => {
                    let bytes = b64::decode(&data)
                        .map_err(|e| CodeError::Server(format!("undecodable output: {e}")))?;
                    if stream == "stdout" {
                        self.ready.extend(self.splitter.push(&bytes)?);
                    } else {
                        let room = MAX_STDERR.saturating_sub(self.stderr.len());
                        self.stderr
                            .extend_from_slice(&bytes[..bytes.len().min(room)]);
                    }
                }
                Some(ExecEvent::Started { .. }) => {}
                end @ (Some(ExecEvent::Exit { .. }) | None) => {
                    if let Some(ExecEvent::Exit {
                        exit_code,
                        signal,
                        timed_out,
                        duration_ms,
                    }) = end
                    {
                        self.ended =
                            Some(exit_description(exit_code, signal, timed_out, duration_ms));
                    }
                    if self.splitter.leftover() > 0 {
                        return Err(WireError::Truncated("an unfinished line".into()).into());
                    }
                    return Ok(None);
                }
                Some(ExecEvent::Error { message, .. }) => {
                    return Err(CodeError::Server(message));
                }
            }
        }
    }

    /// The single answer of a context request.
    async fn answer(mut self, context: &str) -> Result<GuestLine> {
        match self.next().await? {
            Some(GuestLine::Failure { code, message }) => Err(failure(code, message, context)),
            Some(line) => Ok(line),
            None => {
                Err(CodeError::Server(format!("it answered nothing{}", self.stderr_tail())).into())
            }
        }
    }
}

/// How the relay's exec ended, in words.
fn exit_description(
    exit_code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    duration_ms: u64,
) -> String {
    let after = format!("after {:.1} s", duration_ms as f64 / 1e3);
    match (timed_out, signal, exit_code) {
        (true, ..) => format!("the relay was stopped at its time limit, {after}"),
        (false, Some(sig), _) => format!("the relay was killed by signal {sig} {after}"),
        (false, None, Some(code)) => format!("the relay exited with code {code} {after}"),
        (false, None, None) => format!("the relay ended {after}"),
    }
}

/// The server's refusal of a request about `context`.
fn failure(code: FailureCode, message: String, context: &str) -> Error {
    match code {
        FailureCode::UnknownContext => CodeError::UnknownContext(context.to_string()),
        FailureCode::BadRequest => CodeError::Refused(message),
        FailureCode::LimitReached => CodeError::LimitReached(message),
        FailureCode::KernelFailed | FailureCode::Internal => CodeError::Server(message),
    }
    .into()
}

fn unexpected(line: &GuestLine) -> Error {
    CodeError::Wire(WireError::Invalid(format!(
        "an answer of the wrong kind ({line:?})"
    )))
    .into()
}

impl Manager {
    /// Runs `req` in its context; the events come as the kernel produces them, ending
    /// with `done` (or `failure` if the stream broke). Errors before the execution
    /// starts (no interpreter, unknown context, kernel that will not start) are
    /// returned here, so that they are HTTP errors.
    pub async fn run_code(
        self: &Arc<Self>,
        id: &str,
        req: CodeRequest,
    ) -> Result<mpsc::Receiver<CodeEvent>> {
        req.validate()?;
        let request = execute_request(&req);
        let with_envs = request.get("envs").is_some();
        let mut relay = Relay::start(self, id, request, req.timeout_ms()).await?;
        match relay.next().await? {
            // An older server ignores envs: its execution is stopped (dropping the relay
            // interrupts it) rather than run without them.
            Some(GuestLine::Started { envs: false }) if with_envs => {
                return Err(CodeError::EnvsUnsupported(id.to_string()).into())
            }
            Some(GuestLine::Started { .. }) => {}
            Some(GuestLine::Failure { code, message }) => {
                return Err(failure(code, message, req.context()))
            }
            Some(other) => return Err(unexpected(&other)),
            None => {
                return Err(CodeError::Server(format!(
                    "it ended before starting the execution{}",
                    relay.stderr_tail()
                ))
                .into())
            }
        }
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            // Dropping `relay` (client gone, or done) kills the relay in the guest.
            loop {
                let next = tokio::select! {
                    _ = tx.closed() => return,
                    next = relay.next() => next,
                };
                let event = match next {
                    Ok(Some(GuestLine::Event(event))) => event,
                    Ok(Some(other)) => broken(&unexpected(&other)),
                    Ok(None) => broken(&Error::from(CodeError::Wire(WireError::Truncated(
                        format!("no done line{}", relay.stderr_tail()),
                    )))),
                    Err(e) => broken(&Error::from(e)),
                };
                let last = matches!(event, CodeEvent::Done { .. } | CodeEvent::Failure { .. });
                if tx.send(event).await.is_err() || last {
                    return;
                }
            }
        });
        Ok(rx)
    }

    pub async fn code_contexts(self: &Arc<Self>, id: &str) -> Result<Vec<CodeContext>> {
        let relay = Relay::start(self, id, json!({"op": "list"}), 0).await?;
        match relay.answer("").await? {
            GuestLine::Contexts(list) => Ok(list),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn create_code_context(
        self: &Arc<Self>,
        id: &str,
        req: CreateContextRequest,
    ) -> Result<CodeContext> {
        req.validate()?;
        let request = json!({"op": "create", "cwd": req.cwd});
        let relay = Relay::start(self, id, request, 0).await?;
        match relay.answer("").await? {
            GuestLine::Context(ctx) => Ok(ctx),
            other => Err(unexpected(&other)),
        }
    }

    /// `restart` (a fresh kernel: state lost, the context kept) or `delete`.
    pub async fn code_context_op(
        self: &Arc<Self>,
        id: &str,
        context: &str,
        op: ContextOp,
    ) -> Result<()> {
        validate_context_id(context)?;
        let op = match op {
            ContextOp::Restart => "restart",
            ContextOp::Delete => "delete",
        };
        let request = json!({"op": op, "context": context});
        let relay = Relay::start(self, id, request, 0).await?;
        match relay.answer(context).await? {
            GuestLine::Ok => Ok(()),
            other => Err(unexpected(&other)),
        }
    }
}

/// The code server's `execute` request line for `req` (`envs` only when there are some).
fn execute_request(req: &CodeRequest) -> serde_json::Value {
    let mut request = json!({
        "op": "execute",
        "code": req.code,
        "context": req.context(),
        "timeout_ms": req.timeout_ms(),
    });
    if let Some(envs) = req.envs.as_ref().filter(|e| !e.is_empty()) {
        request["envs"] = json!(envs);
    }
    request
}

#[derive(Debug, Clone, Copy)]
pub enum ContextOp {
    Restart,
    Delete,
}

/// The terminal event of a stream that broke after it started.
fn broken(e: &Error) -> CodeEvent {
    let body = e.body();
    CodeEvent::Failure {
        code: body.error.code,
        message: body.error.message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_early_end_says_how_the_relay_ended() {
        assert_eq!(
            exit_description(None, None, true, 630_000),
            "the relay was stopped at its time limit, after 630.0 s"
        );
        assert_eq!(
            exit_description(None, Some(9), false, 1500),
            "the relay was killed by signal 9 after 1.5 s"
        );
        assert_eq!(
            exit_description(Some(0), None, false, 42),
            "the relay exited with code 0 after 0.0 s"
        );
    }

    #[test]
    fn execute_requests_carry_envs_only_when_given() {
        let mut req = CodeRequest {
            code: "print(1)".into(),
            ..Default::default()
        };
        let plain = json!({"op": "execute", "code": "print(1)", "context": "default",
                           "timeout_ms": 300_000});
        assert_eq!(execute_request(&req), plain);
        req.envs = Some(Default::default());
        assert_eq!(execute_request(&req), plain);
        req.envs = Some([("ZYG_A".to_string(), "1".to_string())].into());
        req.context = Some("c1".into());
        req.timeout_ms = Some(5);
        assert_eq!(
            execute_request(&req),
            json!({"op": "execute", "code": "print(1)", "context": "c1", "timeout_ms": 5,
                   "envs": {"ZYG_A": "1"}})
        );
    }
}
