//! The JSON bodies of E2B's control plane, with the field names of
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
    /// `false`: no outbound traffic (E2B: `denyOut: ["0.0.0.0/0"]`). Snake case on the
    /// wire, unlike its neighbours.
    #[serde(default, rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    #[serde(default)]
    pub network: Option<NetworkConfig>,
    /// Named volumes to mount (SandboxVolumeMount).
    #[serde(default)]
    pub volume_mounts: Option<Vec<VolumeMount>>,
}

/// `{"name", "path"}`: volume `name` mounted at `path`.
#[derive(Debug, Clone, Deserialize)]
pub struct VolumeMount {
    pub name: String,
    pub path: String,
}

/// `POST /volumes` (NewVolume).
#[derive(Debug, Deserialize)]
pub struct NewVolume {
    pub name: String,
}

/// A volume in `GET /volumes` (Volume).
#[derive(Debug, Clone, Serialize)]
pub struct ListedVolume {
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    pub name: String,
}

/// `POST /volumes` and `GET /volumes/{id}` (VolumeAndToken); no `domain`: the SDK then
/// uses its own (`E2B_VOLUME_API_URL` for the content API).
#[derive(Debug, Clone, Serialize)]
pub struct VolumeAndToken {
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    pub name: String,
    pub token: String,
}

/// The egress part of E2B's `SandboxNetworkConfig` (its other fields are not served).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    /// Reachable even when `denyOut` covers them (E2B: allow wins).
    #[serde(default)]
    pub allow_out: Option<Vec<String>>,
    #[serde(default)]
    pub deny_out: Option<Vec<String>>,
}

/// `PUT /sandboxes/{id}/network` (SandboxNetworkUpdateConfig): the new egress rules,
/// replacing the old ones (a field left out is cleared). `dnsServers` is not served
/// (the sandbox's resolver is the daemon's own); `rules` (HTTPS rewriting) is not
/// served and is refused when given.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkUpdate {
    #[serde(flatten)]
    pub egress: NetworkConfig,
    #[serde(default, rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    #[serde(default)]
    pub rules: Option<serde_json::Value>,
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Deserialize)]
pub struct SetTimeout {
    pub timeout: i64,
}

/// `POST /sandboxes/{id}/fork`.
#[derive(Debug, Default, Deserialize)]
pub struct ForkSandbox {
    pub timeout: Option<i64>,
    pub count: Option<i64>,
}

/// One entry of the fork answer: the child, or why it did not start.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ForkResult {
    Sandbox(SandboxAnswer),
    Error(ErrorBody),
}

/// `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Default, Deserialize)]
pub struct NewSnapshot {
    pub name: Option<String>,
}

/// E2B's `SnapshotInfo`: the answer of create_snapshot and the items of list_snapshots.
#[derive(Debug, Serialize)]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
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

/// A sandbox in `GET /v2/sandboxes` (E2B's `ListedSandbox`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    pub started_at: String,
    pub end_at: String,
    pub envd_version: &'static str,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    /// `running` or `paused`: the only states E2B's SDKs parse.
    pub state: &'static str,
    pub metadata: BTreeMap<String, String>,
}

/// `GET /sandboxes/{id}` (E2B's `SandboxDetail`): the listed fields and the sandbox's
/// envd token and domain.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(flatten)]
    pub listed: ListedSandbox,
    pub envd_access_token: String,
    pub domain: Option<String>,
    /// The egress rules in force (`update_network` changes them).
    pub network: NetworkInfo,
    pub lifecycle: Lifecycle,
}

/// The egress part of `SandboxDetail.network`, as E2B shows it: a sandbox without any
/// outbound traffic denies `0.0.0.0/0`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInfo {
    pub allow_out: Vec<String>,
    pub deny_out: Vec<String>,
}

/// `SandboxDetail.lifecycle`: what the timeout does (`kill` or `pause`) and whether
/// calls resume a paused sandbox.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    pub on_timeout: &'static str,
    pub auto_resume: bool,
}

/// E2B's error body: `code` is the HTTP status; both fields are required by the SDKs.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorBody {
    pub code: u16,
    pub message: String,
}

/// One metrics sample as E2B's API answers it (`SandboxMetric`; W:
/// e2b/api/client/models/sandbox_metric.py): bytes, and the CPU percentage of all CPUs.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxMetric {
    pub timestamp: String,
    pub timestamp_unix: u64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

impl From<&crate::model::MetricSample> for SandboxMetric {
    fn from(s: &crate::model::MetricSample) -> Self {
        SandboxMetric {
            timestamp: s.timestamp.clone(),
            timestamp_unix: s.timestamp_unix,
            cpu_count: s.cpu_count,
            cpu_used_pct: s.cpu_used_pct,
            mem_used: s.mem_used,
            mem_total: s.mem_total,
            mem_cache: s.mem_cache,
            disk_used: s.disk_used,
            disk_total: s.disk_total,
        }
    }
}

/// `GET /sandboxes/metrics`'s answer (`SandboxesWithMetrics`): each asked-for sandbox's
/// newest sample, by id.
#[derive(Debug, Serialize)]
pub struct SandboxesWithMetrics {
    pub sandboxes: std::collections::BTreeMap<String, SandboxMetric>,
}
