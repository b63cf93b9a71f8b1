//! A sandbox's egress record: what its guest's connections through the daemon's
//! egress proxy (TCP to the ports name rules cover) asked for and what became of them.
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// One entry: a connection refused, or one opened (`open`) and later ended
/// (`closed`, or `cut` by a policy change), or one allowed that could not connect
/// (`failed`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EgressEntry {
    /// The sandbox whose guest made it (a branch child is a sandbox of its own).
    pub sandbox: String,
    /// `refused`, `open`, `closed`, `cut` or `failed`.
    pub event: String,
    /// The host the connection named (TLS SNI or HTTP Host), if it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The address and port the guest connected to.
    pub address: String,
    pub port: u16,
    /// `tls`, `http`, or empty when neither was seen.
    #[serde(default)]
    pub protocol: String,
    /// Plain HTTP only: the first request's method and path (the path cut at 512
    /// characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Why it was allowed or refused.
    pub reason: String,
    /// Bytes from the guest to the destination, and back.
    #[serde(default)]
    pub bytes_out: u64,
    #[serde(default)]
    pub bytes_in: u64,
    /// Unix milliseconds.
    pub started_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    /// Names of the secrets whose values the proxy put in this connection's requests
    /// (secrets bound to hosts; the values never appear here).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

/// `GET /v1/sandboxes/{id}/egress`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct EgressList {
    /// Oldest first.
    pub entries: Vec<EgressEntry>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EgressQuery {
    /// The last this many entries (default 1000, at most 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Stream NDJSON: the entries so far, then each new one as it happens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow: Option<bool>,
}

impl EgressQuery {
    pub fn limit(&self) -> usize {
        self.limit.map_or(1000, |l| l.clamp(1, 10_000) as usize)
    }
}
