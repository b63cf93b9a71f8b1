//! The entries the manager writes to a sandbox's event log ([`crate::event_log`]) for
//! the commands run in it: what ran, as whom, and how it ended. Never the command's
//! environment (secrets travel there) and never its output (the guest's words).
use std::sync::Arc;

use tokio::sync::mpsc;

use super::Manager;
use crate::model::{EventLevel, ExecEvent, ExecRequest};

/// How a command ended, as the agent reported it.
pub(super) struct Ended {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
}

impl Manager {
    /// `command started`: its argv, user, cwd, pid and how it was run (`exec`,
    /// `stream`, `background`).
    pub(super) fn note_command_started(
        &self,
        id: &str,
        req: &ExecRequest,
        pid: Option<u32>,
        how: &str,
    ) {
        let mut fields = vec![("cmd", command_line(&req.argv)), ("mode", how.to_string())];
        if let Some(pid) = pid {
            fields.push(("pid", pid.to_string()));
        }
        if let Some(user) = &req.user {
            fields.push(("user", user.clone()));
        }
        if let Some(cwd) = &req.cwd {
            fields.push(("cwd", cwd.clone()));
        }
        self.event_log
            .record(id, EventLevel::Info, "command started", &fields);
    }

    /// `command ended`: a warning when it failed, was killed or timed out.
    pub(super) fn note_command_ended(&self, id: &str, req: &ExecRequest, end: &Ended) {
        let mut fields = vec![
            ("cmd", command_line(&req.argv)),
            ("duration_ms", end.duration_ms.to_string()),
        ];
        if let Some(code) = end.exit_code {
            fields.push(("exit_code", code.to_string()));
        }
        if let Some(signal) = end.signal {
            fields.push(("signal", signal.to_string()));
        }
        if end.timed_out {
            fields.push(("timed_out", "true".into()));
        }
        let clean = end.exit_code == Some(0) && !end.timed_out;
        let level = if clean {
            EventLevel::Info
        } else {
            EventLevel::Warn
        };
        self.event_log.record(id, level, "command ended", &fields);
    }
}

impl Manager {
    /// `events` (a follower of a process started in the background for `req`) passed
    /// on unchanged, and `command ended` written when it reports the end. Only the
    /// caller that started the process wraps its follower, so an end is written once;
    /// a client that goes away before the end takes the relay with it (the end is then
    /// not written: nothing follows the process any more).
    pub(crate) fn noting_the_end(
        self: &Arc<Self>,
        id: &str,
        req: &ExecRequest,
        mut events: mpsc::Receiver<ExecEvent>,
    ) -> mpsc::Receiver<ExecEvent> {
        let (tx, rx) = mpsc::channel(16);
        let (this, id) = (self.clone(), id.to_string());
        let req = ExecRequest {
            argv: req.argv.clone(),
            ..Default::default()
        };
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                if let ExecEvent::Exit {
                    exit_code,
                    signal,
                    timed_out,
                    duration_ms,
                } = &event
                {
                    let end = Ended {
                        exit_code: *exit_code,
                        signal: *signal,
                        timed_out: *timed_out,
                        duration_ms: *duration_ms,
                    };
                    this.note_command_ended(&id, &req, &end);
                }
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        });
        rx
    }
}

/// `argv` as one line, each word quoted when it is not plain.
fn command_line(argv: &[String]) -> String {
    argv.iter()
        .map(|w| {
            let plain = !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
            if plain {
                w.clone()
            } else {
                format!("{w:?}")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::command_line;

    #[test]
    fn words_that_are_not_plain_are_quoted() {
        let argv = ["bash", "-c", "echo 'hi there'", ""].map(String::from);
        assert_eq!(command_line(&argv), r#"bash -c "echo 'hi there'" """#);
    }
}
