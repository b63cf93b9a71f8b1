//! Which process a request means: envd's `ProcessSelector` (a pid, or the tag it was
//! started with), resolved against one sandbox's terminals, the details envd keeps
//! of the processes it started (tags live there: the agent keeps none), and the
//! agent's own process table.
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use super::book::ProcessBook;
use super::connect::{Code, ConnectError};
use super::pty::Ptys;
use crate::error::Error;
use crate::manager::Manager;

/// `ProcessSelector`: `{"pid": N}` or `{"tag": "t"}` (a oneof).
#[derive(Debug, Deserialize)]
pub struct ProcessSelector {
    #[serde(default)]
    pid: Option<Value>,
    #[serde(default)]
    tag: Option<String>,
}

/// What a selector names.
#[derive(Debug, PartialEq, Eq)]
pub enum Selected {
    Pid(u32),
    Tag(String),
}

impl ProcessSelector {
    /// Exactly one of pid and tag. proto3 JSON writes a uint32 as a number, and
    /// readers take a decimal string too.
    pub fn selected(&self) -> Result<Selected, ConnectError> {
        let bad = |m: String| ConnectError::new(Code::InvalidArgument, m);
        match (&self.pid, &self.tag) {
            (Some(v), None) => match v {
                Value::Number(n) => n.as_u64(),
                Value::String(s) if !s.is_empty() && s.len() <= 10 => s.parse().ok(),
                _ => None,
            }
            .and_then(|n| u32::try_from(n).ok())
            .map(Selected::Pid)
            .ok_or_else(|| bad(format!("process.pid: {v} is not a uint32"))),
            (None, Some(tag)) => Ok(Selected::Tag(tag.clone())),
            _ => Err(bad("process: give exactly one of pid and tag".into())),
        }
    }
}

/// One sandbox's processes, as envd's procedures see them.
#[derive(Clone, Copy)]
pub struct Procs<'a> {
    pub manager: &'a Arc<Manager>,
    pub ptys: &'a Arc<Ptys>,
    pub book: &'a ProcessBook,
    pub id: &'a str,
}

impl Procs<'_> {
    /// The pid `selector` names. A tag names a running terminal or a running process
    /// `Start` gave it to (the one with that pid *and* start time, so not a later
    /// process that reused the pid); anything else is envd's `not_found`.
    pub async fn pid(&self, selector: &ProcessSelector) -> Result<u32, ConnectError> {
        let tag = match selector.selected()? {
            Selected::Pid(pid) => return Ok(pid),
            Selected::Tag(tag) => tag,
        };
        if let Some(pid) = self.ptys.by_tag(self.id, &tag) {
            return Ok(pid);
        }
        if let Some((pid, started)) = self.book.by_tag(self.id, &tag) {
            let same = self
                .manager
                .process(self.id, pid)
                .await
                .is_ok_and(|p| p.state == "running" && p.started_at_ms == started);
            if same {
                return Ok(pid);
            }
        }
        Err(ConnectError::new(
            Code::NotFound,
            format!("process with tag {tag} not found"),
        ))
    }

    /// `pid` is a running process of the sandbox (terminals are asked elsewhere).
    pub async fn running(&self, pid: u32) -> Result<(), ConnectError> {
        match self.manager.process(self.id, pid).await {
            Ok(p) if p.state == "running" => Ok(()),
            Ok(_) => Err(not_found(pid)),
            Err(e) => Err(pid_error(pid, &e)),
        }
    }
}

/// envd's answer about a pid it does not know (or that ended).
pub fn not_found(pid: u32) -> ConnectError {
    ConnectError::new(Code::NotFound, format!("process with pid {pid} not found"))
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
        not_found(pid)
    } else {
        ConnectError::from_zygote(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_name_one_pid_or_one_tag() {
        let sel = |j: &str| {
            serde_json::from_str::<ProcessSelector>(j)
                .unwrap()
                .selected()
        };
        assert_eq!(sel(r#"{"pid": 42}"#).unwrap(), Selected::Pid(42));
        assert_eq!(sel(r#"{"pid": "42"}"#).unwrap(), Selected::Pid(42));
        assert_eq!(sel(r#"{"tag": "t"}"#).unwrap(), Selected::Tag("t".into()));
        for bad in [
            r#"{"pid": -1}"#,
            r#"{"pid": 4294967296}"#,
            r#"{"pid": "x"}"#,
            r#"{"pid": 1, "tag": "t"}"#,
            "{}",
        ] {
            assert_eq!(sel(bad).unwrap_err().code, Code::InvalidArgument, "{bad}");
        }
    }
}
