//! Exec bodies: the request (with its bounds, including the guest agent's frame
//! limit) and the two forms of its result.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use zygote_proto::{Request as AgentRequest, RequestFrame, MAX_FRAME_LEN};

use super::{in_range, validate_guest_path, Validate};
use super::{MAX_ARGV, MAX_EXEC_TIMEOUT_MS, MAX_STDIN_BYTES};
use crate::error::{RequestError, Result};

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Program and arguments (`argv[0]` is searched in the guest's PATH), 1..=4096
    /// entries without NUL. argv, env, cwd and stdin (base64) together must fit the
    /// guest agent's 16 MiB frame; a larger request is refused with 413.
    #[schema(min_items = 1, max_items = 4096)]
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Absolute working directory in the guest (at most 4096 bytes).
    #[serde(default)]
    #[schema(pattern = "^/[^\\u0000]*$")]
    pub cwd: Option<String>,
    /// UTF-8 text written to stdin (then closed), at most 8 MiB; `/dev/null` when absent.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Wall-clock limit in milliseconds (1..=86400000, a day).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 86400000)]
    pub timeout_ms: Option<u64>,
    /// Start it in the background and answer at once (202, with the process): it keeps
    /// running after this request, its stdin stays open (`stdin` is written first), and
    /// its output is kept in the guest for `GET .../processes/{pid}/output`. Not with
    /// `exec/stream`.
    #[serde(default)]
    pub background: bool,
    /// Run as `UID:GID`, `UID` (group 0) or `root` (docker's `exec -u` with numeric
    /// ids). Absent: the sandbox's OCI image's `User` if it names one, else root.
    #[serde(default)]
    #[schema(pattern = "^(root|[0-9]{1,10}(:[0-9]{1,10})?)$")]
    pub user: Option<String>,
}

impl ExecRequest {
    /// The request as the guest agent receives it.
    pub fn to_agent(&self) -> zygote_proto::ExecRequest {
        let (uid, gid) = self
            .user
            .as_deref()
            .and_then(|u| parse_user(u).ok())
            .map_or((None, None), |(u, g)| (Some(u), Some(g)));
        zygote_proto::ExecRequest {
            argv: self.argv.clone(),
            env: self.env.clone(),
            cwd: self.cwd.clone(),
            stdin: self.stdin.as_ref().map(|s| s.clone().into_bytes()),
            timeout_ms: self.timeout_ms,
            uid,
            gid,
            ..Default::default()
        }
    }

    /// Bytes of the agent frame that carries this request (with the widest id), so
    /// one the agent cannot take is refused as the client's mistake (413) before a
    /// sandbox is involved, not failed as a broken agent channel (502).
    pub fn agent_frame_len(&self) -> usize {
        // stdin (up to 8 MiB) travels as base64: sized by formula, not encoded twice.
        let bare = ExecRequest {
            argv: self.argv.clone(),
            env: self.env.clone(),
            cwd: self.cwd.clone(),
            stdin: None,
            timeout_ms: self.timeout_ms,
            background: false,
            user: self.user.clone(),
        };
        let frame = RequestFrame {
            id: u64::MAX,
            request: AgentRequest::Exec(bare.to_agent()),
        };
        let mut count = ByteCount(0);
        serde_json::to_writer(&mut count, &frame).expect("exec frames serialize");
        let stdin = self.stdin.as_ref().map_or(0, |s| {
            r#","stdin":"""#.len() + zygote_proto::b64::encoded_len(s.len())
        });
        count.0 + stdin
    }
}

/// `root`, `UID` (with group 0: the daemon does not read the guest's /etc/passwd, so
/// it does as docker does for a uid it cannot find there) or `UID:GID`.
pub fn parse_user(u: &str) -> Result<(u32, u32)> {
    let bad = || RequestError::invalid(format!("user {u:?}: expected root, UID or UID:GID"));
    if u == "root" {
        return Ok((0, 0));
    }
    let (uid, gid) = match u.split_once(':') {
        Some((a, b)) => (a, b),
        None => (u, "0"),
    };
    Ok((
        uid.parse().map_err(|_| bad())?,
        gid.parse().map_err(|_| bad())?,
    ))
}

