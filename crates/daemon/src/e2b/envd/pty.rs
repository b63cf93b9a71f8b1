//! envd's terminals: `Start` with `pty` set runs the program on a pty in the guest
//! (zygote's native `pty_open`), and the process service then reaches it by pid
//! (`SendInput` with `pty` input, `Update` to resize, `SendSignal`, `Connect`, `List`).
//!
//! A native [`PtySession`] lives as long as its one client; an E2B terminal outlives
//! the request that started it and is shared by every client that names its pid. So
//! this registry owns each session: one pump task per terminal reads its output and
//! fans it out to the streams that follow it (the `Start` stream first, later
//! `Connect` ones, each seeing output from when it joined, as envd). The entry leaves
//! the registry when the program ends or its sandbox's agent goes away (the session
//! fails), so the map holds running terminals only; it is bounded per sandbox
//! ([`MAX_PTYS_PER_SANDBOX`]) and per terminal ([`MAX_FOLLOWERS`]).
//!
//! Backpressure: the pump waits for each follower to take a message (each has a
//! small queue); a follower whose client went away is dropped, so output is then
//! read and discarded like envd's, while a client that stays connected without
//! reading holds the program back as the native WebSocket does.
//!
//! Start's `connect-timeout-ms` bounds the program (envd cancels its context): at the
//! deadline the pump kills it and the followers' streams end `deadline_exceeded`.
use super::process::Launch;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use base64::Engine;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::connect::{Code, ConnectError};
use crate::manager::{Manager, PtyInput, PtyOutput, PtySession, PtySignaller};
use crate::model::{check_pty_size, ExecEvent, PtyQuery};

/// Terminals one sandbox may hold open through envd (the agent allows 256 in all).
pub const MAX_PTYS_PER_SANDBOX: usize = 64;
/// Streams that may follow one terminal at once.
pub const MAX_FOLLOWERS: usize = 16;
/// Messages queued for one follower before the pump waits for it.
const FOLLOWER_QUEUE: usize = 16;

/// What `List` shows of a process envd started: its `ProcessConfig` and tag.
#[derive(Debug, Clone, Default)]
pub struct Details {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub tag: Option<String>,
}

/// One running terminal.
struct Pty {
    details: Details,
    input: mpsc::Sender<PtyInput>,
    signaller: PtySignaller,
    followers: Vec<mpsc::Sender<ExecEvent>>,
}

/// The running terminals of every sandbox, by sandbox id and pid.
#[derive(Default)]
pub struct Ptys {
    sandboxes: Mutex<HashMap<String, HashMap<u32, Pty>>>,
}

/// `PTY.Size` (`{"cols": C, "rows": R}`), as proto3 JSON (uint32 numbers).
#[derive(Debug, serde::Deserialize)]
pub struct PtySize {
    #[serde(default)]
    cols: u64,
    #[serde(default)]
    rows: u64,
}

impl PtySize {
    /// The size as the agent takes it: each side within zygote's 1..=1000.
    pub fn checked(&self) -> Result<(u16, u16), ConnectError> {
        let side = |n: u64| u16::try_from(n).unwrap_or(0);
        let (cols, rows) = (side(self.cols), side(self.rows));
        check_pty_size(cols, rows)
            .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("pty.size: {e}")))?;
        Ok((cols, rows))
    }
}

/// `PTY`: `{"size": PTY.Size}`.
#[derive(Debug, serde::Deserialize)]
pub struct PtyRequest {
    pub size: Option<PtySize>,
}

impl PtyRequest {
    pub fn size(&self) -> Result<(u16, u16), ConnectError> {
        match &self.size {
            Some(size) => size.checked(),
            None => Err(ConnectError::new(
                Code::InvalidArgument,
                "pty.size: the terminal's cols and rows are required",
            )),
        }
    }
}

fn too_many(what: String) -> ConnectError {
    ConnectError::new(Code::ResourceExhausted, what)
}

impl Ptys {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, HashMap<u32, Pty>>) -> T) -> T {
        let mut guard = self.sandboxes.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    fn open_count(&self, sandbox: &str) -> usize {
        self.with(|s| s.get(sandbox).map_or(0, HashMap::len))
    }

