//! The kvm runtime: zygote's own VMM, one `zygote vm serve` process per VM
//! (crates/vmm/CONTROL.md), driven over its JSON-lines control socket.
//!
//! * start: `vm serve --kernel K --disk IMAGE --vsock SOCK --rng` under the
//!   supervisor shell (exit status survives a daemon restart); the base image
//!   is mapped copy-on-write inside the VMM, so no disk layer file exists. The
//!   agent is PID 1 and answers on hybrid vsock (`CONNECT 1024`).
//! * branch: the control `branch` op forks the VMM; each child serves its own
//!   control socket, vsock socket and console in its sandbox's directory, joins
//!   its sandbox's cgroup before building its VM, then is re-identified through
//!   its agent.
//! * snapshots: control `snapshot` full/diff/live into `<snapshot dir>/vm`;
//!   restore is `vm serve --restore DIR --vsock NEW`, then re-identify.
//! * pause to disk: control `pause`, a full `snapshot` into the sandbox's park
//!   directory, `stop`; resume is `vm serve --restore` of it, which maps the memory
//!   file MAP_PRIVATE (pages fault in lazily, from the page cache), then the clock is
//!   stepped (no re-identify: it is the same guest).
//! * volumes: the owner's VMM writes the volume's image; captures freeze a copy that
//!   other VMs see copy-on-write (see `kvm_volumes`).
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use zygote_proto::client::AgentClient;
use zygote_proto::DEFAULT_VSOCK_PORT;
use zygote_vmm::control::protocol::{BranchInfo, SnapshotInfo, StatusInfo, VmRunState};
use zygote_vmm::control::{ControlClient, Request};
use zygote_vmm::persist::snapshot_files::{device_data_file, SnapshotMode, MEMORY_FILE};

use super::guest_agent::{self, BringUpTimes};
use super::handoff::BroughtUp;
use super::kvm_cmd::{self, Boot, VmFiles};
use super::kvm_volumes;
use super::{supervisor, BootSource, Exit, RunState, Runtime, RuntimeError};
use super::{
    AgentPhases, BranchProgress, ChildPhases, GuestNet, SnapshotData, SpawnerUse, StartSpec,
    TapNet, VmRecord, VolumeDisk,
};
use crate::model::SnapshotKind;
use crate::procs::ProcId;

const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// Until `vm serve` listens on its control socket (restores read the memory file first).
const CONTROL_TIMEOUT: Duration = Duration::from_secs(60);
const CONTROL_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
const BRANCH_READY_MS: u64 = 60_000;
/// Subdirectory of a snapshot directory the VMM writes (it must not exist yet).
const VM_SNAPSHOT: &str = "vm";
const ACCEL: &str = "kvm";

/// What the VMM boots for a fresh sandbox.
enum Guest {
    /// The guest kernel (located or built on first use) with the image as root disk.
    Linux { kernel: Mutex<Option<PathBuf>> },
    /// zygote's probe guest instead, and no agent: lets tests drive every
    /// process-management path on hosts where Linux cannot boot under KVM.
    Probe { scenario: String },
}

pub struct KvmRuntime {
    bin: PathBuf,
    guest: Guest,
    /// The connection that brought each VM up, until the daemon's first agent call.
    brought_up: BroughtUp,
    /// Warm spawners each VMM keeps for single-child branches (0: branches fork).
    warm_spawners: usize,
}

impl KvmRuntime {
    /// Have each VMM keep `k` warm spawners (passed on to `vm serve`).
    pub fn with_warm_spawners(mut self, k: usize) -> Self {
        self.warm_spawners = k;
        self
    }

