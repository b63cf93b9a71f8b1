//! The qemu runtime: QEMU microvm (KVM when the host can, else TCG), one
//! detached QEMU per sandbox, branch and snapshots with QEMU's own tools:
//! `stop`, `migrate` of RAM and device state to a file, `blockdev-snapshot-sync`
//! to freeze the disk layer, `cont`; new VMs start with `-incoming` from the
//! file on an overlay of the frozen layer, then are re-identified.
//!
//! Pause to disk is the same migration to a file without the layer switch, then QEMU
//! quits; resume starts QEMU with `-incoming` from that file on the sandbox's own
//! layer (QEMU reads the whole state file back: no lazy restore here).
//!
//! A migration runs inside QEMU, not in the daemon: a daemon killed during a capture or
//! pause leaves QEMU stopped, possibly with its migration still running. A restarted
//! daemon ([`Runtime::reattach`]) cancels such a migration before it resumes the VM.
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use zygote_proto::client::AgentClient;
use zygote_qemu::migrate::{create_overlay_on, detached_args, DetachedVm};
use zygote_qemu::{Accel, NetBackend, QemuConfig};

use super::handoff::BroughtUp;
use super::qmp::Qmp;
use super::{console, guest_agent, qemu_volumes, supervisor};
use super::{
    BootSource, BranchProgress, Exit, ExportedSnapshot, GuestNet, RunState, Runtime, RuntimeError,
    SnapshotData, StartSpec, VmRecord, VolumeDisk,
};
use crate::model::SnapshotKind;

const QEMU: &str = "qemu-system-x86_64";
/// Generous: several TCG guests may boot at once on two busy cores.
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(300);
/// QEMU stops a cancelled migration at its next chunk: quick, unless the host is stuck.
const MIGRATION_CANCEL_TIMEOUT: Duration = Duration::from_secs(30);
/// The agent channel: QEMU serves the guest agent's virtio-serial port on this Unix
/// socket in the sandbox's directory (one connection at a time; only the daemon's
/// user can open the directory). No TCP port on the host leads to an agent.
const AGENT_SOCKET: &str = "agent.sock";
/// RAM and device state in a snapshot's directory.
const STATE_FILE: &str = "state";

pub struct QemuRuntime {
    /// The guest kernel, located (or built) on first use.
    kernel: Mutex<Option<PathBuf>>,
    /// The connection that brought each VM up, until the daemon's first agent call.
    brought_up: BroughtUp,
}

impl QemuRuntime {
    pub fn new() -> Result<QemuRuntime, RuntimeError> {
        let found = std::process::Command::new(QEMU)
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        if let Err(e) = found {
            return Err(RuntimeError::Unavailable(format!(
                "{QEMU}: {e} (install qemu-system-x86 and qemu-utils)"
            )));
        }
        Ok(QemuRuntime {
            kernel: Mutex::new(None),
            brought_up: BroughtUp::default(),
        })
    }

    fn kernel(&self) -> Result<PathBuf, RuntimeError> {
        let mut k = self.kernel.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(path) = &*k {
            return Ok(path.clone());
        }
        let info = zygote_images::build_kernel(&mut |line| tracing::info!("kernel: {line}"))
            .map_err(|e| RuntimeError::Unavailable(format!("guest kernel: {e}")))?;
        *k = Some(info.vmlinux.clone());
        Ok(info.vmlinux)
    }

    fn config(&self, spec: &StartSpec, volumes: &[VolumeDisk]) -> Result<QemuConfig, RuntimeError> {
        let image = match &spec.source {
            BootSource::Image(p) => p.clone(),
            BootSource::Snapshot(s) | BootSource::Parked(s) => s.disk_layer.clone(),
        };
        let mut cfg = QemuConfig::new(self.kernel()?, image);
        cfg.mem_mib = spec.mem_mib;
        cfg.vcpus = spec.vcpus;
        cfg.extra_disks = qemu_volumes::extra_disks(volumes);
        cfg.net = match &spec.net {
            GuestNet::User { restrict } => NetBackend::User {
                restrict: *restrict,
            },
            GuestNet::Tap(t) => NetBackend::Tap {
                ifname: t.tap.clone(),
                mac: t.mac.clone(),
                kernel_ip: t.kernel_ip_param(),
            },
        };
        Ok(cfg)
    }

