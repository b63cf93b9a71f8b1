//! Background process bodies: a process as the API shows it, the output query, and
//! the stdin and signal requests.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use zygote_proto::process::{ProcessInfo, ProcessState, MAX_OUTPUT_WAIT_MS};

use super::{in_range, Validate, MAX_STDIN_BYTES};
use crate::error::{RequestError, Result};

/// A program started with `POST .../exec {"background": true}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Process {
    /// Its pid in the guest (also its process group id): the id the process routes take.
    pub pid: u32,
    pub argv: Vec<String>,
    /// `running` or `exited` (ended, and all its output collected).
    pub state: String,
    /// Exit status, once it exited normally.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Killed because its `timeout_ms` expired.
    pub timed_out: bool,
    /// How long it ran, once it has ended.
    pub duration_ms: Option<u64>,
    /// When it started, by the guest's clock (unix milliseconds).
    pub started_at_ms: u64,
    /// Bytes printed so far, stdout and stderr together: the `offset` of the next output.
    pub output_bytes: u64,
    /// Its stdin still takes data (`POST .../stdin`).
    pub stdin_open: bool,
}

impl From<ProcessInfo> for Process {
    fn from(p: ProcessInfo) -> Self {
        let exit = p.exit.unwrap_or_default();
        Process {
            pid: p.pid,
            argv: p.argv,
            state: match p.state {
                ProcessState::Running => "running",
                ProcessState::Exited => "exited",
            }
            .into(),
            exit_code: exit.exit_code,
            signal: exit.signal,
            timed_out: exit.timed_out,
            duration_ms: (p.state == ProcessState::Exited).then_some(exit.duration_ms),
            started_at_ms: p.started_unix_ms,
            output_bytes: p.output_bytes,
            stdin_open: p.stdin_open,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProcessList {
    /// Oldest first. The guest keeps the 256 most recent.
    pub processes: Vec<Process>,
}

/// The query of `GET .../processes/{pid}/output`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OutputQuery {
    /// Read from this byte offset, counted over stdout and stderr together (default 0).
    /// The guest keeps the last 1 MiB of each process's output.
    #[serde(default)]
    pub offset: Option<u64>,
    /// With nothing new yet, wait up to this long for output or the end
    /// (0..=30000 ms, default 0).
    #[serde(default)]
    #[param(minimum = 0, maximum = 30000)]
    pub wait_ms: Option<u64>,
    /// Stream NDJSON instead (the lines of `POST .../exec/stream`, without `started`):
    /// output as it is printed, from `offset`, then `exit`.
    #[serde(default)]
    pub follow: Option<bool>,
}

impl Validate for OutputQuery {
    fn validate(&self) -> Result<()> {
        if let Some(w) = self.wait_ms {
            in_range("wait_ms", w, 0, MAX_OUTPUT_WAIT_MS)?;
        }
        Ok(())
    }
}

/// Output of a background process from an offset, decoded as UTF-8 (invalid sequences
/// replaced; `follow=true` gives the exact bytes).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProcessOutput {
    pub stdout: String,
    pub stderr: String,
    /// Where this output starts: the `offset` asked, or later if older output was
    /// dropped (`dropped_bytes` says how much).
    pub offset: u64,
    /// The `offset` to read next.
    pub next_offset: u64,
    pub dropped_bytes: u64,
    /// The process as of this answer: once `exited` with `next_offset` equal to its
    /// `output_bytes`, everything has been read.
    pub process: Process,
}

/// `POST .../processes/{pid}/stdin`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StdinRequest {
    /// UTF-8 text to write (at most 8 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Or exact bytes, base64 (at most 8 MiB decoded); not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_base64: Option<String>,
    /// Close stdin afterwards (the program reads end of file).
    #[serde(default)]
    pub eof: bool,
}

impl StdinRequest {
    /// The bytes to write; checks the request on the way.
    pub fn bytes(&self) -> Result<Vec<u8>> {
        let bytes = match (&self.data, &self.data_base64) {
            (Some(_), Some(_)) => {
                return Err(RequestError::invalid("give data or data_base64, not both"));
            }
            (Some(text), None) => text.clone().into_bytes(),
            (None, Some(b)) => zygote_proto::b64::decode(b)
                .map_err(|e| RequestError::invalid(format!("data_base64: {e}")))?,
            (None, None) => Vec::new(),
        };
        if bytes.len() > MAX_STDIN_BYTES {
            return Err(RequestError::invalid(format!(
                "stdin data exceeds {MAX_STDIN_BYTES} bytes"
            )));
        }
        if bytes.is_empty() && !self.eof {
            return Err(RequestError::invalid("nothing to do: no data and no eof"));
        }
        Ok(bytes)
    }
}

