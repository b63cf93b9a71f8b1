//! Interactive terminals: a program on a pty in the guest, bridged to async callers
//! (the WebSocket route) through two channels.
//!
//! The agent client is blocking. Output is pumped by one blocking-pool task that
//! waits for the pty's events and forwards them into a bounded channel; input and
//! resizes are taken from another channel by an async task, each one sent to the
//! agent on the blocking pool, in order. The agent queues at most 64 KiB of unread
//! input and answers `busy` beyond it: the input task then waits and retries, and
//! meanwhile the bounded input channel pushes back on the caller (the WebSocket
//! reader, and so the client's TCP connection), so a program that does not read its
//! terminal cannot make the daemon buffer without bound.
//!
//! [`PtySession`] holds a guard: dropped before the program ended (the client went
//! away), it kills the program, and the agent then ends the rest of its session.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use zygote_proto::client::{ClientError, PtyControl};
use zygote_proto::{ErrorCode, PtyOpenRequest, MAX_PTY_INPUT};

use super::Manager;
use crate::error::{Error, Result};
use crate::model::PtyQuery;

/// Output messages buffered between the guest and a slow client (each up to 64 KiB).
const OUTPUT_QUEUE: usize = 64;
/// Input messages buffered before the caller has to wait.
const INPUT_QUEUE: usize = 16;
/// Pause before offering input again to a program that has not read the last.
const BUSY_RETRY: Duration = Duration::from_millis(10);

/// What the caller sends to the terminal.
#[derive(Debug)]
pub enum PtyInput {
    /// Keystrokes (any length; sent in pieces the agent takes).
    Data(Vec<u8>),
    /// A new size, already validated.
    Resize { cols: u16, rows: u16 },
}

