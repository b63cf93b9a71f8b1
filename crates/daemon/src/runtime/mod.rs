//! Runtimes: how a sandbox's VM is started, branched, snapshotted and
//! stopped. The daemon talks to one [`Runtime`] trait object, picked at
//! start-up ([`select`]); everything runtime-specific that must survive a
//! daemon restart lives in the serialized [`VmRecord`] / [`SnapshotData`].
pub mod console;
pub mod guest_agent;
pub mod handoff;
pub mod kvm;
pub mod kvm_cmd;
mod kvm_pack;
mod kvm_volumes;
pub mod qemu;
mod qemu_pack;
mod qemu_volumes;
pub mod qmp;
pub mod supervisor;
mod volume_files;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use zygote_proto::client::{AgentClient, ClientError};

use crate::model::SnapshotKind;
pub use crate::network::{GuestNet, TapNet};
use crate::procs::ProcId;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("runtime unavailable: {0}")]
    Unavailable(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("VM failed to start: {0}")]
    Boot(String),
    /// An imported snapshot pack's files are not what a snapshot of this runtime is
    /// (the message names no host path: it reaches the client).
    #[error("{0}")]
    BadPack(String),
    #[error("VM control: {0}")]
    Qmp(#[from] qmp::QmpError),
    #[error(transparent)]
    Qemu(#[from] zygote_qemu::QemuError),
    #[error("agent: {0}")]
    Agent(#[from] ClientError),
    #[error("network: {0}")]
    Network(#[from] crate::network::NetError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl RuntimeError {
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> RuntimeError {
        let context = context.into();
        move |source| RuntimeError::Io { context, source }
    }
}

/// The runtime's handle on one running VM; stored in the database, so a
/// restarted daemon can find, control and kill the VM again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmRecord {
    /// Per-VM directory: control socket, logs, exit status.
    pub dir: PathBuf,
    /// The VM process (QEMU, or zygote's VMM).
    pub process: ProcId,
    /// The process waiting for it that records its exit status.
    pub supervisor: Option<ProcId>,
    /// `127.0.0.1:<port>` forwarded to the guest agent.
    pub agent_addr: String,
    /// Control endpoint (QMP socket for qemu).
    pub control: PathBuf,
    /// The writable disk layer the VM uses now (owned by the sandbox).
    pub disk: PathBuf,
    /// `tcg` / `kvm` for qemu; snapshots only restore on the same.
    pub accel: String,
    /// How the guest's `/etc/zygote/forked.d` hooks ended when it was last brought up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fork_hooks: Vec<zygote_proto::HookOutcome>,
    /// Its volume disks, in the order the VM has them (see [`VolumeDisk`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeDisk>,
}

/// One named volume's disk as a VM has it: an extra virtio-blk disk whose serial is the
/// volume's id (how the guest finds it: probe order is not stable), mounted at `path`.
/// Either the volume's own image (`writes_volume`: the sandbox it was mounted into at
/// create), or a copy-on-write view of it (a qcow2 layer over a copy frozen at a branch
/// point or snapshot) that goes with the VM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeDisk {
    /// The volume's id (`vol-...`): the disk's serial in the guest.
    pub volume: String,
    pub name: String,
    /// Where the guest has it mounted.
    pub path: String,
    pub file: PathBuf,
    /// `raw` (a volume's image, or a frozen copy of one) or `qcow2`.
    pub format: String,
    pub writes_volume: bool,
}

/// A snapshot's runtime-specific files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotData {
    /// The snapshot's own directory (memory/device state).
    pub dir: PathBuf,
    /// Memory and device state.
    pub state_file: PathBuf,
    /// The frozen disk layer the snapshot owns (read-only backing file of
    /// every VM started from it, and of the source VM's next layer).
    pub disk_layer: PathBuf,
    pub accel: String,
    /// How long taking it stopped the source VM's vCPUs (absent in records of daemons
    /// that did not measure it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_ms: Option<f64>,
    /// The VM's volume disks at the capture: frozen copies in `dir` (that VMs started
    /// from it read through their own layers); for a pause, the VM's own disks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeDisk>,
    /// The state holds an isolated network interface (QEMU: a tap with vnet_hdr): it
    /// can only be started by a daemon with isolated networking (records from before:
    /// false, unknown).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub isolated_nic: bool,
}

