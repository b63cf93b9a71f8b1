//! What a failed request looks like on the wire: the JSON body every error status
//! carries ([`ErrorBody`]), and [`RequestError`], what validating a request
//! ([`crate::model::Validate`]) finds wrong with it. The daemon answers a
//! `RequestError` as a 400 (or a 413: a request too large for the guest agent), the
//! CLI can check a request before sending it.

/// The result of validating a request.
pub type Result<T, E = RequestError> = std::result::Result<T, E>;

/// Why a request is refused before anything is started.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// A value out of range, a malformed name or path, a combination that makes no
    /// sense: the message says which field and what it may be.
    #[error("{0}")]
    Invalid(String),
    /// A request the guest agent could not take in one frame (an exec's argv, env
    /// and stdin): the client's to shrink (a 413), not a broken agent channel (a 502).
    #[error(
        "the request is {len} bytes as the guest agent receives it (for an exec: argv, \
         env, cwd and stdin in base64), over the agent's limit of {limit} bytes"
    )]
    AgentRequestTooLarge { len: usize, limit: usize },
}

impl RequestError {
    pub fn invalid(msg: impl Into<String>) -> RequestError {
        RequestError::Invalid(msg.into())
    }
}

/// `{"error": {"code": "...", "message": "..."}}`
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Stable code (see the API docs); clients branch on this.
    pub code: String,
    /// Human-readable explanation.
    pub message: String,
    /// With `insufficient_memory`: how many of the requested VMs the host holds now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<u32>,
}