/// A signal by name (`SIGINT`, `INT`, `interrupt`... see [`SignalRequest`]) or number.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub enum SignalSpec {
    Number(i64),
    Name(String),
}

/// `POST .../processes/{pid}/signal`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// 1..=64, or a name: `SIGKILL`/`KILL`/`kill`, `SIGTERM`, `SIGINT` (also
    /// `interrupt`), `SIGHUP`, `SIGQUIT`, `SIGUSR1`, `SIGUSR2`, `SIGSTOP`, `SIGCONT`.
    pub signal: SignalSpec,
}

const SIGNAL_NAMES: [(&str, i32); 9] = [
    ("KILL", libc::SIGKILL),
    ("TERM", libc::SIGTERM),
    ("INT", libc::SIGINT),
    ("HUP", libc::SIGHUP),
    ("QUIT", libc::SIGQUIT),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("STOP", libc::SIGSTOP),
    ("CONT", libc::SIGCONT),
];

impl SignalRequest {
    /// The signal number.
    pub fn number(&self) -> Result<i32> {
        match &self.signal {
            SignalSpec::Number(n) => {
                in_range("signal", (*n).max(0) as u64, 1, 64)?;
                Ok(*n as i32)
            }
            SignalSpec::Name(name) => {
                let upper = name.to_ascii_uppercase();
                let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
                let bare = if bare == "INTERRUPT" { "INT" } else { bare };
                SIGNAL_NAMES
                    .iter()
                    .find(|(n, _)| *n == bare)
                    .map(|(_, s)| *s)
                    .ok_or_else(|| {
                        RequestError::invalid(format!(
                            "unknown signal {name:?} (a number 1..=64 or one of {})",
                            SIGNAL_NAMES.map(|(n, _)| format!("SIG{n}")).join(", ")
                        ))
                    })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signal(v: serde_json::Value) -> Result<i32> {
        serde_json::from_value::<SignalRequest>(serde_json::json!({ "signal": v }))
            .unwrap()
            .number()
    }

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(signal("SIGINT".into()).unwrap(), libc::SIGINT);
        assert_eq!(signal("int".into()).unwrap(), libc::SIGINT);
        assert_eq!(signal("interrupt".into()).unwrap(), libc::SIGINT);
        assert_eq!(signal("kill".into()).unwrap(), libc::SIGKILL);
        assert_eq!(signal(15.into()).unwrap(), 15);
        assert_eq!(signal(64.into()).unwrap(), 64);
        for bad in [
            serde_json::json!(0),
            serde_json::json!(65),
            serde_json::json!(-9),
            serde_json::json!("SIGNOPE"),
            serde_json::json!(""),
        ] {
            assert!(signal(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn stdin_takes_text_or_base64_not_both_and_not_nothing() {
        let text = StdinRequest {
            data: Some("hi\n".into()),
            ..Default::default()
        };
        assert_eq!(text.bytes().unwrap(), b"hi\n");
        let raw = StdinRequest {
            data_base64: Some("AAE=".into()),
            ..Default::default()
        };
        assert_eq!(raw.bytes().unwrap(), [0, 1]);
        let both = StdinRequest {
            data: Some("a".into()),
            data_base64: Some("YQ==".into()),
            eof: false,
        };
        assert!(both.bytes().is_err());
        assert!(StdinRequest::default().bytes().is_err());
        let eof_only = StdinRequest {
            eof: true,
            ..Default::default()
        };
        assert_eq!(eof_only.bytes().unwrap(), b"");
        let bad = StdinRequest {
            data_base64: Some("!!".into()),
            ..Default::default()
        };
        assert!(bad.bytes().is_err());
    }

    #[test]
    fn the_output_wait_is_bounded() {
        let q = OutputQuery {
            wait_ms: Some(MAX_OUTPUT_WAIT_MS + 1),
            ..Default::default()
        };
        assert!(q.validate().is_err());
        assert!(OutputQuery::default().validate().is_ok());
    }
}