impl SnapshotData {
    /// Bytes on disk of the files this snapshot owns.
    pub fn size_bytes(&self) -> u64 {
        let frozen_volumes = self
            .volumes
            .iter()
            .map(|v| &v.file)
            .filter(|f| f.starts_with(&self.dir));
        [&self.state_file, &self.disk_layer]
            .into_iter()
            .chain(frozen_volumes)
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| {
                use std::os::unix::fs::MetadataExt;
                m.blocks() * 512
            })
            .sum()
    }
}

/// What to boot.
#[derive(Debug, Clone)]
pub enum BootSource {
    /// A base ext4 image (raw), never written.
    Image(PathBuf),
    /// A snapshot's memory/device state and disk layer.
    Snapshot(SnapshotData),
    /// The sandbox's own saved state ([`Runtime::park`]): the VM resumes where it
    /// stopped, on the sandbox's existing disk layer (`StartSpec::disk`, used as it is),
    /// as the same guest: no new identity, its agent already holds the sandbox's token;
    /// only the clock is stepped and fresh entropy mixed in.
    Parked(SnapshotData),
}

/// Everything needed to start one VM.
#[derive(Debug, Clone)]
pub struct StartSpec {
    /// The VM directory (exists, empty).
    pub dir: PathBuf,
    /// Where to create the VM's writable disk layer.
    pub disk: PathBuf,
    pub mem_mib: u32,
    pub vcpus: u32,
    pub source: BootSource,
    /// cgroup to place the VM process in.
    pub cgroup: Option<PathBuf>,
    /// Given to the guest after a snapshot/branch start (reidentify).
    pub hostname: String,
    /// The agent's tokens (the sandbox's own, and the one the guest starts with).
    pub auth: guest_agent::AgentAuth,
    /// Where the VM may write snapshots (the kvm runtime's VMM refuses other paths).
    pub snapshot_root: Option<PathBuf>,
    /// The guest's NIC and where the VM process runs (`crate::network`).
    pub net: GuestNet,
    /// The sandbox's ids, for the guest's "you were forked" hooks (reidentify).
    pub identity: zygote_proto::SandboxIdentity,
    /// Volume disks to attach (image boots only: a snapshot or parked state brings its
    /// own, [`SnapshotData::volumes`]).
    pub volumes: Vec<VolumeDisk>,
}

impl StartSpec {
    pub(crate) fn who(&self) -> guest_agent::GuestWho<'_> {
        guest_agent::GuestWho {
            hostname: &self.hostname,
            net: &self.net,
            identity: &self.identity,
            resumed: matches!(self.source, BootSource::Parked(_)),
        }
    }
}

/// What a live VM is doing, as the VM itself reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunState {
    /// Running guest code (or paused by the daemon's own operation).
    Running,
    /// Stopped on its own: an I/O error (a full host disk), a guest panic, an internal
    /// error. `resumable`: it can go on once the cause is gone (see [`Runtime::resume`]).
    Faulted { reason: String, resumable: bool },
}

/// A VM that is gone, and why.
#[derive(Debug, Clone)]
pub struct Exit {
    pub reason: String,
}

pub trait Runtime: Send + Sync {
    /// `qemu` or `kvm`.
    fn name(&self) -> &'static str;
    /// One line on how branch works here (shown by `GET /v1/info`).
    fn branch_mechanism(&self) -> &'static str;
    /// The warm spawners `vm`'s VMM keeps for its next branch (kvm with
    /// `--warm-spawners`; none elsewhere), with what each costs.
    fn warm_spawners(&self, _vm: &VmRecord) -> Vec<SpawnerUse> {
        Vec::new()
    }
    /// Whether VMs can have volume disks ([`StartSpec::volumes`]).
    fn volumes_supported(&self) -> bool {
        false
    }
    fn snapshot_kinds(&self) -> Vec<SnapshotKind>;