    fn start_once(
        &self,
        spec: &StartSpec,
        cfg: &QemuConfig,
        accel: Accel,
        volumes: &[VolumeDisk],
    ) -> Result<VmRecord, RuntimeError> {
        let dir = &spec.dir;
        // QEMU prints the serial port to its stdout, piped into the bounded log's pump
        // (`console`); without the pump program, into the log file directly (unbounded).
        let pump = console::pump_program();
        let log = console::path(dir);
        let vm = DetachedVm {
            overlay: spec.disk.clone(),
            serial_log: match &pump {
                Some(_) => PathBuf::from("/dev/stdout"),
                None => log.clone(),
            },
            qmp_socket: dir.join("qmp.sock"),
            pid_file: dir.join("qemu.pid"),
            agent_socket: dir.join(AGENT_SOCKET),
            incoming: match &spec.source {
                BootSource::Snapshot(s) | BootSource::Parked(s) => Some(s.state_file.clone()),
                BootSource::Image(_) => None,
            },
        };
        for f in [
            &vm.qmp_socket,
            &vm.pid_file,
            &vm.agent_socket,
            &dir.join("exit"),
        ] {
            let _ = std::fs::remove_file(f);
        }
        let stderr_path = dir.join("qemu.stderr");
        let stderr =
            File::create(&stderr_path).map_err(RuntimeError::io("creating qemu.stderr"))?;
        let args = detached_args(cfg, accel, &vm);
        let netns = match &spec.net {
            GuestNet::Tap(t) => Some(t.netns.as_path()),
            GuestNet::User { .. } => None,
        };
        let console_pump = pump
            .as_deref()
            .map(|program| supervisor::ConsolePump { program, log: &log });
        let supervisor = supervisor::spawn(
            QEMU,
            &args,
            dir,
            spec.cgroup.as_deref(),
            netns,
            stderr,
            console_pump.as_ref(),
        )?;
        let record = |process| VmRecord {
            dir: dir.clone(),
            process,
            supervisor: Some(supervisor),
            agent_addr: vm.agent_socket.display().to_string(),
            control: vm.qmp_socket.clone(),
            disk: spec.disk.clone(),
            accel: accel.as_str().to_string(),
            fork_hooks: Vec::new(),
            volumes: volumes.to_vec(),
        };
        let process =
            match supervisor::wait_pid_file(&vm.pid_file, &supervisor, Duration::from_secs(30)) {
                Ok(p) => p,
                Err(e) => {
                    supervisor::kill_and_wait(&supervisor, None);
                    return Err(boot_error(e, dir));
                }
            };
        let mut rec = record(process);
        if let Err(e) = self.bring_up(&mut rec, spec) {
            supervisor::kill_and_wait(&rec.process, rec.supervisor.as_ref());
            return Err(boot_error(e, dir));
        }
        Ok(rec)
    }

    /// From a started QEMU to a guest answering with its new identity.
    fn bring_up(&self, rec: &mut VmRecord, spec: &StartSpec) -> Result<(), RuntimeError> {
        if let BootSource::Snapshot(_) | BootSource::Parked(_) = spec.source {
            let mut qmp = Qmp::connect(&rec.control, Duration::from_secs(30))?;
            qmp.wait_migration(MIGRATION_TIMEOUT)?;
            // The state was saved from a stopped VM, so it arrives stopped.
            qmp.cont()?;
        }
        let connect = || AgentClient::connect_unix(&rec.agent_addr);
        let alive = || rec.process.is_alive();
        let target = guest_agent::AgentTarget {
            connect: &connect,
            alive: &alive,
            what: "QEMU",
            // QEMU accepts the channel before the guest serves it; the request waits
            // in the channel until the agent runs, however long the boot takes.
            attempt_limit: BOOT_TIMEOUT,
        };
        let deadline = Instant::now() + BOOT_TIMEOUT;
        let (client, report, _) =
            guest_agent::bring_up(&target, &spec.who(), &spec.auth, deadline)?;
        rec.fork_hooks = report.hooks;
        self.brought_up.keep(&rec.agent_addr, client);
        Ok(())
    }

