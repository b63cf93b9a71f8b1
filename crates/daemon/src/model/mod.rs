//! The REST API's JSON bodies, with validation. Every request type rejects
//! unknown fields, and [`Validate`] turns out-of-range values into 400s
//! before anything is started.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{Error, Result};

mod agent;
mod branch;
mod create;
mod diff;
mod env;
mod exec;
mod fork;
mod image;
mod logs;
mod merge;
pub mod metadata;
mod network;
pub mod pack;
pub mod pause;
mod ports;
mod process;
mod pty;
mod tree;
mod ttl;
mod validate;
pub use agent::{AgentHealth, AgentState};
pub use branch::{BranchEvent, BranchFailure, BranchRequest, BranchResponse};
pub use create::CreateEvent;
pub use diff::{DiffChange, DiffEntry, DiffQuery, SandboxDiff};
pub use env::{validate_vars, ImageRun, SandboxEnv, SecretSpec};
pub use exec::{ExecEvent, ExecRequest, ExecResponse};
pub use fork::ForkHook;
pub use image::{BuildEvent, BuildImageRequest, Image, ImageList, PullImageRequest};
pub use logs::LogsQuery;
pub use merge::{MergeChange, MergeConflict, MergeReport, MergeRequest, OnConflict};
pub use network::{
    parse_cidr, NetworkMode, NetworkPolicy, NetworkRequest, NetworkView, MAX_NETWORK_RULES,
};
pub use pack::{PackEvent, PackOrigin, PullSnapshotRequest, PushSnapshotRequest};
pub use pause::TtlAction;
pub use ports::{ExposePortRequest, ExposedPort, PortList, ProxyInfo};
pub use process::{
    OutputQuery, Process, ProcessList, ProcessOutput, SignalRequest, SignalSpec, StdinRequest,
};
pub use pty::{check_pty_size, PtyClientMessage, PtyQuery, PtyServerMessage, MAX_PTY_ENV};
pub use tree::{KeepRequest, KeepResponse, SandboxTree, TreeNode, TreeSnapshot};
pub use ttl::{SetTtlRequest, MAX_TTL_SECS};
pub(crate) use validate::in_range;
pub use validate::{validate_guest_path, validate_name, Validate};

