//! Structured errors on the wire: a stable machine-readable `code`, a human
//! message, and the OS errno when one caused it.

use std::fmt;
use std::io;

use serde::{Deserialize, Serialize};

/// Stable error codes. Clients match on these, so existing values never change
/// meaning; new ones may be added (older clients see them as `Unknown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The frame was not a JSON object with a numeric `id` and string `type`.
    MalformedFrame,
    /// The frame exceeded [`crate::MAX_FRAME_LEN`]; the agent closes the connection.
    FrameTooLarge,
    /// The stream ended inside a frame; the agent closes the connection.
    TruncatedFrame,
    /// `type` names no request this agent knows.
    UnknownRequest,
    /// A known request with missing or invalid fields.
    BadRequest,
    /// The id is already in use by an unfinished request on this connection.
    DuplicateId,
    /// Too many unfinished requests on this connection.
    Busy,
    /// No such file, directory or exec.
    NotFound,
    PermissionDenied,
    AlreadyExists,
    /// The program could not be started (not found, not executable, bad cwd…).
    SpawnFailed,
    /// The response would exceed the frame limit (e.g. a huge directory).
    ResponseTooLarge,
    /// The agent cannot do this here (e.g. shutdown in dry-run mode).
    Unsupported,
    /// Any other operating-system error; see `errno`.
    Io,
    /// A bug in the agent.
    Internal,
    /// The connection has not presented the agent's token (`hello`), or presented a
    /// wrong one.
    Unauthorized,
    /// The background process has already ended (it can no longer take stdin or
    /// signals).
    ProcessExited,
    /// A limit on what the guest holds at once is reached (background processes,
    /// terminals, the agent's file descriptors); the message names it. Ending some
    /// background processes or terminals makes room.
    LimitReached,
    /// A code this version does not know (a newer agent).
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::MalformedFrame => "malformed_frame",
            ErrorCode::FrameTooLarge => "frame_too_large",
            ErrorCode::TruncatedFrame => "truncated_frame",
            ErrorCode::UnknownRequest => "unknown_request",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::DuplicateId => "duplicate_id",
            ErrorCode::Busy => "busy",
            ErrorCode::NotFound => "not_found",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::SpawnFailed => "spawn_failed",
            ErrorCode::ResponseTooLarge => "response_too_large",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::Io => "io",
            ErrorCode::Internal => "internal",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::ProcessExited => "process_exited",
            ErrorCode::LimitReached => "limit_reached",
            ErrorCode::Unknown => "unknown",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Body of an `error` response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            code,
            message: message.into(),
            errno: None,
        }
    }

    /// Map an OS error to the closest code, keeping the errno. `context`
    /// (usually the path) prefixes the message.
    pub fn from_io(context: &str, err: &io::Error) -> Self {
        let code = match err.kind() {
            io::ErrorKind::NotFound => ErrorCode::NotFound,
            io::ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
            io::ErrorKind::AlreadyExists => ErrorCode::AlreadyExists,
            io::ErrorKind::InvalidInput => ErrorCode::BadRequest,
            _ => ErrorCode::Io,
        };
        ErrorBody {
            code,
            message: format!("{context}: {err}"),
            errno: err.raw_os_error(),
        }
    }
}
