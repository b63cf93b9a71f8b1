//! Errors: [`Error`] is what the daemon's operations return; each variant
//! maps to an HTTP status and a stable machine-readable code, rendered as
//! `{"error": {"code": "...", "message": "..."}}`.
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
pub use zygote_api::error::{ErrorBody, ErrorDetail, RequestError};
use zygote_proto::client::ClientError;
use zygote_proto::ErrorCode;

use crate::runtime::RuntimeError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error("{0}")]
    MalformedBody(String),
    /// A request that failed its validation ([`zygote_api::model::Validate`]).
    #[error(transparent)]
    Request(#[from] RequestError),
    /// Data over the size limit of one request (a guest file read).
    #[error("more than {limit} bytes, the limit for one request")]
    PayloadTooLarge { limit: usize },
    /// A request body over its route's limit; `what` names the kind of body.
    #[error("{what} may be at most {limit} bytes; this one is larger")]
    BodyTooLarge { what: &'static str, limit: usize },
    #[error("{what} {id:?} not found")]
    NotFound { what: &'static str, id: String },
    #[error("no route {method} {path}")]
    RouteNotFound { method: String, path: String },
    #[error("method {method} not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("sandbox {id} is {state}, not running")]
    NotRunning { id: String, state: String },
    /// Paused to disk: exec, files, branch and snapshot need it running.
    #[error(
        "sandbox {0} is paused: resume it first (POST /v1/sandboxes/{0}/resume, `zygote \
         resume {0}`), or create sandboxes with auto_resume: true to resume on exec and file \
         calls"
    )]
    Paused(String),
    /// Resume of a sandbox that is not paused, or pause of one that is not running.
    #[error("sandbox {id} is {state}: {action} needs it {needs}")]
    WrongState {
        id: String,
        state: String,
        action: &'static str,
        needs: &'static str,
    },
    #[error("sandbox {0} is busy with another branch, snapshot, restore or delete")]
    Busy(String),
    #[error("snapshot {id} is still needed by {dependents}")]
    SnapshotInUse { id: String, dependents: String },
    #[error("{0}")]
    Conflict(String),
    /// Checked before writing a snapshot or an imported pack: better than a failed write
    /// half-way. `what` names the filesystem by its role (never a host path).
    #[error("no space left on {what} ({free_mib} MiB free, up to {needed_mib} MiB needed)")]
    NoSpace {
        what: String,
        free_mib: u64,
        needed_mib: u64,
    },
    #[error("{0}")]
    Unsupported(String),
    /// More new VMs (branch children, created sandboxes) than the host's memory holds, on
    /// a runtime where each holds its own copy of its memory.
    #[error(
        "{requested} {what} of {per_vm_mib} MiB each do not fit: on this runtime each holds \
         its own copy of its memory and the host has {available_mib} MiB available, room \
         for {fit}"
    )]
    InsufficientMemory {
        what: &'static str,
        requested: u32,
        fit: u32,
        per_vm_mib: u32,
        available_mib: u64,
    },
    #[error("guest: {0}")]
    Guest(ClientError),
    #[error("cannot reach the sandbox's agent: {0}")]
    AgentUnreachable(ClientError),
    /// The agent did not answer within the request's deadline (its `timeout_ms` plus
    /// grace, or the default): still alive (`Timeout`) or not at all (`Unresponsive`).
    #[error("the sandbox's agent did not answer in time ({0})")]
    AgentTimeout(ClientError),
    /// What the agent sent is not a well-formed reply: a misbehaving (or hostile) guest.
    /// (The client's message says so: "the agent sent a malformed reply: ...".)
    #[error("{0}")]
    AgentMalformed(ClientError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("image: {0}")]
    Image(#[from] zygote_images::ImageError),
    #[error("{0}")]
    Oci(#[from] zygote_oci::OciError),
    #[error("state database: {0}")]
    Database(#[from] rusqlite::Error),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("internal error: {0}")]
    Internal(String),
    /// A code interpreter request (`/code`) the sandbox's code server could not serve.
    #[error(transparent)]
    Code(#[from] crate::manager::CodeError),
}

impl Error {
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }

    pub fn invalid(msg: impl Into<String>) -> Error {
        Error::Request(RequestError::Invalid(msg.into()))
    }

    pub fn not_found(what: &'static str, id: impl Into<String>) -> Error {
        Error::NotFound {
            what,
            id: id.into(),
        }
    }

    /// An agent error: failures the guest reports about the request
    /// (missing file, bad path, ...) are the caller's 4xx, and so is a request
    /// too large for one agent frame (validation refuses those first; this is
    /// the backstop); an agent that does not answer in time is a 504, one that
    /// answers garbage or cannot be reached a 502. Never a 500: the agent is not ours.
    pub fn agent(e: ClientError) -> Error {
        match e {
            ClientError::Agent(_) => Error::Guest(e),
            ClientError::RequestTooLarge { len, max } => {
                Error::Request(RequestError::AgentRequestTooLarge { len, limit: max })
            }
            ClientError::Timeout { .. } | ClientError::Unresponsive(_) => Error::AgentTimeout(e),
            ClientError::Malformed(_) | ClientError::Protocol(_) => Error::AgentMalformed(e),
            _ => Error::AgentUnreachable(e),
        }
    }

    /// A runtime failure, with the agent's own (reaching or authenticating it on a new
    /// connection) classified as for [`Error::agent`].
    pub fn runtime(e: RuntimeError) -> Error {
        match e {
            RuntimeError::Agent(c) => Error::agent(c),
            RuntimeError::Unsupported(m) => Error::Unsupported(m),
            other => Error::Runtime(other),
        }
    }

    /// HTTP status and stable code.
    pub fn status_code(&self) -> (StatusCode, &'static str) {
        use StatusCode as S;
        match self {
            Error::Unauthorized => (S::UNAUTHORIZED, "unauthorized"),
            Error::MalformedBody(_) => (S::BAD_REQUEST, "malformed_body"),
            Error::Request(RequestError::Invalid(_)) => (S::BAD_REQUEST, "invalid_argument"),
            Error::PayloadTooLarge { .. }
            | Error::BodyTooLarge { .. }
            | Error::Request(RequestError::AgentRequestTooLarge { .. }) => {
                (S::PAYLOAD_TOO_LARGE, "payload_too_large")
            }
            Error::NotFound { .. } => (S::NOT_FOUND, "not_found"),
            Error::RouteNotFound { .. } => (S::NOT_FOUND, "route_not_found"),
            Error::MethodNotAllowed { .. } => (S::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Error::NotRunning { .. } => (S::CONFLICT, "sandbox_not_running"),
            Error::Busy(_) => (S::CONFLICT, "sandbox_busy"),
            Error::Paused(_) => (S::CONFLICT, "sandbox_paused"),
            Error::WrongState { .. } => (S::CONFLICT, "wrong_state"),
            Error::SnapshotInUse { .. } => (S::CONFLICT, "snapshot_in_use"),
            Error::Conflict(_) => (S::CONFLICT, "conflict"),
            Error::NoSpace { .. } => (S::INSUFFICIENT_STORAGE, "no_space"),
            Error::Unsupported(_) => (S::UNPROCESSABLE_ENTITY, "unsupported"),
            Error::InsufficientMemory { .. } => (S::UNPROCESSABLE_ENTITY, "insufficient_memory"),
            Error::Guest(e) => match e.code() {
                Some(ErrorCode::NotFound) => (S::NOT_FOUND, "guest_not_found"),
                Some(ErrorCode::PermissionDenied) => (S::FORBIDDEN, "guest_permission_denied"),
                Some(ErrorCode::AlreadyExists) => (S::CONFLICT, "guest_already_exists"),
                Some(ErrorCode::BadRequest) => (S::BAD_REQUEST, "guest_bad_request"),
                Some(ErrorCode::ProcessExited) => (S::CONFLICT, "process_exited"),
                Some(ErrorCode::Busy) => (S::CONFLICT, "guest_busy"),
                Some(ErrorCode::LimitReached) => (S::TOO_MANY_REQUESTS, "guest_limit_reached"),
                Some(ErrorCode::SpawnFailed) => (S::UNPROCESSABLE_ENTITY, "guest_spawn_failed"),
                Some(ErrorCode::ResponseTooLarge) => {
                    (S::PAYLOAD_TOO_LARGE, "guest_response_too_large")
                }
                _ => (S::BAD_GATEWAY, "guest_error"),
            },
            Error::AgentUnreachable(_) => (S::BAD_GATEWAY, "agent_unreachable"),
            Error::Runtime(RuntimeError::BadPack(_)) => (S::UNPROCESSABLE_ENTITY, "bad_image"),
            Error::Runtime(RuntimeError::Unsupported(_)) => {
                (S::UNPROCESSABLE_ENTITY, "unsupported")
            }
            Error::AgentTimeout(ClientError::Unresponsive(_)) => {
                (S::GATEWAY_TIMEOUT, "agent_unresponsive")
            }
            Error::AgentTimeout(_) => (S::GATEWAY_TIMEOUT, "agent_timeout"),
            Error::AgentMalformed(_) => (S::BAD_GATEWAY, "agent_malformed_reply"),
            // Backstop for a runtime call that failed on the agent: the guest's fault or
            // its absence, never ours.
            Error::Runtime(RuntimeError::Agent(e)) => match e {
                ClientError::Timeout { .. } | ClientError::Unresponsive(_) => {
                    (S::GATEWAY_TIMEOUT, "agent_unresponsive")
                }
                ClientError::Malformed(_) | ClientError::Protocol(_) => {
                    (S::BAD_GATEWAY, "agent_malformed_reply")
                }
                _ => (S::BAD_GATEWAY, "agent_unreachable"),
            },
            Error::Runtime(_) => (S::INTERNAL_SERVER_ERROR, "runtime_error"),
            Error::Image(
                zygote_images::ImageError::UnknownRecipe { .. }
                | zygote_images::ImageError::ImageNotFound(_),
            ) => (S::NOT_FOUND, "not_found"),
            Error::Image(_) => (S::INTERNAL_SERVER_ERROR, "image_error"),
            Error::Oci(e) => oci_status(e),
            Error::Code(e) => code_status(e),
            Error::Database(_) | Error::Io { .. } | Error::Internal(_) => {
                (S::INTERNAL_SERVER_ERROR, "internal")
            }
        }
    }

    pub fn body(&self) -> ErrorBody {
        let (_, code) = self.status_code();
        ErrorBody {
            error: ErrorDetail {
                code: code.to_string(),
                message: self.to_string(),
                fit: match self {
                    Error::InsufficientMemory { fit, .. } => Some(*fit),
                    _ => None,
                },
            },
        }
    }
}

/// A pull's failure: the caller's reference or image (4xx), the registry (502), or
/// ours (500).
fn oci_status(e: &zygote_oci::OciError) -> (StatusCode, &'static str) {
    use zygote_oci::OciError as O;
    use StatusCode as S;
    match e {
        O::BadReference(_) => (S::BAD_REQUEST, "invalid_argument"),
        O::NotFound { .. } => (S::NOT_FOUND, "image_not_found"),
        // Not 401: that would say the API token is wrong.
        O::Unauthorized { .. } => (S::FORBIDDEN, "registry_unauthorized"),
        O::NoPlatform { .. } => (S::UNPROCESSABLE_ENTITY, "unsupported_platform"),
        O::PullsDisabled(_) => (S::UNPROCESSABLE_ENTITY, "unsupported"),
        O::TooLarge { .. } => (S::UNPROCESSABLE_ENTITY, "image_too_large"),
        O::NoSpace { .. } => (S::INSUFFICIENT_STORAGE, "no_space"),
        O::DigestMismatch { .. }
        | O::BadLayer { .. }
        | O::BadImage { .. }
        | O::BadArchive { .. } => (S::UNPROCESSABLE_ENTITY, "bad_image"),
        O::Registry { .. } => (S::BAD_GATEWAY, "registry_error"),
        O::Io { .. } | O::Image(_) => (S::INTERNAL_SERVER_ERROR, "image_error"),
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, _) = self.status_code();
        if status.is_server_error() {
            tracing::error!("{self}");
        } else {
            tracing::debug!("{status}: {self}");
        }
        (status, axum::Json(self.body())).into_response()
    }
}

fn code_status(e: &crate::manager::CodeError) -> (StatusCode, &'static str) {
    use crate::manager::CodeError as C;
    use StatusCode as S;
    match e {
        C::NoInterpreter(_) => (S::UNPROCESSABLE_ENTITY, "no_code_interpreter"),
        C::EnvsUnsupported(_) => (S::UNPROCESSABLE_ENTITY, "code_envs_unsupported"),
        C::UnknownContext(_) => (S::NOT_FOUND, "code_context_not_found"),
        C::Refused(_) => (S::BAD_REQUEST, "invalid_argument"),
        C::LimitReached(_) => (S::TOO_MANY_REQUESTS, "code_context_limit"),
        C::Server(_) => (S::BAD_GATEWAY, "code_server_error"),
        C::Wire(_) => (S::BAD_GATEWAY, "code_server_malformed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use zygote_proto::ErrorBody as AgentErrorBody;

    fn status(e: Error) -> (u16, &'static str) {
        let (s, code) = e.status_code();
        (s.as_u16(), code)
    }

    #[test]
    fn refused_requests_are_400_or_413() {
        let invalid = RequestError::invalid("n must be 1..=256");
        assert_eq!(status(invalid.into()), (400, "invalid_argument"));
        let large = RequestError::AgentRequestTooLarge { len: 2, limit: 1 };
        assert_eq!(status(large.into()), (413, "payload_too_large"));
    }

    #[test]
    fn a_misbehaving_agent_is_a_502_or_504_never_a_500() {
        let timeout = ClientError::Timeout {
            what: "exec",
            after: Duration::from_secs(1),
        };
        let cases = [
            (Error::agent(timeout), (504, "agent_timeout")),
            (
                Error::agent(ClientError::Unresponsive("silent".into())),
                (504, "agent_unresponsive"),
            ),
            (
                Error::agent(ClientError::Malformed("garbage".into())),
                (502, "agent_malformed_reply"),
            ),
            (
                Error::agent(ClientError::Closed("gone".into())),
                (502, "agent_unreachable"),
            ),
            // The connect path (a new connection's hello) fails as a runtime error.
            (
                Error::from(RuntimeError::Agent(ClientError::Malformed("x".into()))),
                (502, "agent_malformed_reply"),
            ),
            (
                Error::from(RuntimeError::Agent(ClientError::Closed(
                    "undecodable".into(),
                ))),
                (502, "agent_unreachable"),
            ),
            (
                Error::runtime(RuntimeError::Agent(ClientError::Unresponsive("x".into()))),
                (504, "agent_unresponsive"),
            ),
        ];
        for (e, want) in cases {
            let shown = e.to_string();
            assert_eq!(status(e), want, "{shown}");
        }
        let malformed = Error::agent(ClientError::Malformed("not JSON".into())).to_string();
        assert!(malformed.contains("malformed reply"), "{malformed}");
    }

    #[test]
    fn a_guest_limit_is_a_429_with_its_own_code() {
        let body = AgentErrorBody::new(ErrorCode::LimitReached, "256 background processes");
        assert_eq!(
            status(Error::agent(ClientError::Agent(body))),
            (429, "guest_limit_reached")
        );
    }
}