/// What the terminal sends back.
#[derive(Debug)]
pub enum PtyOutput {
    Data(Vec<u8>),
    /// Terminal: how the program ended.
    Exit {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    /// Terminal: the session broke (the agent went away).
    Failed(Error),
}

/// A running pty. Drop it to end the program.
pub struct PtySession {
    pub pid: u32,
    pub output: mpsc::Receiver<PtyOutput>,
    pub input: mpsc::Sender<PtyInput>,
    _guard: PtyGuard,
}

impl PtySession {
    /// A handle that signals the program while another task owns the session (and
    /// reads its output): what E2B's `kill` of a terminal needs.
    pub fn signaller(&self) -> PtySignaller {
        PtySignaller {
            control: self._guard.control.clone(),
        }
    }
}

/// Sends signals to one pty's program (see [`PtySession::signaller`]).
#[derive(Clone)]
pub struct PtySignaller {
    control: PtyControl,
}

impl PtySignaller {
    /// Sends `signal` to the program; fails once it has ended.
    pub async fn signal(&self, signal: i32) -> Result<()> {
        let control = self.control.clone();
        tokio::task::spawn_blocking(move || control.kill(signal))
            .await
            .map_err(|e| Error::Internal(format!("blocking task failed: {e}")))?
            .map_err(Error::agent)
    }
}

/// Kills the program when dropped before it ended.
struct PtyGuard {
    control: PtyControl,
    sandbox: String,
    ended: Arc<AtomicBool>,
}

impl Drop for PtyGuard {
    fn drop(&mut self) {
        if self.ended.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::info!(sandbox = %self.sandbox, pty = self.control.id(), "pty client went away: killing its program");
        let control = self.control.clone();
        // The kill blocks on the agent's answer: off the runtime, detached.
        drop(tokio::task::spawn_blocking(move || {
            control.kill(libc::SIGKILL)
        }));
    }
}

impl Manager {
    /// Starts `q`'s program on a pty in sandbox `id`, with the sandbox's envs and
    /// secrets and the query's `env` over them. Errors that prevent the start (no
    /// such sandbox, not running, the program cannot start) are returned here, so
    /// they become HTTP statuses before any upgrade.
    pub async fn pty_open(self: &Arc<Self>, id: &str, q: PtyQuery) -> Result<PtySession> {
        let sandbox_env = self.sandbox_row(id)?.env;
        let mut env = sandbox_env.exec_env();
        env.extend(q.env);
        // Checked when the query was parsed; a bad one here is no user change.
        let (uid, gid) = q
            .user
            .as_deref()
            .and_then(|u| zygote_api::model::parse_user(u).ok())
            .map_or((None, None), |(u, g)| (Some(u), Some(g)));
        let req = PtyOpenRequest {
            argv: q.argv,
            env,
            cwd: q.cwd.or(sandbox_env.image.cwd),
            cols: q.cols,
            rows: q.rows,
            uid,
            gid,
        };
        let client = self.agent(id).await?;
        // If this future is dropped meanwhile, the handle is dropped with the
        // blocking task's result, which kills the program.
        let handle = self
            .blocking(move || client.open_pty(req))
            .await?
            .map_err(Error::agent)?;
        let ended = Arc::new(AtomicBool::new(false));
        let control = handle.control();
        let pid = handle.pid();

        let (out_tx, output) = mpsc::channel(OUTPUT_QUEUE);
        let done = ended.clone();
        tokio::task::spawn_blocking(move || {
            // A send fails only once the receiver is gone, and then the guard has
            // killed the program: its exit ends this wait.
            let result = handle.wait(|data| {
                let _ = out_tx.blocking_send(PtyOutput::Data(data.to_vec()));
            });
            done.store(true, Ordering::SeqCst);
            let last = match result {
                Ok(r) => PtyOutput::Exit {
                    exit_code: r.exit_code,
                    signal: r.signal,
                },
                Err(e) => PtyOutput::Failed(Error::agent(e)),
            };
            let _ = out_tx.blocking_send(last);
        });

        let (input, in_rx) = mpsc::channel(INPUT_QUEUE);
        tokio::spawn(forward_input(
            self.clone(),
            control.clone(),
            in_rx,
            ended.clone(),
        ));
        Ok(PtySession {
            pid,
            output,
            input,
            _guard: PtyGuard {
                control,
                sandbox: id.to_string(),
                ended,
            },
        })
    }
}

/// Sends the caller's input and resizes to the agent, in order, until the caller
/// stops or the program ends.
async fn forward_input(
    manager: Arc<Manager>,
    control: PtyControl,
    mut rx: mpsc::Receiver<PtyInput>,
    ended: Arc<AtomicBool>,
) {
    while let Some(msg) = rx.recv().await {
        let sent = match msg {
            PtyInput::Resize { cols, rows } => {
                let c = control.clone();
                manager.blocking(move || c.resize(cols, rows)).await
            }
            PtyInput::Data(data) => send_data(&manager, &control, data, &ended).await,
        };
        match sent {
            Ok(Ok(())) => {}
            // The program ended (the output side reports it) or the agent is gone.
            Ok(Err(e)) => {
                tracing::debug!(pty = control.id(), "pty input: {e}");
                return;
            }
            Err(e) => {
                tracing::warn!(pty = control.id(), "pty input: {e}");
                return;
            }
        }
    }
}

/// `data` in pieces the agent takes, waiting while it reports `busy`.
async fn send_data(
    manager: &Arc<Manager>,
    control: &PtyControl,
    data: Vec<u8>,
    ended: &AtomicBool,
) -> Result<std::result::Result<(), ClientError>> {
    for piece in data.chunks(MAX_PTY_INPUT) {
        loop {
            let (c, piece) = (control.clone(), piece.to_vec());
            match manager.blocking(move || c.input(&piece)).await? {
                Ok(()) => break,
                Err(e) if e.code() == Some(ErrorCode::Busy) && !ended.load(Ordering::SeqCst) => {
                    tokio::time::sleep(BUSY_RETRY).await;
                }
                Err(e) => return Ok(Err(e)),
            }
        }
    }
    Ok(Ok(()))
}
