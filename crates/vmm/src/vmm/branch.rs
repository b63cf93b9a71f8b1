//! BRANCH: fork the VMM process so each child continues the paused VM independently.
//!
//! Guest RAM is private anonymous memory, so fork(2) gives every child a copy-on-write
//! view of it at the same host address. The parent quiesces all its threads (vCPUs out
//! of KVM_RUN and parked, event thread parked: no locks held), captures `VmState`, forks
//! once, and resumes at once. For one child that fork *is* the child. For N children it
//! is a frozen "spawner" copy that forks the N children itself while the parent already
//! runs again, so the parent's pause does not grow with N; the spawner then drops its
//! guest memory and only reaps. The spawner leads a process group its children share, so
//! a failed branch is cleaned up with one kill; a child that runs outlives the spawner and
//! the parent (until then it dies with the spawner). Asked to keep the branch point
//! ([`Vmm::branch_saving_point`]), the spawner (used then even for one child) also writes
//! a full snapshot of the point from its frozen memory after forking the children, while
//! parent and children run: the point can be restored later without pausing anyone longer.
//!
//! Each child is single-threaded after fork: it unmaps the parent's kvm_run pages and
//! closes every inherited fd (KVM objects, eventfds, sockets, listeners), builds a new
//! KVM VM over the inherited memory, restores the state, starts new threads, reports
//! readiness over a pipe, then runs the caller's child main.
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::ready::{self, ReadyRecord, WaitError};
use super::{RestoreConfig, Vmm, VmmError};
use crate::devices::serial::SerialOut;
use crate::devices::virtio::block::DiskMode;
use crate::devices::virtio::persist::DeviceHostConfig;
use crate::devices::virtio::state::DeviceState;
use crate::persist::VmState;

/// What a branch child does once its VM runs. Its return value is the exit status.
pub type ChildMain<'a> = &'a dyn Fn(ChildContext) -> i32;

pub struct BranchRequest<'a> {
    /// Number of children to create.
    pub count: usize,
    /// Console sink for child `i`.
    pub child_serial: &'a dyn Fn(usize) -> SerialOut,
    /// Host resources for child `i`'s devices (its own vsock socket, tap). Only needed
    /// when the VM has such devices.
    pub child_devices: &'a dyn Fn(usize) -> DeviceHostConfig,
    /// A cgroup (v2 directory) child `i` moves itself into before it builds its VM, so
    /// that everything the new VM makes is accounted there: KVM attaches its per-VM
    /// kernel threads to the creator's cgroups. None: it stays in the parent's.
    pub child_cgroup: &'a dyn Fn(usize) -> Option<PathBuf>,
    /// A network namespace file child `i` joins before it opens its devices' host
    /// resources (its tap lives there). None: it stays in the parent's.
    pub child_netns: &'a dyn Fn(usize) -> Option<PathBuf>,
    /// Runs in each child after its VM is running; never returns to the caller.
    pub child_main: ChildMain<'a>,
    /// File descriptors children keep open besides stdin/stdout/stderr.
    pub keep_fds: Vec<RawFd>,
    /// How long to wait for all children to report running.
    pub ready_timeout: Duration,
}

/// Handed to the child main.
pub struct ChildContext {
    pub index: usize,
    pub vmm: Vmm,
}

#[derive(Debug, Clone)]
pub struct BranchedChild {
    pub index: usize,
    pub pid: libc::pid_t,
    /// From the request to this child's VM running.
    pub ready_after: Duration,
    /// Part of that the child spent rebuilding its VM (new KVM VM, state, threads).
    pub restore: Duration,
}

#[derive(Debug, Clone)]
pub struct BranchReport {
    pub children: Vec<BranchedChild>,
    /// The frozen copy that forked the children (count > 1); it reaps them.
    pub spawner: Option<libc::pid_t>,
    /// How long the parent's vCPUs were stopped.
    pub pause: Duration,
    /// Part of the pause spent stopping vCPUs and capturing state.
    pub capture: Duration,
    /// Part of the pause spent in the parent's fork(2).
    pub fork: Duration,
    /// Part of the pause spent resuming the parent.
    pub resume: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum BranchError {
    #[error("cannot branch: {0}")]
    Vmm(#[from] VmmError),
    #[error("count must be at least 1")]
    ZeroCount,
    #[error(
        "child {index} has no file of its own for the persistent disk {id:?}: it would \
         write into the parent's (give each child a frozen copy, `disk_files`)"
    )]
    SharedPersistentDisk { index: usize, id: String },
    #[error("creating the readiness pipe failed: {0}")]
    Pipe(std::io::Error),
    #[error("fork failed: {0}")]
    Fork(std::io::Error),
    #[error("child {index} (pid {pid}) failed to start its VM (status {status}); see its stderr")]
    ChildFailed {
        index: usize,
        pid: libc::pid_t,
        status: i32,
    },
    #[error("{missing} of {count} children did not report running within {timeout:?}")]
    ChildTimeout {
        missing: usize,
        count: usize,
        timeout: Duration,
    },
}

