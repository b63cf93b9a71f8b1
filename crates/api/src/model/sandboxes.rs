//! A sandbox as the API shows it (`GET /v1/sandboxes`, `GET /v1/sandboxes/{id}`): what
//! it was started from, its resources and limits, TTL, network and environment.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{in_range, AgentHealth, ForkHook, NetworkView, TtlAction, Validate};
use crate::error::Result;

/// cgroup v2 limits for a sandbox's VM process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// `memory.max` in MiB (covers guest RAM and the VMM's own memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 64, maximum = 1048576)]
    pub memory_mib: Option<u64>,
    /// `cpu.max` as a percentage of one CPU (100 = one full core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 102400)]
    pub cpu_percent: Option<u32>,
    /// `pids.max` (threads count too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 8, maximum = 4194304)]
    pub pids: Option<u64>,
}

impl Validate for Limits {
    fn validate(&self) -> Result<()> {
        if let Some(m) = self.memory_mib {
            in_range("limits.memory_mib", m, 64, 1 << 20)?;
        }
        if let Some(c) = self.cpu_percent {
            in_range("limits.cpu_percent", c, 1, 100 * 1024)?;
        }
        if let Some(p) = self.pids {
            in_range("limits.pids", p, 8, 1 << 22)?;
        }
        Ok(())
    }
}

/// What a sandbox was started from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    Image {
        name: String,
        sha256: String,
    },
    Snapshot {
        id: String,
    },
    Branch {
        parent: String,
        branch_point: String,
    },
}

/// What happened to a VM's cgroup and limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CgroupReport {
    /// The cgroup v2 directory holding the VM process, if one was made.
    pub path: Option<String>,
    /// Limits written (`memory.max`, `cpu.max`, `pids.max`).
    pub applied: Vec<String>,
    /// Requested limits that could not be applied, and why.
    pub not_applied: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Sandbox {
    pub id: String,
    pub name: Option<String>,
    /// `creating`, `running`, `paused` (paused to disk with `POST .../pause`: no VM
    /// process, `paused_at` is set; also shown for a moment while a branch or snapshot
    /// stops the vCPUs), `pausing`, `resuming`, `error` (the VM lives but stopped
    /// running its guest, e.g. on a full host disk: `exit_reason` says why; it goes on
    /// by itself once that is fixed), `dead`, `deleting`.
    pub state: String,
    /// `qemu` or `kvm`.
    pub runtime: String,
    pub origin: Origin,
    /// Guest hostname given at boot/branch.
    pub hostname: String,
    /// Labels given at create (and `zygote.parent` on a branch child).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    pub mem_mib: u32,
    pub vcpus: u32,
    pub created_at: u64,
    /// Pid of the VM process (QEMU or zygote's VMM).
    pub pid: Option<u32>,
    pub limits: Limits,
    pub cgroup: CgroupReport,
    /// Snapshots (incl. branch points) whose disk layers this sandbox reads.
    pub depends_on: Vec<String>,
    /// Why the VM stopped, when state is `dead`.
    pub exit_reason: Option<String>,
    pub exited_at: Option<u64>,
    /// Seconds the sandbox lives once running (null: until deleted).
    pub ttl_secs: Option<u64>,
    /// When its TTL runs out (unix seconds, like `created_at`; null: never, or paused:
    /// a paused sandbox's TTL does not run).
    pub expires_at: Option<u64>,
    /// What its TTL running out does: `delete` or `pause`.
    #[serde(default)]
    pub ttl_action: TtlAction,
    /// Exec and file calls resume it when it is paused.
    #[serde(default)]
    pub auto_resume: bool,
    /// When it was paused (unix seconds), while it is paused.
    #[serde(default)]
    pub paused_at: Option<u64>,
    /// TTL seconds it will have once resumed, while it is paused with a TTL.
    #[serde(default)]
    pub ttl_left_secs: Option<u64>,
    pub network: NetworkView,
    /// How the guest's `/etc/zygote/forked.d` hooks ended when it was last started,
    /// branched or restored (empty: it has none).
    #[serde(default)]
    pub fork_hooks: Vec<ForkHook>,
    /// The environment variables its execs get (see `envs` at create).
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    /// Names of its secrets (their values are never shown).
    #[serde(default)]
    pub secrets: Vec<String>,
    /// The daemon's channel to its guest agent while its VM runs (null otherwise): a
    /// `running` sandbox whose agent is silent or misbehaving shows it here.
    #[serde(default)]
    pub agent: Option<AgentHealth>,
    /// Its volumes: the ones it writes (mounted at create), or copy-on-write views of
    /// them (a branch child, a sandbox from a snapshot).
    #[serde(default)]
    pub volumes: Vec<super::MountedVolume>,
    /// Bytes its own writable disk layer holds on the host (what it wrote since its
    /// image or branch point; null without a VM, e.g. paused to disk).
    #[serde(default)]
    pub disk_bytes: Option<u64>,
    /// Its newest metrics sample (as in `GET /v1/sandboxes/{id}/metrics`: taken every
    /// few seconds while it runs), null before the first one.
    #[serde(default)]
    pub metrics: Option<super::MetricSample>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
}