    /// The runtime for sandboxes: needs hardware virtualization (Linux guests
    /// do not boot under shadow-paging KVM), a usable /dev/kvm and the binary.
    pub fn new() -> Result<KvmRuntime, RuntimeError> {
        if !zygote_vmm::host::hardware_virtualization() {
            return Err(RuntimeError::Unavailable(
                "this host has no hardware virtualization (no vmx/svm, kvm_intel/kvm_amd not \
                 loaded): zygote's VMM cannot boot Linux guests here"
                    .into(),
            ));
        }
        zygote_vmm::host::kvm_usable()
            .map_err(|e| RuntimeError::Unavailable(format!("/dev/kvm: {e}")))?;
        Ok(KvmRuntime {
            bin: kvm_cmd::locate_binary()?,
            guest: Guest::Linux {
                kernel: Mutex::new(None),
            },
            brought_up: BroughtUp::default(),
            warm_spawners: 0,
        })
    }

    /// For tests: VMs boot the probe guest `scenario` (image sources are
    /// ignored) and have no agent, so nothing waits for one or re-identifies.
    pub fn with_probe(bin: PathBuf, scenario: &str) -> KvmRuntime {
        KvmRuntime {
            bin,
            guest: Guest::Probe {
                scenario: scenario.into(),
            },
            brought_up: BroughtUp::default(),
            warm_spawners: 0,
        }
    }

    fn has_agent(&self) -> bool {
        matches!(self.guest, Guest::Linux { .. })
    }

    fn kernel(&self, slot: &Mutex<Option<PathBuf>>) -> Result<PathBuf, RuntimeError> {
        let mut k = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(path) = &*k {
            return Ok(path.clone());
        }
        let info = zygote_images::build_kernel(&mut |line| tracing::info!("kernel: {line}"))
            .map_err(|e| RuntimeError::Unavailable(format!("guest kernel: {e}")))?;
        *k = Some(info.vmlinux.clone());
        Ok(info.vmlinux)
    }

    fn argv(
        &self,
        spec: &StartSpec,
        files: &VmFiles,
        volumes: &[VolumeDisk],
    ) -> Result<Vec<String>, RuntimeError> {
        let mut cmdline = kvm_cmd::guest_cmdline();
        if let Some(t) = tap(spec) {
            cmdline.push(' ');
            cmdline.push_str(&t.kernel_ip_param());
        }
        let kernel;
        let boot = match (&spec.source, &self.guest) {
            (BootSource::Snapshot(s) | BootSource::Parked(s), _) => Boot::Restore {
                dir: restore_dir(s)?,
            },
            (BootSource::Image(image), Guest::Linux { kernel: slot }) => {
                kernel = self.kernel(slot)?;
                Boot::Kernel {
                    kernel: &kernel,
                    image,
                    cmdline: &cmdline,
                }
            }
            (BootSource::Image(_), Guest::Probe { scenario }) => Boot::Probe { scenario },
        };
        let mut argv = kvm_cmd::serve_argv(files, &boot, spec.mem_mib, spec.vcpus);
        if let Some(root) = &spec.snapshot_root {
            argv.push("--snapshot-root".into());
            argv.push(root.display().to_string());
        }
        if let Some(t) = tap(spec) {
            argv.push("--net".into());
            argv.push(t.tap.clone());
        }
        if self.warm_spawners > 0 {
            argv.push("--warm-spawners".into());
            argv.push(self.warm_spawners.to_string());
        }
        argv.extend(kvm_volumes::serve_args(volumes));
        Ok(argv)
    }

    /// Spawns `vm serve` under the supervisor and waits for its control socket.
    fn spawn_vmm(
        &self,
        spec: &StartSpec,
        volumes: Vec<VolumeDisk>,
    ) -> Result<VmRecord, RuntimeError> {
        let files = VmFiles::in_dir(&spec.dir);
        files.clear(&spec.dir);
        let args = self.argv(spec, &files, &volumes)?;
        let stderr = std::fs::File::create(&files.stderr)
            .map_err(RuntimeError::io("creating vmm.stderr"))?;
        let bin = self.bin.display().to_string();
        let netns = tap(spec).map(|t| t.netns.as_path());
        let sup = supervisor::spawn(
            &bin,
            &args,
            &spec.dir,
            spec.cgroup.as_deref(),
            netns,
            stderr,
            None,
        )?;
        match wait_control(&files.api_sock, &sup) {
            Ok(process) => Ok(record(spec, &files, process, Some(sup), volumes)),
            Err(e) => {
                // The VMM is the shell's child; kill it too if it got that far.
                for pid in children_of(sup.pid) {
                    if let Some(p) = ProcId::of(pid) {
                        supervisor::kill_and_wait(&p, None);
                    }
                }
                supervisor::kill_and_wait(&sup, None);
                Err(boot_error(e, &spec.dir))
            }
        }
    }