    /// Starts `details`' program on a `cols`x`rows` terminal in sandbox `id`; the
    /// answer is its pid and the first follower (the Start stream's).
    pub async fn open(
        self: &Arc<Self>,
        manager: &Arc<Manager>,
        id: &str,
        details: Details,
        launch: Launch,
        (cols, rows): (u16, u16),
        deadline: Option<Instant>,
    ) -> Result<(u32, mpsc::Receiver<ExecEvent>), ConnectError> {
        let full = || {
            too_many(format!(
                "sandbox has {MAX_PTYS_PER_SANDBOX} terminals open, as many as zygote's envd allows"
            ))
        };
        if self.open_count(id) >= MAX_PTYS_PER_SANDBOX {
            return Err(full());
        }
        let mut argv = vec![details.cmd.clone()];
        argv.extend(details.args.iter().cloned());
        let query = PtyQuery {
            cols,
            rows,
            argv,
            env: launch.env,
            cwd: Some(launch.cwd),
            user: Some(launch.user),
        };
        let session = manager
            .pty_open(id, query)
            .await
            .map_err(|e| ConnectError::from_zygote(&e))?;
        let pid = session.pid;
        let (tx, rx) = mpsc::channel(FOLLOWER_QUEUE);
        let pty = Pty {
            details,
            input: session.input.clone(),
            signaller: session.signaller(),
            followers: vec![tx],
        };
        let registered = self.with(|s| {
            let ptys = s.entry(id.to_string()).or_default();
            if ptys.len() >= MAX_PTYS_PER_SANDBOX {
                return false;
            }
            ptys.insert(pid, pty);
            true
        });
        if !registered {
            // Dropping the session kills the program.
            return Err(full());
        }
        tokio::spawn(self.clone().pump(id.to_string(), session, deadline));
        Ok((pid, rx))
    }

    /// Reads the terminal's output until the program ends and hands each message to
    /// the followers; the entry goes before the last message, so a pid that ended
    /// is not found any more.
    async fn pump(
        self: Arc<Self>,
        sandbox: String,
        mut session: PtySession,
        deadline: Option<Instant>,
    ) {
        let pid = session.pid;
        let mut timed_out = false;
        loop {
            let next = tokio::select! {
                out = session.output.recv() => out,
                _ = sleep_until(deadline), if !timed_out => {
                    timed_out = true;
                    if let Err(e) = session.signaller().signal(libc::SIGKILL).await {
                        tracing::debug!(sandbox, pid, "killing a pty at its timeout: {e}");
                    }
                    continue;
                }
            };
            let last = match next {
                Some(PtyOutput::Data(data)) => {
                    let event = ExecEvent::Output {
                        stream: "pty".into(),
                        data: base64::engine::general_purpose::STANDARD.encode(data),
                    };
                    self.fan_out(&sandbox, pid, event).await;
                    continue;
                }
                Some(PtyOutput::Exit { exit_code, signal }) => ExecEvent::Exit {
                    exit_code,
                    signal,
                    timed_out,
                    duration_ms: 0,
                },
                Some(PtyOutput::Failed(e)) => ExecEvent::Error {
                    code: e.status_code().1.to_string(),
                    message: e.to_string(),
                },
                None => ExecEvent::Error {
                    code: "agent_unreachable".into(),
                    message: "the terminal's session ended without an exit".into(),
                },
            };
            let followers = self.with(|s| {
                let ptys = s.get_mut(&sandbox)?;
                let pty = ptys.remove(&pid);
                if ptys.is_empty() {
                    s.remove(&sandbox);
                }
                pty.map(|p| p.followers)
            });
            for follower in followers.unwrap_or_default() {
                let _ = follower.send(last.clone()).await;
            }
            return;
        }
    }