    /// Starts a VM and returns once its agent answers (and, for snapshot
    /// sources, once it was re-identified). On error nothing is left running.
    fn start(&self, spec: &StartSpec) -> Result<VmRecord, RuntimeError>;

    /// An authenticated connection to the VM's agent: the one that brought it up, if
    /// nobody has taken it yet, else a fresh one that says `hello` with `token`. Both
    /// channels are local Unix sockets: connecting does not wait on the guest.
    fn connect(&self, vm: &VmRecord, token: &str) -> Result<AgentClient, RuntimeError>;

    /// Captures the VM into `snap_dir`. The VM keeps running afterwards on a
    /// new disk layer at `next_disk` (its record is updated); the returned
    /// data owns the previous layer.
    fn snapshot(
        &self,
        vm: &mut VmRecord,
        kind: SnapshotKind,
        snap_dir: &Path,
        next_disk: &Path,
    ) -> Result<SnapshotData, RuntimeError>;

    /// The most bytes [`Runtime::snapshot`] of a `mem_mib` VM writes into the
    /// snapshot directory (checked against the free space first), if it writes any
    /// whose size is known up front.
    fn capture_bytes(&self, kind: SnapshotKind, mem_mib: u32) -> Option<u64>;

    /// Host memory (MiB) each branch child of a `mem_mib` VM takes for itself from the
    /// start: all of it where a child is a full copy, None where children share the
    /// parent's memory copy-on-write (they then grow only by what they write). Where
    /// children copy, every VM of the runtime is a process with its own guest RAM, so
    /// a create of several VMs is bounded by it too.
    fn branch_child_copy_mib(&self, mem_mib: u32) -> Option<u32>;

    /// Branches `parent` into `children.len()` new VMs sharing its state at
    /// one instant; `point_dir`/`next_disk` as for [`Runtime::snapshot`].
    /// With `keep_point`, the point's state must be restorable later (a merge starts
    /// it); a runtime may write it after returning. Reports to `progress` as it goes:
    /// the branch point once taken (the parent runs on), then each child's result as
    /// soon as it is known. An error means the point was never taken and nothing of
    /// the children runs (`progress` then heard nothing).
    fn branch_with_progress(
        &self,
        parent: &mut VmRecord,
        point_dir: &Path,
        next_disk: &Path,
        children: &[StartSpec],
        keep_point: bool,
        progress: &dyn BranchProgress,
    ) -> Result<SnapshotData, RuntimeError>;

    /// [`Runtime::branch_with_progress`], returning the branch point and one result per
    /// child (in order) once every child is done.
    #[allow(clippy::type_complexity)]
    fn branch(
        &self,
        parent: &mut VmRecord,
        point_dir: &Path,
        next_disk: &Path,
        children: &[StartSpec],
        keep_point: bool,
    ) -> Result<(SnapshotData, Vec<Result<VmRecord, RuntimeError>>), RuntimeError> {
        let collected = CollectChildren::new(children.len());
        let point = self.branch_with_progress(
            parent, point_dir, next_disk, children, keep_point, &collected,
        )?;
        Ok((point, collected.into_results()))
    }

    /// After a daemon restart, for a capture ([`Runtime::snapshot`] or
    /// [`Runtime::branch`]) of the live `vm` whose result was never recorded: the
    /// snapshot if the runtime completed it (the VM then runs on `next_disk`, and its
    /// former layer, still `vm.disk`, is the snapshot's), or None if nothing of it is
    /// in use (its files may go). An error means it cannot tell.
    fn finished_capture(
        &self,
        vm: &VmRecord,
        kind: SnapshotKind,
        snap_dir: &Path,
        next_disk: &Path,
    ) -> Result<Option<SnapshotData>, RuntimeError>;

    /// Where [`Runtime::park`] of `vm` into `dir` puts the saved state. Its
    /// `state_file` exists only once the state is complete and synced.
    fn park_data(&self, vm: &VmRecord, dir: &Path) -> SnapshotData;

    /// Pause to disk: stops the vCPUs, saves memory and device state into `dir` (an
    /// existing empty directory; complete and synced on return), then ends the VM
    /// process and frees its memory. The disk layer stays for the VM that
    /// [`BootSource::Parked`] starts. On an error before the state is complete the VM
    /// goes on running unchanged (and the partial state is removed).
    fn park(&self, vm: &VmRecord, dir: &Path) -> Result<SnapshotData, RuntimeError>;