    /// stop → migrate to `<snap_dir>/state` → freeze the disk layer → cont.
    /// Any failure resumes the VM unchanged.
    fn capture(
        &self,
        vm: &mut VmRecord,
        snap_dir: &Path,
        next_disk: &Path,
    ) -> Result<SnapshotData, RuntimeError> {
        let state_file = snap_dir.join(STATE_FILE);
        let mut qmp = Qmp::connect(&vm.control, Duration::from_secs(10))?;
        let stopped = Instant::now();
        qmp.stop()?;
        crate::fault::point("capture.stopped");
        // The volume copies before the layer switch: QEMU on `next_disk` (what start-up
        // checks, `finished_capture`) means every file of the capture is whole.
        let mut volumes = Vec::new();
        let captured = migrate_to_file(&mut qmp, &state_file, "capture")
            .map_err(RuntimeError::from)
            .and_then(|_| {
                crate::fault::point("capture.migrated");
                volumes = qemu_volumes::freeze(&vm.volumes, snap_dir)?;
                crate::fault::point("capture.volumes-copied");
                Ok(qmp.snapshot_disk("root", next_disk)?)
            });
        crate::fault::point("capture.disk-switched");
        let resumed = qmp.cont();
        let pause = stopped.elapsed();
        if let Err(e) = captured {
            let _ = std::fs::remove_file(&state_file);
            let _ = std::fs::remove_file(next_disk);
            for v in &volumes {
                let _ = std::fs::remove_file(&v.file);
            }
            return Err(e);
        }
        resumed?;
        let data = SnapshotData {
            dir: snap_dir.to_path_buf(),
            state_file,
            disk_layer: vm.disk.clone(),
            accel: vm.accel.clone(),
            pause_ms: Some(pause.as_secs_f64() * 1e3),
            volumes,
            isolated_nic: false,
        };
        vm.disk = next_disk.to_path_buf();
        Ok(data)
    }
}

/// Migrates the (stopped) VM's RAM and device state into `file`. A migration that
/// fails to complete (it failed, or timed out) is cancelled before this returns, so the
/// caller's `cont` resumes a VM that no migration will stop again (see
/// [`Qmp::cancel_migration`]). `operation` names the fault point of the migration in
/// flight (`<operation>.migrating`).
fn migrate_to_file(
    qmp: &mut Qmp,
    file: &Path,
    operation: &str,
) -> Result<serde_json::Value, super::qmp::QmpError> {
    let uri = format!(
        "exec:cat > '{}'",
        file.display().to_string().replace('\'', r"'\''")
    );
    qmp.start_migration(&uri)?;
    crate::fault::point(&format!("{operation}.migrating"));
    qmp.wait_migration(MIGRATION_TIMEOUT).inspect_err(|_| {
        if let Err(e) = qmp.cancel_migration(MIGRATION_CANCEL_TIMEOUT) {
            tracing::warn!("cancelling the migration to {}: {e}", file.display());
        }
    })
}

/// fsyncs `partial`, renames it to `dest` and fsyncs their directory.
pub(crate) fn sync_into_place(partial: &Path, dest: &Path) -> Result<(), RuntimeError> {
    File::open(partial)
        .and_then(|f| f.sync_all())
        .and_then(|()| std::fs::rename(partial, dest))
        .and_then(|()| match dest.parent() {
            Some(d) => File::open(d)?.sync_all(),
            None => Ok(()),
        })
        .map_err(RuntimeError::io(format!("saving {}", dest.display())))
}

fn boot_error(e: RuntimeError, dir: &Path) -> RuntimeError {
    let stderr = std::fs::read_to_string(dir.join("qemu.stderr")).unwrap_or_default();
    RuntimeError::Boot(format!(
        "{e}\n--- qemu stderr ---\n{}\n--- serial console (last lines) ---\n{}",
        stderr.trim(),
        console::last_lines(dir, 20)
    ))
}

