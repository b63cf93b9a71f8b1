//! Daemon-level answers: `GET /healthz` and `GET /v1/info` (the runtime in use, cgroup
//! support, networking, the port proxy).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{ProxyInfo, SnapshotKind};

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RuntimeInfo {
    /// `qemu` or `kvm`: the runtime new sandboxes use.
    pub name: String,
    /// Why this runtime was picked.
    pub reason: String,
    /// How branch works on it.
    pub branch: String,
    pub snapshot_kinds: Vec<SnapshotKind>,
    /// Runtimes not in use and why.
    pub unavailable: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Info {
    pub version: String,
    pub runtime: RuntimeInfo,
    /// cgroup v2 support: where VM cgroups go and which limits can be applied.
    pub cgroups: CgroupInfo,
    pub state_dir: String,
    /// How sandboxes are networked (`isolated`: a namespace each, nftables policy).
    pub network: NetworkInfo,
    /// The port proxy serving exposed sandbox ports (null: not running).
    pub proxy: Option<ProxyInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CgroupInfo {
    pub root: Option<String>,
    pub controllers: Vec<String>,
    /// Why limits cannot be applied (empty when they can).
    pub limitations: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
}

/// `GET /v1/info`'s view.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NetworkInfo {
    /// `isolated` or `user`.
    pub backend: String,
    /// Why the backend is `user` (null when isolated).
    pub reason: Option<String>,
    /// Where guests' DNS queries go (isolated backend).
    pub dns: Option<String>,
}