    /// `event` to every follower of the terminal, forgetting those that went away.
    async fn fan_out(&self, sandbox: &str, pid: u32, event: ExecEvent) {
        let followers = self.with(|s| {
            s.get(sandbox)
                .and_then(|p| p.get(&pid))
                .map(|p| p.followers.clone())
        });
        let mut gone = false;
        for follower in followers.unwrap_or_default() {
            gone |= follower.send(event.clone()).await.is_err();
        }
        if gone {
            self.with(|s| {
                if let Some(pty) = s.get_mut(sandbox).and_then(|p| p.get_mut(&pid)) {
                    pty.followers.retain(|f| !f.is_closed());
                }
            });
        }
    }

    /// Whether `pid` is one of sandbox `id`'s running terminals.
    pub fn has(&self, id: &str, pid: u32) -> bool {
        self.with(|s| s.get(id).is_some_and(|p| p.contains_key(&pid)))
    }

    /// A new follower of terminal `pid`, from its next output on; `None` when `pid`
    /// is not a running terminal of sandbox `id`.
    pub fn follow(
        &self,
        id: &str,
        pid: u32,
    ) -> Option<Result<mpsc::Receiver<ExecEvent>, ConnectError>> {
        self.with(|s| {
            let pty = s.get_mut(id)?.get_mut(&pid)?;
            pty.followers.retain(|f| !f.is_closed());
            if pty.followers.len() >= MAX_FOLLOWERS {
                return Some(Err(too_many(format!(
                    "terminal {pid} has {MAX_FOLLOWERS} streams following it, as many as zygote's envd allows"
                ))));
            }
            let (tx, rx) = mpsc::channel(FOLLOWER_QUEUE);
            pty.followers.push(tx);
            Some(Ok(rx))
        })
    }

    fn input(&self, id: &str, pid: u32) -> Option<mpsc::Sender<PtyInput>> {
        self.with(|s| Some(s.get(id)?.get(&pid)?.input.clone()))
    }

    /// Sends `msg` to terminal `pid`: `None` when it is not one of `id`'s terminals.
    pub async fn send(
        &self,
        id: &str,
        pid: u32,
        msg: PtyInput,
    ) -> Option<Result<(), ConnectError>> {
        let input = self.input(id, pid)?;
        Some(input.send(msg).await.map_err(|_| ended(pid)))
    }

    /// Sends `signal` to terminal `pid`'s program: `None` when it is not one of `id`'s.
    pub async fn signal(
        &self,
        id: &str,
        pid: u32,
        signal: i32,
    ) -> Option<Result<(), ConnectError>> {
        let signaller = self.with(|s| Some(s.get(id)?.get(&pid)?.signaller.clone()))?;
        Some(signaller.signal(signal).await.map_err(|_| ended(pid)))
    }

    /// The pid and details of every running terminal of sandbox `id`.
    pub fn list(&self, id: &str) -> Vec<(u32, Details)> {
        self.with(|s| {
            s.get(id)
                .map(|p| p.iter().map(|(pid, p)| (*pid, p.details.clone())).collect())
                .unwrap_or_default()
        })
    }

    /// The running terminal of sandbox `id` started with `tag`.
    pub fn by_tag(&self, id: &str, tag: &str) -> Option<u32> {
        self.with(|s| {
            s.get(id)?
                .iter()
                .find(|(_, p)| p.details.tag.as_deref() == Some(tag))
                .map(|(pid, _)| *pid)
        })
    }
}

/// envd's answer about a pid whose program has just ended.
fn ended(pid: u32) -> ConnectError {
    ConnectError::new(Code::NotFound, format!("process with pid {pid} not found"))
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked_as_zygotes_terminals() {
        let size = |j: &str| serde_json::from_str::<PtyRequest>(j).unwrap().size();
        assert_eq!(size(r#"{"size":{"cols":80,"rows":24}}"#).unwrap(), (80, 24));
        for bad in [
            r#"{"size":{"cols":0,"rows":24}}"#,
            r#"{"size":{"cols":80}}"#,
            r#"{"size":{"cols":1001,"rows":24}}"#,
            r#"{"size":{"cols":65616,"rows":24}}"#,
            r#"{"size":{"cols":4294967295,"rows":4294967295}}"#,
            "{}",
        ] {
            assert_eq!(size(bad).unwrap_err().code, Code::InvalidArgument, "{bad}");
        }
    }
}
