//! `GET /v1/sandboxes/{id}/pty`: its query string and the JSON control messages of
//! the WebSocket (binary messages are raw terminal bytes and need no type).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use zygote_proto::MAX_PTY_DIM;

use super::{validate_guest_path, MAX_ARGV};
use crate::error::{RequestError, Result};

/// The WebSocket subprotocol the daemon selects (a client offers it alongside a token
/// entry).
pub const PTY_PROTOCOL: &str = "zygote.pty.v1";

/// The query of a pty request: `?cols=80&rows=24&cmd=bash&cmd=-l&env=K=V&cwd=/root&user=1000:1000`.
/// `cmd` and `env` repeat (argv in order; one `KEY=VALUE` each), so they are parsed
/// from the raw query rather than by serde.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PtyQuery {
    pub cols: u16,
    pub rows: u16,
    /// Empty: the guest user's login shell.
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    /// Run as `root`, `UID` or `UID:GID` (as exec's `user`); absent: the agent's user.
    pub user: Option<String>,
}

/// Most variables one pty request sets (on top of the sandbox's own).
pub const MAX_PTY_ENV: usize = 128;

fn out_of_range(name: &str, value: &str) -> RequestError {
    RequestError::invalid(format!(
        "{name} must be an integer in 1..={MAX_PTY_DIM}, got {value}"
    ))
}

fn dimension(name: &str, value: &str) -> Result<u16> {
    value
        .parse::<u16>()
        .ok()
        .filter(|n| (1..=MAX_PTY_DIM).contains(n))
        .ok_or_else(|| out_of_range(name, &format!("{value:?}")))
}

/// Checks a terminal size (a resize message's).
pub fn check_pty_size(cols: u16, rows: u16) -> Result<()> {
    for (name, n) in [("cols", cols), ("rows", rows)] {
        if !(1..=MAX_PTY_DIM).contains(&n) {
            return Err(out_of_range(name, &n.to_string()));
        }
    }
    Ok(())
}

impl PtyQuery {
    /// Parses and validates a raw query string; unknown parameters are refused.
    pub fn parse(query: Option<&str>) -> Result<PtyQuery> {
        let mut q = PtyQuery::default();
        let (mut cols, mut rows) = (None, None);
        for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            let once = |seen: bool| {
                if seen {
                    Err(RequestError::invalid(format!("{name} given twice")))
                } else {
                    Ok(())
                }
            };
            match &*name {
                "cols" => {
                    once(cols.is_some())?;
                    cols = Some(dimension("cols", &value)?);
                }
                "rows" => {
                    once(rows.is_some())?;
                    rows = Some(dimension("rows", &value)?);
                }
                "cwd" => {
                    once(q.cwd.is_some())?;
                    validate_guest_path(&value)?;
                    q.cwd = Some(value.into_owned());
                }
                "user" => {
                    once(q.user.is_some())?;
                    super::exec::parse_user(&value)?;
                    q.user = Some(value.into_owned());
                }
                "cmd" => {
                    if value.contains('\0') || (q.argv.is_empty() && value.is_empty()) {
                        return Err(RequestError::invalid(
                            "cmd entries must not contain NUL, and the first names a program",
                        ));
                    }
                    if q.argv.len() >= MAX_ARGV {
                        return Err(RequestError::invalid(format!(
                            "more than {MAX_ARGV} cmd entries"
                        )));
                    }
                    q.argv.push(value.into_owned());
                }
                "env" => {
                    let Some((k, v)) = value.split_once('=') else {
                        return Err(RequestError::invalid(format!(
                            "env {value:?}: want KEY=VALUE"
                        )));
                    };
                    if k.is_empty() || k.contains('\0') || v.contains('\0') {
                        return Err(RequestError::invalid(format!(
                            "bad environment variable {k:?}"
                        )));
                    }
                    if q.env.len() >= MAX_PTY_ENV {
                        return Err(RequestError::invalid(format!(
                            "more than {MAX_PTY_ENV} env entries"
                        )));
                    }
                    q.env.insert(k.to_string(), v.to_string());
                }
                other => {
                    return Err(RequestError::invalid(format!(
                        "unknown query parameter {other:?} (cols, rows, cmd, env, cwd, user)"
                    )))
                }
            }
        }
        q.cols = cols.ok_or_else(|| RequestError::invalid("cols is required"))?;
        q.rows = rows.ok_or_else(|| RequestError::invalid("rows is required"))?;
        Ok(q)
    }
}

/// A JSON (text) message from the client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum PtyClientMessage {
    /// New terminal size (each 1..=1000); a bad one is answered with an `error`
    /// message and changes nothing.
    Resize { cols: u16, rows: u16 },
}

/// A JSON (text) message from the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PtyServerMessage {
    /// The program ended (exactly one of the two is set); the daemon closes the
    /// WebSocket next.
    Exit {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    /// A control message was refused (the session goes on), or the session failed
    /// (then the WebSocket is closed next). `code` as in the API's errors.
    Error { code: String, message: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_parse_in_order_and_are_validated() {
        let q = PtyQuery::parse(Some(
            "cols=80&rows=24&cmd=sh&cmd=-c&cmd=echo%20a%26b&env=A=1&env=B=x%3Dy&cwd=/tmp",
        ))
        .unwrap();
        assert_eq!((q.cols, q.rows), (80, 24));
        assert_eq!(q.argv, ["sh", "-c", "echo a&b"]);
        assert_eq!(q.env["B"], "x=y");
        assert_eq!(q.cwd.as_deref(), Some("/tmp"));
        assert!(PtyQuery::parse(Some("cols=80&rows=24"))
            .unwrap()
            .argv
            .is_empty());
        for bad in [
            "",
            "cols=80",
            "rows=24",
            "cols=0&rows=24",
            "cols=80&rows=1001",
            "cols=-1&rows=24",
            "cols=x&rows=24",
            "cols=80&rows=24&cols=81",
            "cols=80&rows=24&cwd=rel",
            "cols=80&rows=24&env=NOEQ",
            "cols=80&rows=24&env==v",
            "cols=80&rows=24&cmd=",
            "cols=80&rows=24&cmd=a%00",
            "cols=80&rows=24&bogus=1",
        ] {
            assert!(PtyQuery::parse(Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn control_messages() {
        let m: PtyClientMessage =
            serde_json::from_str(r#"{"type":"resize","cols":100,"rows":30}"#).unwrap();
        assert_eq!(
            m,
            PtyClientMessage::Resize {
                cols: 100,
                rows: 30
            }
        );
        assert!(serde_json::from_str::<PtyClientMessage>(r#"{"type":"nope"}"#).is_err());
        let exit = PtyServerMessage::Exit {
            exit_code: Some(3),
            signal: None,
        };
        assert_eq!(
            serde_json::to_string(&exit).unwrap(),
            r#"{"type":"exit","exit_code":3,"signal":null}"#
        );
        assert!(check_pty_size(1000, 1).is_ok());
        assert!(check_pty_size(1001, 1).is_err());
        assert!(check_pty_size(1, 0).is_err());
    }
}