/// A persistent disk's writes reach its file: two VMs must never share one, so each
/// child must be given a file of its own for every persistent disk of the parent.
fn check_children_own_their_disks(state: &VmState, req: &BranchRequest) -> Result<(), BranchError> {
    for index in 0..req.count {
        if let Some(id) = unowned_persistent_disk(state, &(req.child_devices)(index)) {
            return Err(BranchError::SharedPersistentDisk { index, id });
        }
    }
    Ok(())
}

/// The id of a persistent disk in `state` that `host` gives no file of its own.
pub(super) fn unowned_persistent_disk(state: &VmState, host: &DeviceHostConfig) -> Option<String> {
    state.devices.virtio.iter().find_map(|d| match &d.device {
        DeviceState::Block(b)
            if b.config.mode == DiskMode::Persistent
                && !host.disk_files.iter().any(|f| b.config.is_named(f)) =>
        {
            Some(b.config.id.clone().unwrap_or_default())
        }
        _ => None,
    })
}

/// Status a spawner reports for a child it could not fork.
const STATUS_FORK_FAILED: i32 = 2;

/// Close every fd ≥ 3 except `keep`, with close_range(2) over the gaps.
pub(super) fn close_fds_except(keep: &mut [RawFd]) {
    keep.sort_unstable();
    let mut start: u32 = 3;
    for &fd in keep.iter().filter(|&&fd| fd >= 3) {
        let fd = fd as u32;
        if fd > start {
            // SAFETY: closing descriptors we no longer use; no Rust object in this child
            // will touch them again (the parent's objects are never dropped here).
            unsafe { libc::syscall(libc::SYS_close_range, start, fd - 1, 0) };
        }
        start = fd + 1;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, start, u32::MAX, 0) };
}

/// Move this process into the cgroup `dir` (cgroup v2: write our pid to cgroup.procs).
pub(super) fn join_cgroup(dir: Option<PathBuf>) -> Result<(), VmmError> {
    let Some(dir) = dir else { return Ok(()) };
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() };
    std::fs::write(dir.join("cgroup.procs"), pid.to_string())
        .map_err(|e| VmmError::Device(format!("joining cgroup {}: {e}", dir.display())))
}