    /// From a VMM serving its socket to a guest answering with its identity.
    /// Wait for the guest's agent and reidentify it; where the time went (None: a
    /// probe guest, which has no agent).
    fn bring_up(
        &self,
        rec: &mut VmRecord,
        spec: &StartSpec,
    ) -> Result<Option<BringUpTimes>, RuntimeError> {
        if !self.has_agent() {
            // Probe guests: the VMM answering `status` with a live VM is "up".
            let st = status(&rec.control)?;
            if st.state == VmRunState::Stopped {
                return Err(RuntimeError::Boot(format!("the VM stopped: {:?}", st.exit)));
            }
            return Ok(None);
        }
        let connect = || AgentClient::connect_vsock_uds(&rec.agent_addr, DEFAULT_VSOCK_PORT);
        let alive = || rec.process.is_alive();
        let target = guest_agent::AgentTarget {
            connect: &connect,
            alive: &alive,
            what: "zygote's VMM",
            // A vsock connection is refused until the guest listens: retry often.
            attempt_limit: Duration::from_secs(10),
        };
        let deadline = Instant::now() + BOOT_TIMEOUT;
        let (client, report, times) =
            guest_agent::bring_up(&target, &spec.who(), &spec.auth, deadline)?;
        rec.fork_hooks = report.hooks;
        self.brought_up.keep(&rec.agent_addr, client);
        Ok(Some(times))
    }
}

/// The VMM's snapshot directory inside a [`SnapshotData`].
/// The guest's tap, when the sandbox has a namespace of its own (else it has no NIC:
/// QEMU's user network has no counterpart here).
fn tap(spec: &StartSpec) -> Option<&TapNet> {
    match &spec.net {
        GuestNet::Tap(t) => Some(t),
        GuestNet::User { .. } => None,
    }
}

fn restore_dir(s: &SnapshotData) -> Result<&Path, RuntimeError> {
    let dir = s.state_file.parent().unwrap_or(&s.dir);
    if !dir.join(MEMORY_FILE).exists() {
        return Err(RuntimeError::Unsupported(format!(
            "snapshot {} holds no VM state to restore (a kvm branch point: branches fork the \
             running VM instead of saving it)",
            s.dir.display()
        )));
    }
    Ok(dir)
}

fn record(
    spec: &StartSpec,
    files: &VmFiles,
    process: ProcId,
    supervisor: Option<ProcId>,
    volumes: Vec<VolumeDisk>,
) -> VmRecord {
    VmRecord {
        dir: spec.dir.clone(),
        process,
        supervisor,
        // The hybrid-vsock socket: `CONNECT <port>` reaches the agent.
        agent_addr: files.vsock.display().to_string(),
        control: files.api_sock.clone(),
        // The root disk is copy-on-write in the VMM's memory: this path stays
        // unused, but keeps the manager's layer bookkeeping uniform.
        disk: spec.disk.clone(),
        accel: ACCEL.into(),
        fork_hooks: Vec::new(),
        volumes,
    }
}

fn control(sock: &Path) -> ControlClient {
    ControlClient::new(sock).with_timeout(CONTROL_REQUEST_TIMEOUT)
}

fn ctl_err(e: zygote_vmm::control::client::ClientError) -> RuntimeError {
    RuntimeError::Boot(format!("VMM control: {e}"))
}