    /// Whether a VM resumed from a park directory still reads it: then it is kept until
    /// the sandbox is paused again or deleted.
    fn resumed_needs_park(&self) -> bool {
        false
    }

    /// After a daemon restart: makes sure an alive VM is usable again
    /// (e.g. resumes one left paused by an interrupted snapshot).
    fn reattach(&self, vm: &VmRecord) -> Result<(), RuntimeError>;

    /// The live VM's own run state (the watcher asks: a process that lives may still
    /// have stopped running its guest).
    fn run_state(&self, vm: &VmRecord) -> Result<RunState, RuntimeError>;

    /// Lets a VM that stopped on its own ([`RunState::Faulted`] with `resumable`) go on.
    fn resume(&self, vm: &VmRecord) -> Result<(), RuntimeError>;

    /// None while the VM process lives; otherwise why it ended.
    fn exit_status(&self, vm: &VmRecord) -> Option<Exit>;

    /// Kills the VM and removes its directory and disk layer.
    fn destroy(&self, vm: &VmRecord);

    /// A snapshot as files that stand on their own (for a snapshot pack): its base
    /// image, one disk layer over it with every intermediate layer folded in (made in
    /// `work`), and its state files.
    fn export_files(
        &self,
        data: &SnapshotData,
        work: &Path,
    ) -> Result<ExportedSnapshot, RuntimeError>;

    /// The snapshot whose state files are in `dir` and whose folded disk layer (for
    /// runtimes whose disk is not among the state files) is `disk`, now over the base
    /// image at `base`.
    fn import_files(
        &self,
        dir: &Path,
        state_file: &Path,
        disk: Option<&Path>,
        base: &Path,
        accel: &str,
    ) -> Result<SnapshotData, RuntimeError>;
}

/// [`Runtime::export_files`]' result.
#[derive(Debug, Clone)]
pub struct ExportedSnapshot {
    /// The raw base image the disk layer reads.
    pub base: PathBuf,
    /// The disk layer, self-contained but for the base (None: it is among `state`).
    pub disk: Option<PathBuf>,
    /// State files by their path relative to the snapshot's directory.
    pub state: Vec<(String, PathBuf)>,
    /// Which of `state` is [`SnapshotData::state_file`].
    pub state_file: String,
}

/// Where [`Runtime::branch_with_progress`] reports a branch as it happens. Called from
/// the runtime's threads: an implementation must not block for long (children wait).
pub trait BranchProgress: Sync {
    /// The branch point is taken and `parent` (its record as updated: on the next disk
    /// layer) runs again. Called once, before any child's result.
    fn point_taken(&self, parent: &VmRecord, point: &SnapshotData);
    /// Child `index` runs (its agent answered, it was reidentified), or failed and
    /// nothing of it runs. Called once per child, in the order they finish.
    fn child_done(&self, index: usize, result: Result<VmRecord, RuntimeError>);
    /// How long child `index`'s steps took, when it runs (before its `child_done`).
    fn child_phases(&self, _index: usize, _phases: ChildPhases) {}
}

/// How long the runtime's steps of bringing one branch child up took (ms).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ChildPhases {
    /// From the runtime's start of the branch to the child's VM running (kvm: the
    /// parent's pause, its fork, the child's VM build; qemu: QEMU started on the point).
    pub vm_ms: f64,
    /// The part of `vm_ms` the child spent building its VM over the inherited memory
    /// (kvm only).
    pub vm_build_ms: Option<f64>,
    /// The part of `vm_ms` spent catching a warm spawner up (kvm, warm branches only).
    pub warm_catch_up_ms: Option<f64>,
    /// The part of `vm_ms` spent sending a warm spawner the state (kvm, warm only).
    pub warm_state_ms: Option<f64>,
    /// From the VM running to its agent answering, reidentified.
    pub agent_ms: f64,
    /// The parts of `agent_ms` (runtimes that tell them apart).
    pub agent: Option<AgentPhases>,
}