/// Move this (single-threaded, freshly forked) process into the network namespace
/// `file` names, so that the tap it opens next is that namespace's.
pub(super) fn join_netns(file: Option<PathBuf>) -> Result<(), VmmError> {
    let Some(file) = file else { return Ok(()) };
    let ns = std::fs::File::open(&file).map_err(|e| {
        VmmError::Device(format!("opening network namespace {}: {e}", file.display()))
    })?;
    // SAFETY: setns on a descriptor we own; it changes only this thread's namespace, and
    // the child has no other thread yet (vCPU threads created later inherit it).
    if unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) } < 0 {
        return Err(VmmError::Device(format!(
            "joining network namespace {}: {}",
            file.display(),
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Leave a forked process without running the parent's destructors or atexit handlers.
pub(super) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit is always safe to call.
    unsafe { libc::_exit(code) }
}

impl Vmm {
    /// Fork `req.count` children that continue this VM. Returns in the parent only.
    pub fn branch(&mut self, req: &BranchRequest) -> Result<BranchReport, BranchError> {
        self.branch_saving_point(req, None)
    }

    /// [`Vmm::branch`], and with `point`, a full snapshot of the branch point written
    /// there by the spawner once the children are forked (`<point>` appears, complete,
    /// when it is done; on failure the spawner's stderr says why and it does not).
    pub fn branch_saving_point(
        &mut self,
        req: &BranchRequest,
        point: Option<&Path>,
    ) -> Result<BranchReport, BranchError> {
        let point = point.map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()));
        let use_spawner = req.count > 1 || point.is_some();
        if req.count == 0 {
            return Err(BranchError::ZeroCount);
        }
        let started = Instant::now();
        let start_ns = ready::mono_ns();
        let was_paused = self.paused;
        let state = self.pause_and_capture()?;
        let captured = started.elapsed();
        if let Err(e) = check_children_own_their_disks(&state, req) {
            if !was_paused {
                self.resume()?;
            }
            return Err(e);
        }

        let mut fds = [0 as RawFd; 2];
        // SAFETY: plain pipe creation.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            let err = std::io::Error::last_os_error();
            if !was_paused {
                self.resume()?;
            }
            return Err(BranchError::Pipe(err));
        }
        let (ready_r, ready_w) = (fds[0], fds[1]);

        let fork_started = Instant::now();
        // SAFETY: every other thread of this VMM is parked holding no locks; the child
        // never returns into the caller's frames.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: the child has no use for the read end.
            unsafe { libc::close(ready_r) };
            if !use_spawner {
                self.become_child(&state, 0, ready_w, req);
            }
            self.become_spawner(&state, ready_w, req, point.as_deref());
        }
        let fork_time = fork_started.elapsed();
        let fork_err = (pid < 0).then(std::io::Error::last_os_error);
        // Resume first: everything else can happen while the guest runs.
        let resume_started = Instant::now();
        let resumed = if was_paused { Ok(()) } else { self.resume() };
        let pause = started.elapsed();
        let resume_time = resume_started.elapsed();
        // SAFETY: only children write readiness records.
        unsafe { libc::close(ready_w) };
        if let Some(err) = fork_err {
            // SAFETY: closing our read end.
            unsafe { libc::close(ready_r) };
            resumed?;
            return Err(BranchError::Fork(err));
        }
        if use_spawner {
            // The spawner's own process group (it sets it too; whoever runs first wins).
            // SAFETY: plain setpgid on our child.
            unsafe { libc::setpgid(pid, pid) };
        }
        self.children.push(pid);

        let waited = ready::wait_for(ready_r, req.count, started + req.ready_timeout);
        // SAFETY: done with the read end.
        unsafe { libc::close(ready_r) };
        resumed?;
        let records = match waited {
            Ok(r) => r,
            Err(e) => {
                // Don't leave half-started children behind: the spawner's children are
                // in its process group, a direct child is the pid itself.
                let target = if use_spawner { -pid } else { pid };
                // SAFETY: signalling processes we created.
                unsafe { libc::kill(target, libc::SIGKILL) };
                self.reap_children(true);
                return Err(match e {
                    WaitError::Failed { record } => BranchError::ChildFailed {
                        index: record.index as usize,
                        pid: record.pid,
                        status: record.status,
                    },
                    WaitError::Timeout { received } => BranchError::ChildTimeout {
                        missing: req.count - received.len(),
                        count: req.count,
                        timeout: req.ready_timeout,
                    },
                });
            }
        };
        Ok(BranchReport {
            children: records
                .iter()
                .map(|r| BranchedChild {
                    index: r.index as usize,
                    pid: r.pid,
                    ready_after: ready::since(start_ns, r.ready_mono_ns),
                    restore: Duration::from_nanos(r.restore_ns),
                })
                .collect(),
            spawner: use_spawner.then_some(pid),
            pause,
            capture: captured,
            fork: fork_time,
            resume: resume_time,
        })
    }

    /// Drop what belongs to the parent VMM: its kvm_run mappings and every fd.
    pub(super) fn release_parent_objects(&mut self, ready_w: RawFd, keep_fds: &[RawFd]) {
        for v in &self.vcpus {
            let m = v.kvm_run_mapping();
            // SAFETY: the parent's kvm_run pages; no thread in this process uses them.
            unsafe { libc::munmap(m.addr as *mut libc::c_void, m.size) };
        }
        let mut keep = keep_fds.to_vec();
        keep.push(ready_w);
        close_fds_except(&mut keep);
        // This process's own children list starts empty, and the parent's warm
        // spawners are not this process's to kill (their sockets are closed above).
        self.children.clear();
        std::mem::forget(std::mem::take(&mut self.spawners));
    }

    /// Runs in a forked child of the parent (count == 1): never returns.
    fn become_child(
        &mut self,
        state: &VmState,
        index: usize,
        ready_w: RawFd,
        req: &BranchRequest,
    ) -> ! {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let t = Instant::now();
            self.release_parent_objects(ready_w, &req.keep_fds);
            self.rebuild_and_run(state, index, ready_w, req, t)
        }));
        exit_now(code.unwrap_or(101))
    }

    /// Build this child's own VM over the inherited memory, report, run the child main.
    fn rebuild_and_run(
        &mut self,
        state: &VmState,
        index: usize,
        ready_w: RawFd,
        req: &BranchRequest,
        t: Instant,
    ) -> i32 {
        // The parent's device objects are still in this process's memory: its disks
        // are adopted as they are, other private data is copied (see `inherit`).
        let result = join_cgroup((req.child_cgroup)(index))
            .and_then(|()| join_netns((req.child_netns)(index)))
            .and_then(|()| {
                let device_host = (req.child_devices)(index);
                let inherited_disks = self.inherited_disks(state, &device_host);
                let device_data = self
                    .private_data_not_inherited(&inherited_disks)
                    .map_err(|e| VmmError::Device(format!("reading device data: {e}")))?;
                let cfg = RestoreConfig {
                    serial_out: (req.child_serial)(index),
                    start_paused: false,
                    device_host,
                    device_data,
                    inherited_disks,
                };
                Vmm::restore(self.ram.clone(), state, cfg)
            });
        if result.is_ok() {
            // Running, the child is a VM of its own: it must outlive the spawner (killed
            // with the parent's cgroup when the parent is deleted). Cleared before the
            // report, so that nobody who has seen the report can still take it down by
            // killing the spawner; a failed branch kills the spawner's process group.
            // SAFETY: plain prctl on this process.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, 0) };
        }
        let record = ReadyRecord {
            index: index as u32,
            status: if result.is_ok() { 0 } else { 1 },
            // SAFETY: getpid cannot fail.
            pid: unsafe { libc::getpid() },
            restore_ns: t.elapsed().as_nanos() as u64,
            ready_mono_ns: ready::mono_ns(),
            mismatches: 0,
        };
        record.send(ready_w);
        // SAFETY: readiness is reported; the child main doesn't need the pipe.
        unsafe { libc::close(ready_w) };
        match result {
            Ok(vmm) => (req.child_main)(ChildContext { index, vmm }),
            Err(e) => {
                eprintln!("zygote: branch child {index}: {e}");
                1
            }
        }
    }

    /// Runs in the frozen spawner (count > 1, or a point to save): forks every child,
    /// writes the point's snapshot if asked, then only reaps.
    fn become_spawner(
        &mut self,
        state: &VmState,
        ready_w: RawFd,
        req: &BranchRequest,
        point: Option<&Path>,
    ) -> ! {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.release_parent_objects(ready_w, &req.keep_fds);
            // Its own process group, inherited by the children: a failed branch ends
            // them all with one kill(-spawner), whatever each has reported.
            // SAFETY: plain setpgid on this process (the parent does the same, racing us).
            unsafe { libc::setpgid(0, 0) };
            // SAFETY: getpid cannot fail.
            let spawner = unsafe { libc::getpid() };
            for index in 0..req.count {
                let t = Instant::now();
                // SAFETY: the spawner is single-threaded.
                let pid = unsafe { libc::fork() };
                if pid == 0 {
                    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        // Until it reports running, a child dies with the spawner (which
                        // only dies when killed), so cleaning up a failed branch is one
                        // kill; after that it is independent (see rebuild_and_run).
                        // SAFETY: plain prctl; then re-check the parent to close the race.
                        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
                        if unsafe { libc::getppid() } != spawner {
                            return 1;
                        }
                        self.rebuild_and_run(state, index, ready_w, req, t)
                    }));
                    exit_now(code.unwrap_or(101));
                }
                if pid < 0 {
                    ReadyRecord {
                        index: index as u32,
                        status: STATUS_FORK_FAILED,
                        pid: -1,
                        restore_ns: 0,
                        ready_mono_ns: ready::mono_ns(),
                        mismatches: 0,
                    }
                    .send(ready_w);
                    break;
                }
            }
            // SAFETY: the spawner reports nothing itself, and the fds kept for the
            // children (e.g. their listening sockets) must not stay open here.
            unsafe { libc::close(ready_w) };
            for &fd in &req.keep_fds {
                // SAFETY: as above; nothing in the spawner uses them.
                unsafe { libc::close(fd) };
            }
            if let Some(dest) = point {
                // Still the branch point: this process's memory and device objects are
                // the frozen copy the children started from.
                if let Err(e) = self.write_full_snapshot(state, dest) {
                    eprintln!("zygote: saving branch point {}: {e}", dest.display());
                }
            }
            // The children hold their own copy-on-write references; the spawner needs no
            // guest memory while it waits.
            self.ram.unmap_for_spawner();
            loop {
                let mut status = 0;
                // SAFETY: reaping our own children.
                if unsafe { libc::waitpid(-1, &mut status, 0) } < 0
                    && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD)
                {
                    return 0;
                }
            }
        }));
        exit_now(code.unwrap_or(101))
    }

    /// Reap exited branch children (and spawners); with `block`, wait for all of them.
    pub fn reap_children(&mut self, block: bool) -> Vec<(libc::pid_t, i32)> {
        let mut reaped = Vec::new();
        self.children.retain(|&pid| {
            let mut status = 0;
            let flags = if block { 0 } else { libc::WNOHANG };
            // SAFETY: waiting on our own child.
            let r = unsafe { libc::waitpid(pid, &mut status, flags) };
            if r == pid || r < 0 {
                reaped.push((pid, status));
                false
            } else {
                true
            }
        });
        reaped
    }

    /// Direct children of this VMM (single branch children and spawners) not yet reaped.
    pub fn children(&self) -> &[libc::pid_t] {
        &self.children
    }
}