fn status(sock: &Path) -> Result<StatusInfo, RuntimeError> {
    control(sock).request(&Request::Status).map_err(ctl_err)
}

/// Waits for the control socket while `owner` (the supervisor, or the VMM
/// itself) lives; returns the VMM the socket reports.
fn wait_control(sock: &Path, owner: &ProcId) -> Result<ProcId, RuntimeError> {
    let deadline = Instant::now() + CONTROL_TIMEOUT;
    let c = control(sock);
    loop {
        let slice = (Instant::now() + Duration::from_millis(200)).min(deadline);
        if c.wait_ready(slice).is_ok() {
            break;
        }
        if !owner.is_alive() {
            return Err(RuntimeError::Boot(
                "zygote's VMM exited during start-up".into(),
            ));
        }
        if Instant::now() >= deadline {
            return Err(RuntimeError::Boot(format!(
                "no control socket {} after {CONTROL_TIMEOUT:?}",
                sock.display()
            )));
        }
    }
    let st = status(sock)?;
    ProcId::of(st.pid as u32)
        .ok_or_else(|| RuntimeError::Boot("zygote's VMM exited during start-up".into()))
}

/// Direct children of `pid` (the supervisor shell's VMM).
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn boot_error(e: RuntimeError, dir: &Path) -> RuntimeError {
    let files = VmFiles::in_dir(dir);
    let stderr = std::fs::read_to_string(&files.stderr).unwrap_or_default();
    RuntimeError::Boot(format!(
        "{e}\n--- vmm stderr ---\n{}\n--- serial console (last lines) ---\n{}",
        stderr.trim(),
        super::console::last_lines(dir, 20)
    ))
}

fn snapshot_data(dir: &Path, vm_dir: &Path, pause_ms: f64) -> SnapshotData {
    SnapshotData {
        pause_ms: Some(pause_ms),
        dir: dir.to_path_buf(),
        state_file: vm_dir.join(MEMORY_FILE),
        // The root disk is virtio device 0; its file holds the CoW pages.
        disk_layer: vm_dir.join(device_data_file(0)),
        accel: ACCEL.into(),
        volumes: Vec::new(),
        isolated_nic: false,
    }
}

