//! The JSON bodies of E2B's control plane that slice 1 serves, with the field names of
//! E2B's generated clients (their mixed casing included). Unknown fields are ignored, as
//! E2B's API does: newer SDKs send more than is read here.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /v2/sandboxes` (NewSandboxV2).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until the sandbox is killed; absent: [`super::control::DEFAULT_TIMEOUT_SECS`].
    pub timeout: Option<i64>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub auto_pause: Option<bool>,
}

/// `POST /v2/sandboxes/{id}/connect`.
#[derive(Debug, Default, Deserialize)]
pub struct ConnectSandbox {
    pub timeout: Option<i64>,
}

/// The answer of create and connect (E2B's `Sandbox`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxAnswer {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    pub envd_version: &'static str,
    pub envd_access_token: String,
    /// Ports other than envd's are not served the E2B way yet: no traffic token.
    pub traffic_access_token: Option<String>,
    pub domain: Option<String>,
}

/// `GET /sandboxes/{id}` (E2B's `SandboxDetail`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    pub started_at: String,
    pub end_at: String,
    pub envd_version: &'static str,
    pub envd_access_token: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    /// `running` or `paused`: the only states E2B's SDKs parse.
    pub state: &'static str,
    pub metadata: BTreeMap<String, String>,
    pub domain: Option<String>,
}

/// E2B's error body: `code` is the HTTP status; both fields are required by the SDKs.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub code: u16,
    pub message: String,
}