/// Limits on what one request may ask for.
/// Sandboxes of one create (where each VM holds its own copy of its memory, also bounded
/// by what the host has: `Manager::begin_create`).
pub const MAX_FAN_OUT: u32 = 256;
/// Guest RAM when a create request names none.
pub const DEFAULT_MEM_MIB: u32 = 256;
/// Children of one branch (where children copy their parent's memory, also bounded by
/// what the host has: `Manager::branch`).
pub const MAX_BRANCH_COUNT: u32 = 256;
pub const MIN_MEM_MIB: u32 = 64;
pub const MAX_MEM_MIB: u32 = 65536;
pub const MAX_VCPUS: u32 = 32;
pub const MAX_ARGV: usize = 4096;
pub const MAX_EXEC_TIMEOUT_MS: u64 = 24 * 3600 * 1000;
/// Largest body accepted by `PUT .../files` (the largest request body of any route).
pub const MAX_FILE_BYTES: usize = 64 * 1024 * 1024;
/// Largest JSON request body. Only an exec comes near it: it must fit the guest
/// agent's 16 MiB frame once re-encoded (checked exactly by its validation), and
/// twice that leaves room for JSON escapes in the body (a newline in stdin takes
/// two bytes) while a body no exec could fit is refused before it is read.
pub const MAX_JSON_BODY_BYTES: usize = 2 * zygote_proto::MAX_FRAME_LEN;
pub const MAX_STDIN_BYTES: usize = 8 * 1024 * 1024;

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

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    /// Image name (e.g. `minimal`) or `name-sha256` prefix; exclusive with `snapshot`.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 200)]
    pub image: Option<String>,
    /// Snapshot id to start from (its memory, processes and files).
    #[serde(default)]
    pub snapshot: Option<String>,
    /// Optional label; also the guest hostname (a suffix is added for n > 1).
    #[serde(default)]
    #[schema(pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]
    pub name: Option<String>,
    /// How many sandboxes to create (fan-out), 1..=256. On the qemu runtime (each VM
    /// holds its own copy of its memory), at most as many as the host's available memory
    /// holds (422 `insufficient_memory` says how many fit). They are listed as `creating`
    /// until each runs.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 256)]
    pub n: Option<u32>,
    /// Guest RAM in MiB, 64..=65536 (image boots only; a snapshot keeps its own).
    #[serde(default)]
    #[schema(minimum = 64, maximum = 65536)]
    pub mem_mib: Option<u32>,
    /// Virtual CPUs, 1..=32 (image boots only; a snapshot keeps its own).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 32)]
    pub vcpus: Option<u32>,
    #[serde(default)]
    pub limits: Limits,
    /// Delete the sandbox this many seconds after it is running (1..=604800); none by default.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 604800)]
    pub ttl_secs: Option<u64>,
    /// `egress` (default: outbound connections through NAT, never to the host, the
    /// link-local range or other sandboxes) or `none` (no traffic).
    #[serde(default)]
    pub network: Option<NetworkMode>,
    /// Only these IPv4 CIDRs (or single addresses) may be reached. DNS too: the guest's
    /// resolver address leads to the daemon's resolver (`network.dns` in
    /// `GET /v1/info`), which must be in this list for the sandbox to resolve names.
    #[serde(default)]
    #[schema(max_items = 256)]
    pub allow_out: Option<Vec<String>>,
    /// These IPv4 CIDRs are refused, even when `allow_out` contains them (the daemon's
    /// resolver included: then the sandbox gets no DNS).
    #[serde(default)]
    #[schema(max_items = 256)]
    pub deny_out: Option<Vec<String>>,
    /// Environment variables every exec in the sandbox gets (an exec's own `env` wins);
    /// branch children inherit them. At most 128 variables (with `secrets`), 32 KiB per
    /// value, 256 KiB in all.
    #[serde(default)]
    pub envs: Option<BTreeMap<String, String>>,
    /// Like `envs`, but their values are never shown by the API, and one with
    /// `"inherit": false` is not given to branch children. Neither is written into the
    /// guest: they exist only in the environment of execs.
    #[serde(default)]
    pub secrets: Option<BTreeMap<String, SecretSpec>>,
    /// Your own labels (at most 63 keys of 1-128 characters of `A-Za-z0-9._-/`, values up
    /// to 1024 bytes; keys starting `zygote.` are reserved): shown on the sandbox, kept by
    /// its branch children (which add `zygote.parent`), filterable in the list.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Exec and file calls, and requests through the port proxy, on the sandbox while it
    /// is paused resume it first (without it they get 409 `sandbox_paused`, and the proxy
    /// 502). Kept by branch children.
    #[serde(default)]
    pub auto_resume: Option<bool>,
    /// What its TTL running out does: `delete` (default) or `pause`. Kept by branch
    /// children.
    #[serde(default)]
    pub ttl_action: Option<TtlAction>,
    /// Answer at once with an NDJSON stream of CreateEvent lines (`accepted`, then one
    /// `sandbox` or `sandbox_failed` per sandbox as it comes up, then `done` or `error`)
    /// instead of `201` once all run. Checks (the request, the image or snapshot, the
    /// name, the memory a fan-out needs) answer before the stream starts. A client that
    /// goes away does not stop the create.
    #[serde(default)]
    pub stream: Option<bool>,
}

impl CreateSandboxRequest {
    /// The sandbox's stored environment (validated).
    pub fn sandbox_env(&self) -> Result<SandboxEnv> {
        SandboxEnv::new(
            self.envs.as_ref().unwrap_or(&BTreeMap::new()),
            self.secrets.as_ref().unwrap_or(&BTreeMap::new()),
        )
    }

    pub fn network_request(&self) -> NetworkRequest {
        NetworkRequest {
            network: self.network,
            allow_out: self.allow_out.clone(),
            deny_out: self.deny_out.clone(),
        }
    }
}

impl Validate for CreateSandboxRequest {
    fn validate(&self) -> Result<()> {
        match (&self.image, &self.snapshot) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid("give either image or snapshot, not both"))
            }
            (None, None) => {
                return Err(Error::invalid("give an image or a snapshot to start from"))
            }
            (Some(i), None) if i.is_empty() || i.len() > 200 => {
                return Err(Error::invalid("image must be 1-200 characters"))
            }
            _ => {}
        }
        if let Some(name) = &self.name {
            validate_name("name", name)?;
        }
        in_range("n", self.n.unwrap_or(1), 1, MAX_FAN_OUT)?;
        if let Some(m) = self.mem_mib {
            in_range("mem_mib", m, MIN_MEM_MIB, MAX_MEM_MIB)?;
        }
        if let Some(v) = self.vcpus {
            in_range("vcpus", v, 1, MAX_VCPUS)?;
        }
        if self.snapshot.is_some() && (self.mem_mib.is_some() || self.vcpus.is_some()) {
            return Err(Error::invalid(
                "mem_mib and vcpus come from the snapshot; leave them out",
            ));
        }
        ttl::validate_ttl(self.ttl_secs)?;
        self.network_request().policy()?;
        self.sandbox_env()?;
        if let Some(m) = &self.metadata {
            metadata::validate_metadata(m)?;
        }
        self.limits.validate()
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
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
}