impl Runtime for KvmRuntime {
    fn name(&self) -> &'static str {
        "kvm"
    }

    fn warm_spawners(&self, vm: &VmRecord) -> Vec<SpawnerUse> {
        if self.warm_spawners == 0 || !vm.process.is_alive() {
            return Vec::new();
        }
        let Ok(st) = status(&vm.control) else {
            return Vec::new();
        };
        st.spawners
            .iter()
            .map(|s| SpawnerUse {
                pid: s.pid,
                ready: s.ready,
                stale_pages: s.stale_pages,
                private_bytes: crate::procs::memory_use(s.pid as u32).map_or(0, |m| m.private),
            })
            .collect()
    }

    fn branch_mechanism(&self) -> &'static str {
        "zygote's VMM: fork(2) of the paused VM process (guest RAM and the CoW root disk \
         shared copy-on-write), each child serves its own control/vsock sockets, then reidentify"
    }

    fn snapshot_kinds(&self) -> Vec<SnapshotKind> {
        vec![SnapshotKind::Full, SnapshotKind::Diff, SnapshotKind::Live]
    }

    fn volumes_supported(&self) -> bool {
        true
    }

    fn start(&self, spec: &StartSpec) -> Result<VmRecord, RuntimeError> {
        let volumes = kvm_volumes::disks_for_start(spec)?;
        let mut rec = self.spawn_vmm(spec, volumes)?;
        if let Err(e) = self.bring_up(&mut rec, spec) {
            supervisor::kill_and_wait(&rec.process, rec.supervisor.as_ref());
            return Err(boot_error(e, &spec.dir));
        }
        Ok(rec)
    }

    fn connect(&self, vm: &VmRecord, token: &str) -> Result<AgentClient, RuntimeError> {
        self.brought_up.take_or_connect(vm, token, || {
            AgentClient::connect_vsock_uds(&vm.agent_addr, DEFAULT_VSOCK_PORT)
        })
    }

    fn snapshot(
        &self,
        vm: &mut VmRecord,
        kind: SnapshotKind,
        snap_dir: &Path,
        next_disk: &Path,
    ) -> Result<SnapshotData, RuntimeError> {
        let mode = match kind {
            SnapshotKind::Full | SnapshotKind::Branch => SnapshotMode::Full,
            SnapshotKind::Diff => SnapshotMode::Diff,
            SnapshotKind::Live => SnapshotMode::Live,
        };
        let vm_dir = snap_dir.join(VM_SNAPSHOT);
        let req = Request::Snapshot {
            mode,
            path: vm_dir.clone(),
        };
        let ((info, volumes), paused) = self.paused_for_volumes(vm, || {
            let volumes = kvm_volumes::freeze(&vm.volumes, snap_dir)?;
            crate::fault::point("capture.volumes-copied");
            match control(&vm.control).request::<SnapshotInfo>(&req) {
                Ok(info) => Ok((info, volumes)),
                Err(e) => {
                    kvm_volumes::remove(&volumes);
                    Err(if e.code() == Some("bad_request") {
                        RuntimeError::Unsupported(format!("{} snapshot: {e}", kind.as_str()))
                    } else {
                        ctl_err(e)
                    })
                }
            }
        })?;
        tracing::debug!(
            "snapshot {}: {:?}, paused {:.1} ms, {} pages",
            vm_dir.display(),
            info.mode,
            info.pause_ms,
            info.pages_written
        );
        vm.disk = next_disk.to_path_buf();
        let mut data = snapshot_data(snap_dir, &vm_dir, paused.unwrap_or(info.pause_ms));
        data.volumes = volumes;
        Ok(data)
    }

    fn export_files(
        &self,
        data: &SnapshotData,
        _work: &Path,
    ) -> Result<super::ExportedSnapshot, RuntimeError> {
        super::kvm_pack::export(data, VM_SNAPSHOT)
    }

    fn import_files(
        &self,
        dir: &Path,
        _state_file: &Path,
        _disk: Option<&Path>,
        base: &Path,
        _accel: &str,
    ) -> Result<SnapshotData, RuntimeError> {
        super::kvm_pack::import(dir, VM_SNAPSHOT, base)?;
        Ok(snapshot_data(dir, &dir.join(VM_SNAPSHOT), 0.0))
    }

    fn branch_child_copy_mib(&self, _mem_mib: u32) -> Option<u32> {
        // Forked: guest RAM is shared copy-on-write with the parent and siblings.
        None
    }

    fn capture_bytes(&self, kind: SnapshotKind, mem_mib: u32) -> Option<u64> {
        match kind {
            // A sparse memory file of the touched pages, at most all of RAM.
            SnapshotKind::Full => Some(u64::from(mem_mib) << 20),
            // Dirty pages only (unknown until taken); a branch writes no files.
            SnapshotKind::Diff | SnapshotKind::Live | SnapshotKind::Branch => None,
        }
    }

    fn branch_with_progress(
        &self,
        parent: &mut VmRecord,
        point_dir: &Path,
        next_disk: &Path,
        children: &[StartSpec],
        keep_point: bool,
        progress: &dyn BranchProgress,
    ) -> Result<SnapshotData, RuntimeError> {
        let files: Vec<VmFiles> = children.iter().map(|c| VmFiles::in_dir(&c.dir)).collect();
        for (f, c) in files.iter().zip(children) {
            f.clear(&c.dir);
        }
        let dirs: Vec<PathBuf> = children.iter().map(|c| c.dir.clone()).collect();
        let started = Instant::now();
        let mut asked_after = Duration::ZERO;
        let ((info, child_disks, point_volumes), paused) =
            self.paused_for_volumes(parent, || {
                let child_disks = if parent.volumes.is_empty() {
                    vec![Vec::new(); children.len()]
                } else {
                    kvm_volumes::freeze_for_children(&parent.volumes, &dirs)?
                };
                crate::fault::point("capture.volumes-copied");
                let point_volumes = match (keep_point, child_disks.first()) {
                    (true, Some(first)) if !first.is_empty() => {
                        std::fs::create_dir_all(point_dir)
                            .map_err(RuntimeError::io("creating the branch point's directory"))?;
                        kvm_volumes::link_point(first, point_dir)
                    }
                    _ => Ok(Vec::new()),
                };
                let undo = |point: &[VolumeDisk]| {
                    kvm_volumes::remove(child_disks.iter().flatten().chain(point));
                };
                let point_volumes = point_volumes.inspect_err(|_| undo(&[]))?;
                let req = Request::Branch {
                    children: files
                        .iter()
                        .zip(children)
                        .zip(&child_disks)
                        .map(|((f, c), disks)| {
                            let mut child = kvm_cmd::branch_child(f, c.cgroup.as_deref(), tap(c));
                            child.disk_files = kvm_volumes::disk_files(disks);
                            child
                        })
                        .collect(),
                    // Written by the VMM's frozen spawner after the children run: no longer pause.
                    point_snapshot: keep_point.then(|| point_dir.join(VM_SNAPSHOT)),
                    ready_timeout_ms: BRANCH_READY_MS,
                };
                asked_after = started.elapsed();
                match control(&parent.control).request::<BranchInfo>(&req) {
                    Ok(info) => Ok((info, child_disks, point_volumes)),
                    Err(e) => {
                        undo(&point_volumes);
                        Err(RuntimeError::Boot(format!(
                            "branching {}: {e}",
                            parent.dir.display()
                        )))
                    }
                }
            })?;
        parent.disk = next_disk.to_path_buf();
        // Fork-based: the point records lineage only, unless kept (its state file then
        // appears once the spawner has written it).
        let mut point = snapshot_data(
            point_dir,
            &point_dir.join(VM_SNAPSHOT),
            paused.unwrap_or(info.pause_ms),
        );
        point.volumes = point_volumes;
        progress.point_taken(parent, &point);
        supervisor::start_children(
            children,
            |i, spec| {
                let child = info.children.iter().find(|c| c.index == i);
                let up = Instant::now();
                let (rec, agent) = self.adopt_child(
                    spec,
                    &files[i],
                    child.map(|c| c.pid),
                    child_disks[i].clone(),
                )?;
                if let Some(c) = child {
                    progress.child_phases(
                        i,
                        ChildPhases {
                            vm_ms: asked_after.as_secs_f64() * 1e3 + c.ready_ms,
                            vm_build_ms: Some(c.restore_ms),
                            warm_catch_up_ms: c.catch_up_ms,
                            warm_state_ms: c.state_ms,
                            agent_ms: up.elapsed().as_secs_f64() * 1e3,
                            agent: agent.map(|a| AgentPhases {
                                connect_ms: a.connect.as_secs_f64() * 1e3,
                                reidentify_ms: a.reidentify.as_secs_f64() * 1e3,
                                guest: a.guest,
                            }),
                        },
                    );
                }
                Ok(rec)
            },
            |i, r| progress.child_done(i, r),
        );
        Ok(point)
    }

    fn finished_capture(
        &self,
        vm: &VmRecord,
        kind: SnapshotKind,
        snap_dir: &Path,
        _next_disk: &Path,
    ) -> Result<Option<SnapshotData>, RuntimeError> {
        // A branch point here is lineage only: no files, and the VM's disk lives in its
        // memory, so there is nothing to keep (the children go with their records).
        if kind == SnapshotKind::Branch {
            return Ok(None);
        }
        // The VMM writes `<vm>.tmp-<pid>` and renames it into place once every file is
        // synced; a diff or live writer (a frozen copy of the VMM) may still be at it.
        let deadline = Instant::now() + CONTROL_REQUEST_TIMEOUT;
        let tmp_prefix = format!("{VM_SNAPSHOT}.tmp-");
        let writing = || {
            std::fs::read_dir(snap_dir)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.strip_prefix(&tmp_prefix)
                        .and_then(|pid| pid.parse::<u32>().ok())
                        .is_some_and(|pid| ProcId::of(pid).is_some())
                })
        };
        while writing() {
            if Instant::now() >= deadline {
                return Err(RuntimeError::Boot(format!(
                    "a snapshot writer in {} is still at work",
                    snap_dir.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let vm_dir = snap_dir.join(VM_SNAPSHOT);
        if !vm_dir.is_dir() {
            return Ok(None);
        }
        let mut data = snapshot_data(snap_dir, &vm_dir, 0.0);
        data.pause_ms = None;
        // Frozen before the VMM was asked for the state: complete if the state is.
        data.volumes = kvm_volumes::frozen_in(&vm.volumes, snap_dir);
        Ok(Some(data))
    }

    fn park_data(&self, vm: &VmRecord, dir: &Path) -> SnapshotData {
        // The VMM writes `vm.tmp-<pid>` and renames it to `vm` once synced: the memory
        // file inside exists only when the state is whole. The root disk's CoW pages are
        // the device's data file in it (the disk lives in the VMM's memory), and so are
        // a volume view's; the sandbox keeps its own volume disks.
        let mut data = snapshot_data(dir, &dir.join(VM_SNAPSHOT), 0.0);
        data.pause_ms = None;
        data.volumes = vm.volumes.clone();
        data
    }

    fn park(&self, vm: &VmRecord, dir: &Path) -> Result<SnapshotData, RuntimeError> {
        let c = control(&vm.control);
        // Paused first so the guest cannot run on between the snapshot and the stop
        // (a snapshot of a paused VM leaves it paused).
        c.request::<StatusInfo>(&Request::Pause).map_err(ctl_err)?;
        let vm_dir = dir.join(VM_SNAPSHOT);
        let req = Request::Snapshot {
            mode: SnapshotMode::Full,
            path: vm_dir.clone(),
        };
        let info = match c.request::<SnapshotInfo>(&req) {
            Ok(info) => info,
            Err(e) => {
                let _ = c.request::<StatusInfo>(&Request::Resume);
                return Err(ctl_err(e));
            }
        };
        crate::fault::point("pause.saved");
        // `stop` ends the VMM; its reply may or may not make it out first.
        let _ = c.request::<StatusInfo>(&Request::Stop);
        vm.process.wait_gone(Duration::from_secs(5));
        supervisor::kill_and_wait(&vm.process, vm.supervisor.as_ref());
        self.brought_up.forget(&vm.agent_addr);
        let mut data = snapshot_data(dir, &vm_dir, info.pause_ms);
        data.volumes = vm.volumes.clone();
        Ok(data)
    }

    fn resumed_needs_park(&self) -> bool {
        // The restored VMM maps the memory file (pages fault in from it), and its diff
        // snapshots name the park directory as their parent.
        true
    }

    fn run_state(&self, vm: &VmRecord) -> Result<RunState, RuntimeError> {
        // Guest RAM and the root disk live in the VMM's memory: no host disk can fill
        // under a running guest. What remains is the VM having stopped.
        let st = status(&vm.control)?;
        Ok(match st.state {
            VmRunState::Stopped => RunState::Faulted {
                reason: format!("the VM stopped: {:?}", st.exit),
                resumable: false,
            },
            _ => RunState::Running,
        })
    }

    fn resume(&self, vm: &VmRecord) -> Result<(), RuntimeError> {
        control(&vm.control)
            .request::<StatusInfo>(&Request::Resume)
            .map(drop)
            .map_err(ctl_err)
    }

    fn reattach(&self, vm: &VmRecord) -> Result<(), RuntimeError> {
        let st = status(&vm.control)?;
        // Left paused by an operation the previous daemon did not finish.
        if st.state == VmRunState::Paused {
            tracing::info!("resuming VM in {} (paused)", vm.dir.display());
            control(&vm.control)
                .request::<StatusInfo>(&Request::Resume)
                .map_err(ctl_err)?;
        }
        Ok(())
    }

    fn exit_status(&self, vm: &VmRecord) -> Option<Exit> {
        if vm.process.is_alive() {
            return None;
        }
        let files = VmFiles::in_dir(&vm.dir);
        // The supervisor writes the status right after the VMM ends.
        let deadline = Instant::now() + Duration::from_millis(500);
        let mut reason = loop {
            if let Some((r, clean)) = kvm_cmd::read_exit_record(&files.exit_record()) {
                break kvm_cmd::describe_guest_end(&r, clean);
            }
            if vm.supervisor.is_some() {
                if let Some(s) = supervisor::recorded_status(&vm.dir) {
                    break supervisor::describe_status("zygote's VMM", s);
                }
            }
            if Instant::now() >= deadline {
                break match vm.supervisor {
                    Some(_) => "zygote's VMM and its supervisor are gone (no exit status was \
                                recorded)"
                        .to_string(),
                    None => kvm_cmd::describe_unrecorded_end(vm.control.exists()),
                };
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        supervisor::add_guest_panic(&mut reason, &vm.dir);
        Some(Exit { reason })
    }

    fn destroy(&self, vm: &VmRecord) {
        // A branch child has no supervisor: its parent VMM (or the spawner,
        // which exits once its last child is gone) reaps it.
        self.brought_up.forget(&vm.agent_addr);
        supervisor::destroy_vm(vm);
    }
}

impl KvmRuntime {
    /// Runs `capture` with the VM paused when `vm` writes a volume (its copies and the
    /// captured state must agree; see `kvm_volumes`), resuming it whatever happens.
    /// Returns the result and, when it paused the VM, for how long (ms).
    fn paused_for_volumes<T>(
        &self,
        vm: &VmRecord,
        capture: impl FnOnce() -> Result<T, RuntimeError>,
    ) -> Result<(T, Option<f64>), RuntimeError> {
        if !kvm_volumes::need_pause(&vm.volumes)
            || status(&vm.control)?.state != VmRunState::Running
        {
            return capture().map(|t| (t, None));
        }
        let c = control(&vm.control);
        let stopped = Instant::now();
        c.request::<StatusInfo>(&Request::Pause).map_err(ctl_err)?;
        let result = capture();
        if let Err(e) = c.request::<StatusInfo>(&Request::Resume) {
            // What was captured is complete (a branch's children already run): the
            // failure is the parent's, which its run state shows.
            tracing::error!("resuming {} after a capture: {e}", vm.dir.display());
        }
        let paused_ms = stopped.elapsed().as_secs_f64() * 1e3;
        result.map(|t| (t, Some(paused_ms)))
    }

    /// A branch child the VMM reported ready: record, cgroup, identity.
    fn adopt_child(
        &self,
        spec: &StartSpec,
        files: &VmFiles,
        pid: Option<i32>,
        volumes: Vec<VolumeDisk>,
    ) -> Result<(VmRecord, Option<BringUpTimes>), RuntimeError> {
        let process = pid
            .and_then(|p| ProcId::of(p as u32))
            .ok_or_else(|| RuntimeError::Boot("the branch child is not running".into()))?;
        let mut rec = record(spec, files, process, None, volumes);
        // Its control socket was bound before the fork; only the guest needs waiting for.
        match self.bring_up(&mut rec, spec) {
            Ok(times) => Ok((rec, times)),
            Err(e) => {
                supervisor::kill_and_wait(&rec.process, None);
                Err(boot_error(e, &spec.dir))
            }
        }
    }
}