/// An `io::Write` that only counts, to size an encoding without keeping it.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Validate for ExecRequest {
    fn validate(&self) -> Result<()> {
        if self.argv.is_empty() || self.argv[0].is_empty() {
            return Err(RequestError::invalid("argv must name a program"));
        }
        if self.argv.len() > MAX_ARGV {
            return Err(RequestError::invalid(format!(
                "argv has more than {MAX_ARGV} entries"
            )));
        }
        if self.argv.iter().any(|a| a.contains('\0')) {
            return Err(RequestError::invalid("argv entries must not contain NUL"));
        }
        for (k, v) in &self.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(RequestError::invalid(format!(
                    "bad environment variable {k:?}"
                )));
            }
        }
        if let Some(cwd) = &self.cwd {
            validate_guest_path(cwd)?;
        }
        if self
            .stdin
            .as_ref()
            .is_some_and(|s| s.len() > MAX_STDIN_BYTES)
        {
            return Err(RequestError::invalid(format!(
                "stdin exceeds {MAX_STDIN_BYTES} bytes"
            )));
        }
        if let Some(t) = self.timeout_ms {
            in_range("timeout_ms", t, 1, MAX_EXEC_TIMEOUT_MS)?;
        }
        if let Some(u) = &self.user {
            parse_user(u)?;
        }
        // Last: it encodes the whole request, so it runs only for one otherwise valid.
        let len = self.agent_frame_len();
        if len > MAX_FRAME_LEN {
            return Err(RequestError::AgentRequestTooLarge {
                len,
                limit: MAX_FRAME_LEN,
            });
        }
        Ok(())
    }
}

/// Result of a non-streaming exec. Output is decoded as UTF-8 (invalid
/// sequences replaced); use the streaming form for exact bytes.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExecResponse {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub stdout: String,
    pub stderr: String,
}

/// One line of the NDJSON stream of `POST .../exec/stream`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    /// The program runs (pid in the guest).
    Started { pid: u32 },
    /// A chunk of output; `data` is base64 of the exact bytes.
    Output { stream: String, data: String },
    /// Terminal: how it ended.
    Exit {
        exit_code: Option<i32>,
        signal: Option<i32>,
        timed_out: bool,
        duration_ms: u64,
    },
    /// Terminal: it could not run or the sandbox went away.
    Error { code: String, message: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_request_checks() {
        assert!(ExecRequest::default().validate().is_err());
        let mut r = ExecRequest {
            argv: vec!["true".into()],
            ..Default::default()
        };
        assert!(r.validate().is_ok());
        r.cwd = Some("relative".into());
        assert!(r.validate().is_err());
        r.cwd = None;
        for (user, ok) in [
            ("root", true),
            ("0", true),
            ("1000:100", true),
            ("app", false),
            ("1:", false),
            ("-1", false),
            ("1:2:3", false),
        ] {
            r.user = Some(user.into());
            assert_eq!(r.validate().is_ok(), ok, "{user}");
        }
        assert_eq!(
            (r.to_agent().uid, r.to_agent().gid),
            (None, None),
            "an invalid user is refused, never run"
        );
        r.user = Some("1000".into());
        assert_eq!((r.to_agent().uid, r.to_agent().gid), (Some(1000), Some(0)));
        r.user = None;
        r.env.insert("A=B".into(), "x".into());
        assert!(r.validate().is_err());
    }

    #[test]
    fn the_agent_frame_size_is_exact_and_bounds_the_request() {
        for (stdin, user) in [
            (None, None),
            (Some(""), Some("root")),
            (Some("a"), None),
            (Some("ab"), Some("1000:1000")),
            (Some("abc"), Some("4294967295")),
            (Some("h\u{e9}llo"), None),
        ] {
            let r = ExecRequest {
                argv: vec!["echo".into(), "a\"b\n\u{1}".into()],
                env: BTreeMap::from([("K".into(), "v\t".into())]),
                cwd: Some("/tmp".into()),
                stdin: stdin.map(str::to_string),
                timeout_ms: Some(5),
                background: false,
                user: user.map(str::to_string),
            };
            let frame = RequestFrame {
                id: u64::MAX,
                request: AgentRequest::Exec(r.to_agent()),
            };
            let encoded = serde_json::to_vec(&frame).unwrap();
            assert_eq!(r.agent_frame_len(), encoded.len(), "stdin {stdin:?}");
        }

        // Within every other bound (one argument, 8 MiB of stdin) yet too large for
        // one frame: stdin grows by a third in base64.
        let big = ExecRequest {
            argv: vec!["cat".into(), "x".repeat(6 << 20)],
            stdin: Some("y".repeat(MAX_STDIN_BYTES)),
            ..Default::default()
        };
        match big.validate() {
            Err(RequestError::AgentRequestTooLarge { len, limit }) => {
                assert_eq!(limit, MAX_FRAME_LEN);
                assert_eq!(len, big.agent_frame_len());
                assert!(len > limit);
            }
            other => panic!("expected AgentRequestTooLarge, got {other:?}"),
        }
    }
}