/// The query string of the file routes (`?path=/etc/hostname&mode=644`).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    /// Absolute path in the guest (at most 4096 bytes, no NUL).
    #[param(pattern = "^/[^\\u0000]*$")]
    pub path: String,
    /// Permission bits for written files, octal digits up to `7777` (e.g. `644`).
    #[serde(default)]
    #[param(pattern = "^0*[0-7]{1,4}$")]
    pub mode: Option<String>,
    /// Reading: also read a file that is not a regular file (a device or FIFO), up to
    /// the size limit. Without it such a read is refused.
    #[serde(default)]
    pub special: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileEntry {
    pub name: String,
    /// `file`, `dir`, `symlink`, `other`.
    pub kind: String,
    pub size: u64,
    pub mode: u32,
    pub mtime: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DirListing {
    pub path: String,
    pub entries: Vec<FileEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WriteResult {
    pub path: String,
    pub size: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    /// All guest memory and device state (the VM pauses while it is written).
    Full,
    /// Only memory dirtied since the parent snapshot, layered on it.
    Diff,
    /// Taken without stopping the guest for the copy (copy-on-write).
    Live,
    /// Created by a branch: what the children and the parent share.
    Branch,
}

impl SnapshotKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Full => "full",
            SnapshotKind::Diff => "diff",
            SnapshotKind::Live => "live",
            SnapshotKind::Branch => "branch",
        }
    }

    pub fn parse(s: &str) -> Option<SnapshotKind> {
        [Self::Full, Self::Diff, Self::Live, Self::Branch]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// Which sandbox to snapshot.
    #[schema(min_length = 1)]
    pub sandbox: String,
    /// `full` (default), `diff` or `live`, as the runtime supports (see `GET /v1/info`).
    #[serde(default)]
    pub kind: Option<SnapshotKind>,
    #[serde(default)]
    #[schema(pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]
    pub name: Option<String>,
}

impl Validate for SnapshotRequest {
    fn validate(&self) -> Result<()> {
        if self.sandbox.is_empty() {
            return Err(Error::invalid("sandbox must name a sandbox"));
        }
        if self.kind == Some(SnapshotKind::Branch) {
            return Err(Error::invalid(
                "branch snapshots are made by POST .../branch",
            ));
        }
        if let Some(name) = &self.name {
            validate_name("name", name)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Snapshot {
    pub id: String,
    pub name: Option<String>,
    pub kind: SnapshotKind,
    pub runtime: String,
    /// The sandbox it was taken of.
    pub source_sandbox: String,
    /// Snapshots whose layers this one builds on (oldest first).
    pub depends_on: Vec<String>,
    /// Sandboxes and snapshots that need this one (deleting it is refused while any do).
    pub dependents: Vec<String>,
    pub mem_mib: u32,
    pub vcpus: u32,
    pub created_at: u64,
    /// Bytes of its own files (memory state and disk layer).
    pub size_bytes: u64,
    /// Made implicitly (by a branch); removed automatically once nothing depends on it.
    pub implicit: bool,
    /// How long taking it stopped the sandbox's vCPUs (null if not measured).
    pub pause_ms: Option<f64>,
    /// For a snapshot imported from a pack: where it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<PackOrigin>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// Snapshot to roll the sandbox back (or forward) to.
    #[schema(min_length = 1)]
    pub snapshot: String,
}

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
    pub network: crate::network::NetworkInfo,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_request_bounds() {
        let ok = CreateSandboxRequest {
            image: Some("minimal".into()),
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
        let both = CreateSandboxRequest {
            snapshot: Some("snap-1".into()),
            ..ok.clone()
        };
        assert!(both.validate().is_err());
        for n in [0, MAX_FAN_OUT + 1] {
            let r = CreateSandboxRequest {
                n: Some(n),
                ..ok.clone()
            };
            assert!(r.validate().is_err(), "n={n}");
        }
        let mem = CreateSandboxRequest {
            mem_mib: Some(1),
            ..ok.clone()
        };
        assert!(mem.validate().is_err());
        let lim = CreateSandboxRequest {
            limits: Limits {
                pids: Some(1),
                ..Default::default()
            },
            ..ok
        };
        assert!(lim.validate().is_err());
    }
}