impl Runtime for QemuRuntime {
    fn name(&self) -> &'static str {
        "qemu"
    }

    fn volumes_supported(&self) -> bool {
        true
    }

    fn branch_mechanism(&self) -> &'static str {
        "QEMU: stop, migrate RAM+device state to a file, freeze the qcow2 layer \
         (blockdev-snapshot-sync), children start with -incoming on overlays of it, then reidentify"
    }

    fn snapshot_kinds(&self) -> Vec<SnapshotKind> {
        vec![SnapshotKind::Full]
    }

    fn start(&self, spec: &StartSpec) -> Result<VmRecord, RuntimeError> {
        let volumes = qemu_volumes::disks_for_start(spec)?;
        let cfg = self.config(spec, &volumes)?;
        let accel = match &spec.source {
            BootSource::Snapshot(s) | BootSource::Parked(s) if s.accel == "kvm" => Accel::Kvm,
            BootSource::Snapshot(_) | BootSource::Parked(_) => Accel::Tcg,
            BootSource::Image(_) => zygote_qemu::detect_accel(),
        };
        match &spec.source {
            BootSource::Image(base) => create_overlay_on(base, "raw", &spec.disk)?,
            BootSource::Snapshot(s) => create_overlay_on(&s.disk_layer, "qcow2", &spec.disk)?,
            // The sandbox's own layer, kept through the pause.
            BootSource::Parked(_) => {}
        }
        let result = self.start_once(spec, &cfg, accel, &volumes);
        if result.is_err() && !matches!(spec.source, BootSource::Parked(_)) {
            let _ = std::fs::remove_file(&spec.disk);
        }
        result
    }

    fn connect(&self, vm: &VmRecord, token: &str) -> Result<AgentClient, RuntimeError> {
        self.brought_up
            .take_or_connect(vm, token, || AgentClient::connect_unix(&vm.agent_addr))
    }

    fn snapshot(
        &self,
        vm: &mut VmRecord,
        kind: SnapshotKind,
        snap_dir: &Path,
        next_disk: &Path,
    ) -> Result<SnapshotData, RuntimeError> {
        match kind {
            SnapshotKind::Full | SnapshotKind::Branch => self.capture(vm, snap_dir, next_disk),
            other => Err(RuntimeError::Unsupported(format!(
                "the qemu runtime takes full snapshots only ({} needs zygote's VMM: the kvm runtime)",
                other.as_str()
            ))),
        }
    }

    fn branch_child_copy_mib(&self, mem_mib: u32) -> Option<u32> {
        // Each child is a QEMU of its own that loads the branch point's RAM.
        Some(mem_mib)
    }

    fn capture_bytes(&self, _kind: SnapshotKind, mem_mib: u32) -> Option<u64> {
        // Branch points too: a state file of RAM (zero pages take almost nothing) and
        // device state, for every kind.
        Some(u64::from(mem_mib) << 20)
    }

    fn branch_with_progress(
        &self,
        parent: &mut VmRecord,
        point_dir: &Path,
        next_disk: &Path,
        children: &[StartSpec],
        // Always kept: a branch point here is a saved state file.
        _keep_point: bool,
        progress: &dyn BranchProgress,
    ) -> Result<SnapshotData, RuntimeError> {
        let point = self.capture(parent, point_dir, next_disk)?;
        progress.point_taken(parent, &point);
        // Children load the same state file concurrently.
        supervisor::start_children(
            children,
            |_, c| {
                let mut spec = c.clone();
                spec.source = BootSource::Snapshot(point.clone());
                self.start(&spec)
            },
            |i, r| progress.child_done(i, r),
        );
        Ok(point)
    }

    fn export_files(
        &self,
        data: &SnapshotData,
        work: &Path,
    ) -> Result<ExportedSnapshot, RuntimeError> {
        super::qemu_pack::export(data, work)
    }

    fn import_files(
        &self,
        dir: &Path,
        state_file: &Path,
        disk: Option<&Path>,
        base: &Path,
        accel: &str,
    ) -> Result<SnapshotData, RuntimeError> {
        let disk =
            disk.ok_or_else(|| RuntimeError::BadPack("the pack has no disk layer".into()))?;
        super::qemu_pack::import(dir, state_file, disk, base, accel)
    }

    fn finished_capture(
        &self,
        vm: &VmRecord,
        _kind: SnapshotKind,
        snap_dir: &Path,
        next_disk: &Path,
    ) -> Result<Option<SnapshotData>, RuntimeError> {
        // The layer switch is the capture's last step, after the state file is complete:
        // QEMU writing to `next_disk` means the snapshot is whole.
        let mut qmp = Qmp::connect(&vm.control, Duration::from_secs(10))?;
        if qmp.active_image("root")?.as_deref() != Some(next_disk) {
            return Ok(None);
        }
        Ok(Some(SnapshotData {
            dir: snap_dir.to_path_buf(),
            state_file: snap_dir.join(STATE_FILE),
            disk_layer: vm.disk.clone(),
            accel: vm.accel.clone(),
            pause_ms: None,
            volumes: qemu_volumes::frozen_in(&vm.volumes, snap_dir),
            isolated_nic: false,
        }))
    }

    fn park_data(&self, vm: &VmRecord, dir: &Path) -> SnapshotData {
        SnapshotData {
            dir: dir.to_path_buf(),
            state_file: dir.join(STATE_FILE),
            disk_layer: vm.disk.clone(),
            accel: vm.accel.clone(),
            pause_ms: None,
            volumes: vm.volumes.clone(),
            isolated_nic: false,
        }
    }

    fn park(&self, vm: &VmRecord, dir: &Path) -> Result<SnapshotData, RuntimeError> {
        let mut data = self.park_data(vm, dir);
        // Written under another name and renamed once synced: `state` existing means
        // the state is whole (start-up relies on it after a crash).
        let partial = dir.join(format!("{STATE_FILE}.partial"));
        let mut qmp = Qmp::connect(&vm.control, Duration::from_secs(10))?;
        let stopped = Instant::now();
        qmp.stop()?;
        let saved = migrate_to_file(&mut qmp, &partial, "pause")
            .map_err(RuntimeError::from)
            .and_then(|_| sync_into_place(&partial, &data.state_file));
        if let Err(e) = saved {
            let _ = std::fs::remove_file(&partial);
            let _ = std::fs::remove_file(&data.state_file);
            qmp.cont()?;
            return Err(e);
        }
        data.pause_ms = Some(stopped.elapsed().as_secs_f64() * 1e3);
        crate::fault::point("pause.saved");
        // A clean quit (the disk layer is flushed: `stop` and the migration drained it),
        // then a kill for a QEMU that does not go.
        let _ = qmp.execute("quit", serde_json::json!({}));
        drop(qmp);
        vm.process.wait_gone(Duration::from_secs(5));
        supervisor::kill_and_wait(&vm.process, vm.supervisor.as_ref());
        self.brought_up.forget(&vm.agent_addr);
        Ok(data)
    }

    fn run_state(&self, vm: &VmRecord) -> Result<RunState, RuntimeError> {
        let mut qmp = Qmp::connect(&vm.control, Duration::from_secs(10))?;
        let status = qmp.status()?;
        let faulted = |reason: String, resumable| RunState::Faulted { reason, resumable };
        Ok(match status.as_str() {
            // QEMU stops the guest when a write fails (werror=enospc, the virtio-blk
            // default, for a full disk); it can go on once the write can succeed.
            "io-error" => {
                let detail = match qmp.io_status("root")?.as_deref() {
                    Some("nospace") => format!(
                        "no space left on device (the disk layer {})",
                        vm.disk.display()
                    ),
                    Some(other) => format!("disk I/O status {other}"),
                    None => "disk I/O failed".to_string(),
                };
                faulted(format!("io-error: {detail}"), true)
            }
            "internal-error" | "guest-panicked" | "shutdown" => {
                faulted(format!("QEMU reports {status}"), false)
            }
            _ => RunState::Running,
        })
    }

    fn resume(&self, vm: &VmRecord) -> Result<(), RuntimeError> {
        let mut qmp = Qmp::connect(&vm.control, Duration::from_secs(10))?;
        Ok(qmp.cont()?)
    }

    fn reattach(&self, vm: &VmRecord) -> Result<(), RuntimeError> {
        let mut qmp = Qmp::connect(&vm.control, Duration::from_secs(10))?;
        // The migration of a capture or pause the previous daemon did not finish runs
        // on without it: cancelled first, or the `cont` below would make it a live
        // migration that stops the guest once complete.
        if let Some(ended) = qmp.cancel_migration(MIGRATION_CANCEL_TIMEOUT)? {
            tracing::info!(
                "VM in {}: the migration a crash left running ended {ended}",
                vm.dir.display()
            );
        }
        let status = qmp.status()?;
        // Left stopped by a snapshot, branch or pause the previous daemon did not
        // finish: on this runtime only those stop a VM that goes on (a pause to disk
        // ends QEMU; a faulted VM reports `io-error` or worse, never `paused`).
        if matches!(status.as_str(), "paused" | "postmigrate") {
            tracing::info!("resuming VM in {} ({status})", vm.dir.display());
            qmp.cont()?;
        }
        Ok(())
    }

    fn exit_status(&self, vm: &VmRecord) -> Option<Exit> {
        if vm.process.is_alive() {
            return None;
        }
        // The supervisor writes the status right after QEMU ends.
        let deadline = Instant::now() + Duration::from_millis(500);
        let status = loop {
            match supervisor::recorded_status(&vm.dir) {
                Some(s) => break Some(s),
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                None => break None,
            }
        };
        let mut reason = match status {
            Some(s) => supervisor::describe_status("QEMU", s),
            None => "QEMU and its supervisor are gone (no exit status was recorded)".to_string(),
        };
        let stderr = std::fs::read_to_string(vm.dir.join("qemu.stderr")).unwrap_or_default();
        // The supervisor shell adds its own "Killed"-style line: not news.
        let stderr: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with("zygote-vm: "))
            .filter(|l| !matches!(l.trim(), "Killed" | "Terminated" | "Aborted"))
            .collect();
        if !stderr.is_empty() {
            reason.push_str(&format!(": {}", stderr.join("; ")));
        }
        supervisor::add_guest_panic(&mut reason, &vm.dir);
        Some(Exit { reason })
    }

    fn destroy(&self, vm: &VmRecord) {
        self.brought_up.forget(&vm.agent_addr);
        supervisor::destroy_vm(vm);
    }
}
