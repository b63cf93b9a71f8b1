//! What can go wrong talking to the agent, and why a connection ended.
use std::io;
use std::time::Duration;

use crate::{ErrorBody, ErrorCode};

/// Everything that can go wrong talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {target}: {source}")]
    Connect { target: String, source: io::Error },
    #[error("vsock handshake failed: {0}")]
    Handshake(String),
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("connection closed: {0}")]
    Closed(String),
    /// The request's deadline passed, but the agent still answers a health check: the
    /// connection is kept.
    #[error("no response to {what} within {after:?}")]
    Timeout { what: &'static str, after: Duration },
    /// The agent answered nothing in time, not even a health check: the connection
    /// was closed.
    #[error("the agent stopped answering: {0}")]
    Unresponsive(String),
    /// The agent sent something that is not a well-formed reply (undecodable frame,
    /// wrong response type, inconsistent data); an undecodable frame also closes the
    /// connection, whose stream can no longer be trusted.
    #[error("the agent sent a malformed reply: {0}")]
    Malformed(String),
    #[error("agent error {0}")]
    Agent(ErrorBody),
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("request of {len} bytes exceeds the {max}-byte frame limit")]
    RequestTooLarge { len: usize, max: usize },
    #[error("cannot encode request: {0}")]
    Encode(#[from] serde_json::Error),
}

impl ClientError {
    /// The agent's error code, when the agent answered with an error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Agent(body) => Some(body.code),
            _ => None,
        }
    }

    /// The request is over on the agent's side too: the agent answered with an error,
    /// or the connection (whose requests the agent ends with it) is gone.
    pub fn ends_request(&self) -> bool {
        matches!(
            self,
            ClientError::Agent(_)
                | ClientError::Closed(_)
                | ClientError::Unresponsive(_)
                | ClientError::Malformed(_)
        )
    }

    /// The transport failed before the agent answered (not listening yet, connection
    /// dropped or closed before any reply): trying again on a new connection may work.
    /// An answer the agent gave (an error, a protocol violation) is final.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. }
                | ClientError::Handshake(_)
                | ClientError::Io(_)
                | ClientError::Closed(_)
        )
    }
}

/// Why a connection ended, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseCause {
    /// [`AgentClient::close`], or the last handle was dropped.
    Client,
    /// The agent ended the stream, or the transport failed.
    Lost(String),
    /// A request went unanswered past its deadline, and so did a health check after it.
    Unresponsive(String),
    /// The agent sent a frame that is not a well-formed response.
    Malformed(String),
}

impl CloseCause {
    /// The error callers of a connection closed for this reason get.
    pub(super) fn error(&self) -> ClientError {
        match self {
            CloseCause::Client => ClientError::Closed("closed by the client".into()),
            CloseCause::Lost(why) => ClientError::Closed(why.clone()),
            CloseCause::Unresponsive(why) => ClientError::Unresponsive(why.clone()),
            CloseCause::Malformed(why) => ClientError::Malformed(why.clone()),
        }
    }
}