/// A warm spawner and its cost (see the VMM's `warm` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpawnerUse {
    pub pid: i32,
    /// Its VM is built: the next one-child branch can go through it.
    pub ready: bool,
    /// Pages (RAM and disk) the parent wrote since its last catch-up: what a branch
    /// through it would copy now.
    pub stale_pages: u64,
    /// Host memory it holds alone (old copies of pages, its VM's structures).
    pub private_bytes: u64,
}

/// The parts of a child's `agent_ms`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AgentPhases {
    /// Until the agent took a connection.
    pub connect_ms: f64,
    /// Hello and reidentify, answered.
    pub reidentify_ms: f64,
    /// Reidentify's parts inside the guest (agents that report them).
    pub guest: Option<zygote_proto::ReidentifyTimes>,
}

/// A [`BranchProgress`] that keeps every child's result, for callers that want them
/// all at the end.
struct CollectChildren(std::sync::Mutex<Vec<Option<Result<VmRecord, RuntimeError>>>>);

impl CollectChildren {
    fn new(n: usize) -> Self {
        Self(std::sync::Mutex::new((0..n).map(|_| None).collect()))
    }

    fn into_results(self) -> Vec<Result<VmRecord, RuntimeError>> {
        self.0
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(RuntimeError::Boot("no result for the child".into()))))
            .collect()
    }
}

impl BranchProgress for CollectChildren {
    fn point_taken(&self, _parent: &VmRecord, _point: &SnapshotData) {}

    fn child_done(&self, index: usize, result: Result<VmRecord, RuntimeError>) {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = all.get_mut(index) {
            *slot = Some(result);
        }
    }
}

/// The runtime the daemon uses and why.
pub struct Selected {
    pub runtime: Arc<dyn Runtime>,
    pub reason: String,
    /// Runtimes not chosen, with the reason.
    pub unavailable: Vec<(String, String)>,
}

/// `kvm` (zygote's VMM) when it can serve sandboxes here (hardware
/// virtualization, usable /dev/kvm, the `zygote` binary), else `qemu`.
/// `forced` ("kvm"/"qemu") skips the choice and fails if that runtime
/// cannot work here. `warm_spawners`: what the kvm runtime's VMMs keep (see
/// `zygote vm serve --warm-spawners`).
pub fn select(forced: Option<&str>, warm_spawners: usize) -> Result<Selected, RuntimeError> {
    let unavailable = |e: RuntimeError| match e {
        RuntimeError::Unavailable(m) => m,
        other => other.to_string(),
    };
    match forced {
        Some("kvm") => Ok(Selected {
            runtime: Arc::new(
                kvm::KvmRuntime::new()
                    .map_err(|e| RuntimeError::Unavailable(format!("kvm: {}", unavailable(e))))?
                    .with_warm_spawners(warm_spawners),
            ),
            reason: "requested with --runtime kvm".into(),
            unavailable: Vec::new(),
        }),
        Some("qemu") => Ok(Selected {
            runtime: Arc::new(qemu::QemuRuntime::new()?),
            reason: "requested with --runtime qemu".into(),
            unavailable: match kvm::KvmRuntime::new() {
                Ok(_) => Vec::new(),
                Err(e) => vec![("kvm".into(), unavailable(e))],
            },
        }),
        None => match kvm::KvmRuntime::new() {
            Ok(k) => Ok(Selected {
                runtime: Arc::new(k.with_warm_spawners(warm_spawners)),
                reason: "hardware virtualization is available: zygote's VMM (fork-based \
                         branch, full/diff/live snapshots)"
                    .into(),
                unavailable: Vec::new(),
            }),
            Err(e) => Ok(Selected {
                runtime: Arc::new(qemu::QemuRuntime::new()?),
                reason: "the kvm runtime is unavailable (see unavailable); QEMU runs everywhere"
                    .into(),
                unavailable: vec![("kvm".into(), unavailable(e))],
            }),
        },
        Some(other) => Err(RuntimeError::Unavailable(format!(
            "unknown runtime {other:?} (kvm or qemu)"
        ))),
    }
}
